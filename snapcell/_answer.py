"""The text a model reads from the `run_code` tool: answers cut to a length, host signatures, tool-call arguments."""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from snapcell.errors import ConfigError
from snapcell.runner import RunResult
from snapcell.storage import TurnRecord

__all__ = [
    "MIN_ANSWER_CHARS",
    "cut_answer",
    "render_answer",
    "replayed",
    "stub_signatures",
    "tool_signatures",
    "tool_call_arguments",
]

MIN_ANSWER_CHARS = 200


def cut_answer(text: str, max_chars: int) -> str:
    """Cut ``text`` to at most ``max_chars`` characters, keeping the end and saying how much was cut.

    Raises:
        ConfigError: ``max_chars`` is below `MIN_ANSWER_CHARS`, too small to say what was cut.
    """
    if not isinstance(max_chars, int) or max_chars < MIN_ANSWER_CHARS:
        raise ConfigError(f"max_chars must be an integer >= {MIN_ANSWER_CHARS}, not {max_chars!r}")
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    while True:
        marker = f"[... {cut} characters cut from the start of this answer ...]\n"
        keep = max_chars - len(marker)
        if len(text) - keep == cut:
            return marker + text[len(text) - keep :]
        cut = len(text) - keep


def render_answer(result: RunResult, notes: Iterable[str] = (), *, max_chars: int = 8000) -> str:
    """Render a run for a model: stdout, stderr, the value's repr, the error, then notes, cut to ``max_chars``.

    Args:
        result: What the run did.
        notes: Notes of the tool (state expired, restart) shown before the run's own notes.
        max_chars: Longest answer; longer ones keep their end (errors and notes) and say what was cut.
    """
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.value_repr is not None and result.value_repr != "None":  # like Python's own prompt
        parts.append(result.value_repr)
    if result.error is not None:
        parts.append(result.error.for_model())
    if result.files:
        shown = ", ".join(f"{f.path} ({f.media_type}, {f.size_bytes:,} bytes)" for f in result.files[:20])
        more = f" and {len(result.files) - 20} more" if len(result.files) > 20 else ""
        parts.append(f"[files] {shown}{more}")
    parts.extend(f"[note] {note}" for note in (*notes, *result.notes))
    memory = _memory_note(result)
    if memory:
        parts.append(f"[note] {memory}")
    return cut_answer("\n".join(parts) if parts else "(no output)", max_chars)


# Tell the model about memory once the namespace is big enough to matter, so it can free some before it runs out.
_MEMORY_NOTE_BYTES = 256 * 1024 * 1024


def _memory_note(result: RunResult) -> str:
    big_namespace = "largest:" in result.namespace_summary
    big_process = result.memory_bytes is not None and result.memory_bytes >= _MEMORY_NOTE_BYTES
    if not (big_namespace or big_process):
        return ""
    used = f"the session uses {result.memory_bytes / 2**20:,.0f} MiB; " if result.memory_bytes else ""
    return f"{used}{result.namespace_summary}"


def stub_signatures(stubs: str) -> list[str]:
    """``def name(args) -> ret`` (and the docstring's first line) of every top-level function or class in stubs."""
    try:
        tree = ast.parse(stubs)
    except SyntaxError as exc:
        raise ConfigError(f"the stubs are not valid Python: {exc}") from exc
    lines = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            node.decorator_list = []
            node.body = [ast.Expr(ast.Constant(...))]
            signature = ast.unparse(node).splitlines()[0].removesuffix(":")
            lines.append(signature + (f"\n    {doc[0]}" if doc else ""))
    return lines


def replayed(turn: TurnRecord) -> str:
    """The answer of a retried turn that was already committed: the kept answer, or a note that it ran."""
    if turn.answer is not None:
        return turn.answer
    return (
        f"[note] this turn (turn ID {turn.turn_id!r}) already ran and its result was saved; it was not run again, "
        "and its answer is no longer kept"
    )


def tool_signatures(tools: Mapping[str, Callable[..., Any]]) -> list[str]:
    lines = []
    for name, func in tools.items():
        try:
            signature = str(inspect.signature(func, eval_str=True))
        except Exception:  # evaluating the host's own annotations may raise anything; fall back to their text
            try:
                signature = str(inspect.signature(func))
            except (TypeError, ValueError):
                signature = "(...)"
        prefix = "async def" if inspect.iscoroutinefunction(func) else "def"
        doc = (inspect.getdoc(func) or "").strip().splitlines()
        lines.append(f"{prefix} {name}{signature}" + (f"\n    {doc[0]}" if doc else ""))
    return lines


def tool_call_arguments(arguments: str | Mapping[str, Any]) -> tuple[str, bool]:
    """Parse a model's tool-call arguments (JSON text or a dict) into ``(code, setup)``.

    ``setup`` may be a JSON boolean or the text ``"true"``/``"false"`` (some models quote booleans); it defaults
    to false.

    Raises:
        ConfigError: The arguments are not an object with a string ``code``, or ``setup`` is not a boolean.
    """
    try:
        data = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"run_code arguments are not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("code"), str):
        raise ConfigError("run_code arguments must be a JSON object with a string 'code'")
    setup = data.get("setup", False)
    if isinstance(setup, str) and setup.strip().lower() in ("true", "false"):
        setup = setup.strip().lower() == "true"
    if not isinstance(setup, bool):
        raise ConfigError(f"run_code argument 'setup' must be true or false, not {setup!r}")
    return data["code"], setup
