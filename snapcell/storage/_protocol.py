"""The `Store` protocol, key validation and the async wrapper shared by every backend."""

from __future__ import annotations

import asyncio
import contextvars
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from snapcell.errors import ConfigError, InvalidKey, ObjectTooLarge, StorageTimeout

__all__ = [
    "DEFAULT_TTL_S",
    "MAX_KEY_LENGTH",
    "SEGMENT",
    "AsyncStore",
    "BoundedGet",
    "BulkDelete",
    "ObjectInfo",
    "Store",
    "call_deadline",
    "storage_deadline",
    "validate_key",
    "validate_prefix",
]

_T = TypeVar("_T")
# The monotonic time by which every store call made in this context must give up; see `storage_deadline`.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("snapcell_storage_deadline", default=None)
# How long the async wrapper waits past a deadline for the store's own, more precise, error before giving up.
_BACKSTOP_S = 1.0
# Largest put of an in-memory store run in the event loop's thread (its copy of 1 MiB takes about 0.1 ms).
_INLINE_PUT_BYTES = 1024 * 1024

# How long a checkpoint is kept by default: seven days, after which cleanup deletes it and loading it fails.
DEFAULT_TTL_S = 7 * 86400.0
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
    """Opaque bytes under validated keys; every backend (memory, local directory, S3) implements this.

    A store may also have an ``in_memory`` attribute: true when none of its operations waits for anything (no I/O,
    no lock held for long), so that `AsyncStore` may run them in the event loop's thread.
    """

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


