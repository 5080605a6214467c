"""Conversation heads: each conversation's current checkpoint ID, its history, and the lease of a turn in progress.

A `HeadStore` is sync at its core, like a `Store`; `AsyncHeads` wraps one for async callers. Every backend is the
same small state machine over one record per conversation, applied atomically by the backend (a lock in memory, a
``BEGIN IMMEDIATE`` transaction in SQLite, a conditional write on S3). The transitions live here, once.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from snapcell.errors import ConfigError, Conflict, HeadCorrupt, InvalidKey

__all__ = [
    "DEFAULT_MAX_HISTORY",
    "AsyncHeads",
    "Head",
    "HeadStore",
    "MemoryHeads",
    "RecordHeads",
    "default_heads",
    "open_heads",
    "validate_conversation_id",
]

DEFAULT_MAX_HISTORY = 50
MAX_CONVERSATION_ID = 128
_CONVERSATION_ID = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,127}\Z")


def validate_conversation_id(conversation_id: str) -> str:
    """Check a conversation ID and return it unchanged.

    A conversation ID is 1 to 128 characters of letters, digits, ``.``, ``_``, ``:`` and ``-``, not starting with
    ``.``; it is safe to use inside a storage key or a file name.

    Raises:
        InvalidKey: The ID is malformed; nothing was read or written.
    """
    if not isinstance(conversation_id, str):
        raise InvalidKey(f"a conversation ID must be a str, not {type(conversation_id).__name__}")
    if not _CONVERSATION_ID.match(conversation_id):
        shown = conversation_id if len(conversation_id) <= 40 else conversation_id[:40] + "..."
        raise InvalidKey(
            f"invalid conversation ID {shown!r}: use 1 to {MAX_CONVERSATION_ID} characters of letters, digits, "
            "'.', '_', ':' and '-', not starting with '.' (hash longer or other IDs first)"
        )
    return conversation_id


@dataclass(frozen=True, slots=True)
class Head:
    """A conversation's head as a head store holds it.

    Attributes:
        checkpoint_id: The current checkpoint ID, or None for an empty session.
        history: Earlier checkpoint IDs, newest first, bounded by the store's ``max_history``.
        version: Opaque token that changes on every head change; pass it to `HeadStore.compare_and_set`.
            Lease changes leave it alone. ``""`` only inside a store, for a record that holds a lease but no head.
        updated_at: When the head last moved (seconds since the epoch).
        lease_owner: Who holds the lease of a turn in progress, if anyone (it may have expired).
        lease_expires_at: When that lease expires (seconds since the epoch); 0 without a lease.
    """

    checkpoint_id: bytes | None = None
    history: tuple[bytes, ...] = ()
    version: str = ""
    updated_at: float = 0.0
    lease_owner: str | None = None
    lease_expires_at: float = 0.0

    def lease_held(self, now: float) -> bool:
        """True when someone holds an unexpired lease at ``now``."""
        return self.lease_owner is not None and self.lease_expires_at > now


@runtime_checkable
class HeadStore(Protocol):
    """One head per conversation, moved only by compare-and-swap, plus a lease marking a turn in progress.

    Implemented by `MemoryHeads`, `SQLiteHeads` and `S3Heads`.
    """

    def get(self, conversation_id: str) -> Head | None:
        """Return the conversation's head, or None when it has none yet.

        Raises:
            InvalidKey: The conversation ID is malformed.
            StorageError: The backend failed; the call may be retried.
        """
        ...

    def compare_and_set(
        self,
        conversation_id: str,
        expected_version: str | None,
        checkpoint_id: bytes | None,
        *,
        history: Sequence[bytes] = (),
        owner: str | None = None,
        release_lease: bool = False,
    ) -> str:
        """Move the head if it is still at ``expected_version``; return the new version.

        Args:
            conversation_id: The conversation.
            expected_version: The version read before the turn, or None to create the head (create-only).
            checkpoint_id: The new current checkpoint ID (None for an empty session).
            history: The new history, newest first; cut to the store's ``max_history``.
            owner: When given, the write also requires that ``owner`` holds the lease (expired or not).
            release_lease: Release ``owner``'s lease in the same write.

        Raises:
            Conflict: The head moved, exists (create-only), was deleted, or the lease belongs to someone else;
                nothing was written.
            InvalidKey: The conversation ID is malformed.
            StorageError: The backend failed; nothing or everything was written, the call may be retried.
        """
        ...

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """Take the lease for ``ttl_s`` seconds unless another owner holds an unexpired one; True when taken.

        The owner that holds it may take it again (this extends it).
        """
        ...

    def renew_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """Extend ``owner``'s lease to ``now + ttl_s``; False when ``owner`` no longer holds it."""
        ...

    def release_lease(self, conversation_id: str, owner: str) -> None:
        """Drop ``owner``'s lease; nothing happens if someone else holds it now."""
        ...

    def delete(self, conversation_id: str, *, expected_version: str | None = None) -> bool:
        """Forget the conversation; with ``expected_version``, only if the head is still there. True if deleted."""
        ...

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """Yield every conversation that has a head, with the head, in no particular order.

        Args:
            corrupt: When given, a head that cannot be decoded is appended here and skipped instead of raised.

        Raises:
            HeadCorrupt: A head cannot be decoded and ``corrupt`` is None.
            StorageError: The backend failed.
        """
        ...

    def close(self) -> None:
        """Release connections; the store must not be used afterwards."""
        ...


