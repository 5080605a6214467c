"""Compile a script into a code object: top-level await, trailing value, future flags, linecache."""

from __future__ import annotations

import ast
import linecache
from types import CodeType
from typing import TYPE_CHECKING

from snapcell.errors import ScriptSyntaxError

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = ["RESULT_NAME", "CompiledCell", "compile_cell", "register_source"]

# The trailing expression's value is stored here for the length of one run.
RESULT_NAME = "__snapcell_result__"

# `inspect.CO_COROUTINE` (importing inspect costs a zygote ~5% of its start-up).
_CO_COROUTINE = 0x0080
_FUTURE_MASK = 0
for _feature in ("annotations", "generator_stop", "barry_as_FLUFL"):
    import __future__

    _FUTURE_MASK |= getattr(__future__, _feature).compiler_flag


@dataclass(frozen=True, slots=True)
class CompiledCell:
    """A script ready to execute.

    Attributes:
        code: The module code object.
        is_async: True when the code uses top-level ``await`` and must be awaited.
        has_value: True when the last statement is an expression whose value is the run's value.
        future_flags: ``__future__`` compiler flags in force after this cell, to carry to the next.
        filename: The cell's unique filename (``<cell-N>``), registered in ``linecache``.
    """

    code: CodeType
    is_async: bool
    has_value: bool
    future_flags: int
    filename: str


def register_source(filename: str, source: str) -> None:
    """Make ``source`` visible to tracebacks and ``inspect`` under ``filename``."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)


def parse_cell(source: str, filename: str) -> ast.Module:
    """Parse a script, turning a syntax error into `ScriptSyntaxError`.

    Raises:
        ScriptSyntaxError: The script does not parse; nothing ran and the session is unchanged.
    """
    try:
        return ast.parse(source, filename=filename, type_comments=False)
    except SyntaxError as exc:
        raise _syntax_error(exc, source) from None
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, absurd nesting
        raise ScriptSyntaxError(
            f"the script could not be parsed: {exc}",
            exc_type=type(exc).__name__,
            exc_message=str(exc),
            hint="Rewrite the script as plain Python source.",
        ) from None


def compile_cell(tree: ast.Module, source: str, filename: str, future_flags: int) -> CompiledCell:
    """Compile a parsed (and policy-checked) script.

    A trailing expression becomes an assignment to `RESULT_NAME` so the run can return its value.

    Args:
        tree: The parsed script; it is modified in place.
        source: The script text, registered in ``linecache`` under ``filename``.
        filename: Unique cell filename such as ``<cell-3>``.
        future_flags: Flags carried from earlier cells of the session.

    Raises:
        ScriptSyntaxError: The script is not valid (``return`` outside a function, ...); nothing ran.
    """
    last = tree.body[-1] if tree.body else None
    has_value = isinstance(last, ast.Expr)
    if isinstance(last, ast.Expr):
        # Both new nodes are located here; every other node already is (no fix-up pass over the whole tree).
        target = ast.copy_location(ast.Name(id=RESULT_NAME, ctx=ast.Store()), last)
        tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
    future_flags |= _future_flags_of(tree)
    flags = future_flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        code = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        raise _syntax_error(exc, source) from None
    register_source(filename, source)
    is_async = bool(code.co_flags & _CO_COROUTINE)
    return CompiledCell(code, is_async, has_value, future_flags, filename)


def _future_flags_of(tree: ast.Module) -> int:
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__import__("__future__"), alias.name, None)
                if feature is not None:
                    flags |= feature.compiler_flag & _FUTURE_MASK
    return flags


def _syntax_error(exc: SyntaxError, source: str) -> ScriptSyntaxError:
    lineno = exc.lineno
    lines = source.splitlines()
    text = lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else (exc.text or "").rstrip("\n")
    pointer = ""
    if text and exc.offset:
        pointer = "\n    " + " " * max(exc.offset - 1, 0) + "^"
    where = f"line {lineno}" if lineno else "the script"
    rendered = f"SyntaxError: {exc.msg} ({where})"
    if text:
        rendered += f"\n    {text.strip() if not exc.offset else text}{pointer}"
    return ScriptSyntaxError(
        f"syntax error at {where}: {exc.msg}",
        exc_type="SyntaxError",
        exc_message=exc.msg,
        traceback_text=rendered,
        lineno=lineno,
        hint="Nothing ran; fix the syntax and run the script again.",
    )
