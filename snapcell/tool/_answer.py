"""The text a model reads from the `run_code` tool: answers cut to a length, host signatures."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from snapcell._support import duration, is_async_callable
from snapcell.checkpoint import Manifest
from snapcell.errors import ConfigError, ScriptError, TimeLimitExceeded, WorkerLost
from snapcell.heads import TurnRecord
from snapcell.interpreter import DROPPED_PREFIX, Artifact, HostCall, PausedCall, RunResult, dropped_note
from snapcell.policy import DEFAULT_MODULES, Policy, with_file_access
from snapcell.wire import MAX_ASSIGNED, MAX_ASSIGNED_CHARS

__all__ = [
    "MIN_ANSWER_CHARS",
    "lost_note",
    "modules_text",
    "cut_answer",
    "pause_ttl_note",
    "paused_text",
    "pausing_text",
    "dropped_in_turn",
    "failed_host_call",
    "host_text",
    "render_answer",
    "without_dropped_notes",
    "replayed",
    "stub_signatures",
    "tool_signatures",
    "TurnAnswer",
]

MIN_ANSWER_CHARS = 200


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TurnAnswer:
    """A turn's answer with what a client shows beside the text: whether it failed, and the files it wrote.

    Attributes:
        text: The answer the model reads, as `CodeTool.run_code` returns it.
        result: The run, or None when the turn ID was committed already and the code did not run again (``text``
            is the committed answer).
        saved: Whether the turn's state was saved (the head moved to it, or moved earlier for a committed turn ID);
            False when the worker was lost or the workspace went over its quota.
    """

    text: str
    result: RunResult | None = None
    saved: bool = True

    @property
    def failed(self) -> bool:
        """Whether the turn went wrong: the script failed, was refused or stopped, or its state was not saved."""
        return not self.saved or (self.result is not None and self.result.status != "ok")

    @property
    def files(self) -> tuple[Artifact, ...]:
        """The files the run wrote under ``out/`` (process mode), with their bytes up to ``max_artifact_bytes``."""
        return self.result.files if self.result is not None else ()


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
        # The part cut here may hold the markers of earlier cuts (output kept by its tail, a long value cut in
        # the middle): the count covers what they dropped too, so it says how much of the original is missing.
        dropped = cut + _earlier_cuts(text[:cut])
        marker = f"[... {dropped} characters cut from the start of this answer ...]\n"
        keep = max_chars - len(marker)
        if len(text) - keep == cut:
            return marker + text[len(text) - keep :]
        cut = len(text) - keep


# Markers of the cuts made before the answer is put together: the output's (`TailBuffer`), a value's (`_render`).
_EARLIER_CUT = re.compile(
    r"\[\.\.\. (\d+) (?:earlier characters of output were )?dropped \.\.\.\]\n|\.\.\.\[(\d+) characters cut\]\.\.\."
)


def _earlier_cuts(text: str) -> int:
    """Characters that cuts marked in ``text`` dropped, less the markers' own length (counted as cut already)."""
    extra = 0
    for match in _EARLIER_CUT.finditer(text):
        extra += int(match.group(1) or match.group(2)) - len(match.group(0))
    return extra


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
    run_notes = result.notes
    if result.error is not None:
        failed = failed_host_call(result)
        if failed is not None:
            parts.append(f"the host function {failed.name} failed: {failed.error}")
        parts.append(result.error.for_model())
        if failed is not None:
            parts.append(
                "This error came from the application's host function, not from a mistake in the code; retry once "
                "if it looks temporary, otherwise tell the user what failed."
            )
        if isinstance(result.error, TimeLimitExceeded):  # the error says it already
            run_notes = tuple(note for note in run_notes if not note.startswith("stopped after "))
    if result.paused is not None:
        parts.append(paused_text(result.paused))
    if result.files:
        # Paths are checked on the host already (no control characters); escaping what is shown is the last line.
        shown = ", ".join(f"{_inert(f.path)} ({f.media_type}, {f.size_bytes:,} bytes)" for f in result.files[:20])
        more = f" and {len(result.files) - 20} more" if len(result.files) > 20 else ""
        parts.append(f"[files] {shown}{more}")
    parts.extend(f"[note] {note}" for note in (*notes, *run_notes))
    memory = _memory_note(result)
    if memory:
        parts.append(f"[note] {memory}")
    return cut_answer("\n".join(parts) if parts else "(no output)", max_chars)