# ----------------------------------------------------------------- transitions


class _Delete:
    """Marker returned by a transition to delete the record."""


DELETE = _Delete()
Transition = Callable[[Head | None], "Head | _Delete | None"]


def _new_version() -> str:
    # Random, so a head that returns to an earlier checkpoint (rewind) still gets a new version: no ABA.
    return secrets.token_hex(8)


def _cas(
    expected_version: str | None,
    checkpoint_id: bytes | None,
    history: Sequence[bytes],
    owner: str | None,
    release_lease: bool,
    max_history: int,
    now: float,
) -> Transition:
    def apply(record: Head | None) -> Head:
        current = record.version if record is not None else ""
        if expected_version is None and current:
            raise Conflict("the conversation already has a head; nothing was overwritten")
        if expected_version is not None and current != expected_version:
            raise Conflict(
                "another turn moved this conversation's head since it was read; nothing was overwritten "
                "(the newer head stays)"
            )
        holder = record.lease_owner if record is not None and record.lease_expires_at else None
        if owner is not None and holder != owner:
            raise Conflict(
                "this turn's lease on the conversation expired and another turn took it over; nothing was overwritten"
            )
        base = record or Head()
        lease = (None, 0.0) if release_lease else (base.lease_owner, base.lease_expires_at)
        return Head(
            checkpoint_id=None if checkpoint_id is None else bytes(checkpoint_id),
            history=tuple(bytes(h) for h in history)[:max_history],
            version=_new_version(),
            updated_at=now,
            lease_owner=lease[0],
            lease_expires_at=lease[1],
        )

    return apply


def _acquire(owner: str, ttl_s: float, now: float, *, renew_only: bool) -> Transition:
    def apply(record: Head | None) -> Head | None:
        mine = record is not None and record.lease_owner == owner and record.lease_expires_at > 0
        if renew_only and not mine:
            return None
        if record is not None and not mine and record.lease_held(now):
            return None
        return replace(record or Head(), lease_owner=owner, lease_expires_at=now + ttl_s)

    return apply


def _release(owner: str) -> Transition:
    def apply(record: Head | None) -> Head | _Delete | None:
        if record is None or record.lease_owner != owner:
            return None
        if not record.version:
            return DELETE  # a lease-only record: nothing else to keep
        return replace(record, lease_owner=None, lease_expires_at=0.0)

    return apply


def _delete(expected_version: str | None, now: float, deleted: list[bool]) -> Transition:
    def apply(record: Head | None) -> Head | _Delete | None:
        deleted.clear()  # a backend may retry a transition after a lost race
        if record is None or (expected_version is not None and record.version != expected_version):
            return None
        if record.lease_held(now) and expected_version is not None:
            return None  # a turn is in progress: cleanup leaves the conversation to it
        deleted.append(True)
        return DELETE

    return apply


def _check_lease_args(owner: str, ttl_s: float) -> None:
    if not isinstance(owner, str) or not owner:
        raise ConfigError("a lease owner must be a non-empty string")
    if not isinstance(ttl_s, int | float) or ttl_s <= 0:
        raise ConfigError(f"a lease ttl must be a positive number of seconds, not {ttl_s!r}")


class RecordHeads:
    """The `HeadStore` methods over two primitives a backend supplies: ``_read`` and atomic ``_update``.

    ``_update(conversation_id, transition)`` reads the record, calls ``transition(record)`` and, atomically with the
    read, writes the result (a `Head`), deletes the record (`DELETE`) or writes nothing (None); it returns what was
    written, or None. A transition may raise `Conflict`, which propagates with nothing written.

    Args:
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        clock: Returns the current time in seconds; injectable for tests.
    """

    def __init__(self, *, max_history: int = DEFAULT_MAX_HISTORY, clock: Callable[[], float] = time.time) -> None:
        if not isinstance(max_history, int) or max_history < 0:
            raise ConfigError(f"max_history must be a non-negative integer, not {max_history!r}")
        self.max_history = max_history
        self.clock = clock

    def _read(self, conversation_id: str) -> Head | None:
        raise NotImplementedError

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        raise NotImplementedError

    def get(self, conversation_id: str) -> Head | None:
        """See `HeadStore.get`."""
        record = self._read(validate_conversation_id(conversation_id))
        return record if record is not None and record.version else None

    def compare_and_set(
        self,
        conversation_id: str,
        expected_version: str | None,
        checkpoint_id: bytes | None,
        *,
        history: Sequence[bytes] = (),
        owner: str | None = None,
        release_lease: bool = False,
    ) -> str:
        """See `HeadStore.compare_and_set`."""
        validate_conversation_id(conversation_id)
        if expected_version == "":
            raise ConfigError("expected_version must be a version read from the store, or None to create")
        release = release_lease and owner is not None
        transition = _cas(expected_version, checkpoint_id, history, owner, release, self.max_history, self.clock())
        written = self._update(conversation_id, transition)
        if written is None:  # pragma: no cover - a CAS transition always writes or raises
            raise Conflict("the head could not be written; nothing was overwritten")
        return written.version

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """See `HeadStore.acquire_lease`."""
        validate_conversation_id(conversation_id)
        _check_lease_args(owner, ttl_s)
        now = self.clock() if now is None else now
        return self._update(conversation_id, _acquire(owner, ttl_s, now, renew_only=False)) is not None

    def renew_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        """See `HeadStore.renew_lease`."""
        validate_conversation_id(conversation_id)
        _check_lease_args(owner, ttl_s)
        now = self.clock() if now is None else now
        return self._update(conversation_id, _acquire(owner, ttl_s, now, renew_only=True)) is not None

    def release_lease(self, conversation_id: str, owner: str) -> None:
        """See `HeadStore.release_lease`."""
        self._update(validate_conversation_id(conversation_id), _release(owner))

    def delete(self, conversation_id: str, *, expected_version: str | None = None) -> bool:
        """See `HeadStore.delete`."""
        deleted: list[bool] = []
        self._update(validate_conversation_id(conversation_id), _delete(expected_version, self.clock(), deleted))
        return bool(deleted)

    def close(self) -> None:
        """Nothing to release by default."""


