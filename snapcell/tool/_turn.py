"""One turn of `CodeTool`: head read, warm session or load, run, dump, head write (with read-back).

The tool holds the conversation's lease around `run_turn`; everything here runs under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from snapcell.conversation import Conversation
from snapcell.errors import (
    CheckpointExpired,
    CheckpointNotFound,
    Conflict,
    RunCancelled,
    SnapcellError,
    StorageError,
    TurnOutcomeUnknown,
    WorkerLost,
    WorkspaceQuotaExceeded,
)
from snapcell.heads import Head, TurnRecord
from snapcell.interpreter import RunResult
from snapcell.session import AsyncSession
from snapcell.tool._answer import cut_answer, dropped_in_turn, lost_note, render_answer, replayed, without_dropped_notes
from snapcell.tool._records import CANCELLED_NOTE, cancelled_notes, conversation_head, count_run

if TYPE_CHECKING:
    from collections.abc import Callable

    from snapcell.tool._context import TurnContext
    from snapcell.tool._lease import Lease

__all__ = ["KEPT_ANSWER_CHARS", "STATE_GONE_NOTE", "commit_turn", "load_head", "run_turn"]

STATE_GONE_NOTE = (
    "the earlier state of this conversation is gone (its checkpoint expired or was deleted); this code ran in a "
    "fresh, empty session, so variables, functions and imports from earlier turns must be recreated"
)
# A committed turn's answer is kept in its head, for a retry, up to this long (cut from the start, like answers).
KEPT_ANSWER_CHARS = 8000


async def run_turn(
    tool: TurnContext,
    conversation_id: str,
    code: str,
    setup: bool,
    lease: Lease,
    turn_id: str,
    conversation: Conversation | None = None,
) -> str:
    read, head = lease.head_read()
    if not read:
        head = await tool._storage(f"reading the head of conversation {conversation_id!r}", conversation_id)
    done = head.turn(turn_id) if head is not None else None
    if done is not None:
        if conversation is not None and head is not None and conversation.last_turn_id != turn_id:
            # Committed by a writer that died before saving the conversation: adopt the turn's state, once.
            if head.turns and head.turns[0].turn_id == turn_id and head.checkpoint_id is not None:
                conversation.record_turn(head.checkpoint_id, turn_id)
        return replayed(done)
    notes: list[str] = cancelled_notes(head)
    cancelled: BaseException | None = None
    start = head if conversation is None else conversation_head(conversation)
    at = start.checkpoint_id if start is not None else None
    async with tool._warm.turn(conversation_id, at, tool._new_session, room_needed=tool._pool_full) as warm:
        session = warm.session
        # A warm session holds exactly the checkpoint this turn starts from: nothing to load.
        if warm.reused and start is not None and at is not None:
            history: tuple[bytes, ...] = (at, *start.history)
        else:
            history = await load_head(tool, session, start, notes)
        dropped_before = frozenset(d.name for d in session.manifest.dropped) if session.manifest else frozenset()
        try:
            # The answer of the turn whose dump dropped a variable named it; the run would name it again.
            # The dump always follows a run that ends: asked for with it, it costs no round trip of its own.
            run = await session.run(code, external_lookup=tool.tools, setup=setup, then_dump=True)
            result = without_dropped_notes(run)
        except RunCancelled as exc:
            result, cancelled = without_dropped_notes(exc.result), exc
            if result.status == "lost":  # it did not stop in time and its worker was killed: nothing to save
                if conversation is not None:
                    count_run(conversation, result)
                raise
            notes.append(CANCELLED_NOTE + (", ".join(result.assigned) or "none") + ")")
        except WorkerLost as exc:
            if conversation is not None:
                count_run(conversation, exc.result if isinstance(exc.result, RunResult) else RunResult(status="lost"))
            return lost_answer(tool, exc, notes)
        # The state is saved even when the turn is being cancelled: shielded, and awaited to its end.
        save = asyncio.ensure_future(
            save_turn(
                tool,
                session,
                conversation_id,
                head,
                history,
                result,
                notes,
                lease,
                turn_id,
                conversation,
                dropped_before=dropped_before,
                on_dumped=lambda new_id: warm.dumped(new_id, result.memory_bytes),
            )
        )
        try:
            answer = await asyncio.shield(save)
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
            answer = await save
    if cancelled is not None:
        raise cancelled
    return answer


def lost_answer(tool: TurnContext, exc: WorkerLost, notes: list[str]) -> str:
    notes.append(lost_note(exc))
    return render_answer(RunResult(status="lost"), notes, max_chars=tool.max_answer_chars)


async def save_turn(
    tool: TurnContext,
    session: AsyncSession,
    conversation_id: str,
    head: Head | None,
    history: tuple[bytes, ...],
    result: RunResult,
    notes: list[str],
    lease: Lease,
    turn_id: str,
    conversation: Conversation | None,
    *,
    dropped_before: frozenset[str] = frozenset(),
    on_dumped: Callable[[bytes], None] | None = None,
) -> str:
    """Dump the session, move the head (reading it back after a failed write); the turn's answer."""
    try:
        new_id = await session.dump()
        if on_dumped is not None:
            on_dumped(new_id)
        dropped = dropped_in_turn(session.manifest, dropped_before, result)
        if dropped is not None:
            notes.append(dropped)  # this turn's answer says what was not saved
    except WorkspaceQuotaExceeded as exc:
        notes.append(f"{exc}; this call was not saved: the next call starts from the state before it")
        if conversation is not None:
            count_run(conversation, result)
        return render_answer(result, notes, max_chars=tool.max_answer_chars)
    except WorkerLost as exc:
        if conversation is not None:
            count_run(conversation, dataclasses.replace(result, status="lost"))
        return lost_answer(tool, exc, notes)
    if conversation is not None:
        count_run(conversation, result, bytes_stored=session.bytes_stored)
    answer = await commit_turn(tool, conversation_id, head, history, new_id, result, notes, lease, turn_id)
    if conversation is not None:
        conversation.record_turn(new_id, turn_id)
    return answer


