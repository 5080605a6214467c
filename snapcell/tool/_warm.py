"""Warm conversations: a conversation's live session kept for a while after its turn, to skip the next load.

A kept session is reused only when the conversation's head still names the checkpoint that session dumped at the end
of its turn (and dropped nothing from it that a load would not bring back from the definitions and setup cells it
keeps), so the namespace it holds is what a load would restore, and when its worker still answers (it may have died
while it was kept: a run sent to it would fail as if the code had killed it). Any other head (another server's turn,
a rewind, a failed head write), or a worker that does not answer, checks the warm session in and the turn loads as
usual. Sessions are kept for ``keep_warm_s``, at most ``max_sessions`` of them and at most ``max_bytes`` of worker
memory in all; the oldest go first. Evicted and expired sessions are checked in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from snapcell.errors import SnapcellError
from snapcell.interpreter import lost_at_load
from snapcell.session import AsyncSession

__all__ = ["WarmSessions", "WarmTurn"]

log = logging.getLogger("snapcell")


@dataclass(slots=True)
class _Kept:
    stack: AsyncExitStack
    session: AsyncSession
    checkpoint_id: bytes
    memory_bytes: int
    timer: asyncio.TimerHandle | None = None
    until: float = 0.0  # when it is due to be checked in, on `WarmSessions.clock`


@dataclass(slots=True)
class WarmTurn:
    """One turn's session: reused warm (``reused``) or freshly checked out; call `dumped` once it is saved."""

    session: AsyncSession
    reused: bool
    _stack: AsyncExitStack
    _dumped: bytes | None = field(default=None)
    _memory_bytes: int = field(default=0)

    def dumped(self, checkpoint_id: bytes, memory_bytes: int | None) -> None:
        """Offer the session for keeping: its namespace is now exactly checkpoint ``checkpoint_id``."""
        manifest = self.session.manifest
        if self.session.checkpoint_id == checkpoint_id and manifest is not None and not lost_at_load(manifest):
            self._dumped = checkpoint_id
            self._memory_bytes = memory_bytes or 0


