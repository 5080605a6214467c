"""One turn of `CodeTool`, a `Turn`: head read, warm session or load, run, dump, head write (with read-back).

The tool holds the conversation's lease around `Turn.run`; everything here runs under it.
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
    from snapcell.tool._context import TurnContext
    from snapcell.tool._lease import Lease
    from snapcell.tool._warm import WarmTurn

__all__ = ["KEPT_ANSWER_CHARS", "STATE_GONE_NOTE", "Turn", "load_head"]

STATE_GONE_NOTE = (
    "the earlier state of this conversation is gone (its checkpoint expired or was deleted); this code ran in a "
    "fresh, empty session, so variables, functions and imports from earlier turns must be recreated"
)
# A committed turn's answer is kept in its head, for a retry, up to this long (cut from the start, like answers).
KEPT_ANSWER_CHARS = 8000


class Turn:
    """One turn of a conversation, under its lease: what it carries from the head read to the head write.

    `CodeTool.run_code` makes one per call, inside the conversation's lease, and awaits `run`.

    Args:
        context: The tool's settings and services.
        lease: The conversation's lease, held for the whole turn.
        turn_id: The turn's idempotency key, recorded in the head with its answer.
        conversation: The application's `Conversation`, if given: the state starts from its checkpoints, and its
            usage and new checkpoint are recorded in it.

    Attributes:
        conversation_id: The conversation (the lease's).
        head: The conversation's head as read under the lease (None before its first turn): the head write expects
            its version, and a turn ID it has committed is answered from it.
        start: The state the turn starts from: the head, or the conversation's own checkpoints.
        history: The checkpoints the next head keeps, newest first (known once the session is loaded).
        notes: Notes for the model, at the end of the answer.
    """

    def __init__(
        self, context: TurnContext, lease: Lease, turn_id: str, conversation: Conversation | None = None
    ) -> None:
        self.context = context
        self.lease = lease
        self.conversation_id = lease.conversation_id
        self.turn_id = turn_id
        self.conversation = conversation
        self.head: Head | None = None
        self.start: Head | None = None
        self.history: tuple[bytes, ...] = ()
        self.notes: list[str] = []

    async def run(self, code: str, setup: bool) -> str:
        """Run ``code`` as this turn and return the answer; see `CodeTool.run_code`.

        A turn ID the head has committed returns the committed answer, and the code does not run again.
        """
        read, self.head = self.lease.head_read()
        if not read:
            self.head = await self.context.read_head(self.conversation_id)
        done = self.head.turn(self.turn_id) if self.head is not None else None
        if done is not None:
            return self._replayed(done)
        self.notes = cancelled_notes(self.head)
        self.start = self.head if self.conversation is None else conversation_head(self.conversation)
        at = self.start.checkpoint_id if self.start is not None else None
        cancelled: BaseException | None = None
        context = self.context
        async with context.warm.turn(
            self.conversation_id, at, context.new_session, room_needed=context.pool_full
        ) as warm:
            session = warm.session
            await self._load(warm)
            dropped_before = frozenset(d.name for d in session.manifest.dropped) if session.manifest else frozenset()
            try:
                # The answer of the turn whose dump dropped a variable named it; the run would name it again.
                # The dump always follows a run that ends: asked for with it, it costs no round trip of its own.
                run = await session.run(code, external_lookup=context.tools, setup=setup, then_dump=True)
                result = without_dropped_notes(run)
            except RunCancelled as exc:
                result, cancelled = without_dropped_notes(exc.result), exc
                if result.status == "lost":  # it did not stop in time and its worker was killed: nothing to save
                    self._count(result)
                    raise
                self.notes.append(CANCELLED_NOTE + (", ".join(result.assigned) or "none") + ")")
            except WorkerLost as exc:
                self._count(exc.result if isinstance(exc.result, RunResult) else RunResult(status="lost"))
                return self._lost(exc)
            # The state is saved even when the turn is being cancelled: shielded, and awaited to its end.
            save = asyncio.ensure_future(self._save(warm, result, dropped_before))
            try:
                answer = await asyncio.shield(save)
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
                answer = await save
        if cancelled is not None:
            raise cancelled
        return answer

    async def _load(self, warm: WarmTurn) -> None:
        """Bring the turn's session to its start, and learn the history the next head keeps."""
        start = self.start
        # A warm session holds exactly the checkpoint this turn starts from: nothing to load.
        if warm.reused and start is not None and start.checkpoint_id is not None:
            self.history = (start.checkpoint_id, *start.history)
        else:
            self.history = await load_head(self.context, warm.session, start, self.notes)

    def _replayed(self, done: TurnRecord) -> str:
        """The answer of a turn ID the head has committed, recording its state in the conversation if it missed it."""
        conversation, head = self.conversation, self.head
        if conversation is not None and head is not None and conversation.last_turn_id != self.turn_id:
            # Committed by a writer that died before saving the conversation: adopt the turn's state, once.
            if head.turns and head.turns[0].turn_id == self.turn_id and head.checkpoint_id is not None:
                conversation.record_turn(head.checkpoint_id, self.turn_id)
        return replayed(done)

    def _count(self, result: RunResult, *, bytes_stored: int = 0) -> None:
        """Add a run to the conversation's usage, if the turn has a conversation."""
        if self.conversation is not None:
            count_run(self.conversation, result, bytes_stored=bytes_stored)

    def _lost(self, exc: WorkerLost) -> str:
        """The answer of a turn whose worker was lost: the head does not move."""
        self.notes.append(lost_note(exc))
        return render_answer(RunResult(status="lost"), self.notes, max_chars=self.context.max_answer_chars)

    async def _save(self, warm: WarmTurn, result: RunResult, dropped_before: frozenset[str]) -> str:
        """Dump the session, move the head (reading it back after a failed write); the turn's answer."""
        session = warm.session
        try:
            new_id = await session.dump()
            warm.dumped(new_id, result.memory_bytes)
            dropped = dropped_in_turn(session.manifest, dropped_before, result)
            if dropped is not None:
                self.notes.append(dropped)  # this turn's answer says what was not saved
        except WorkspaceQuotaExceeded as exc:
            self.notes.append(f"{exc}; this call was not saved: the next call starts from the state before it")
            self._count(result)
            return render_answer(result, self.notes, max_chars=self.context.max_answer_chars)
        except WorkerLost as exc:
            self._count(dataclasses.replace(result, status="lost"))
            return self._lost(exc)
        self._count(result, bytes_stored=session.bytes_stored)
        answer = await self._commit(new_id, result)
        if self.conversation is not None:
            self.conversation.record_turn(new_id, self.turn_id)
        return answer

    async def _commit(self, new_id: bytes, result: RunResult) -> str:
        """Move the head to ``new_id`` with the turn's record, giving the lease back with it; the turn's answer.

        Raises:
            Conflict: Another turn moved the head (read back: this turn's write did not land).
            StorageError: The write failed and the head read back does not show it.
            TurnOutcomeUnknown: The write or the read-back did not finish: the turn may be saved or not.
        """
        context, lease, turn_id = self.context, self.lease, self.turn_id
        answer = render_answer(result, self.notes, max_chars=context.max_answer_chars)
        record = TurnRecord(
            turn_id, answer if len(answer) <= KEPT_ANSWER_CHARS else cut_answer(answer, KEPT_ANSWER_CHARS)
        )
        write = context.heads.compare_and_set(
            self.conversation_id,
            self.head.version if self.head is not None else None,
            new_id,
            history=self.history,
            owner=lease.owner,
            release_lease=True,
            turn=record,
        )
        try:
            await context.bounded(write)
        except (TimeoutError, Conflict, StorageError) as exc:
            # The write may have landed although it reported a failure (a reply lost on the way back, a retried
            # request on S3): read the head back before saying anything about it.
            current = await self._read_back(exc)
            if current is None or (current.turn(turn_id) is None and current.checkpoint_id != new_id):
                if isinstance(exc, TimeoutError):
                    raise TurnOutcomeUnknown(
                        f"saving turn {turn_id!r} of conversation {self.conversation_id!r} did not finish within "
                        f"{context.storage_timeout_s:g} s (storage_timeout_s) and the head does not show it yet; it "
                        f"may still land: run the turn again with turn_id={turn_id!r} (it will not run twice)",
                        conversation_id=self.conversation_id,
                        turn_id=turn_id,
                    ) from exc
                raise
            if current.lease_owner != lease.owner:
                lease.released_with_head()
            committed = current.turn(turn_id)
            return committed.answer if committed is not None and committed.answer is not None else answer
        lease.released_with_head()
        return answer

    async def _read_back(self, error: BaseException) -> Head | None:
        """Read the head after a failed write, retrying within one storage deadline.

        Raises:
            TurnOutcomeUnknown: The head could not be read.
        """
        context, conversation_id, turn_id = self.context, self.conversation_id, self.turn_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (context.storage_timeout_s or 10.0)
        delay = 0.05
        while True:
            try:
                return await context.bounded(context.heads.get(conversation_id), max(deadline - loop.time(), 0.01))
            except (TimeoutError, StorageError) as exc:
                if loop.time() + delay >= deadline:
                    why = str(error) or f"no answer within {context.storage_timeout_s:g} s"
                    raise TurnOutcomeUnknown(
                        f"saving turn {turn_id!r} of conversation {conversation_id!r} failed ({why}) and reading "
                        f"the head back failed too ({exc or 'no answer'}): the turn may or may not be saved; run it "
                        f"again with turn_id={turn_id!r}: if it was saved you get its answer and it does not run twice",
                        conversation_id=conversation_id,
                        turn_id=turn_id,
                    ) from error
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)


async def load_head(
    context: TurnContext, session: AsyncSession, head: Head | None, notes: list[str]
) -> tuple[bytes, ...]:
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
                notes.append(fallback_note(context, lost, checkpoint_id))
            return candidates
    notes.append(STATE_GONE_NOTE)
    return candidates


def fallback_note(context: TurnContext, lost: list[str], loaded: bytes) -> str:
    try:
        saved = datetime.fromtimestamp(context.pool.keyring.parse_id(loaded).created_at, UTC)
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
