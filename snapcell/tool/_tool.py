"""The ready-made agent tool: ``run_code(conversation_id, code)`` with one head per conversation.

`CodeTool` keeps each conversation's current checkpoint ID in a head store, runs one turn at a time per
conversation (an asyncio lock in this process, a lease in the head store across processes and servers), and turns
each run into the text a model should read. `SyncCodeTool` is its synchronous twin over a `Pool`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import secrets
import socket
from collections.abc import Callable, Collection, Mapping
from typing import Any

from snapcell.conversation import Conversation, ConversationStore
from snapcell.errors import ConfigError
from snapcell.heads import (
    AsyncHeads,
    Head,
    HeadStore,
    TurnRecord,
    default_heads,
    validate_conversation_id,
    validate_turn_id,
)
from snapcell.interpreter import validate_lookup
from snapcell.limits import Limits
from snapcell.pool import AsyncPool, Pool
from snapcell.session import Answer, check_pausing
from snapcell.telemetry import conversation_context, trace_turn
from snapcell.tool._answer import (
    MIN_ANSWER_CHARS,
    TurnAnswer,
    cut_answer,
    host_text,
    modules_text,
    pausing_text,
    render_answer,
    stub_signatures,
    tool_signatures,
)
from snapcell.tool._arguments import RunCodeArguments, tool_call_arguments
from snapcell.tool._context import HeadMove, TurnContext
from snapcell.tool._files import files_at_head, put_file
from snapcell.tool._keeping import ConversationKeeper, Durability
from snapcell.tool._lease import TurnLeases
from snapcell.tool._records import CANCELLED_NOTE
from snapcell.tool._turn import KEPT_ANSWER_CHARS, STATE_GONE_NOTE, Turn
from snapcell.tool._warm import WarmSessions
from snapcell.typecheck import stubs_from_functions
from snapcell.workspace import FileInfo, check_mounts

__all__ = [
    "CANCELLED_NOTE",
    "KEPT_ANSWER_CHARS",
    "MIN_ANSWER_CHARS",
    "STATE_GONE_NOTE",
    "CodeTool",
    "SyncCodeTool",
    "TurnAnswer",
    "cut_answer",
    "render_answer",
    "tool_call_arguments",
]

_HOLDER_ID = re.compile(r"[A-Za-z0-9_:.-]{1,96}\Z")

_DESCRIPTION = """\
Run Python code in a persistent session that belongs to this conversation. Variables, functions, classes and \
imports defined in one call are still there in later calls (even days later), so keep intermediate data in \
variables rather than printing all of it. The answer shows what the code printed, then the value of its last \
expression (as in a notebook cell), then any error with its traceback, then notes about the session. Top-level \
`await` works, so `await asyncio.gather(...)` runs host functions concurrently. Long answers are cut from the \
start, so print only what you need to see."""
_FILES = (
    "\n\nThe working directory is this conversation's workspace: files written there with open() or pathlib are "
    "still there in later calls. Files written under out/ (charts, reports) are shown to the user. memory() gives the "
    "session's memory in bytes (resident_bytes, peak_resident_bytes, limit_bytes)."
)


def _checked_stubs(stubs: str | None, type_check: bool | None, tools: Mapping[str, Callable[..., Any]]) -> str | None:
    """The stubs every turn is type-checked against (made from ``tools`` if none are given), or None: no checks.

    Raises:
        ConfigError: ``type_check`` is not a bool or None.
    """
    if type_check is not None and not isinstance(type_check, bool):
        raise ConfigError(f"type_check must be True, False or None, not {type_check!r}")
    if not (stubs is not None if type_check is None else type_check):
        return None
    return stubs if stubs is not None else stubs_from_functions(tools)


class CodeTool:
    """The ``run_code`` tool for an agent: one persistent Python session per conversation.

    Args:
        pool: The pool that runs the sessions and stores the checkpoints.
        heads: Where each conversation's head lives; default: `default_heads` of the pool's store
            (`SQLiteHeads` next to a local store, `S3Heads` on S3, `MemoryHeads` in memory).
        tools: Host functions by name (sync or async) the code may call.
        stubs: Python stubs of the host functions; when given, every script is type-checked against them before it
            runs (needs ty), and the tool's description lists them.
        type_check: Type-check every script before it runs (needs ty): against ``stubs``, or without them against
            stubs made from the host functions' signatures (`snapcell.typecheck.stubs_from_functions`), which the
            description then lists. Default: only when ``stubs`` are given.
        limits: Limits of every run instead of the pool's.
        max_answer_chars: Longest answer; longer ones keep their end and say what was cut (default 8,000).
        lease_ttl_s: Seconds a turn's lease lasts; it is renewed every third of that while the turn runs, so only a
            dead process's lease ever expires. Servers sharing a head store should use the same value.
        lease_wait_s: Seconds a turn waits for another turn of the same conversation before `ConversationBusy`.
        storage_timeout_s: Deadline of every head-store call of a turn (read, lease, write, read-back), default
            10 s; a head store that does not answer fails the turn with `StorageTimeout` (a `StorageUnavailable`)
            naming the call, or `TurnOutcomeUnknown` for a write. A store that stops answering fails a turn at
            most 2 x ``storage_timeout_s`` + 2 s after it stopped: the write, its read-back, then up to 2 s (never
            more than ``storage_timeout_s``) waiting to give the lease back. None waits for ever (a read-back still
            gives up after 10 s). Store calls inside load and dump are bounded by the store's own settings.
        mounts: Host directories readable at ``name/`` in every session's workspace (``{"data": "/srv/datasets"}``);
            never writable, never saved (process mode).
        holder_id: This tool's name in the leases it takes (letters, digits, ``_ : . -``, at most 96). A later turn
            of a tool with the same holder ID takes over such a lease at once, so a server that restarts with a
            stable ID (its host name, a pod name) finds its conversations free; never give two live tools the same
            ID. Default: a new ID per tool (host name, process ID, random).
        keep_warm_s: Seconds a conversation's live session is kept after its turn (0, the default, keeps none). The
            next turn reuses it, without loading, when the head still names the checkpoint it saved; otherwise it
            is checked in and the turn loads as usual. A kept session holds a worker process (and its memory).
        max_warm_sessions: Sessions kept warm at once (the oldest is checked in first); warm sessions also give up
            their workers whenever a new checkout would otherwise wait for one.
        max_warm_bytes: Worker memory all warm sessions may hold together, in bytes (None: no bound).
        conversations: A `ConversationStore` the tool keeps conversations in: a turn given a `Conversation` (or
            a conversation ID, loaded from this store) records its answer as the result of its tool call, its
            checkpoint and its usage in the conversation and stores them in one write, however the turn ends. None
            (the default): the turn records its checkpoint and usage in a `Conversation` in memory, and the
            application stores it with the result message.
        durability: When a turn is stored in ``conversations``: ``"sync"`` (default) before its answer returns;
            ``"async"`` in the background while the application's next step runs (the store's methods on that
            conversation wait for it, and `aclose` does); ``"exit"`` once, when the tool closes (`aclose`).
        on_host_error: ``"advance"`` (default): a turn whose host function raised an error the script did not
            catch is saved like any other. ``"hold"``: it is not saved, the head stays where it was (the failed
            run can be inspected before the conversation goes on), and the answer says so.
        pausing: Names of host functions whose call pauses the script until the application answers (a person's
            approval, say): the turn saves a paused checkpoint and its answer says what the script waits for;
            `resume` goes on from the call. They need no entry in ``tools`` (one there gives the description its
            signature, and is never called). See the docs' "Pause and resume".

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
        type_check: bool | None = None,
        limits: Limits | None = None,
        max_answer_chars: int = 8000,
        lease_ttl_s: float = 60.0,
        lease_wait_s: float = 30.0,
        storage_timeout_s: float | None = 10.0,
        holder_id: str | None = None,
        mounts: Mapping[str, str] | None = None,
        keep_warm_s: float = 0.0,
        max_warm_sessions: int = 16,
        max_warm_bytes: int | None = 1024**3,
        conversations: ConversationStore | None = None,
        durability: Durability = "sync",
        on_host_error: str = "advance",
        pausing: Collection[str] | None = None,
    ) -> None:
        if not isinstance(max_answer_chars, int) or max_answer_chars < MIN_ANSWER_CHARS:
            raise ConfigError(f"max_answer_chars must be an integer >= {MIN_ANSWER_CHARS}, not {max_answer_chars!r}")
        for label, value in (("lease_ttl_s", lease_ttl_s), ("lease_wait_s", lease_wait_s)):
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{label} must be a positive number of seconds, not {value!r}")
        if storage_timeout_s is not None and (not isinstance(storage_timeout_s, int | float) or storage_timeout_s <= 0):
            raise ConfigError(
                f"storage_timeout_s must be a positive number of seconds or None, not {storage_timeout_s!r}"
            )
        if holder_id is not None and (not isinstance(holder_id, str) or not _HOLDER_ID.match(holder_id)):
            raise ConfigError(f"holder_id must be 1 to 96 letters, digits, '_', ':', '.' or '-', not {holder_id!r}")
        _check_warm(keep_warm_s, max_warm_sessions, max_warm_bytes)
        if on_host_error not in ("advance", "hold"):
            raise ConfigError(f"on_host_error must be 'advance' or 'hold', not {on_host_error!r}")
        if conversations is None and durability != "sync":
            raise ConfigError("durability applies to a conversation store: pass conversations= too")
        keeper = ConversationKeeper(conversations, durability) if conversations is not None else None
        if not isinstance(pool, AsyncPool):
            raise ConfigError(f"pool must be an AsyncPool (use SyncCodeTool with a Pool), not {type(pool).__name__}")
        if heads is not None and not isinstance(heads, HeadStore):
            raise ConfigError(
                f"heads must be a head store (SQLiteHeads, S3Heads, PostgresHeads, MemoryHeads), not {heads!r}"
            )
        if stubs is not None and not isinstance(stubs, str):
            raise ConfigError(f"stubs must be Python source text (a str) or None, not {type(stubs).__name__}")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a snapcell Limits(...) or None, not {type(limits).__name__}")
        # Checked now, not on the first turn: a bad name would otherwise fail only after a lease was taken.
        tools = validate_lookup(tools, what="tools")
        self.pausing = check_pausing(pausing)
        self.pool = pool
        self.heads: HeadStore = heads if heads is not None else default_heads(pool.store)
        self._owns_heads = heads is None
        self.tools = tools
        self.stubs = stubs
        self.conversations = conversations
        self.durability = durability
        self.on_host_error = on_host_error
        self._keeper = keeper
        self.max_answer_chars = max_answer_chars
        self.lease_ttl_s = float(lease_ttl_s)
        self.lease_wait_s = float(lease_wait_s)
        self.storage_timeout_s = None if storage_timeout_s is None else float(storage_timeout_s)
        self.holder_id = holder_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        if not _HOLDER_ID.match(self.holder_id):  # an exotic host name
            self.holder_id = f"host:{os.getpid()}:{secrets.token_hex(4)}"
        checkout: dict[str, Any] = {"limits": limits, "mounts": check_mounts(mounts) or None}
        checked = _checked_stubs(stubs, type_check, self.tools)
        if checked is not None:
            checkout.update(type_check=True, type_check_stubs=checked)
        shown = checked if checked is not None else stubs
        host = stub_signatures(shown) if shown is not None else tool_signatures(self.tools)
        process = pool.isolation == "process"
        self.description = (
            f"{_DESCRIPTION} {modules_text(pool.policy, file_access=process)}"
            + (_FILES if process else " There is no file access (open() is not available).")
            + host_text(host)
            + pausing_text(self.pausing)
        )
        self._warm = WarmSessions(
            keep_warm_s=float(keep_warm_s), max_sessions=max_warm_sessions, max_bytes=max_warm_bytes
        )
        self._leases = TurnLeases(
            self.heads,
            ttl_s=self.lease_ttl_s,
            wait_s=self.lease_wait_s,
            storage_timeout_s=self.storage_timeout_s,
            holder_id=self.holder_id,
        )
        self._context = TurnContext(
            pool=pool,
            tools=self.tools,
            max_answer_chars=self.max_answer_chars,
            heads=AsyncHeads(self.heads),
            leases=self._leases,
            warm=self._warm,
            new_session=functools.partial(pool.checkout, **checkout),
            keeper=keeper,
            hold_on_host_error=on_host_error == "hold",
            pausing=self.pausing,
        )

    @property
    def json_schema(self) -> dict[str, Any]:
        """JSON schema of the tool's parameters (``code``, optional ``setup``); the description goes beside it.

        It is `RunCodeArguments`'s, the model `tool_call_arguments` checks a call with.
        """
        return RunCodeArguments.input_schema()

    # ------------------------------------------------------------------ turns

    async def run_code(
        self, conversation_id: str | Conversation, code: str, setup: bool = False, *, turn_id: str | None = None
    ) -> str:
        """Run one turn of a conversation and return the text the model should read.

        Waits for any other turn of the conversation (in this process, then across processes through the lease),
        loads the conversation's head (nothing on its first turn), runs ``code``, dumps the namespace and moves the
        head to the new checkpoint, keeping the previous one in its history. The head moves after every turn whose
        code ran, also when the script failed or timed out: those are in the answer, for the model to fix.

        Each turn has an ID, recorded in the head with the turn's answer (and where the turn started and the
        checkpoint it made) when the head moves. Pass your own ``turn_id`` (the model's tool-call ID, say) to make
        the call safe to retry: a turn whose ID is already committed returns the committed answer and does not run
        again. A failed head write is read back before it is reported, so `StorageError` and `Conflict` mean the head
        did not move; `TurnOutcomeUnknown` means that could not be told, and a retry with the same ``turn_id``
        settles it: the state then holds the turn once, but if the first run was not saved the code runs again, and
        so do the host functions it calls.

        If the head's checkpoint expired or was deleted, the code runs on the newest checkpoint in the history that
        still loads (or in an empty session if none does), the history is kept, and the answer says in one line
        what was lost. If the worker process dies during the run or the dump (`WorkerLost`: a crash, a signal,
        memory), the head does not move, the answer says that the session restarted and this code's changes are
        lost, and the next turn continues from the head as it was.

        Given a `Conversation` instead of an ID, the conversation is the truth about the Python state: the turn
        starts from `Conversation.checkpoint_id` (so a `Conversation.truncate` or `Conversation.fork` moves the state
        too), and when the head has moved, the turn's checkpoint, turn ID and usage are recorded in the conversation
        (in memory: the application's next `ConversationStore.add_messages` stores them with the turn's messages).
        With ``conversations=`` the tool also records the answer as the result of the transcript's tool call
        ``turn_id`` (in the call's own format; none when the transcript has no such unanswered call) and stores
        the conversation itself, per ``durability``; given only an ID, it loads the conversation from that store
        (a new one if there is none). A crash between the head's move and that save leaves the stored
        conversation as it was before the turn, messages and state alike; retrying the turn with the same
        ``turn_id`` returns the committed answer and records its checkpoint (and, with ``conversations=``, its
        result), without running the code again, if the turn started from the state the conversation stands on;
        one that started elsewhere (the conversation was truncated or forked since) raises `TurnOnOtherBranch` and
        nothing is adopted. Every run's usage is added to ``Conversation.usage``, also of runs that failed, timed
        out, were cancelled or lost their worker.

        Cancelling the task that awaits this interrupts the script where it is (in process mode and for async code
        inline; a synchronous cell inline runs to its end first, as it holds the event loop), saves the namespace
        as it stands and moves the head, then re-raises the cancellation; the next turn's answer says that the
        previous turn was cancelled and which variables it had set. A retry with the same ``turn_id`` returns the
        cancelled turn's answer ("this turn was cancelled ...", with those variables); with ``conversations=``
        that answer is recorded as the tool call's result and stored before the cancellation is re-raised, so
        the transcript never keeps an unanswered call.

        With ``on_host_error="hold"``, a turn whose host function raised an error the script did not catch is not
        saved: the head stays where it was, nothing is recorded under ``turn_id`` (a retry runs again), and the
        answer ends with a note saying so.

        Args:
            conversation_id: The application's conversation ID (see `validate_conversation_id`), or a
                `Conversation`.
            code: The model's script.
            setup: Mark the script as a setup cell (rerun after a restart).
            turn_id: The turn's idempotency key (same rules as a conversation ID); default: a new random one.

        Returns:
            The answer text, at most ``max_answer_chars`` long (a replayed answer at most `KEPT_ANSWER_CHARS`).

        Raises:
            InvalidKey: The conversation ID or turn ID is malformed; nothing ran.
            ConversationBusy: Another turn of this conversation held it for ``lease_wait_s`` (a `Conflict`); nothing
                ran, the message says whether that turn is running or its lease went stale.
            Conflict: Another turn moved the conversation's head while this turn ran; this turn's changes were not
                saved and the conversation's head is the other turn's. With ``conversations=`` and
                ``durability="sync"``, also: another writer changed the stored conversation after this turn's head
                moved (load it again and answer the call with the same ``turn_id``: the turn is recorded, not run).
            TurnOnOtherBranch: With a `Conversation`: ``turn_id`` was committed from another state than the
                conversation's (a `Conflict`); nothing ran and nothing changed: call again with a new ``turn_id``.
            TurnOutcomeUnknown: The head write failed and the head could not be read back, or did not answer in time
                and does not show the turn yet (a `StorageError`): the turn may be saved or not; call again with the
                same ``turn_id`` (the code and its host functions run again if it was not saved).
            StorageError: The checkpoint or head store failed or did not answer within ``storage_timeout_s``; the
                head did not move, the turn may be retried. With ``conversations=`` and ``durability="sync"``, also:
                the conversation store failed after the head moved (the message says which store): the turn is in
                the `Conversation` in memory, and a retry with the same ``turn_id`` returns its answer and stores
                it, without running the code again.
            CheckpointCorrupt: The head's checkpoint was altered or signed with another key (check the keys after a
                rotation); the head did not move: fix the keys, or `rewind` / start a new conversation.
            CheckpointVersionError: The head's checkpoint was written by another Python minor version; the head did
                not move: run it on that version, or `rewind` / start a new conversation.
            SessionError: No worker could be checked out; nothing ran.
        """
        answer = await self.run_turn(conversation_id, code, setup, turn_id=turn_id)
        return answer.text

    async def run_turn(
        self, conversation_id: str | Conversation, code: str, setup: bool = False, *, turn_id: str | None = None
    ) -> TurnAnswer:
        """Run one turn as `run_code` does; return its answer with whether it failed and the files it wrote.

        For a client that shows more than text: an MCP server marks a failed run as an error and attaches the
        charts a run wrote under ``out/``. Raises what `run_code` raises.
        """
        return await self._turn(conversation_id, code, setup, turn_id, None)

    async def resume(
        self,
        conversation_id: str | Conversation,
        value: Any = None,
        *,
        error: BaseException | None = None,
        turn_id: str | None = None,
    ) -> str:
        """Resume the conversation's paused script with the application's answer, as a turn; return its answer.

        The head's checkpoint holds a run that paused at a pausing host call (see ``pausing``). Like a `run_code`
        turn (lease, load, dump, head move, turn record), but instead of new code the paused script goes on: the
        paused call returns ``value`` (or raises ``error``) and the answer is the whole script's, as if it had never
        paused (it may pause again). Host functions called before the pause are not called again.
        Exactly once as a turn: called again with a ``turn_id`` already committed, it returns that answer and
        nothing runs. A fork of a paused conversation can be resumed with another answer.

        Args:
            conversation_id: The conversation (or a `Conversation`, as for `run_code`).
            value: What the paused call returns (plain data).
            error: An exception the paused call raises in the script instead.
            turn_id: The turn's idempotency key; default: a new random one.

        Raises:
            SessionError: The conversation's state holds no paused run; nothing ran and the head did not move.
            ResumeDiverged: The replay of the script left its log (its host functions answered otherwise, say); the
                head did not move: the conversation is still paused.
            ConfigError: The answer is not plain data; nothing ran.
            Also what `run_code` raises.
        """
        answer = await self._turn(conversation_id, "", False, turn_id, Answer.checked(value, error))
        return answer.text

    async def _turn(
        self,
        conversation_id: str | Conversation,
        code: str,
        setup: bool,
        turn_id: str | None,
        resume: Answer | None,
    ) -> TurnAnswer:
        """A turn of `run_turn`, or of `resume` with the answer of the paused call."""
        conversation: Conversation | None
        if isinstance(conversation_id, Conversation):
            conversation, key = conversation_id, conversation_id.id
        else:
            conversation, key = None, conversation_id
        validate_conversation_id(key)
        turn_id = secrets.token_hex(16) if turn_id is None else validate_turn_id(turn_id)
        if conversation is None and self._keeper is not None:
            self._keeper.check_id_turn()
        try:
            async with self._leases.hold(key) as lease:
                with conversation_context(key), trace_turn(code):
                    if conversation is None and self._keeper is not None:
                        conversation = await self._keeper.load(key)
                    answer = None if resume is None else (resume.value, resume.error)
                    turn = Turn(self._context, lease, turn_id, conversation, answer=answer)
                    text = await turn.run(code, setup)
                    return TurnAnswer(text=text, result=turn.result, saved=turn.saved)
        finally:
            self._warm.start_checkins()  # the turn's session is checked in once its answer is returned

    async def aclose(self) -> None:
        """Store the conversations whose turns are not stored yet (``durability="exit"``, and background writes
        that failed) after waiting for the background writes; check in warm sessions and those of finished turns
        still being checked in, finish giving back leases (for up to ``storage_timeout_s``), then close the head
        store if the tool opened it (the default one); a head store passed in stays open.

        Raises:
            StorageError: A conversation could not be stored (the rest of the closing is done); the turns are
                still in the `Conversation` objects, and the next write of each stores them.
            Conflict: Another writer changed a stored conversation meanwhile.
        """
        try:
            if self._keeper is not None:
                await self._keeper.aclose()
        finally:
            await self._warm.aclose()
            await self._leases.aclose()
            if self._owns_heads:
                await asyncio.to_thread(self.heads.close)

    # ------------------------------------------------------------ files

    async def put_file(
        self, conversation_id: str, path: str, data: bytes, *, turn_id: str | None = None
    ) -> bytes | None:
        """Write a file into the conversation's workspace as a turn of its own; return the new checkpoint ID.

        Like a `run_code` turn: takes the conversation's lease, loads its head, writes the file, dumps and moves the
        head (the previous checkpoint goes into the history, so `rewind` undoes it). With a ``turn_id`` already
        committed, nothing is written again and the head's checkpoint ID is returned.

        Raises:
            WorkspacePathError: The path is absolute, climbs out, or lies in a mount; nothing changed.
            WorkspaceQuotaExceeded: The workspace would exceed its quota; nothing changed.
            Conflict: Another turn moved the head meanwhile; this write was not saved.
            TurnOutcomeUnknown: The head write failed and the head could not be read back, or does not show it yet;
                call again with the same ``turn_id``.
            StorageError: The stores failed; the head did not move.
        """
        return await put_file(self._context, conversation_id, path, data, turn_id=turn_id)

    async def get_file(self, conversation_id: str, path: str) -> bytes:
        """Return a file of the conversation's workspace at its head (under the lease; the head does not move).

        Raises:
            WorkspacePathError: The path is malformed or goes through a symlink.
            WorkspaceError: No such file (or the conversation has no head yet).
        """
        async with files_at_head(self._context, conversation_id) as session:
            return await session.read_file(path)

    async def list_files(self, conversation_id: str) -> list[FileInfo]:
        """Every file of the conversation's workspace at its head (under the lease; the head does not move)."""
        async with files_at_head(self._context, conversation_id) as session:
            return await session.list_files()

    # ------------------------------------------------------------ history ops

    async def rewind(self, conversation_id: str, turns: int = 1, *, turn_id: str | None = None) -> bytes | None:
        """Move the conversation's head back ``turns`` turns in its history; return the new current checkpoint ID.

        The IDs rewound over leave the history (their checkpoints stay in storage until they expire). Waits for a
        turn in progress, like `run_code`. The rewind is recorded in the head under ``turn_id``, like a turn: called
        again with a turn ID already committed, nothing moves and the head's current checkpoint ID is returned. A
        failed head write is read back before it is reported, as a turn's is.

        Args:
            conversation_id: The conversation.
            turns: How many turns to go back.
            turn_id: The rewind's idempotency key (rules of a conversation ID); default: a new random one.

        Raises:
            ConfigError: The conversation has no head, or fewer than ``turns`` earlier checkpoints in its history.
            ConversationBusy: A turn held the conversation for ``lease_wait_s``; nothing changed.
            Conflict: Another turn moved the head meanwhile (read back: this rewind did not land); nothing changed.
            TurnOutcomeUnknown: The head write failed and the head could not be read back, or does not show it yet;
                call again with the same ``turn_id``.
            StorageError: The head store failed; the head did not move.
        """
        validate_conversation_id(conversation_id)
        if not isinstance(turns, int) or turns < 1:
            raise ConfigError(f"turns must be a positive integer, not {turns!r}")
        turn_id = secrets.token_hex(16) if turn_id is None else validate_turn_id(turn_id)
        async with self._leases.hold(conversation_id) as lease:
            head = self._known(conversation_id, await self._context.read_head(conversation_id))
            if head.turn(turn_id) is not None:
                return head.checkpoint_id
            if len(head.history) < turns:
                raise ConfigError(
                    f"conversation {conversation_id!r} has {len(head.history)} earlier checkpoints in its history; "
                    f"it cannot go back {turns} turns"
                )
            target = head.history[turns - 1]
            rewind = self._context.heads.compare_and_set(
                conversation_id,
                head.version,
                target,
                history=head.history[turns:],
                owner=lease.owner,
                release_lease=True,
                turn=TurnRecord(
                    turn_id, f"rewind {turns} turn{'s' if turns > 1 else ''} to checkpoint ...{target.hex()[-16:]}"
                ),
            )
            current = await self._context.move_head(
                HeadMove(
                    conversation_id=conversation_id,
                    write=rewind,
                    turn_id=turn_id,
                    landed=lambda moved: moved.turn(turn_id) is not None,
                    what=f"rewinding conversation {conversation_id!r}",
                    again=f"call rewind again with turn_id={turn_id!r}: if it landed, the head does not move again",
                )
            )
            lease.released_with_head(current)
            return target

    async def fork(self, conversation_id: str, new_conversation_id: str, *, turn_id: str | None = None) -> bytes | None:
        """Start ``new_conversation_id`` at the same checkpoint (and history) as ``conversation_id``.

        Both conversations then go their own ways; checkpoints are immutable, so nothing is copied. The fork is
        recorded in the new conversation's head under ``turn_id``: called again with it, once the fork landed, it
        returns the new conversation's checkpoint ID and changes nothing. A failed head write is read back before it
        is reported, as a turn's is.

        Args:
            conversation_id: The conversation to fork.
            new_conversation_id: The new conversation.
            turn_id: The fork's idempotency key (rules of a conversation ID); default: a new random one.

        Returns:
            The checkpoint ID both conversations now stand on.

        Raises:
            ConfigError: ``conversation_id`` has no head.
            Conflict: ``new_conversation_id`` already exists (read back: not made by this fork); nothing changed.
            TurnOutcomeUnknown: The head write failed and the head could not be read back, or does not show it yet;
                call again with the same ``turn_id``.
            StorageError: The head store failed; nothing was created.
        """
        validate_conversation_id(new_conversation_id)
        if turn_id is None:
            turn_id = secrets.token_hex(16)  # a new one: no earlier call to look for
        else:
            validate_turn_id(turn_id)
            forked = await self._context.read_head(new_conversation_id)
            if forked is not None and forked.turn(turn_id) is not None:
                return forked.checkpoint_id
        head = self._known(conversation_id, await self._context.read_head(validate_conversation_id(conversation_id)))
        fork = self._context.heads.compare_and_set(
            new_conversation_id,
            None,
            head.checkpoint_id,
            history=head.history,
            turn=TurnRecord(turn_id, f"fork of conversation {conversation_id!r}"),
        )
        await self._context.move_head(
            HeadMove(
                conversation_id=new_conversation_id,
                write=fork,
                turn_id=turn_id,
                landed=lambda moved: moved.turn(turn_id) is not None,
                what=f"creating conversation {new_conversation_id!r} (a fork of {conversation_id!r})",
                again=f"call fork again with turn_id={turn_id!r}: if it landed, nothing is created again",
            )
        )
        return head.checkpoint_id

    async def head(self, conversation_id: str) -> Head | None:
        """Return the conversation's head (current checkpoint ID and history), or None before its first turn.

        Raises:
            StorageError: The head store failed or did not answer within ``storage_timeout_s``.
        """
        return await self._context.read_head(validate_conversation_id(conversation_id))

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
        type_check: bool | None = None,
        limits: Limits | None = None,
        max_answer_chars: int = 8000,
        lease_ttl_s: float = 60.0,
        lease_wait_s: float = 30.0,
        storage_timeout_s: float | None = 10.0,
        holder_id: str | None = None,
        mounts: Mapping[str, str] | None = None,
        keep_warm_s: float = 0.0,
        max_warm_sessions: int = 16,
        max_warm_bytes: int | None = 1024**3,
        conversations: ConversationStore | None = None,
        durability: Durability = "sync",
        on_host_error: str = "advance",
        pausing: Collection[str] | None = None,
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
            type_check=type_check,
            limits=limits,
            max_answer_chars=max_answer_chars,
            lease_ttl_s=lease_ttl_s,
            lease_wait_s=lease_wait_s,
            storage_timeout_s=storage_timeout_s,
            holder_id=holder_id,
            mounts=mounts,
            keep_warm_s=keep_warm_s,
            max_warm_sessions=max_warm_sessions,
            max_warm_bytes=max_warm_bytes,
            conversations=conversations,
            durability=durability,
            on_host_error=on_host_error,
            pausing=pausing,
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

    def run_code(
        self, conversation_id: str | Conversation, code: str, setup: bool = False, *, turn_id: str | None = None
    ) -> str:
        """See `CodeTool.run_code`."""
        answer: str = self._pool.call(self._inner.run_code(conversation_id, code, setup, turn_id=turn_id))
        return answer

    def run_turn(
        self, conversation_id: str | Conversation, code: str, setup: bool = False, *, turn_id: str | None = None
    ) -> TurnAnswer:
        """See `CodeTool.run_turn`."""
        answer: TurnAnswer = self._pool.call(self._inner.run_turn(conversation_id, code, setup, turn_id=turn_id))
        return answer

    def resume(
        self,
        conversation_id: str | Conversation,
        value: Any = None,
        *,
        error: BaseException | None = None,
        turn_id: str | None = None,
    ) -> str:
        """See `CodeTool.resume`."""
        answer: str = self._pool.call(self._inner.resume(conversation_id, value, error=error, turn_id=turn_id))
        return answer

    def rewind(self, conversation_id: str, turns: int = 1, *, turn_id: str | None = None) -> bytes | None:
        """See `CodeTool.rewind`."""
        target: bytes | None = self._pool.call(self._inner.rewind(conversation_id, turns, turn_id=turn_id))
        return target

    def fork(self, conversation_id: str, new_conversation_id: str, *, turn_id: str | None = None) -> bytes | None:
        """See `CodeTool.fork`."""
        target: bytes | None = self._pool.call(self._inner.fork(conversation_id, new_conversation_id, turn_id=turn_id))
        return target

    def head(self, conversation_id: str) -> Head | None:
        """See `CodeTool.head`."""
        head: Head | None = self._pool.call(self._inner.head(conversation_id))
        return head

    def put_file(self, conversation_id: str, path: str, data: bytes, *, turn_id: str | None = None) -> bytes | None:
        """See `CodeTool.put_file`."""
        new_id: bytes | None = self._pool.call(self._inner.put_file(conversation_id, path, data, turn_id=turn_id))
        return new_id

    def get_file(self, conversation_id: str, path: str) -> bytes:
        """See `CodeTool.get_file`."""
        return self._pool.call(self._inner.get_file(conversation_id, path))

    def list_files(self, conversation_id: str) -> list[FileInfo]:
        """See `CodeTool.list_files`."""
        return self._pool.call(self._inner.list_files(conversation_id))

    def close(self) -> None:
        """See `CodeTool.aclose`."""
        self._pool.call(self._inner.aclose())


def _check_warm(keep_warm_s: object, max_warm_sessions: object, max_warm_bytes: object) -> None:
    """Validate the warm-session settings of `CodeTool`.

    Raises:
        ConfigError: A setting is invalid.
    """
    if isinstance(keep_warm_s, bool) or not isinstance(keep_warm_s, int | float) or not 0 <= keep_warm_s < 1e9:
        raise ConfigError(f"keep_warm_s must be a number of seconds >= 0, not {keep_warm_s!r}")
    if isinstance(max_warm_sessions, bool) or not isinstance(max_warm_sessions, int) or max_warm_sessions < 0:
        raise ConfigError(f"max_warm_sessions must be a whole number >= 0, not {max_warm_sessions!r}")
    if max_warm_bytes is not None and (
        isinstance(max_warm_bytes, bool) or not isinstance(max_warm_bytes, int) or max_warm_bytes < 0
    ):
        raise ConfigError(f"max_warm_bytes must be a whole number of bytes >= 0 or None, not {max_warm_bytes!r}")
