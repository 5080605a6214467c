"""The leases of `CodeTool`'s turns: one turn at a time per conversation, across processes and servers.

`TurnLeases` takes a conversation's lease in the head store (after an asyncio lock in this process), renews it while
the turn runs, and gives it back with retries of its own when the turn failed, so a storage fault never strands a
conversation: the same holder takes its own lease over at once, everyone else waits at most one ttl. A held lease is
a `Lease`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from snapcell.errors import ConversationBusy, SnapcellError, StorageTimeout
from snapcell.heads import AsyncHeads, Head, HeadStore, RecordHeads, call_head_store, new_lease_owner

__all__ = ["Lease", "TurnLeases", "describe"]

log = logging.getLogger("snapcell")
_POLL_MIN_S = 0.01
_POLL_MAX_S = 0.25
# A failed turn waits this long for its lease to be given back before it reports; retries go on in the background.
RELEASE_WAIT_S = 2.0
_T = TypeVar("_T")


def describe(exc: BaseException) -> str:
    """An exception as a message shows it: its text, or its type when it has none (a bare ``TimeoutError()``)."""
    return str(exc) or type(exc).__name__


class Lease:
    """A conversation's lease, held by one turn (`TurnLeases.hold` yields it).

    Attributes:
        conversation_id: The conversation.
        owner: The lease's owner in the head store (``"<holder>/<turn>"``); a head write under the lease names it.
        held: False once a head update gave the lease back (`released_with_head`): nothing is left to give back.
    """

    __slots__ = ("_head", "_read", "conversation_id", "held", "owner")

    def __init__(self, conversation_id: str, owner: str) -> None:
        self.conversation_id = conversation_id
        self.owner = owner
        self.held = True
        self._read = False
        self._head: Head | None = None

    def released_with_head(self, read_back: Head | None = None) -> None:
        """Note that a head update (``release_lease=True``) gave the lease back.

        Args:
            read_back: After a write whose answer was lost: the head read back that shows the write; the lease is
                noted as given back only if that head no longer names it.
        """
        if read_back is None or read_back.lease_owner != self.owner:
            self.held = False

    def keep_head(self, head: Head | None) -> None:
        """Keep the head that the store returned with the lease, in the same call."""
        self._read, self._head = True, head

    def head_read(self) -> tuple[bool, Head | None]:
        """The head read when the lease was taken, once: (False, None) when it was not read then."""
        read, head = self._read, self._head
        self._read, self._head = False, None
        return read, head

    def __repr__(self) -> str:
        return f"Lease({self.conversation_id!r}, {self.owner!r}, held={self.held})"


class TurnLeases:
    """Take, renew and give back the leases of one tool's turns; bound every head-store call by a deadline.

    Args:
        heads: The head store.
        ttl_s: Seconds a lease lasts; renewed every third of that while the turn runs.
        wait_s: Seconds a turn waits for the lease before `ConversationBusy`.
        storage_timeout_s: Deadline of each head-store call, or None.
        holder_id: The holder part of this tool's lease owners (``"<holder>/<turn>"``).
    """

    def __init__(
        self, heads: HeadStore, *, ttl_s: float, wait_s: float, storage_timeout_s: float | None, holder_id: str
    ) -> None:
        self.heads = heads
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.storage_timeout_s = storage_timeout_s
        self.holder_id = holder_id
        self._aheads = AsyncHeads(heads)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._background: set[asyncio.Task[None]] = set()
        # Heads read with the lease, in the same store call (one thread hand-off and transaction fewer per turn), by
        # lease owner; only for the stores' own get/acquire_lease (a subclass overriding either is called as usual).
        cls: type[object] = type(heads)
        self._read_with_lease = isinstance(heads, RecordHeads) and all(
            getattr(cls, name) is getattr(RecordHeads, name) for name in ("get", "acquire_lease")
        )

    @property
    def release_wait_s(self) -> float:
        """How long a failed turn waits for its lease to be given back before it reports: 2 s, at most
        ``storage_timeout_s`` (the release goes on in the background after that)."""
        return min(RELEASE_WAIT_S, self.storage_timeout_s or RELEASE_WAIT_S)

    async def bounded(self, call: Awaitable[_T], timeout_s: float | None = None) -> _T:
        """Await a head-store call for at most ``timeout_s`` (default ``storage_timeout_s``).

        Raises:
            StorageTimeout: This deadline passed (its message and ``timeout_s`` name the limit that applied), or the
                store gave up by itself first: its own `StorageTimeout` (a store's deadline, shorter than this one),
                raised unchanged, or another `TimeoutError`, raised as a `StorageTimeout` with the time waited.
        """
        limit = self.storage_timeout_s if timeout_s is None else timeout_s
        if limit is None:
            return await call
        deadline = asyncio.timeout(limit)
        started = time.monotonic()
        try:
            async with deadline:
                return await call
        except StorageTimeout:
            raise  # the store's own deadline: its error names it
        except TimeoutError as exc:
            if deadline.expired():
                which = "storage_timeout_s" if timeout_s is None else "what was left of storage_timeout_s"
                message, waited = f"the head store did not answer within {limit:.3g} s ({which})", limit
            else:
                waited = time.monotonic() - started
                message = f"the head store gave up after {max(waited, 0.001):.3g} s ({describe(exc)})"
            raise StorageTimeout(message, operation="head store call", timeout_s=waited) from exc

    def timed_out(self, what: str, exc: TimeoutError) -> StorageTimeout:
        """The error for a head-store read or lease call that did not answer in time; ``what`` names the call.

        Its message and ``timeout_s`` say which deadline passed (this tool's ``storage_timeout_s``, or the store's
        own, shorter one) and how long it was.
        """
        return StorageTimeout(
            f"{what} timed out: {describe(exc)}; nothing was changed, the turn may be retried",
            operation=what,
            timeout_s=exc.timeout_s if isinstance(exc, StorageTimeout) else self.storage_timeout_s or 0.0,
        )

    @contextlib.asynccontextmanager
    async def hold(self, conversation_id: str) -> AsyncIterator[Lease]:
        """Hold the in-process lock and the head store's lease of a conversation; yield the `Lease`.

        The body calls `Lease.released_with_head` when a head update gave the lease back; otherwise it is given
        back here.
        """
        lock = self._locks.get(conversation_id)
        if lock is None:
            lock = self._locks[conversation_id] = asyncio.Lock()
        async with lock:
            lease = Lease(conversation_id, new_lease_owner(self.holder_id))
            try:
                await self._acquire(lease)
            except ConversationBusy:
                raise
            except BaseException:
                # A store error may hide a lease that was granted after all: give it back (a no-op otherwise).
                self.in_background(self.release(conversation_id, lease.owner))
                raise
            renewer = asyncio.create_task(self._renew(conversation_id, lease.owner))
            try:
                yield lease
            finally:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
                if lease.held:
                    # The turn failed, maybe because the store did: give the lease back with retries of its own,
                    # waiting a little for it; if the store stays down, this holder's next turn takes it over at
                    # once and everyone else's when it expires.
                    release = self.in_background(self.release(conversation_id, lease.owner))
                    await asyncio.wait({release}, timeout=self.release_wait_s)

    async def _acquire(self, lease: Lease) -> None:
        deadline = time.monotonic() + self.wait_s
        delay = _POLL_MIN_S
        while not await self._try_lease(lease):
            if time.monotonic() >= deadline:
                raise await self._busy(lease.conversation_id)
            await asyncio.sleep(min(delay * random.uniform(0.5, 1.5), max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _POLL_MAX_S)

    async def _try_lease(self, lease: Lease) -> bool:
        """One attempt at the lease, under the storage deadline.

        The attempt runs in a thread that cannot be stopped: if this turn is cancelled or gives up waiting, the
        lease is given back once the attempt finishes, or it would keep the conversation locked for a whole ttl.
        """
        conversation_id, owner = lease.conversation_id, lease.owner
        attempt = asyncio.ensure_future(self._attempt(lease))
        try:
            return await self.bounded(asyncio.shield(attempt))
        except TimeoutError as exc:
            self.in_background(self.release(conversation_id, owner, after=attempt))
            raise self.timed_out(f"taking the lease of conversation {conversation_id!r}", exc) from exc
        except asyncio.CancelledError:
            self.in_background(self.release(conversation_id, owner, after=attempt))
            raise

    async def _attempt(self, lease: Lease) -> bool:
        conversation_id, owner = lease.conversation_id, lease.owner
        if not self._read_with_lease:
            return await self._aheads.acquire_lease(conversation_id, owner, self.ttl_s)
        heads = self.heads
        assert isinstance(heads, RecordHeads)
        taken, head = await call_head_store(
            heads, lambda: heads.acquire_lease_and_get(conversation_id, owner, self.ttl_s)
        )
        if taken:
            lease.keep_head(head)
        return taken

    async def _busy(self, conversation_id: str) -> ConversationBusy:
        """The error of a turn that waited ``lease_wait_s``: who holds the conversation, and is it still alive."""
        record = None
        if isinstance(self.heads, RecordHeads):
            with contextlib.suppress(SnapcellError, TimeoutError):
                record = await self.bounded(asyncio.to_thread(self.heads.record, conversation_id))
        waited = f"this turn waited {self.wait_s:g} s (lease_wait_s)"
        if record is None or record.lease_owner is None or not isinstance(self.heads, RecordHeads):
            return ConversationBusy(
                f"another turn of conversation {conversation_id!r} is running; {waited}: wait for it to finish and "
                "try again",
                conversation_id=conversation_id,
            )
        now = self.heads.clock()
        left = max(record.lease_expires_at - now, 0.0)
        since = now - record.lease_renewed_at if 0 < record.lease_renewed_at <= now else None
        renewed = f"{since:.0f} s ago" if since is not None else "at an unknown time"
        stale = record.lease_stale(now)
        if stale:
            message = (
                f"conversation {conversation_id!r} is held by a stale lease: its holder {record.lease_owner!r} stopped "
                f"renewing it (last renewed {renewed}; it crashed, or lost the head store); {waited}; the "
                f"conversation is free when the lease expires, in {left:.0f} s: try again then"
            )
        else:
            message = (
                f"another turn of conversation {conversation_id!r} is running (its holder {record.lease_owner!r} "
                f"renewed its lease {renewed}); {waited}: wait for it to finish and try again"
            )
        return ConversationBusy(
            message,
            conversation_id=conversation_id,
            holder=record.lease_owner,
            stale=stale,
            lease_expires_at=record.lease_expires_at,
        )

    async def _renew(self, conversation_id: str, owner: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                if not await self.bounded(self._aheads.renew_lease(conversation_id, owner, self.ttl_s)):
                    return  # lost: the head update will be refused with Conflict
            except (SnapcellError, TimeoutError) as exc:
                # A failed renewal is not the turn's failure: try again next time; if the lease really lapses,
                # the head update is refused with Conflict and nothing is overwritten.
                log.warning(
                    "snapcell: renewing the lease of conversation %r failed: %s", conversation_id, describe(exc)
                )

    async def release(self, conversation_id: str, owner: str, *, after: asyncio.Future[bool] | None = None) -> None:
        """Give a lease back, retrying until it would have expired anyway; first wait for ``after`` (an attempt)."""
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ttl_s
        delay = 0.05
        while True:
            try:
                await self.bounded(self._aheads.release_lease(conversation_id, owner))
                return
            except (SnapcellError, TimeoutError) as exc:
                if loop.time() + delay >= deadline:
                    log.warning(
                        "snapcell: giving back the lease of conversation %r failed: %s; it expires by itself",
                        conversation_id,
                        describe(exc),
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def in_background(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def aclose(self) -> None:
        """Finish giving back leases, for up to ``storage_timeout_s``; then stop trying."""
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=self.storage_timeout_s or RELEASE_WAIT_S)
            for task in pending:
                task.cancel()