def pause_ttl_note(ttl_s: float) -> str:
    """The note of a turn that paused: how long the pause may last."""
    return (
        f"the paused state is kept for {duration(ttl_s)} (the checkpoint's ttl); an answer after that finds it "
        "expired and the script does not continue"
    )


def paused_text(call: PausedCall) -> str:
    """What the model reads of a run that paused: the call it waits at, and that the script goes on from there."""
    shown = [repr(a) for a in call.args] + [f"{k}={v!r}" for k, v in call.kwargs.items()]
    text = _inert(f"{call.name}({', '.join(shown)})")
    if len(text) > 500:
        text = text[:497] + "..."
    return (
        f"[paused] the script is waiting at {text} for an answer from the application (a person may take hours). "
        "When it comes, the script continues from that call, which returns the answer; the next answer shows the "
        "script's whole output. Nothing after the call has run yet."
    )


def _inert(text: str) -> str:
    """``text`` with every character that is not printable escaped (``\\n``, ``\\x1b``): it cannot start a line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def failed_host_call(result: RunResult) -> HostCall | None:
    """The host-function call whose exception ended the run, if the error is that exception passed through."""
    error = result.error
    if not isinstance(error, ScriptError) or not error.exc_type:
        return None
    texts = (f"{error.exc_type}: {error.exc_message}", error.exc_message)
    for call in reversed(result.external_calls):
        if call.error is None or "is not available in this run" in call.error:
            continue  # a name the run does not have is the script's mistake
        if any(text and call.error.startswith(text) for text in texts):
            return call
    return None


# Tell the model about memory once the namespace is big enough to matter, so it can free some before it runs out.
_MEMORY_NOTE_BYTES = 256 * 1024 * 1024


def _memory_note(result: RunResult) -> str:
    big_namespace = "largest:" in result.namespace_summary
    big_process = result.memory_bytes is not None and result.memory_bytes >= _MEMORY_NOTE_BYTES
    if not (big_namespace or big_process):
        return ""
    used = f"the session uses {result.memory_bytes / 2**20:,.0f} MiB; " if result.memory_bytes else ""
    return f"{used}{result.namespace_summary}"


def dropped_in_turn(manifest: Manifest | None, before: Collection[str], result: RunResult) -> str | None:
    """The note naming what this turn's dump did not save and the turn's answer has not said yet (None: nothing).

    A variable the checkpoint this turn started from had dropped already (it is still alive in a warm session) is
    named again only when the run assigned it a new value.

    Args:
        manifest: The manifest of this turn's dump.
        before: Names the checkpoint this turn started from had dropped.
        result: The turn's run (for the names it assigned).
    """
    if manifest is None or not manifest.dropped:
        return None
    assigned = set(result.assigned)
    unknown = len(result.assigned) >= MAX_ASSIGNED  # the list was cut: any name may have been assigned
    new = [
        d
        for d in manifest.dropped
        if d.name not in before or unknown or d.name in assigned or d.name[:MAX_ASSIGNED_CHARS] in assigned
    ]
    return (dropped_note(new, manifest.definitions, manifest.setup_cells) or None) if new else None


def without_dropped_notes(result: RunResult) -> RunResult:
    """``result`` without the run's notes on what an earlier dump dropped: the answer of that dump's turn said it."""
    notes = tuple(note for note in result.notes if not note.startswith(DROPPED_PREFIX))
    return result if notes == result.notes else dataclasses.replace(result, notes=notes)


def stub_signatures(stubs: str) -> list[str]:
    """``def name(args) -> ret`` (and the docstring's first line) of every top-level function or class in stubs.

    A class also shows its fields (``name: type``, the keys of a TypedDict) and its public methods' signatures, so
    the model learns the shape of what the host functions take and return.
    """
    try:
        tree = ast.parse(stubs)
    except SyntaxError as exc:
        raise ConfigError(f"the stubs are not valid Python: {exc}") from exc
    lines = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            members = _class_members(node) if isinstance(node, ast.ClassDef) else []
            lines.append(_signature_line(node) + (f"\n    {doc[0]}" if doc else "") + "".join(members))
    return lines


def host_text(signatures: list[str]) -> str:
    """The description's part on the host functions, then the types their signatures use (stub classes)."""
    functions = [line for line in signatures if not line.startswith("class ")]
    types = [line for line in signatures if line.startswith("class ")]
    text = "\n\nHost functions (already defined; call them directly):\n" + "\n".join(functions) if functions else ""
    if types:
        text += "\n\nTypes in their signatures (for reference, not defined in the session):\n" + "\n".join(types)
    return text


def pausing_text(names: Collection[str]) -> str:
    """The description's part on the host functions that pause a script (empty without any)."""
    if not names:
        return ""
    listed = ", ".join(f"{name}()" for name in sorted(names))
    return (
        f"\n\nPausing host functions: {listed}. A call of one pauses the script until the application answers "
        "(a person may take hours): the answer ends there and says what the script waits for; once answered, the "
        "script continues from that call, which returns the answer, and the next answer shows the whole output. "
        "Code before the call runs again on resume with the same host results, so keep it free of side effects "
        "other than host calls."
    )


def _signature_line(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    node.decorator_list = []
    node.body = [ast.Expr(ast.Constant(...))]
    return ast.unparse(node).splitlines()[0].removesuffix(":")


def _class_members(node: ast.ClassDef) -> list[str]:
    """A stub class's fields and public methods, one indented line each (a class body is never unparsed whole)."""
    members = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.append(f"\n    {ast.unparse(item)}")
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_"):
            members.append(f"\n    {_signature_line(item)}")
    return members


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
        prefix = "async def" if is_async_callable(func) else "def"
        doc = (inspect.getdoc(func) or "").strip().splitlines()
        lines.append(f"{prefix} {name}{signature}" + (f"\n    {doc[0]}" if doc else ""))
    return lines


def modules_text(policy: Policy, *, file_access: bool = False) -> str:
    """What scripts can import, in a sentence for the model: the modules the policy allows that are installed.

    Args:
        policy: The pool's policy.
        file_access: The sessions have a workspace (process mode): their runner's policy adds the file modules.
    """
    if not policy.restricted:
        return "Any installed module can be imported."
    # The standard-library modules of the default list and the file modules a workspace adds: known to hold no way
    # onto the network. Modules a policy adds are listed first, whatever they are.
    known = DEFAULT_MODULES
    if file_access:
        effective = with_file_access(policy)
        known = known | (effective.allowed_modules - policy.allowed_modules)
        policy = effective
    importable = {name for name in policy.modules - {"__future__"} if _installed(name)}
    standard = importable & policy.allowed_modules & known
    listed = ", ".join(sorted(importable - standard))
    if standard:
        listed += ("; and " if listed else "") + "from the standard library: " + ", ".join(sorted(standard))
    network = "" if policy.modules - known else " and there is no network access"
    return f"Modules that can be imported (with their submodules): {listed}. Other imports fail{network}."


def _installed(name: str) -> bool:
    """Whether the module ``name`` can be found (a top-level name: nothing is imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


_LOST_REASONS = {
    "timeout": "it ran past the time limit and could not be stopped",
    "memory": "it ran out of memory",
    "signal": "it was killed",
    "crash": "it crashed",
}


def lost_note(exc: WorkerLost) -> str:
    """The model's note for a lost worker: short, and without the application's configuration names."""
    why = _LOST_REASONS.get(exc.reason, "it stopped")
    return (
        f"the Python session restarted because {why}; this code's changes are lost and the variables are as they "
        "were before it ran; do not rerun it unchanged"
    )
