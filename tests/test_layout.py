"""Imports run one way: storage knows nothing of pool, session, tool or cli; nothing below cli imports it; no circles.

Every import counts, also those inside functions: a lazy import still ties the modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "snapcell"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_storage_imports_only_storage_errors_and_telemetry() -> None:
    for name, imported in _graph().items():
        if name.startswith("snapcell.storage"):
            outside = {
                m for m in imported if not m.startswith(("snapcell.storage", "snapcell.errors", "snapcell._support"))
            }
            assert outside <= {"snapcell.telemetry"}, f"{name} imports {sorted(outside)}"


def test_nothing_below_the_cli_imports_it() -> None:
    for name, imported in _graph().items():
        if name.startswith("snapcell.cli") or name == "snapcell.__main__":  # the entry points
            continue
        assert not {m for m in imported if m.startswith("snapcell.cli")}, f"{name} imports the CLI"


def test_no_import_circles_inside_storage() -> None:
    graph = {n: {m for m in deps if m.startswith("snapcell.storage.")} for n, deps in _graph().items()}
    graph = {n: deps for n, deps in graph.items() if n.startswith("snapcell.storage.")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(n for n in graph if reaches(n, n, {n}))
    assert not circles, f"modules on an import circle: {circles}"
