"""The ready-made agent tool: ``run_code(conversation_id, code)`` with one head per conversation.

`CodeTool` keeps each conversation's current checkpoint ID in a head store, runs one turn at a time per
conversation (an asyncio lock in this process, a lease in the head store across processes and servers), and turns
each run into the text a model should read. `SyncCodeTool` is its synchronous twin over a `Pool`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import logging
import os
import random
import re
import secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from snapcell._telemetry import conversation_context
from snapcell.errors import (
    CheckpointExpired,
    CheckpointNotFound,
    ConfigError,
    Conflict,
    ScriptError,
    SnapcellError,
    StorageError,
    TimeLimitExceeded,
    WorkerLost,
)
from snapcell.pool import AsyncPool, Pool
from snapcell.runner import DEFAULT_MODULES, HostCall, Limits, Policy, RunResult
from snapcell.runner._host import validate_lookup
from snapcell.storage import AsyncHeads, Head, HeadStore, default_heads, validate_conversation_id

__all__ = [
    "MIN_ANSWER_CHARS",
    "STATE_GONE_NOTE",
    "CodeTool",
    "SyncCodeTool",
    "cut_answer",
    "render_answer",
    "tool_call_arguments",
]

STATE_GONE_NOTE = (
    "the earlier state of this conversation is gone (its checkpoint expired or was deleted); this code ran in a "
    "fresh, empty session, so variables, functions and imports from earlier turns must be recreated"
)
MIN_ANSWER_CHARS = 200
log = logging.getLogger("snapcell")
_POLL_MIN_S = 0.01
_POLL_MAX_S = 0.25

_DESCRIPTION = """\
Run Python code in a persistent session that belongs to this conversation. Variables, functions, classes and \
imports defined in one call are still there in later calls (even days later), so keep intermediate data in \
variables rather than printing all of it. The answer shows what the code printed, then the value of its last \
expression (as in a notebook cell), then any error with its traceback, then notes about the session. Top-level \
`await` works, so `await asyncio.gather(...)` runs host functions concurrently. Long answers are cut from the \
start, so print only what you need to see."""


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
    r"\[\.\.\. (\d+) earlier characters of output were dropped \.\.\.\]\n|\.\.\.\[(\d+) characters cut\]\.\.\."
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
        failed = _failed_host_call(result)
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
    parts.extend(f"[note] {note}" for note in (*notes, *run_notes))
    memory = _memory_note(result)
    if memory:
        parts.append(f"[note] {memory}")
    return cut_answer("\n".join(parts) if parts else "(no output)", max_chars)


def _failed_host_call(result: RunResult) -> HostCall | None:
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


def _modules_text(policy: Policy) -> str:
    """What the policy lets scripts import, in a sentence for the model."""
    if not policy.restricted:
        return "Any installed module can be imported."
    standard = policy.allowed_modules & DEFAULT_MODULES - {"__future__"}
    others = sorted(policy.modules - standard - {"__future__"})
    listed = ", ".join(others)
    if standard:
        listed += ("; and " if others else "") + "from the standard library: " + ", ".join(sorted(standard))
    # Only the standard-library modules of the default list are known to hold no way onto the network.
    offline = "" if policy.modules - DEFAULT_MODULES else " and there is no network access"
    return (
        f"Modules that can be imported (with their submodules): {listed}. Other imports fail; open() is not "
        f"available{offline}."
    )


_LOST_REASONS = {
    "timeout": "it ran past the time limit and could not be stopped",
    "memory": "it ran out of memory",
    "signal": "it was killed",
    "crash": "it crashed",
}


def _lost_note(exc: WorkerLost) -> str:
    """The model's note for a lost worker: short, and without the application's configuration names."""
    why = _LOST_REASONS.get(exc.reason, "it stopped")
    return (
        f"the Python session restarted because {why}; this code's changes are lost and the variables are as they "
        "were before it ran; do not rerun it unchanged"
    )


def _stub_signatures(stubs: str) -> list[str]:
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


def _tool_signatures(tools: Mapping[str, Callable[..., Any]]) -> list[str]:
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


class CodeTool:
    """The ``run_code`` tool for an agent: one persistent Python session per conversation.

    Args:
        pool: The pool that runs the sessions and stores the checkpoints.
        heads: Where each conversation's head lives; default: `default_heads` of the pool's store
            (`SQLiteHeads` next to a local store, `S3Heads` on S3, `MemoryHeads` in memory).
        tools: Host functions by name (sync or async) the code may call.
        stubs: Python stubs of the host functions; when given, every script is type-checked against them before it
            runs (needs ty), and the tool's description lists them.
        limits: Limits of every run instead of the pool's.
        max_answer_chars: Longest answer; longer ones keep their end and say what was cut (default 8,000).
        lease_ttl_s: Seconds a turn's lease lasts; it is renewed every third of that while the turn runs, so only a
            dead process's lease ever expires.
        lease_wait_s: Seconds a turn waits for another turn of the same conversation before `Conflict`.

    Raises:
        ConfigError: A setting is invalid, or the pool's store has no default head store.
    """

    name = "run_code"

    def __init__(
        self,
        pool: AsyncPool,
        *,
        heads: HeadStore | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        stubs: str | None = None,
        limits: Limits | None = None,
        max_answer_chars: int = 8000,
        lease_ttl_s: float = 60.0,
        lease_wait_s: float = 30.0,
    ) -> None:
        if not isinstance(max_answer_chars, int) or max_answer_chars < MIN_ANSWER_CHARS:
            raise ConfigError(f"max_answer_chars must be an integer >= {MIN_ANSWER_CHARS}, not {max_answer_chars!r}")
        for label, value in (("lease_ttl_s", lease_ttl_s), ("lease_wait_s", lease_wait_s)):
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{label} must be a positive number of seconds, not {value!r}")
        if not isinstance(pool, AsyncPool):
            raise ConfigError(f"pool must be an AsyncPool (use SyncCodeTool with a Pool), not {type(pool).__name__}")
        if heads is not None and not isinstance(heads, HeadStore):
            raise ConfigError(f"heads must be a head store (SQLiteHeads, S3Heads, MemoryHeads), not {heads!r}")
        if stubs is not None and not isinstance(stubs, str):
            raise ConfigError(f"stubs must be Python source text (a str) or None, not {type(stubs).__name__}")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a snapcell Limits(...) or None, not {type(limits).__name__}")
        # Checked now, not on the first turn: a bad name would otherwise fail only after a lease was taken.
        tools = validate_lookup(tools, what="tools")
        self.pool = pool
        self.heads: HeadStore = heads if heads is not None else default_heads(pool.store)
        self._owns_heads = heads is None
        self.tools = tools
        self.stubs = stubs
        self.max_answer_chars = max_answer_chars
        self.lease_ttl_s = float(lease_ttl_s)
        self.lease_wait_s = float(lease_wait_s)
        self._checkout: dict[str, Any] = {"limits": limits}
        if stubs is not None:
            self._checkout.update(type_check=True, type_check_stubs=stubs)
        host = _stub_signatures(stubs) if stubs is not None else _tool_signatures(self.tools)
        self.description = f"{_DESCRIPTION} {_modules_text(pool.policy)}" + (
            "\n\nHost functions (already defined; call them directly):\n" + "\n".join(host) if host else ""
        )
        self._aheads = AsyncHeads(self.heads)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._owner_prefix = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def json_schema(self) -> dict[str, Any]:
        """JSON schema of the tool's parameters (``code``, optional ``setup``); the description goes beside it."""
        return {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Python code to run; the value of its last expression is shown.",
                },
                "setup": {
                    "type": "boolean",
                    "description": "True for setup code (imports, loading data) that should run again if the "
                    "session ever restarts.",
                    "default": False,
                },
            },
            "required": ["code"],
            "additionalProperties": False,
        }

    # ------------------------------------------------------------------ turns

    async def run_code(self, conversation_id: str, code: str, setup: bool = False) -> str:
        """Run one turn of a conversation and return the text the model should read.

        Waits for any other turn of the conversation (in this process, then across processes through the lease),
        loads the conversation's head (nothing on its first turn), runs ``code``, dumps the namespace and moves the
        head to the new checkpoint, keeping the previous one in its history. The head moves after every turn whose
        code ran, also when the script failed or timed out: those are in the answer, for the model to fix.

        If the head's checkpoint expired or was deleted, the code runs in an empty session, the head starts
        afresh, and the answer says so in one line. If the worker process dies during the run or the dump
        (`WorkerLost`: a crash, a signal, memory), the head does not move, the answer says that the session
        restarted and this code's changes are lost, and the next turn continues from the head as it was.

        Args:
            conversation_id: The application's conversation ID (see `validate_conversation_id`).
            code: The model's script.
            setup: Mark the script as a setup cell (rerun after a restart).

        Returns:
            The answer text, at most ``max_answer_chars`` long.

        Raises:
            InvalidKey: The conversation ID is malformed; nothing ran.
            Conflict: Another turn of this conversation held it for ``lease_wait_s``, or moved its head while this
                turn ran; this turn's changes were not saved and the conversation's head is the other turn's.
            StorageError: The checkpoint or head store failed; the head did not move, the turn may be retried.
            CheckpointCorrupt: The head's checkpoint was altered or signed with another key (check the keys after a
                rotation); the head did not move: fix the keys, or `rewind` / start a new conversation.
            CheckpointVersionError: The head's checkpoint was written by another Python minor version; the head did
                not move: run it on that version, or `rewind` / start a new conversation.
            SessionError: No worker could be checked out; nothing ran.
        """
        validate_conversation_id(conversation_id)
        async with self._turn_lease(conversation_id) as owner:
            return await self._turn(conversation_id, code, setup, owner)

    async def _turn(self, conversation_id: str, code: str, setup: bool, owner: list[str]) -> str:
        with conversation_context(conversation_id):
            return await self._turn_in_context(conversation_id, code, setup, owner)

    async def _turn_in_context(self, conversation_id: str, code: str, setup: bool, owner: list[str]) -> str:
        head = await self._aheads.get(conversation_id)
        notes: list[str] = []
        async with self.pool.checkout(**self._checkout) as session:
            fresh = False
            if head is not None and head.checkpoint_id is not None:
                try:
                    await session.load_session(head.checkpoint_id)
                except (CheckpointExpired, CheckpointNotFound):
                    notes.append(STATE_GONE_NOTE)
                    fresh = True
            try:
                result = await session.run(code, external_lookup=self.tools, setup=setup)
                new_id = await session.dump()
            except WorkerLost as exc:
                notes.append(_lost_note(exc))
                return render_answer(RunResult(), notes, max_chars=self.max_answer_chars)
        history: tuple[bytes, ...] = ()
        if head is not None and not fresh:
            history = head.history if head.checkpoint_id is None else (head.checkpoint_id, *head.history)
        try:
            await self._aheads.compare_and_set(
                conversation_id,
                head.version if head is not None else None,
                new_id,
                history=history,
                owner=owner[0],
                release_lease=True,
            )
        except (Conflict, StorageError):
            # The update may have landed even though it reported a failure (a retried request on S3): checkpoint
            # IDs are unique, so a head that names this turn's checkpoint means the turn was stored.
            current = await self._aheads.get(conversation_id)
            if current is None or current.checkpoint_id != new_id:
                raise
            if current.lease_owner != owner[0]:
                owner.clear()  # the head update released it
        else:
            owner.clear()  # released with the head
        return render_answer(result, notes, max_chars=self.max_answer_chars)

    @contextlib.asynccontextmanager
    async def _turn_lease(self, conversation_id: str) -> AsyncIterator[list[str]]:
        """Hold the in-process lock and the head store's lease of a conversation; yield ``[owner]``.

        The body may clear the list when it released the lease itself (with the head update).
        """
        lock = self._locks.get(conversation_id)
        if lock is None:
            lock = self._locks[conversation_id] = asyncio.Lock()
        async with lock:
            owner = f"{self._owner_prefix}:{secrets.token_hex(6)}"
            try:
                await self._acquire(conversation_id, owner)
            except BaseException:
                # Cancelled (or failed) while the store may already have granted the lease: give it back, or
                # the conversation stays locked for the whole lease time. Releasing a lease not held does nothing.
                await asyncio.shield(self._aheads.release_lease(conversation_id, owner))
                raise
            renewer = asyncio.create_task(self._renew(conversation_id, owner))
            held = [owner]
            try:
                yield held
            finally:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
                if held:
                    await asyncio.shield(self._aheads.release_lease(conversation_id, owner))

    async def _acquire(self, conversation_id: str, owner: str) -> None:
        deadline = time.monotonic() + self.lease_wait_s
        delay = _POLL_MIN_S
        while not await self._try_lease(conversation_id, owner):
            if time.monotonic() >= deadline:
                raise Conflict(
                    f"another turn of conversation {conversation_id!r} is running (it has held the conversation for "
                    f"the last {self.lease_wait_s:g} s); wait for it to finish and try again"
                )
            await asyncio.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _POLL_MAX_S)

    async def _try_lease(self, conversation_id: str, owner: str) -> bool:
        """One attempt at the lease; if the caller is cancelled meanwhile, wait for the store's answer first.

        The attempt runs in a thread that cannot be stopped: giving the lease back before it finished would
        let it take the lease afterwards and keep the conversation locked for the whole lease time.
        """
        attempt = asyncio.ensure_future(self._aheads.acquire_lease(conversation_id, owner, self.lease_ttl_s))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            await asyncio.gather(attempt, return_exceptions=True)
            raise

    async def _renew(self, conversation_id: str, owner: str) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            try:
                if not await self._aheads.renew_lease(conversation_id, owner, self.lease_ttl_s):
                    return  # lost: the head update will be refused with Conflict
            except SnapcellError as exc:
                # A failed renewal is not the turn's failure: try again next time; if the lease really lapses,
                # the head update is refused with Conflict and nothing is overwritten.
                log.warning("snapcell: renewing the lease of conversation %r failed: %s", conversation_id, exc)

    async def aclose(self) -> None:
        """Close the head store if the tool opened it (the default one); a head store passed in stays open."""
        if self._owns_heads:
            await asyncio.to_thread(self.heads.close)

    # ------------------------------------------------------------ history ops

    async def rewind(self, conversation_id: str, turns: int = 1) -> bytes | None:
        """Move the conversation's head back ``turns`` turns in its history; return the new current checkpoint ID.

        The IDs rewound over leave the history (their checkpoints stay in storage until they expire). Waits for a
        turn in progress, like `run_code`.

        Raises:
            ConfigError: The conversation has no head, or fewer than ``turns`` earlier checkpoints in its history.
            Conflict: A turn held the conversation for ``lease_wait_s``; nothing changed.
        """
        validate_conversation_id(conversation_id)
        if not isinstance(turns, int) or turns < 1:
            raise ConfigError(f"turns must be a positive integer, not {turns!r}")
        async with self._turn_lease(conversation_id) as owner:
            head = self._known(conversation_id, await self._aheads.get(conversation_id))
            if len(head.history) < turns:
                raise ConfigError(
                    f"conversation {conversation_id!r} has {len(head.history)} earlier checkpoints in its history; "
                    f"it cannot go back {turns} turns"
                )
            target = head.history[turns - 1]
            await self._aheads.compare_and_set(
                conversation_id,
                head.version,
                target,
                history=head.history[turns:],
                owner=owner[0],
                release_lease=True,
            )
            owner.clear()
            return target

    async def fork(self, conversation_id: str, new_conversation_id: str) -> bytes | None:
        """Start ``new_conversation_id`` at the same checkpoint (and history) as ``conversation_id``.

        Both conversations then go their own ways; checkpoints are immutable, so nothing is copied.

        Returns:
            The checkpoint ID both conversations now stand on.

        Raises:
            ConfigError: ``conversation_id`` has no head.
            Conflict: ``new_conversation_id`` already exists; nothing changed.
        """
        validate_conversation_id(new_conversation_id)
        head = self._known(conversation_id, await self._aheads.get(validate_conversation_id(conversation_id)))
        await self._aheads.compare_and_set(new_conversation_id, None, head.checkpoint_id, history=head.history)
        return head.checkpoint_id

    async def head(self, conversation_id: str) -> Head | None:
        """Return the conversation's head (current checkpoint ID and history), or None before its first turn."""
        return await self._aheads.get(validate_conversation_id(conversation_id))

    @staticmethod
    def _known(conversation_id: str, head: Head | None) -> Head:
        if head is None:
            raise ConfigError(f"conversation {conversation_id!r} has no head yet: it has not run a turn")
        return head

    def __repr__(self) -> str:
        return f"CodeTool({self.pool.store.url!r}, heads={self.heads!r}, tools={sorted(self.tools)})"


