"""Moving a checkpoint's blobs between the store and a session: fetch, verify, write once, refresh."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from snapcell.checkpoint import BlobRef, Dumped, blob_key, blob_raw_size, decode_blob
from snapcell.errors import CheckpointCorrupt, CheckpointNotFound, ObjectExists, ObjectTooLarge
from snapcell.storage import AsyncStore

__all__ = ["BlobIO", "ForgedBlob"]

_CONCURRENCY = 8
T = TypeVar("T")


class ForgedBlob(Exception):
    """A worker sent a blob whose content does not match its name: it is not stored."""


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
        """Write a dump's new blobs (create-only) after checking them, and refresh the old ones it reuses.

        Returns:
            False when a blob the dump relies on has vanished from the store (the caller dumps again
            without relying on earlier blobs).

        Raises:
            ForgedBlob: A new blob's content does not match its name (a compromised worker); nothing was stored.
            StorageError: The store failed.
        """
        if dumped.new_blobs:
            sizes = {ref.hash: ref.raw_bytes for ref in dumped.manifest.blobs}
            await asyncio.to_thread(_check_new_blobs, dumped, sizes)

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


def _check_new_blobs(dumped: Dumped, sizes: dict[str, int]) -> None:
    """Decode every new blob and compare its hash with its name, before anything is stored."""
    scratch = bytearray()
    for name, data in dumped.new_blobs.items():
        size = sizes.get(name)
        if size is None:
            raise ForgedBlob(f"the worker sent blob {name}, which its manifest does not list")
        if blob_raw_size(data) != size:
            # Checked against the bytes actually received before allocating: a manifest may claim any size.
            raise ForgedBlob(
                f"the worker sent blob {name} whose content does not match its name: it does not hold the {size} "
                "bytes its manifest says"
            )
        if len(scratch) < size:
            scratch = bytearray(size)
        try:
            decode_blob(data, digest=bytes.fromhex(name), into=memoryview(scratch)[:size])
        except (CheckpointCorrupt, ValueError) as exc:
            raise ForgedBlob(f"the worker sent blob {name} whose content does not match its name: {exc}") from exc


async def _bounded(coros: Iterable[Awaitable[T]]) -> list[T]:
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def run(coro: Awaitable[T]) -> T:
        async with limit:
            return await coro

    return await asyncio.gather(*(run(c) for c in coros))
