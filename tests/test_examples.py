"""Every example in examples/ runs offline, as a reader would run it, against the real framework packages."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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
