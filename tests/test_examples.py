"""Every example in examples/ runs offline, as a reader would run it, against the real framework packages."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from snapcell.conversation import FileConversationStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` afresh (module-level settings read the environment at import)."""
    spec = importlib.util.spec_from_file_location(f"snapcell_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_pydantic_ai_agent_keeps_state_between_runs() -> None:
    example = load("pydantic_ai_agent")
    assert asyncio.run(example.main()) == ["The tool says: 2", "The tool says: ['Acme', 'Initech']"]


def test_openai_agents_function_tool_keeps_state_between_runs() -> None:
    example = load("openai_agents")
    assert asyncio.run(example.main()) == ["The tool says: 505.75", "The tool says: 'A-3'"]


def test_anthropic_tool_use_loop_runs_with_the_async_client() -> None:
    example = load("anthropic_messages")
    answers = asyncio.run(example.main(example.fake_client()))
    assert answers == ["The tool says: ['Acme', 'Initech']", "The tool says: 2"]


def test_fastapi_service_shares_one_tool_across_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv("SNAPCELL_STORE", f"file://{tmp_path / 'store'}")
    example = load("fastapi_service")
    with TestClient(example.app) as client:
        first = client.post("/conversations/shop-7/turns", json={"code": "prices = {'USD': 40, 'GBP': 25}"})
        assert first.status_code == 200 and first.json()["answer"] == "(no output)"
        tool = example.app.state.tool
        second = client.post("/conversations/shop-7/turns", json={"code": "round(sum(prices.values()) * 2, 1)"})
        assert second.json() == {"conversation_id": "shop-7", "answer": "130"}
        assert example.app.state.tool is tool  # one tool for every request
        other = client.post("/conversations/shop-8/turns", json={"code": "prices"})
        assert "NameError" in other.json()["answer"]
        assert client.post("/conversations/bad%20id/turns", json={"code": "1"}).status_code == 422
        head = client.get("/conversations/shop-7").json()["checkpoint_id"]
        assert isinstance(head, str) and len(bytes.fromhex(head)) > 16
    # The heads live in the store, so a restarted service continues the conversation.
    with TestClient(load("fastapi_service").app) as client:
        again = client.post("/conversations/shop-7/turns", json={"code": "sorted(prices)"})
        assert again.json()["answer"] == "['GBP', 'USD']"


def test_conversation_loop_keeps_messages_and_state_together(tmp_path: Path) -> None:
    def run() -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "conversation_loop.py"), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    first = run()
    assert "Load the numbers. -> The answer is 8." in first and "sum? -> The answer is 31." in first
    second = run()  # a new process: the code of this run uses `numbers` and `total` from the first
    assert "mean? -> The answer is 3.875." in second
    third = run()  # truncates the last exchange, then asks again on the state before it
    assert "truncated the last exchange" in third and "mean? -> The answer is 3.875." in third
    stored = FileConversationStore(tmp_path / "conversations").load_sync("demo")
    assert stored is not None
    assert [m["content"] for m in stored.messages if m["role"] == "user"] == [
        "Load the numbers.",
        "What is their sum?",
        "And their mean?",
    ]
    assert stored.usage.runs == 4
    assert stored.usage.by_status == {"ok": 4}


def test_every_example_runs_the_models_code_sandboxed_or_says_why() -> None:
    # A reader copies an example into an application: running without the sandbox must not look like the norm.
    for path in sorted(EXAMPLES.glob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if 'isolation="inline"' in line:
                said = "#" in line or lines[number - 1].lstrip().startswith("#")
                assert said, f"{path.name}:{number + 1} runs inline without a comment saying why"
