"""The README's Python code runs: every ```python block, unless the comment line above it marks it a fragment."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.test_examples import load

ROOT = Path(__file__).resolve().parents[1]
# A block, and the line above its opening fence (an HTML comment marks fragments and blocks that need a fake).
_BLOCK = re.compile(r"(?:^(?P<mark><!--[^\n]*-->)\n)?^```python\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
FRAGMENT = "<!-- fragment -->"
ANTHROPIC = "<!-- readme-test: anthropic -->"


def blocks() -> list[tuple[int, str | None, str]]:
    text = (ROOT / "README.md").read_text()
    return [(text[: m.start("code")].count("\n") + 1, m.group("mark"), m.group("code")) for m in _BLOCK.finditer(text)]


def test_every_python_block_is_run_or_marked() -> None:
    found = blocks()
    assert len(found) >= 2
    for line, mark, _ in found:
        assert mark in (None, FRAGMENT, ANTHROPIC), f"README.md:{line}: unknown marker {mark!r}"


@pytest.mark.parametrize(("line", "mark", "code"), [b for b in blocks() if b[1] is None], ids=lambda v: str(v))
def test_readme_block_runs(
    line: int, mark: str | None, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)  # blocks keep their store in ./.snapcell
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), "a runnable block should show what it did"


def test_readme_anthropic_block_runs_with_a_fake_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (line, _, code), *_ = [b for b in blocks() if b[1] == ANTHROPIC]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "offline")
    namespace = {"__name__": "readme_block"}  # defines everything; main() runs below, against the fake
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
    namespace["client"] = load("anthropic_messages").fake_client()
    asyncio.run(namespace["main"]())  # type: ignore[operator]
    assert capsys.readouterr().out.strip() == "The tool says: ['Acme']"


def test_links_stay_inside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert {"ARCHITECTURE.md", "examples/anthropic_messages.py"} <= set(local)
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which is not in the repository"
    assert "shared notes" not in text and "DESIGN.md" not in text


def test_licence_metadata_is_an_spdx_expression() -> None:
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    metadata = importlib.metadata.metadata("snapcell")
    assert metadata["License-Expression"] == "MIT", "reinstall: the installed metadata predates the SPDX licence"
    assert "CHANGELOG.md" in (ROOT / "README.md").read_text() and (ROOT / "CHANGELOG.md").exists()
