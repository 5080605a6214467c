"""`MemoryStore`: a process-local store for tests and examples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from snapcell.errors import CheckpointNotFound, ObjectExists

from ._protocol import ObjectInfo, too_large, validate_key, validate_prefix

__all__ = ["MemoryStore"]


@dataclass(frozen=True, slots=True)
class _Entry:
    data: bytes
    created_at: float
    expires_at: float | None


class MemoryStore:
    """Keep objects in a dict guarded by a lock; every instance starts empty and nothing is persisted.

    Args:
        name: Optional label, shown in `url` (``memory://name``).
        now: Clock for ``created_at`` (seconds since the epoch); inject one to test expiry without sleeping.
    """

    def __init__(self, name: str = "", *, now: Callable[[], float] = time.time) -> None:
        self._name = name
        self._now = now
        self._lock = threading.Lock()
        self._objects: dict[str, _Entry] = {}
        # Every operation is a dict access under a lock held for no longer than that: `AsyncStore` runs them in the
        # event loop's thread rather than hand each to a thread. Not for a subclass, which may override one with a
        # call that waits.
        self.in_memory = type(self) is MemoryStore

    @property
    def url(self) -> str:
        """``memory://`` followed by the store's name."""
        return f"memory://{self._name}"

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """See `Store.put`; ``expires_at`` is recorded but never acted on."""
        validate_key(key)
        entry = _Entry(bytes(data), self._now(), expires_at)
        with self._lock:
            if not overwrite and key in self._objects:
                raise ObjectExists(f"object {key!r} already exists in {self.url}; checkpoints are never overwritten")
            self._objects[key] = entry

    def get(self, key: str) -> bytes:
        """See `Store.get`."""
        validate_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise CheckpointNotFound(f"no object {key!r} in {self.url}", key=key)
        return entry.data

    def get_at_most(self, key: str, max_bytes: int) -> bytes:
        """See `BoundedGet.get_at_most`."""
        data = self.get(key)
        if len(data) > max_bytes:
            raise too_large(key, len(data), max_bytes, self.url)
        return data

    def touch(self, key: str) -> None:
        """See `Store.touch`."""
        validate_key(key)
        with self._lock:
            entry = self._objects.get(key)
            if entry is None:
                raise CheckpointNotFound(f"no object {key!r} in {self.url}", key=key)
            self._objects[key] = _Entry(entry.data, self._now(), entry.expires_at)

    def delete(self, key: str) -> None:
        """See `Store.delete`."""
        validate_key(key)
        with self._lock:
            self._objects.pop(key, None)

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """See `Store.scan`; yields a snapshot taken when the call is made."""
        validate_prefix(prefix)
        with self._lock:
            items = sorted(((k, e) for k, e in self._objects.items() if k.startswith(prefix)), key=lambda item: item[0])
        return (ObjectInfo(key=key, size=len(entry.data), created_at=entry.created_at) for key, entry in items)

    def close(self) -> None:
        """Do nothing; the objects stay readable until the store is garbage collected."""

    def __repr__(self) -> str:
        return f"MemoryStore({self._name!r})"
