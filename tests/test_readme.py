"""The documentation works: README.md and every docs/*.md page.

Every ```python block runs, unless the HTML comment on the line above marks it: `<!-- fragment -->` is not run (a
piece of a program, or one that needs a server), `<!-- docs-test: anthropic -->` runs against a fake Anthropic API.
A runnable block runs as a program in a fresh directory and must print something. Links inside the repository
(there and in ARCHITECTURE.md) resolve, to a heading where they name one, and every page is in the site's nav
(mkdocs.yml).
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.test_examples import load

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINKED = [*PAGES, ROOT / "ARCHITECTURE.md"]  # pages whose links must resolve
# A block, and the line above its opening fence (an HTML comment marks fragments and blocks that need a fake).
_BLOCK = re.compile(r"(?:^(?P<mark><!--[^\n]*-->)\n)?^```python\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
_FENCE = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
FRAGMENT = "<!-- fragment -->"
ANTHROPIC = "<!-- docs-test: anthropic -->"


class Block(NamedTuple):
    page: Path
    line: int
    mark: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(pages: list[Path] = PAGES) -> list[Block]:
    found = []
    for page in pages:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            found.append(Block(page, text[: m.start("code")].count("\n") + 1, m.group("mark"), m.group("code")))
    return found


def test_every_python_block_is_run_or_marked() -> None:
    found = blocks()
    assert len([b for b in found if b.page.name == "README.md"]) >= 2
    assert len([b for b in found if b.mark is None]) >= 10, "most of the documentation's code should run"
    for block in found:
        assert block.mark in (None, FRAGMENT, ANTHROPIC), f"{block}: unknown marker {block.mark!r}"


@pytest.mark.parametrize("block", [b for b in blocks() if b.mark is None], ids=str)
def test_block_runs(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # blocks keep their store in ./.snapcell
    exec(compile(block.code, str(block), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), "a runnable block should show what it did"


def test_anthropic_block_runs_with_a_fake_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (block,) = [b for b in blocks() if b.mark == ANTHROPIC]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "offline")
    namespace: dict[str, Any] = {"__name__": "docs_block"}  # defines everything; main() runs below, against the fake
    exec(compile(block.code, str(block), "exec"), namespace)
    namespace["client"] = load("anthropic_messages").fake_client()
    asyncio.run(namespace["main"]())
    assert capsys.readouterr().out.strip() == "The tool says: ['Acme']"


def _prose(text: str) -> str:
    """The page without its fenced code blocks, which may hold anything that looks like a link or a heading."""
    return _FENCE.sub("", text)


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as Python-Markdown's toc (and GitHub, for these headings) makes them."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(page.read_text()), re.MULTILINE):
        text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
        anchors.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower()))
    return anchors


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(page: Path) -> None:
    text = page.read_text()
    for link in _LINK.findall(_prose(text)):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{page.name} links to {link}, which is not in the repository"
        assert ROOT in target.parents, f"{page.name} links to {link}, outside the repository"
        if page.parent == DOCS:
            assert target.parent == DOCS or DOCS in target.parents, f"{page.name} links to {link}, outside docs/"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name} links to {link}, a heading {target.name} does not have"
    assert "shared notes" not in text and "DESIGN.md" not in text


def test_readme_is_a_short_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    local = {link.partition("#")[0] for link in _LINK.findall(_prose(text))}
    assert {"ARCHITECTURE.md", "CHANGELOG.md", "LICENSE", "examples/anthropic_messages.py"} <= local
    assert {f"docs/{page.name}" for page in DOCS.glob("*.md")} <= local, "the README links every page"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's loader, without running its `!!python/name:` tags (they name a function; None will do here)."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _nav_pages(item: object) -> list[str]:
    if isinstance(item, str):
        return [item]
    if isinstance(item, dict):
        return [page for value in item.values() for page in _nav_pages(value)]
    if isinstance(item, list):
        return [page for value in item for page in _nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_once() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == sorted(page.name for page in DOCS.glob("*.md"))
    assert len(nav) == len(set(nav))


def test_licence_metadata_is_an_spdx_expression() -> None:
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    metadata = importlib.metadata.metadata("snapcell")
    assert metadata["License-Expression"] == "MIT", "reinstall: the installed metadata predates the SPDX licence"
    assert "CHANGELOG.md" in (ROOT / "README.md").read_text() and (ROOT / "CHANGELOG.md").exists()