class MemoryHeads(RecordHeads):
    """Heads in a dict, for tests and examples; safe across threads, not across processes.

    Args: as for `RecordHeads`.
    """

    def __init__(self, *, max_history: int = DEFAULT_MAX_HISTORY, clock: Callable[[], float] = time.time) -> None:
        super().__init__(max_history=max_history, clock=clock)
        self._records: dict[str, Head] = {}
        self._lock = threading.Lock()

    def _read(self, conversation_id: str) -> Head | None:
        with self._lock:
            return self._records.get(conversation_id)

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        with self._lock:
            result = transition(self._records.get(conversation_id))
            if isinstance(result, _Delete):
                self._records.pop(conversation_id, None)
                return None
            if result is not None:
                self._records[conversation_id] = result
            return result

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`; memory heads are never corrupt."""
        with self._lock:
            items = [(cid, head) for cid, head in self._records.items() if head.version]
        return iter(items)

    def __repr__(self) -> str:
        return f"MemoryHeads({len(self._records)} conversations)"


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
    ) -> str:
        """See `HeadStore.compare_and_set`."""
        return await asyncio.to_thread(
            lambda: self.sync.compare_and_set(
                conversation_id,
                expected_version,
                checkpoint_id,
                history=history,
                owner=owner,
                release_lease=release_lease,
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


def default_heads(store: object) -> HeadStore:
    """The head store that goes with a checkpoint store.

    A `LocalStore` gets `SQLiteHeads` in ``<root>/.heads.sqlite3`` (a dot-file, so store scans, usage and quota
    ignore it), an `S3Store` gets `S3Heads` under its prefix, a `MemoryStore` gets `MemoryHeads`.

    Raises:
        ConfigError: The store is of another kind; pass ``heads=`` explicitly.
    """
    from ._heads_s3 import S3Heads
    from ._heads_sqlite import SQLiteHeads
    from ._local import LocalStore
    from ._memory import MemoryStore
    from ._s3 import S3Store

    if isinstance(store, LocalStore):
        return SQLiteHeads(store.root / ".heads.sqlite3")
    if isinstance(store, S3Store):
        return S3Heads(store)
    if isinstance(store, MemoryStore):
        return MemoryHeads()
    raise ConfigError(f"no default head store for {store!r}; pass heads=SQLiteHeads(path) or heads=S3Heads(store)")


def open_heads(url: str, *, must_exist: bool = False, **options: object) -> HeadStore:
    """Open the head store a URL names: ``sqlite:///abs/path``, ``sqlite://rel/path``, ``s3://bucket/prefix``
    (heads under ``prefix/heads/``; ``options`` go to `open_store`) or ``memory://``.

    With ``must_exist`` (cleanup's mode, where a head store that is wrongly empty would let heads be deleted), a
    SQLite file is never created and ``memory://``, always empty, is refused.

    Raises:
        ConfigError: Unknown scheme or malformed URL; with ``must_exist``, no such SQLite file, or ``memory://``.
    """
    from ._config import open_store
    from ._heads_s3 import S3Heads
    from ._heads_sqlite import SQLiteHeads
    from ._s3 import S3Store

    scheme, sep, rest = url.partition("://") if isinstance(url, str) else ("", "", "")
    if scheme == "sqlite" and rest and not options:
        return SQLiteHeads(rest, create=not must_exist)
    if scheme == "memory" and not options:
        if must_exist:
            raise ConfigError("a memory:// head store is always empty here; give the head store the sessions use")
        return MemoryHeads()
    if scheme == "s3":
        store = open_store(url, **options)  # type: ignore[arg-type]
        if isinstance(store, S3Store):
            heads = S3Heads(store)
            heads._owns_store = True
            return heads
    raise ConfigError(f"invalid head store URL {url!r}; use sqlite:///path, s3://bucket/prefix or memory://")
