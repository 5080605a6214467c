"""The folders show the trust boundary, and imports run one way.

- No import circle anywhere in the package.
- `snapcell.worker` (code that runs only inside a worker) and `snapcell.backends` (the host's side of a session)
  never import each other: they share `wire`, `interpreter`, `policy` and `limits`.
- Outside a package only its face (its ``__init__``) is imported, never one of its ``_private`` modules.
- `snapcell.storage` imports nothing of snapcell but `errors` and `_support`; `snapcell.heads` and
  `snapcell.conversation` build on it; only `snapcell.ops` combines stores, heads and checkpoints; nothing below
  the command line imports it.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import still ties the modules
together. The checks run on any tree (`graph_of`), so the tests below also show each rule failing on a small tree
that breaks it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "snapcell"


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph_of(root: Path) -> dict[str, set[str]]:
    """Every module of the package at ``root`` and the package's modules it imports, by dotted name."""
    modules = {_module_name(root, p): p for p in root.rglob("*.py")}
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


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def crossings(graph: dict[str, set[str]], side: str, other: str) -> list[str]:
    """Imports from package ``side`` into package ``other``."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _inside(name, side)
        for target in targets
        if _inside(target, other)
    )


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another package's ``_private`` module: outside a package only its face may be imported."""
    found = []
    for name, targets in graph.items():
        for target in targets:
            owner, _, last = target.rpartition(".")
            if last.startswith("_") and not last.startswith("__") and not _inside(name, owner):
                found.append(f"{name} -> {target}")
    return sorted(found)


def outside(graph: dict[str, set[str]], package: str, allowed: Iterable[str]) -> list[str]:
    """Imports by ``package`` of snapcell modules that are neither in it nor in ``allowed``."""
    root = package.split(".")[0]
    allowed = (package, *allowed)
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _inside(name, package)
        for target in targets
        if _inside(target, root) and target != root and not any(_inside(target, a) for a in allowed)
    )


def test_no_import_circles_anywhere() -> None:
    assert circles(graph_of(PACKAGE)) == []


def test_the_worker_and_the_hosts_backends_never_import_each_other() -> None:
    graph = graph_of(PACKAGE)
    assert crossings(graph, "snapcell.worker", "snapcell.backends") == []
    assert crossings(graph, "snapcell.backends", "snapcell.worker") == []


def test_outside_a_package_only_its_face_is_imported() -> None:
    assert private_imports(graph_of(PACKAGE)) == []


def test_storage_imports_only_errors_and_support() -> None:
    assert outside(graph_of(PACKAGE), "snapcell.storage", ["snapcell.errors", "snapcell._support"]) == []


def test_heads_and_conversations_build_on_storage_alone() -> None:
    graph = graph_of(PACKAGE)
    base = ["snapcell.errors", "snapcell._support", "snapcell.storage", "snapcell.telemetry"]
    assert outside(graph, "snapcell.heads", base) == []
    assert outside(graph, "snapcell.conversation", [*base, "snapcell.heads"]) == []


def test_only_ops_combines_stores_heads_and_checkpoints() -> None:
    graph = graph_of(PACKAGE)
    for name, targets in graph.items():
        if _inside(name, "snapcell.ops") or _inside(name, "snapcell.cli") or name == "snapcell":
            continue
        assert not {t for t in targets if _inside(t, "snapcell.ops")}, f"{name} imports the operator jobs"


def test_nothing_below_the_cli_imports_it() -> None:
    for name, imported in graph_of(PACKAGE).items():
        if _inside(name, "snapcell.cli") or name == "snapcell.__main__":  # the entry points
            continue
        assert not {m for m in imported if _inside(m, "snapcell.cli")}, f"{name} imports the CLI"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "snapcell" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "snapcell"


def test_each_rule_fails_on_a_tree_that_breaks_it(tmp_path: Path) -> None:
    """The checks are not vacuous: a circle hidden in a function, a worker importing a backend, a private import."""
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "worker/__init__.py": "",
            "worker/_serve.py": "def serve():\n    from snapcell.backends import _pool\n",
            "backends/__init__.py": "",
            "backends/_pool.py": "import typing\nif typing.TYPE_CHECKING:\n    from snapcell.wire import x\n",
            "wire/__init__.py": "from snapcell.wire.x import y\n",
            "wire/x.py": "def f():\n    import snapcell.backends._pool\n",
            "storage/__init__.py": "from snapcell import tool\n",
            "tool.py": "",
        },
    )
    graph = graph_of(package)
    assert circles(graph) == [["snapcell.backends._pool", "snapcell.wire", "snapcell.wire.x"]]
    assert "snapcell.worker._serve -> snapcell.backends._pool" in crossings(
        graph, "snapcell.worker", "snapcell.backends"
    )
    assert "snapcell.wire.x -> snapcell.backends._pool" in private_imports(graph)
    assert outside(graph, "snapcell.storage", ["snapcell.errors"]) == ["snapcell.storage -> snapcell.tool"]
