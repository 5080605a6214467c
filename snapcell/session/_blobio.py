"""Moving a checkpoint's blobs between the store and a session: fetch, write once, refresh.

What a worker sent is checked before it gets here (`Verifier.check_dump` in `_verify.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from snapcell.checkpoint import BlobRef, Dumped, blob_key
from snapcell.errors import CheckpointCorrupt, CheckpointNotFound, ObjectExists, ObjectTooLarge
from snapcell.storage import AsyncStore

__all__ = ["BlobIO"]

_CONCURRENCY = 8
T = TypeVar("T")


class BlobIO:
    """Reads and writes the blobs of one signing key's namespace in a store.

    Args:
        store: The store.
        namespace: The blob namespace of the key (`Keyring.blob_namespace`).
    """

    def __init__(self, store: AsyncStore, namespace: str) -> None:
        self._store = store
        self.namespace = namespace

    def key(self, name: str) -> str:
        """The store key of the blob named ``name`` (its content hash, hex)."""
        return blob_key(bytes.fromhex(name), self.namespace)

    async def fetch(self, refs: Iterable[BlobRef]) -> dict[str, bytes]:
        """Fetch blobs concurrently; the runner checks each one's hash before use.

        Raises:
            CheckpointCorrupt: A blob is missing from the store.
            StorageError: The store failed.
        """

        async def fetch(ref: BlobRef) -> tuple[str, bytes]:
            try:
                # A stored blob is never larger than its raw bytes plus the codec byte (whoever wrote it, at any
                # level: encoders store raw what does not compress): a bigger object is not read.
                return ref.hash, await self._store.get_at_most(self.key(ref.hash), ref.raw_bytes + 1)
            except ObjectTooLarge as exc:
                raise CheckpointCorrupt(
                    f"blob {ref.hash} of this checkpoint is {exc.size} bytes in the store, more than the "
                    f"{ref.raw_bytes} bytes it holds; it was replaced, and the checkpoint cannot be loaded"
                ) from exc
            except CheckpointNotFound as exc:
                raise CheckpointCorrupt(
                    f"blob {ref.hash} of this checkpoint is missing from the store; the checkpoint cannot be "
                    "loaded (was the store's blobs/ prefix cleaned by hand?)"
                ) from exc

        return dict(await _bounded(fetch(ref) for ref in refs))

    async def store(self, dumped: Dumped, expires_at: float) -> bool:
        """Write a dump's new blobs (create-only), and refresh the old ones it reuses.

        Call it only with a dump that passed `Verifier.check_dump`: a new blob is stored under the name it came with.

        Returns:
            False when a blob the dump relies on has vanished from the store (the caller dumps again
            without relying on earlier blobs).

        Raises:
            StorageError: The store failed.
        """

        async def put(name: str, data: bytes) -> bool:
            key = self.key(name)
            try:
                await self._store.put(key, data, expires_at=expires_at)
                return True
            except ObjectExists:
                pass  # already stored (content addressing), maybe long ago: refresh it to outlive this checkpoint
            try:
                await self._store.touch(key)
            except CheckpointNotFound:
                await self._store.put(key, data, expires_at=expires_at)  # deleted in between: write it again
            return True

        async def touch(name: str) -> bool:
            try:
                await self._store.touch(self.key(name))
            except CheckpointNotFound:
                return False
            return True

        await _bounded(put(name, data) for name, data in dumped.new_blobs.items())
        return all(await _bounded(touch(name) for name in dumped.refresh))


async def _bounded(coros: Iterable[Awaitable[T]]) -> list[T]:
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def run(coro: Awaitable[T]) -> T:
        async with limit:
            return await coro

    return await asyncio.gather(*(run(c) for c in coros))
