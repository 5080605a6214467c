"""`AsyncHeads`: a `HeadStore` for async callers, each call in a worker thread or, when it cannot wait, at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

from ._heads import Head, HeadStore, TurnRecord
from ._sqlite import SQLiteHeads, WouldWait

__all__ = ["AsyncHeads", "call_head_store"]

_T = TypeVar("_T")


async def call_head_store(heads: HeadStore, call: Callable[[], _T]) -> _T:
    """``call()``, an operation of ``heads``: in a worker thread, or on this (the event loop's) thread when it
    needs no waiting.

    A `SQLiteHeads` (itself, not a subclass, whose methods may do anything) answers most calls without waiting: the
    connection is free and no other process holds the write lock. Such a call, about 40 us of SQLite, costs less
    than the two thread wake-ups of a hand-off; one that would wait (`SQLiteHeads.without_waiting`) changes nothing
    and goes to a thread as any other store's call does.
    """
    if type(heads) is SQLiteHeads:
        try:
            return heads.without_waiting(call)
        except WouldWait:
            pass
    return await asyncio.to_thread(call)


class AsyncHeads:
    """Async face of a `HeadStore`: the same methods as coroutines; reads and leases run by `call_head_store`, head
    writes in a worker thread.

    Attributes:
        sync: The wrapped head store.
    """

    __slots__ = ("sync",)

    def __init__(self, heads: HeadStore) -> None:
        self.sync = heads

    async def get(self, conversation_id: str) -> Head | None:
        """See `HeadStore.get`."""
        return await call_head_store(self.sync, lambda: self.sync.get(conversation_id))

    async def compare_and_set(
        self,
        conversation_id: str,
        expected_version: str | None,
        checkpoint_id: bytes | None,
        *,
        history: Sequence[bytes] = (),
        owner: str | None = None,
        release_lease: bool = False,
        turn: TurnRecord | None = None,
    ) -> str:
        """See `HeadStore.compare_and_set`."""
        # A turn is passed only when there is one, so head stores written before turns existed keep working.
        extra = {} if turn is None else {"turn": turn}
        # A head write is synced at its commit (`SQLiteHeads`): always in a thread, never on the event loop.
        return await asyncio.to_thread(
            lambda: self.sync.compare_and_set(
                conversation_id,
                expected_version,
                checkpoint_id,
                history=history,
                owner=owner,
                release_lease=release_lease,
                **extra,
            )
        )

    async def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float) -> bool:
        """See `HeadStore.acquire_lease`."""
        return await call_head_store(self.sync, lambda: self.sync.acquire_lease(conversation_id, owner, ttl_s))

    async def renew_lease(self, conversation_id: str, owner: str, ttl_s: float) -> bool:
        """See `HeadStore.renew_lease`."""
        return await call_head_store(self.sync, lambda: self.sync.renew_lease(conversation_id, owner, ttl_s))

    async def release_lease(self, conversation_id: str, owner: str) -> None:
        """See `HeadStore.release_lease`."""
        await call_head_store(self.sync, lambda: self.sync.release_lease(conversation_id, owner))