class SyncCodeTool:
    """The synchronous twin of `CodeTool`, over a `Pool`; it runs on the pool's event loop.

    Takes the same arguments as `CodeTool`; see its methods for details.
    """

    name = CodeTool.name

    def __init__(
        self,
        pool: Pool,
        *,
        heads: HeadStore | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        stubs: str | None = None,
        limits: Limits | None = None,
        max_answer_chars: int = 8000,
        lease_ttl_s: float = 60.0,
        lease_wait_s: float = 30.0,
    ) -> None:
        if not isinstance(pool, Pool):
            raise ConfigError(f"pool must be a Pool (use CodeTool with an AsyncPool), not {type(pool).__name__}")
        self._pool = pool
        # The sessions must run on the loop that owns the pool's workers, so reuse the pool's runner.
        self._inner = CodeTool(
            pool.aio,
            heads=heads,
            tools=tools,
            stubs=stubs,
            limits=limits,
            max_answer_chars=max_answer_chars,
            lease_ttl_s=lease_ttl_s,
            lease_wait_s=lease_wait_s,
        )

    @property
    def inner(self) -> CodeTool:
        """The async tool this wraps."""
        return self._inner

    @property
    def heads(self) -> HeadStore:
        """The head store."""
        return self._inner.heads

    @property
    def description(self) -> str:
        """See `CodeTool.description`."""
        return self._inner.description

    @property
    def json_schema(self) -> dict[str, Any]:
        """See `CodeTool.json_schema`."""
        return self._inner.json_schema

    def run_code(self, conversation_id: str, code: str, setup: bool = False) -> str:
        """See `CodeTool.run_code`."""
        answer: str = self._pool.call(self._inner.run_code(conversation_id, code, setup))
        return answer

    def rewind(self, conversation_id: str, turns: int = 1) -> bytes | None:
        """See `CodeTool.rewind`."""
        target: bytes | None = self._pool.call(self._inner.rewind(conversation_id, turns))
        return target

    def fork(self, conversation_id: str, new_conversation_id: str) -> bytes | None:
        """See `CodeTool.fork`."""
        target: bytes | None = self._pool.call(self._inner.fork(conversation_id, new_conversation_id))
        return target

    def head(self, conversation_id: str) -> Head | None:
        """See `CodeTool.head`."""
        head: Head | None = self._pool.call(self._inner.head(conversation_id))
        return head

    def close(self) -> None:
        """See `CodeTool.aclose`."""
        self._pool.call(self._inner.aclose())


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