async def commit_turn(
    tool: TurnContext,
    conversation_id: str,
    head: Head | None,
    history: tuple[bytes, ...],
    new_id: bytes,
    result: RunResult,
    notes: list[str],
    lease: Lease,
    turn_id: str,
) -> str:
    answer = render_answer(result, notes, max_chars=tool.max_answer_chars)
    turn = TurnRecord(turn_id, answer if len(answer) <= KEPT_ANSWER_CHARS else cut_answer(answer, KEPT_ANSWER_CHARS))
    write = tool._aheads.compare_and_set(
        conversation_id,
        head.version if head is not None else None,
        new_id,
        history=history,
        owner=lease.owner,
        release_lease=True,
        turn=turn,
    )
    try:
        await tool._bounded(write)
    except (TimeoutError, Conflict, StorageError) as exc:
        # The write may have landed although it reported a failure (a reply lost on the way back, a retried
        # request on S3): read the head back before saying anything about it.
        current = await read_back(tool, conversation_id, turn_id, exc)
        if current is None or (current.turn(turn_id) is None and current.checkpoint_id != new_id):
            if isinstance(exc, TimeoutError):
                raise TurnOutcomeUnknown(
                    f"saving turn {turn_id!r} of conversation {conversation_id!r} did not finish within "
                    f"{tool.storage_timeout_s:g} s (storage_timeout_s) and the head does not show it yet; it may "
                    f"still land: run the turn again with turn_id={turn_id!r} (it will not run twice)",
                    conversation_id=conversation_id,
                    turn_id=turn_id,
                ) from exc
            raise
        if current.lease_owner != lease.owner:
            lease.released_with_head()  # the head update released it
        committed = current.turn(turn_id)
        return committed.answer if committed is not None and committed.answer is not None else answer
    lease.released_with_head()  # released with the head
    return answer


async def load_head(tool: TurnContext, session: AsyncSession, head: Head | None, notes: list[str]) -> tuple[bytes, ...]:
    """Load the newest checkpoint of the head that still exists; return the history the next head keeps.

    A checkpoint that expired or was deleted is skipped for the next one in the history, and the note says what
    was lost; none is ever dropped from the history. A corrupt or foreign-version checkpoint is raised, and the
    head does not move: that is a key or version problem to fix (or to `rewind` past), not lost state.
    """
    if head is None:
        return ()
    if head.checkpoint_id is None:
        return head.history
    candidates = (head.checkpoint_id, *head.history)
    lost: list[str] = []
    for checkpoint_id in candidates:
        try:
            await session.load_session(checkpoint_id)
        except CheckpointExpired:
            lost.append("expired")
        except CheckpointNotFound:
            lost.append("deleted")
        else:
            if lost:
                notes.append(fallback_note(tool, lost, checkpoint_id))
            return candidates
    notes.append(STATE_GONE_NOTE)
    return candidates


def fallback_note(tool: TurnContext, lost: list[str], loaded: bytes) -> str:
    try:
        saved = datetime.fromtimestamp(tool.pool.keyring.parse_id(loaded).created_at, UTC)
        when = f" (saved {saved:%Y-%m-%d %H:%M} UTC)"
    except SnapcellError:
        when = ""
    turns = "turn" if len(lost) == 1 else f"{len(lost)} turns"
    why = " / ".join(dict.fromkeys(lost))
    return (
        f"the state of the last {turns} of this conversation is gone (checkpoint {why}); this code ran on the "
        f"state saved before {'it' if len(lost) == 1 else 'them'}{when}, so variables, functions and imports from "
        f"the last {turns} must be recreated"
    )


async def read_back(tool: TurnContext, conversation_id: str, turn_id: str, error: BaseException) -> Head | None:
    """Read the head after a failed write, retrying within one storage deadline.

    Raises:
        TurnOutcomeUnknown: The head could not be read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (tool.storage_timeout_s or 10.0)
    delay = 0.05
    while True:
        try:
            return await tool._bounded(tool._aheads.get(conversation_id), max(deadline - loop.time(), 0.01))
        except (TimeoutError, StorageError) as exc:
            if loop.time() + delay >= deadline:
                why = str(error) or f"no answer within {tool.storage_timeout_s:g} s"
                raise TurnOutcomeUnknown(
                    f"saving turn {turn_id!r} of conversation {conversation_id!r} failed ({why}) and reading the "
                    f"head back failed too ({exc or 'no answer'}): the turn may or may not be saved; run it again "
                    f"with turn_id={turn_id!r}: if it was saved you get its answer and it does not run twice",
                    conversation_id=conversation_id,
                    turn_id=turn_id,
                ) from error
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
