"""The top-level ``def``/``class``/``import`` statements of a session's cells, kept to re-create definitions.

A function or class travels in a checkpoint as bytecode, which another Python minor version (or a narrower policy,
or a serializer failure) may not restore. Its source does not have that problem: the checkpoint keeps the latest
top-level statement that bound each such name, and a load that cannot restore the name runs that statement again.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Collection, Iterable, Mapping

__all__ = ["Definitions", "bound_names", "cell_bindings", "setup_cells_assigning"]

# Most statements kept, newest first; a session defining more keeps the latest ones.
_MAX_KEPT = 500
_MAX_SOURCE_CHARS = 200_000


def bound_names(node: ast.stmt) -> set[str]:
    """The names a top-level def, class or import statement binds (empty for any other statement)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom):
        return {alias.asname or alias.name for alias in node.names if alias.name != "*"}
    return set()


def _segment(source: str, node: ast.stmt) -> str | None:
    lines = source.splitlines(keepends=True)
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    last = node.end_lineno or node.lineno
    text = "".join(lines[first - 1 : last])
    return text if len(text) <= _MAX_SOURCE_CHARS else None


class Definitions:
    """Name to the source of the latest top-level statement that defined it, in definition order."""

    def __init__(self, sources: Iterable[str] = ()) -> None:
        self._by_name: dict[str, str] = {}
        # A checkpoint's statements, parsed only when a name is looked up or a new definition is added: a load
        # whose definitions all restored, and the dump after it, need not parse them (51 parses: 2.5 ms a load).
        self._unparsed: list[str] | None = list(sources)

    def _parsed(self) -> dict[str, str]:
        if self._unparsed is not None:
            unparsed, self._unparsed = self._unparsed, None
            for source in unparsed:
                self._add(source, None)
        return self._by_name

    def record(self, code: str, namespace: Mapping[str, object]) -> None:
        """Keep the def/class/import statements of a cell that ran, for the names they bound that still exist."""
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return
        for node in tree.body:
            if bound_names(node):
                text = _segment(code, node)
                if text is not None:
                    self._add(text, namespace)

    def _add(self, text: str, namespace: Mapping[str, object] | None) -> None:
        if namespace is not None:
            self._parsed()
        try:
            (node,) = ast.parse(text).body
        except (SyntaxError, ValueError):
            return
        for name in bound_names(node):
            if namespace is not None and not isinstance(
                namespace.get(name), types.FunctionType | type | types.ModuleType
            ):
                continue  # not reached, or rebound since: not a definition to re-create
            self._by_name.pop(name, None)  # moved to the end: later definitions may use earlier ones
            self._by_name[name] = text
        while len(self._by_name) > _MAX_KEPT:
            del self._by_name[next(iter(self._by_name))]

    def sources(self) -> list[str]:
        """The kept statements, once each, oldest first."""
        if self._unparsed is not None:
            # A dump's own list, as it was kept: once each and oldest first already.
            return list(dict.fromkeys(self._unparsed))[-_MAX_KEPT:]
        return list(dict.fromkeys(self._by_name.values()))

    def for_names(self, names: Collection[str]) -> tuple[list[str], list[str]]:
        """The statements that define any of ``names`` (in order), and the names they cover."""
        if not names:
            return [], []
        by_name = self._parsed()
        chosen = [text for name, text in by_name.items() if name in names]
        covered = [name for name in by_name if name in names]
        return list(dict.fromkeys(chosen)), covered

    def recreatable(self, dropped: Iterable[tuple[str, str]]) -> list[str]:
        """The names of ``dropped`` (name, type name) whose value a kept statement re-creates, in order.

        A dump drops a function or class whose value the checkpoint rule refuses (a ``contextlib.contextmanager``
        wrapper refers to a private class) although its source is kept: running that source again re-creates it.
        Only a value of the kind its statement makes counts (a def makes a function); a name rebound since to
        another kind of value keeps its drop.
        """
        wanted = {name: type_name for name, type_name in dropped}
        if not wanted:
            return []
        nodes = {name: ast.parse(text).body[0] for name, text in self._parsed().items()}
        # A value later statements changed through a decorator (``@show.register``) would come back without those
        # changes, and only the latest statement per name is kept: it stays dropped, and named as gone.
        registered = {_root(decorator) for node in nodes.values() for decorator in getattr(node, "decorator_list", [])}
        chosen = []
        for name, node in nodes.items():
            type_name = wanted.get(name)
            if type_name is None or name in registered:
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                fits = type_name == "function"
            else:
                # an instance of the class itself (``Box = Box()``) is not the class either
                fits = isinstance(node, ast.ClassDef) and type_name not in _NOT_CLASSES and type_name != name
            if fits:
                chosen.append(name)
        return chosen


def _root(decorator: ast.expr) -> str | None:
    """``show`` for ``@show.register`` or ``@show.register(int)``; None for a plain name or anything else."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not isinstance(node, ast.Attribute):
        return None
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# Type names of values a class statement does not make (what a rebound class name may hold and a dump drops).
_NOT_CLASSES = frozenset(
    {"function", "generator", "coroutine", "async_generator", "module", "builtin_function_or_method"}
)


def setup_cells_assigning(names: set[str], setup_cells: list[str]) -> list[str]:
    """The setup cells that bind any of ``names`` at top level, in order."""
    if not names:
        return []
    return [source for source in setup_cells if cell_bindings(source) & names]


def cell_bindings(source: str) -> set[str]:
    """The names a cell binds: assignment targets anywhere, and its top-level def, class and import statements."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return (
        {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
        | {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        | {
            (alias.asname or alias.name).split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
    )
