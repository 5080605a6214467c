"""`AsyncHeads`: a `HeadStore` for async callers, each call in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ._heads import Head, HeadStore, TurnRecord

__all__ = ["AsyncHeads"]


class AsyncHeads:
    """Async face of a `HeadStore`: the same methods as coroutines, each run in a worker thread.

    Attributes:
        sync: The wrapped head store.
    """

    __slots__ = ("sync",)

    def __init__(self, heads: HeadStore) -> None:
        self.sync = heads

    async def get(self, conversation_id: str) -> Head | None:
        """See `HeadStore.get`."""
        return await asyncio.to_thread(self.sync.get, conversation_id)

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
        return await asyncio.to_thread(self.sync.acquire_lease, conversation_id, owner, ttl_s)

    async def renew_lease(self, conversation_id: str, owner: str, ttl_s: float) -> bool:
        """See `HeadStore.renew_lease`."""
        return await asyncio.to_thread(self.sync.renew_lease, conversation_id, owner, ttl_s)

    async def release_lease(self, conversation_id: str, owner: str) -> None:
        """See `HeadStore.release_lease`."""
        await asyncio.to_thread(self.sync.release_lease, conversation_id, owner)