@contextmanager
def storage_deadline(seconds: float | None) -> Iterator[None]:
    """Make every store call inside the block give up ``seconds`` from now, with `StorageTimeout`.

    Deadlines nest: the earliest one wins. The deadline lives in a context variable, so it follows the calls
    `AsyncStore` runs in worker threads; `S3Store` stops retrying and fails when it passes, and `AsyncStore` stops
    waiting for any backend. ``None`` adds no deadline.

    Args:
        seconds: Time from now, in seconds; must be positive.

    Raises:
        ConfigError: ``seconds`` is not a positive number.
    """
    if seconds is None:
        yield
        return
    check_timeout_s(seconds)
    deadline = time.monotonic() + seconds
    current = _DEADLINE.get()
    token = _DEADLINE.set(deadline if current is None else min(current, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def call_deadline(timeout_s: float | None = None) -> float | None:
    """Return the monotonic time by which a store call starting now must finish, or None for no deadline.

    It is the earliest of ``now + timeout_s`` and the deadline of any enclosing `storage_deadline` block.
    """
    current = _DEADLINE.get()
    own = None if timeout_s is None else time.monotonic() + timeout_s
    if current is None or own is None:
        return own if current is None else current
    return min(current, own)


def check_timeout_s(seconds: float | None) -> None:
    """Check a storage timeout: ``None`` or a positive, finite number of seconds.

    Raises:
        ConfigError: It is anything else.
    """
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0
    ):
        raise ConfigError(f"a storage timeout must be a positive number of seconds, not {seconds!r}")


class AsyncStore:
    """Async face of a `Store`: the same methods as coroutines, each run in a worker thread.

    The event loop is never blocked by storage I/O. A store whose ``in_memory`` attribute is true (`MemoryStore`)
    does no I/O: its calls run in the event loop's thread, without the hand-off to a thread and back (a put of more
    than 1 MiB, whose copy would hold up the loop, and a listing still go to a thread). Each method's behaviour and
    errors are those of its sync twin on the wrapped store; ``close``/``aclose`` close the wrapped store.

    A call's deadline is the earliest of the method's ``timeout_s=``, the wrapper's ``timeout_s`` and any enclosing
    `storage_deadline`. It reaches the worker thread, so `S3Store` gives up by then with its own `StorageTimeout`;
    the wrapper also stops waiting shortly after it and raises `StorageTimeout` itself, whatever the backend (the
    abandoned call still finishes in its thread; a put that finishes late is complete, never partial).

    A store that enforces its own per-request deadline (``enforces_deadline``, like `S3Store` with
    `S3Config.storage_timeout_s`) needs nothing more, and a large upload or download made of many requests is
    not cut short by default. For any other store the wrapper's default is the store's ``timeout_s`` attribute
    (e.g. `LocalStore(timeout_s=...)` on a network file system), enforced by the wrapper.

    Args:
        store: The synchronous store to wrap.
        timeout_s: Default deadline of every call, in seconds; ``None`` for the default described above.

    Attributes:
        sync: The wrapped synchronous store.
        timeout_s: The default deadline of every call, or None.
    """

    __slots__ = ("_in_memory", "sync", "timeout_s")

    def __init__(self, store: Store, *, timeout_s: float | None = None) -> None:
        check_timeout_s(timeout_s)
        own = getattr(store, "timeout_s", None)
        enforced = getattr(store, "enforces_deadline", False) is True
        if timeout_s is None and not enforced and isinstance(own, int | float) and not isinstance(own, bool):
            timeout_s = float(own)
        self.sync = store
        self.timeout_s: float | None = timeout_s
        self._in_memory = getattr(store, "in_memory", False) is True

    @property
    def url(self) -> str:
        """The wrapped store's URL."""
        return self.sync.url

    async def _call(
        self,
        operation: str,
        key: str | None,
        timeout_s: float | None,
        fn: Callable[[], _T],
        *,
        inline: bool = False,
    ) -> _T:
        """Run ``fn`` in a thread within the call's deadline, or at once in this thread when ``inline``."""
        check_timeout_s(timeout_s)
        limits = [t for t in (timeout_s, self.timeout_s) if t is not None]
        deadline = call_deadline(min(limits) if limits else None)
        if deadline is None:
            return fn() if inline else await asyncio.to_thread(fn)
        remaining = deadline - time.monotonic()
        what = f"{operation} of {key!r}" if key is not None else operation
        if remaining <= 0:
            raise StorageTimeout(
                f"storage {what} on {self.url} not started: its deadline had already passed; retry later",
                operation=operation,
                key=key,
                timeout_s=0.0,
            )
        token = _DEADLINE.set(deadline)  # to_thread copies this context, so the store sees the deadline too
        try:
            if inline:  # done at once: no deadline to watch
                return fn()
            # A little past the deadline, so a store that enforces it itself (S3) reports its own, richer error.
            return await asyncio.wait_for(asyncio.to_thread(fn), remaining + min(_BACKSTOP_S, remaining / 10))
        except TimeoutError as exc:
            if isinstance(exc, StorageTimeout):
                raise
            raise StorageTimeout(
                f"storage {what} on {self.url} did not finish within {remaining:.3g} s; "
                "the store is slow or unreachable, retry later",
                operation=operation,
                key=key,
                timeout_s=remaining,
            ) from exc
        finally:
            _DEADLINE.reset(token)

    async def put(
        self,
        key: str,
        data: bytes | bytearray,
        *,
        expires_at: float | None = None,
        overwrite: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """See `Store.put`; ``timeout_s`` bounds this call (see the class)."""
        await self._call(
            "put",
            key,
            timeout_s,
            lambda: self.sync.put(key, data, expires_at=expires_at, overwrite=overwrite),
            inline=self._in_memory and len(data) <= _INLINE_PUT_BYTES,
        )

    async def get(self, key: str, *, timeout_s: float | None = None) -> bytes:
        """See `Store.get`; ``timeout_s`` bounds this call (see the class)."""
        return await self._call("get", key, timeout_s, lambda: self.sync.get(key), inline=self._in_memory)

    async def get_at_most(self, key: str, max_bytes: int, *, timeout_s: float | None = None) -> bytes:
        """See `BoundedGet.get_at_most`; a store without it is read whole, then refused if too large."""
        sync = self.sync
        if isinstance(sync, BoundedGet):
            return await self._call(
                "get", key, timeout_s, lambda: sync.get_at_most(key, max_bytes), inline=self._in_memory
            )
        data = await self._call("get", key, timeout_s, lambda: self.sync.get(key), inline=self._in_memory)
        if len(data) > max_bytes:
            raise too_large(key, len(data), max_bytes, self.url)
        return data

    async def touch(self, key: str, *, timeout_s: float | None = None) -> None:
        """See `Store.touch`; ``timeout_s`` bounds this call (see the class)."""
        await self._call("touch", key, timeout_s, lambda: self.sync.touch(key), inline=self._in_memory)

    async def delete(self, key: str, *, timeout_s: float | None = None) -> None:
        """See `Store.delete`; ``timeout_s`` bounds this call (see the class)."""
        await self._call("delete", key, timeout_s, lambda: self.sync.delete(key), inline=self._in_memory)

    async def scan(self, prefix: str = "", *, timeout_s: float | None = None) -> list[ObjectInfo]:
        """See `Store.scan`; returns the whole listing as a list; ``timeout_s`` bounds the whole listing."""
        return await self._call("scan", prefix or None, timeout_s, lambda: list(self.sync.scan(prefix)))

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
