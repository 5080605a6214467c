"""One turn of `CodeTool`, a `Turn`: head read, warm session or load, run, dump, head write (with read-back).

The tool holds the conversation's lease around `Turn.run`; everything here runs under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from snapcell.conversation import Conversation
from snapcell.errors import (
    CheckpointExpired,
    CheckpointNotFound,
    RunCancelled,
    SnapcellError,
    TurnOnOtherBranch,
    WorkerLost,
    WorkspaceQuotaExceeded,
)
from snapcell.heads import Head, TurnRecord
from snapcell.interpreter import RunResult
from snapcell.session import AsyncSession
from snapcell.tool._answer import (
    cut_answer,
    dropped_in_turn,
    failed_host_call,
    lost_note,
    pause_ttl_note,
    render_answer,
    replayed,
    without_dropped_notes,
)
from snapcell.tool._context import HeadMove
from snapcell.tool._records import (
    CANCELLED_LOST_NOTE,
    CANCELLED_NOTE,
    HELD_NOTE,
    cancelled_notes,
    conversation_head,
    count_run,
)

if TYPE_CHECKING:
    from snapcell.tool._context import TurnContext
    from snapcell.tool._lease import Lease
    from snapcell.tool._warm import WarmTurn

__all__ = ["KEPT_ANSWER_CHARS", "STATE_GONE_NOTE", "Turn", "load_head", "retry_advice", "shows_write"]

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
        answer: ``(value, error)`` for a turn that resumes the paused run of the conversation's state with that
            answer (`AsyncSession.resume`) instead of running code.

    Attributes:
        conversation_id: The conversation (the lease's).
        head: The conversation's head as read under the lease (None before its first turn): the head write expects
            its version, and a turn ID it has committed is answered from it.
        start: The state the turn starts from: the head, or the conversation's own checkpoints.
        history: The checkpoints the next head keeps, newest first (known once the session is loaded).
        notes: Notes for the model, at the end of the answer.
        result: The turn's run once it ended (None before, and for a committed turn ID: nothing ran).
        saved: Whether the head moved to this turn's state (or had, for a committed turn ID).
    """

    def __init__(
        self,
        context: TurnContext,
        lease: Lease,
        turn_id: str,
        conversation: Conversation | None = None,
        *,
        answer: tuple[Any, BaseException | None] | None = None,
    ) -> None:
        self.context = context
        self.answer = answer
        self.lease = lease
        self.conversation_id = lease.conversation_id
        self.turn_id = turn_id
        self.conversation = conversation
        self.head: Head | None = None
        self.start: Head | None = None
        self.history: tuple[bytes, ...] = ()
        self.notes: list[str] = []
        self.result: RunResult | None = None
        self.saved = False

    async def run(self, code: str, setup: bool) -> str:
        """Run ``code`` as this turn and return the answer; see `CodeTool.run_code`.

        A turn ID the head has committed returns the committed answer, and the code does not run again. With a
        conversation, the turn's result, checkpoint and usage are recorded in it, and stored when the tool keeps
        conversations (also when the turn is cancelled: then the cancellation is raised once it is stored).
        """
        keeper = self.context.keeper
        if keeper is not None and self.conversation is not None:
            await keeper.before_turn(self.conversation)
        read, self.head = self.lease.head_read()
        if not read:
            self.head = await self.context.read_head(self.conversation_id)
        done = self.head.turn(self.turn_id) if self.head is not None else None
        if done is not None:
            self.saved = True
            answer, adopted = self._replayed(done)
            await self._keep(answer, adopted)
            return answer
        answer, checkpoint_id, cancelled = await self._turn(code, setup)
        # Recorded and stored even when the turn is being cancelled: shielded, and awaited to its end.
        keep = asyncio.ensure_future(self._keep(answer, checkpoint_id))
        try:
            await asyncio.shield(keep)
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
            await keep
        if cancelled is not None:
            raise cancelled
        return answer

    async def _turn(self, code: str, setup: bool) -> tuple[str, bytes | None, BaseException | None]:
        """Load, run and save; the answer, the checkpoint the head moved to (None: it did not move), and the
        cancellation to raise once the turn is recorded (None: it was not cancelled)."""
        self.notes = cancelled_notes(self.head)
        self.start = self.head if self.conversation is None else conversation_head(self.conversation)
        at = self.start.checkpoint_id if self.start is not None else None
        cancelled: BaseException | None = None
        context = self.context
        # A lighter worker when neither the code nor the checkpoint (a paused run's cell included) names numpy or
        # pandas, as far as this tool has seen the checkpoint (see `ModuleHints`).
        hint = context.modules.hint(at, code)
        checkout = context.new_session if hint is None else functools.partial(context.new_session, modules_hint=hint)
        async with context.warm.turn(self.conversation_id, at, checkout, room_needed=context.pool_full) as warm:
            session = warm.session
            await self._load(warm)
            if not warm.reused:
                context.modules.learn(session)
            dropped_before = frozenset(d.name for d in session.manifest.dropped) if session.manifest else frozenset()
            try:
                # The answer of the turn whose dump dropped a variable named it; the run would name it again.
                # The dump always follows a run that ends: asked for with it, it costs no round trip of its own.
                if self.answer is not None:
                    value, error = self.answer
                    run = await session.resume(value, error=error, external_lookup=context.tools)
                else:
                    run = await session.run(
                        code,
                        external_lookup=context.tools,
                        setup=setup,
                        then_dump=True,
                        raise_on_lost=True,
                        pausing=context.pausing,
                    )
                result = self.result = without_dropped_notes(run)
                if result.paused is not None:
                    self.notes.append(pause_ttl_note(context.pool.ttl_s))
            except RunCancelled as exc:
                result, cancelled = without_dropped_notes(exc.result), exc
                self.result = result
                if result.status == "lost":  # it did not stop in time and its worker was killed: nothing to save
                    self._count(result)
                    self.notes.append(CANCELLED_LOST_NOTE)
                    return render_answer(result, self.notes, max_chars=context.max_answer_chars), None, exc
                self.notes.append(CANCELLED_NOTE + (", ".join(result.assigned) or "none") + ")")
            except WorkerLost as exc:
                self._count(exc.result if isinstance(exc.result, RunResult) else RunResult(status="lost"))
                return self._lost(exc), None, None
            if cancelled is None and context.hold_on_host_error and failed_host_call(result) is not None:
                # Nothing is dumped: the session is checked in, and the next turn loads the head as it was.
                self._count(result)
                self.notes.append(HELD_NOTE)
                return render_answer(result, self.notes, max_chars=context.max_answer_chars), None, None
            # The state is saved even when the turn is being cancelled: shielded, and awaited to its end.
            save = asyncio.ensure_future(self._save(warm, result, dropped_before))
            try:
                answer, new_id = await asyncio.shield(save)
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
                answer, new_id = await save
        return answer, new_id, cancelled

    async def _keep(self, answer: str, checkpoint_id: bytes | None) -> None:
        """Record the turn in its conversation (if it has one): the answer as its tool call's result (when the tool
        keeps conversations), the checkpoint the head moved to; then store it as the durability mode says."""
        conversation, keeper = self.conversation, self.context.keeper
        if conversation is None:
            return
        if keeper is None:
            if checkpoint_id is not None:
                conversation.record_turn(checkpoint_id, self.turn_id)
            return
        index = conversation.add_tool_result(self.turn_id, answer)
        if checkpoint_id is not None:
            conversation.record_turn(checkpoint_id, self.turn_id, index=index)
        await keeper.keep(conversation)

    async def _load(self, warm: WarmTurn) -> None:
        """Bring the turn's session to its start, and learn the history the next head keeps."""
        start = self.start
        # A warm session holds exactly the checkpoint this turn starts from: nothing to load.
        if warm.reused and start is not None and start.checkpoint_id is not None:
            self.history = (start.checkpoint_id, *start.history)
        else:
            self.history = await load_head(self.context, warm.session, start, self.notes)

    def _replayed(self, done: TurnRecord) -> tuple[str, bytes | None]:
        """The answer of a turn ID the head has committed, and its checkpoint if the conversation missed it (to be
        recorded in it).

        Raises:
            TurnOnOtherBranch: The turn started from another state than the conversation stands on; nothing was
                adopted.
        """
        conversation, head = self.conversation, self.head
        if conversation is None or head is None:
            return replayed(done), None
        states = _turn_states(done, head)
        if states is None:
            return replayed(done), None  # an earlier snapcell's record, no longer the head's latest: nothing to check
        started_from, produced = states
        if produced.hex() in conversation.checkpoints.values() or _descends(head, conversation.checkpoint_id, produced):
            return replayed(done), None  # the conversation holds the turn's state already
        if started_from != conversation.checkpoint_id:
            # Its state is that of another branch (the conversation was truncated or forked since the turn ran, or
            # another copy of it ran the turn): adopting it would put that branch's variables under this transcript.
            raise TurnOnOtherBranch(
                f"turn {self.turn_id!r} of conversation {self.conversation_id!r} was committed on another branch: "
                f"it started from {_short(started_from)}, and this conversation stands on "
                f"{_short(conversation.checkpoint_id)} (it was truncated or forked since, or another copy of it ran "
                "the turn); its answer and state were not adopted, nothing ran and nothing changed. To run the code "
                "on this conversation's state, call again with a new turn_id",
                conversation_id=self.conversation_id,
                turn_id=self.turn_id,
                started_from=started_from,
                expected=conversation.checkpoint_id,
            )
        # Committed by a writer that died before saving the conversation: adopt the turn's state, once.
        return replayed(done), produced

    def _count(self, result: RunResult, *, bytes_stored: int = 0) -> None:
        """Add a run to the conversation's usage, if the turn has a conversation."""
        if self.conversation is not None:
            count_run(self.conversation, result, bytes_stored=bytes_stored, turn_id=self.turn_id)

    def _lost(self, exc: WorkerLost) -> str:
        """The answer of a turn whose worker was lost: the head does not move."""
        self.notes.append(lost_note(exc))
        self.result = RunResult(status="lost")
        return render_answer(self.result, self.notes, max_chars=self.context.max_answer_chars)

    async def _save(
        self, warm: WarmTurn, result: RunResult, dropped_before: frozenset[str]
    ) -> tuple[str, bytes | None]:
        """Dump the session, move the head (reading it back after a failed write); the turn's answer and the
        checkpoint the head moved to (None: it did not move)."""
        session = warm.session
        try:
            new_id = await session.dump()
            warm.dumped(new_id, result.memory_bytes)
            self.context.modules.learn(session)
            dropped = dropped_in_turn(session.manifest, dropped_before, result)
            if dropped is not None:
                self.notes.append(dropped)  # this turn's answer says what was not saved
        except WorkspaceQuotaExceeded as exc:
            self.notes.append(f"{exc}; this call was not saved: the next call starts from the state before it")
            self._count(result)
            return render_answer(result, self.notes, max_chars=self.context.max_answer_chars), None
        except WorkerLost as exc:
            self._count(dataclasses.replace(result, status="lost"))
            return self._lost(exc), None
        self._count(result, bytes_stored=session.bytes_stored)
        return await self._commit(new_id, result), new_id

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
            turn_id,
            answer if len(answer) <= KEPT_ANSWER_CHARS else cut_answer(answer, KEPT_ANSWER_CHARS),
            checkpoint_id=new_id,
            started_from=self.start.checkpoint_id if self.start is not None else None,
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
        current = await context.move_head(
            HeadMove(
                conversation_id=self.conversation_id,
                write=write,
                turn_id=turn_id,
                landed=lambda head: shows_write(head, turn_id, new_id) or head.checkpoint_id == new_id,
                what=f"saving turn {turn_id!r} of conversation {self.conversation_id!r}",
                again=retry_advice(turn_id),
            )
        )
        lease.released_with_head(current)
        self.saved = True
        committed = current.turn(turn_id) if current is not None else None
        return committed.answer if committed is not None and committed.answer is not None else answer


