"""What a turn and a workspace operation use of the tool that runs them: `TurnContext`.

`CodeTool` builds one when it is made and hands it to each `Turn` and file operation (`_turn`, `_files`): they read
the tool's settings and services from it, so they never import the tool, and the tool imports them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from snapcell.errors import Conflict, StorageError, TurnOutcomeUnknown
from snapcell.tool._lease import describe
from snapcell.tool._modules import ModuleHints

if TYPE_CHECKING:
    from snapcell.heads import AsyncHeads, Head
    from snapcell.pool import AsyncPool
    from snapcell.session import AsyncSession
    from snapcell.tool._keeping import ConversationKeeper
    from snapcell.tool._lease import TurnLeases
    from snapcell.tool._warm import WarmSessions

__all__ = ["HeadMove", "TurnContext"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """The tool's settings and services a turn uses.

    Attributes:
        pool: The pool that runs the sessions (its keyring reads a checkpoint ID's time).
        tools: Host functions by name; the tool's own mapping, looked up at each run.
        max_answer_chars: Longest answer.
        heads: The head store, async.
        leases: Takes and gives back the conversations' leases; bounds head-store calls by the deadline.
        warm: The sessions kept warm after their turns.
        new_session: Checks out a new session with the tool's settings (limits, mounts, type checking); takes
            `AsyncPool.checkout`'s ``modules_hint``.
        keeper: Stores the conversations turns are given, or None (the application stores them).
        hold_on_host_error: A turn whose host function raised an error the script did not catch leaves the head
            where it was (``on_host_error="hold"``).
        pausing: Host functions whose call pauses the run (`CodeTool.resume` goes on from it).
        modules: The heavy modules recent checkpoints name, for each turn's ``modules_hint``.
    """

    pool: AsyncPool
    tools: Mapping[str, Callable[..., Any]]
    max_answer_chars: int
    heads: AsyncHeads
    leases: TurnLeases
    warm: WarmSessions
    new_session: Callable[..., AbstractAsyncContextManager[AsyncSession]]
    keeper: ConversationKeeper | None = None
    hold_on_host_error: bool = False
    pausing: frozenset[str] = frozenset()
    modules: ModuleHints = field(default_factory=ModuleHints)

    @property
    def storage_timeout_s(self) -> float | None:
        """Deadline of every head-store call of a turn, or None (the leases' own)."""
        return self.leases.storage_timeout_s

    def pool_full(self) -> bool:
        """Whether every worker slot of the pool is checked out (warm sessions give theirs up then).

        Sessions already being checked in do not count: their slots come free without evicting a warm session.
        """
        taken = len(self.pool._sessions) - self.warm.leaving
        return self.pool.isolation == "process" and taken >= self.pool.max_workers

    async def bounded(self, call: Awaitable[_T], timeout_s: float | None = None) -> _T:
        """Await a head-store call for at most ``timeout_s`` (default ``storage_timeout_s``); see `TurnLeases.bounded`.

        Raises:
            TimeoutError: The deadline passed (a `StorageTimeout`), or the store's own did.
        """
        return await self.leases.bounded(call, timeout_s)

    async def read_head(self, conversation_id: str) -> Head | None:
        """Read the conversation's head under the storage deadline.

        Raises:
            StorageTimeout: No answer within ``storage_timeout_s`` (or the store's own, shorter deadline).
        """
        try:
            return await self.bounded(self.heads.get(conversation_id))
        except TimeoutError as exc:
            raise self.leases.timed_out(f"reading the head of conversation {conversation_id!r}", exc) from exc

    async def move_head(self, move: HeadMove) -> Head | None:
        """Await a head write under the storage deadline, and check the outcome it reports.

        A write may land although it reported a failure: its answer was lost (a timeout, a reset connection), or a
        client's retry of it was refused because the first attempt had landed. So after any failure the head is
        read back: the write succeeded if the head shows it (``move.landed``), another writer won if it does not.

        Returns:
            None when the write answered; else the head read back, which shows the write.

        Raises:
            Conflict: Another writer moved the head (read back: this write is not in it); nothing was overwritten.
            StorageError: The write failed and the head read back does not show it: it did not land.
            TurnOutcomeUnknown: The write did not answer in time and the head does not show it yet (it may still
                land), or the head could not be read back.
        """
        try:
            await self.bounded(move.write)
            return None
        except (TimeoutError, Conflict, StorageError) as exc:
            current = await self.read_back(move, exc)
            if current is not None and move.landed(current):
                return current
            if isinstance(exc, TimeoutError):
                raise TurnOutcomeUnknown(
                    f"{move.what} did not finish ({describe(exc)}) and the head does not show it yet; it may still "
                    f"land: {move.again}",
                    conversation_id=move.conversation_id,
                    turn_id=move.turn_id,
                ) from exc
            raise

    async def read_back(self, move: HeadMove, error: BaseException) -> Head | None:
        """Read the head after a failed write, retrying within one storage deadline (10 s without one).

        Raises:
            TurnOutcomeUnknown: The head could not be read.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.storage_timeout_s or 10.0)
        delay = 0.05
        while True:
            try:
                return await self.bounded(self.heads.get(move.conversation_id), max(deadline - loop.time(), 0.01))
            except (TimeoutError, StorageError) as exc:
                if loop.time() + delay >= deadline:
                    raise TurnOutcomeUnknown(
                        f"{move.what} failed ({describe(error)}) and reading the head back failed too "
                        f"({describe(exc)}): it may or may not have landed; {move.again}",
                        conversation_id=move.conversation_id,
                        turn_id=move.turn_id,
                    ) from error
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadMove:
    """One head write and how to tell, from the head read back, whether it landed (`TurnContext.move_head`).

    Attributes:
        conversation_id: The conversation whose head moves.
        write: The write (``heads.compare_and_set(...)``), not yet awaited.
        turn_id: The ID recorded with the write (a turn's, a rewind's ...), for `TurnOutcomeUnknown`.
        landed: Whether a head read back shows this write (its turn record, its new checkpoint).
        what: What the write does, for messages ("saving turn 't1' of conversation 'c'").
        again: What a caller does when the outcome is unknown (call again with the same ``turn_id``, and what
            that does).
    """

    conversation_id: str
    write: Awaitable[str]
    turn_id: str
    landed: Callable[[Head], bool]
    what: str
    again: str