class WarmSessions:
    """Keeps live sessions of recent conversations (see the module docstring).

    Args:
        keep_warm_s: Seconds a session is kept after its turn; 0 keeps none.
        max_sessions: Sessions kept at once.
        max_bytes: Worker memory (as last reported by each run) the kept sessions may hold in all; None: no bound.
        clock: Monotonic seconds, which the keep time is counted on; injectable for tests (a timer wakes at the
            keep time and checks in what the clock says is due; every turn also checks in what is due).

    Attributes:
        reused: Turns that ran in a kept session.
        dead: Kept sessions found with a worker that no longer answered, and checked in instead of reused.
    """

    def __init__(
        self,
        *,
        keep_warm_s: float,
        max_sessions: int,
        max_bytes: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_warm_s = keep_warm_s
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.clock = clock
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        # Check-ins of finished turns, started by `start_checkins` once the turn's answer is returned.
        self._checkins: list[Coroutine[Any, Any, None]] = []
        self._waiting = 0  # turns waiting for a new checkout
        self.reused = 0
        self.dead = 0

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def leaving(self) -> int:
        """Sessions being checked in right now (each still holds its worker slot for a few milliseconds)."""
        return len(self._closing) + len(self._checkins)

    def start_checkins(self) -> None:
        """Start checking in the sessions of finished turns; `CodeTool.run_code` calls it as its answer is returned.

        Started any earlier, a check-in's first step (a worker's kill, a thread for its scratch mount) would run at the
        turn's next wait for the event loop (giving its lease back), and the answer would wait for it.
        """
        checkins, self._checkins = self._checkins, []
        for checkin in checkins:
            self._in_background(checkin)

    @contextlib.asynccontextmanager
    async def turn(
        self,
        conversation_id: str,
        head_checkpoint: bytes | None,
        checkout: Callable[[], AbstractAsyncContextManager[AsyncSession]],
        *,
        room_needed: Callable[[], bool] = lambda: False,
    ) -> AsyncIterator[WarmTurn]:
        """Give the turn its session: the warm one if it still matches the head, else a new checkout.

        Args:
            conversation_id: The conversation.
            head_checkpoint: The checkpoint the conversation's head names (None before its first turn).
            checkout: Checks out a new session (``pool.checkout(...)``).
            room_needed: True while a new checkout would wait for a slot that a warm session holds; the
                oldest warm sessions are checked in until it is False.
        """
        self._check_in_due()
        kept = self._kept.pop(conversation_id, None)
        if kept is not None and kept.timer is not None:
            kept.timer.cancel()
        if (
            kept is not None
            and head_checkpoint is not None
            and kept.checkpoint_id == head_checkpoint
            and await self._answers(kept)
        ):
            self.reused += 1
            turn = WarmTurn(kept.session, True, kept.stack)
        else:
            if kept is not None:
                await self._checkin(kept.stack)
            while self._kept and room_needed():
                await self._evict(next(iter(self._kept)))
            stack = AsyncExitStack()
            self._waiting += 1
            try:
                session = await stack.enter_async_context(checkout())
            finally:
                self._waiting -= 1
            turn = WarmTurn(session, False, stack)
        try:
            yield turn
        except BaseException as exc:
            await turn._stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        # A turn waiting for a checkout gets this session's worker rather than waiting behind a warm session.
        if turn._dumped is None or self.keep_warm_s <= 0 or self.max_sessions < 1 or self._waiting:
            # The turn is saved and its answer ready: checking the session in (killing its worker, removing its
            # scratch directory: milliseconds) happens after the answer is returned, off the turn's latency
            # (`start_checkins`). The worker's slot stays taken until then, so no checkout gets ahead of it.
            self._checkins.append(self._checkin(turn._stack))
            return
        await self._keep(conversation_id, _Kept(turn._stack, turn.session, turn._dumped, turn._memory_bytes))

    async def _answers(self, kept: _Kept) -> bool:
        """Whether a kept session's worker is alive and answers (a round trip); one that does not is not reused."""
        try:
            alive = await kept.session.ping()
        except SnapcellError as exc:
            log.debug("snapcell: a warm session did not answer: %s", exc)
            alive = False
        if not alive:
            self.dead += 1
            log.debug("snapcell: a warm session's worker is gone; the turn loads its checkpoint instead")
        return alive

    async def _keep(self, conversation_id: str, kept: _Kept) -> None:
        self._kept[conversation_id] = kept
        kept.until = self.clock() + self.keep_warm_s
        kept.timer = asyncio.get_running_loop().call_later(self.keep_warm_s, self._expire, conversation_id, kept)
        while len(self._kept) > self.max_sessions or (
            self.max_bytes is not None and len(self._kept) > 1 and self._bytes() > self.max_bytes
        ):
            await self._evict(next(iter(self._kept)))
        if self.max_bytes is not None and self._bytes() > self.max_bytes:
            await self._evict(conversation_id)  # alone over the bound

    def _bytes(self) -> int:
        return sum(kept.memory_bytes for kept in self._kept.values())

    def _expire(self, conversation_id: str, kept: _Kept) -> None:
        """The timer of a kept session: check it in if it is due (on the clock), else look again when it will be."""
        if self._kept.get(conversation_id) is not kept:
            return
        left = kept.until - self.clock()
        if left > 0:
            kept.timer = asyncio.get_running_loop().call_later(left, self._expire, conversation_id, kept)
            return
        self._check_in_due()

    def _check_in_due(self) -> None:
        """Check in (in the background) every kept session past its keep time: a timer may fire late."""
        now = self.clock()
        for conversation_id, kept in list(self._kept.items()):
            if kept.until <= now:
                del self._kept[conversation_id]  # at once: a turn of its conversation must not take it now
                if kept.timer is not None:
                    kept.timer.cancel()
                self._in_background(self._checkin(kept.stack))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _checkin(stack: AsyncExitStack) -> None:
        try:
            await stack.aclose()
        except SnapcellError as exc:  # checking in a session whose worker is gone; nothing is lost
            log.debug("snapcell: checking in a session failed: %s", exc)

    async def _evict(self, conversation_id: str) -> None:
        kept = self._kept.pop(conversation_id, None)
        if kept is None:
            return
        if kept.timer is not None:
            kept.timer.cancel()
        try:
            await kept.stack.aclose()
        except SnapcellError as exc:  # checking in a session whose worker is gone; nothing is lost
            log.debug("snapcell: checking in a warm session failed: %s", exc)

    async def aclose(self) -> None:
        """Check every warm session in, and wait for the check-ins still under way."""
        self.start_checkins()
        while self._kept:
            await self._evict(next(iter(self._kept)))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