def shows_write(head: Head, turn_id: str, checkpoint_id: bytes | None) -> bool:
    """Whether ``head`` records the write of ``turn_id`` that moved it to ``checkpoint_id``.

    The turn ID is enough for a record of an earlier snapcell (it keeps no checkpoint), and for one that names
    none (a move to an empty session).
    """
    record = head.turn(turn_id)
    return record is not None and (not record.states_known or record.checkpoint_id == checkpoint_id)


def retry_advice(turn_id: str) -> str:
    """What a caller does after `TurnOutcomeUnknown` of a turn, and what is guaranteed then."""
    return (
        f"run the turn again with turn_id={turn_id!r}: if it was saved, you get its answer and its code does not run "
        "again; if it was not, its code runs again (and so do the host functions it calls); either way the "
        "conversation's state holds the turn once"
    )


def _turn_states(record: TurnRecord, head: Head) -> tuple[bytes | None, bytes] | None:
    """Where a committed turn started and the checkpoint it produced; None when that cannot be told.

    A record of an earlier snapcell keeps neither; while its turn is the head's latest, the head tells both: the
    turn produced the head's checkpoint and started from the one before it.
    """
    if record.checkpoint_id is not None:
        return record.started_from, record.checkpoint_id
    if head.turns and head.turns[0].turn_id == record.turn_id and head.checkpoint_id is not None:
        return (head.history[0] if head.history else None), head.checkpoint_id
    return None


def _descends(head: Head, state: bytes | None, ancestor: bytes) -> bool:
    """Whether ``state`` is ``ancestor`` or was made from it by later turns, as the head's turn records tell it."""
    for _ in range(len(head.turns) + 1):
        if state is None:
            return False
        if state == ancestor:
            return True
        # Each turn's checkpoint is new (a dump), so at most one record produced it.
        made = next((t for t in head.turns if t.checkpoint_id == state), None)
        if made is None:
            return False
        state = made.started_from
    return False


def _short(checkpoint_id: bytes | None) -> str:
    # The end of an ID: its start is a format byte and a timestamp, the same for checkpoints made close together.
    return "an empty session" if checkpoint_id is None else f"checkpoint ...{checkpoint_id.hex()[-16:]}"


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
