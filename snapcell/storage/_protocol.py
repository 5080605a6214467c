"""The `Store` protocol, key validation and the async wrapper shared by every backend."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from snapcell.errors import InvalidKey, ObjectTooLarge

__all__ = [
    "MAX_KEY_LENGTH",
    "SEGMENT",
    "AsyncStore",
    "BoundedGet",
    "BulkDelete",
    "ObjectInfo",
    "Store",
    "validate_key",
    "validate_prefix",
]

MAX_KEY_LENGTH = 512
SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")
_KEY_RULES = "segments of letters, digits, '.', '_' and '-' separated by '/', none empty or starting with '.'"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object as `Store.scan` reports it.

    Attributes:
        key: The object's key, relative to the store.
        size: Its size in bytes.
        created_at: When it was written, in seconds since the epoch.
    """

    key: str
    size: int
    created_at: float


@runtime_checkable
class Store(Protocol):
    """Opaque bytes under validated keys; every backend (memory, local directory, S3) implements this."""

    @property
    def url(self) -> str:
        """The URL that `open_store` would open this store from."""
        ...

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """Store ``data`` under ``key``; create-only unless ``overwrite``.

        Args:
            key: A key accepted by `validate_key`.
            data: The bytes to store.
            expires_at: When the object may be deleted (seconds since the epoch); a hint, recorded where the
                backend can, never enforced on the hot path.
            overwrite: Replace an existing object instead of refusing.

        Raises:
            InvalidKey: The key is malformed; nothing was written.
            ObjectExists: The key is taken and ``overwrite`` is false; the existing object is untouched.
            StorageError: The store failed; the call may be retried.
        """
        ...

    def get(self, key: str) -> bytes:
        """Return the bytes stored under ``key``.

        Raises:
            InvalidKey: The key is malformed.
            CheckpointNotFound: Nothing is stored under the key.
            StorageError: The store failed; the call may be retried.
        """
        ...

    def touch(self, key: str) -> None:
        """Reset ``key``'s creation time to now, so expiry and lifecycle rules count from now.

        Raises:
            CheckpointNotFound: No object is stored under ``key``.
            StorageError: The store failed; the call may be retried.
        """
        ...

    def delete(self, key: str) -> None:
        """Delete ``key``; a key that does not exist is not an error.

        Raises:
            InvalidKey: The key is malformed; nothing was deleted.
            StorageError: The store failed; the call may be retried.
        """
        ...

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, sorted by key; listings are paginated.

        Raises:
            InvalidKey: The prefix is malformed.
            StorageError: The store failed; the call may be retried.
        """
        ...

    def close(self) -> None:
        """Release connections and handles; the store must not be used afterwards."""
        ...


@runtime_checkable
class BulkDelete(Protocol):
    """Optional extra of a store that deletes many keys per request (S3's ``DeleteObjects``); cleanup uses it."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete every key in ``keys``; keys that do not exist are not an error."""
        ...


@runtime_checkable
class BoundedGet(Protocol):
    """Optional extra of a store that refuses an object by its size before reading it (every built-in backend)."""

    def get_at_most(self, key: str, max_bytes: int) -> bytes:
        """Return the bytes under ``key`` if there are at most ``max_bytes`` of them.

        Raises:
            ObjectTooLarge: The object is larger; nothing was read.
            CheckpointNotFound: Nothing is stored under the key.
            StorageError: The store failed; the call may be retried.
        """
        ...


def too_large(key: str, size: int, limit: int, url: str) -> ObjectTooLarge:
    """The error for an object over a bounded read's limit."""
    return ObjectTooLarge(
        f"object {key!r} in {url} is {size} bytes, over the {limit} bytes this read allows; it was not read",
        key=key,
        size=size,
        limit=limit,
    )


def validate_key(key: str) -> str:
    """Check that ``key`` is a safe storage key and return it unchanged.

    A key is made of ``/``-separated segments of ``[A-Za-z0-9._-]``; no segment is empty or starts with ``.``
    (so no ``..``), there is no leading or trailing slash, and it is at most 512 characters long.

    Args:
        key: The key to check.

    Returns:
        The same key.

    Raises:
        InvalidKey: The key is malformed; say which rule it broke.
    """
    if not isinstance(key, str):
        raise InvalidKey(f"storage key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey("storage key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"storage key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    for segment in key.split("/"):
        if not SEGMENT.match(segment):
            raise InvalidKey(f"invalid storage key {key!r}: bad segment {segment!r}; keys are {_KEY_RULES}")
    return key


def validate_prefix(prefix: str) -> str:
    """Check a scan prefix: empty, a valid key, or a valid key followed by ``/``; return it unchanged.

    Raises:
        InvalidKey: The prefix is malformed.
    """
    if prefix == "":
        return prefix
    if isinstance(prefix, str) and prefix.endswith("/"):
        validate_key(prefix[:-1])
        return prefix
    return validate_key(prefix)


class AsyncStore:
    """Async face of a `Store`: the same methods as coroutines, each run in a worker thread.

    The event loop is never blocked by storage I/O. Each method's behaviour and errors are those of its sync twin
    on the wrapped store; ``close``/``aclose`` close the wrapped store.

    Attributes:
        sync: The wrapped synchronous store.
    """

    __slots__ = ("sync",)

    def __init__(self, store: Store) -> None:
        self.sync = store

    @property
    def url(self) -> str:
        """The wrapped store's URL."""
        return self.sync.url

    async def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """See `Store.put`."""
        await asyncio.to_thread(self.sync.put, key, data, expires_at=expires_at, overwrite=overwrite)

    async def get(self, key: str) -> bytes:
        """See `Store.get`."""
        return await asyncio.to_thread(self.sync.get, key)

    async def get_at_most(self, key: str, max_bytes: int) -> bytes:
        """See `BoundedGet.get_at_most`; a store without it is read whole, then refused if too large."""
        if isinstance(self.sync, BoundedGet):
            return await asyncio.to_thread(self.sync.get_at_most, key, max_bytes)
        data = await asyncio.to_thread(self.sync.get, key)
        if len(data) > max_bytes:
            raise too_large(key, len(data), max_bytes, self.url)
        return data

    async def touch(self, key: str) -> None:
        """See `Store.touch`."""
        await asyncio.to_thread(self.sync.touch, key)

    async def delete(self, key: str) -> None:
        """See `Store.delete`."""
        await asyncio.to_thread(self.sync.delete, key)

    async def scan(self, prefix: str = "") -> list[ObjectInfo]:
        """See `Store.scan`; returns the whole listing as a list."""
        return await asyncio.to_thread(lambda: list(self.sync.scan(prefix)))

    async def close(self) -> None:
        """See `Store.close`."""
        await asyncio.to_thread(self.sync.close)

    aclose = close

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncStore({self.sync!r})"
