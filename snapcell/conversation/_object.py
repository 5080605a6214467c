"""Conversations in an object store (S3, or any snapcell `Store`): one object per write, all create-only.

Under ``<prefix><id>/`` each write of a conversation is one object named by its revision (``r000000000007``),
written with a conditional create (``If-None-Match: *`` on S3): of two writers that read the same revision, one
creates the next revision's object and the other gets `Conflict`. A `save` writes the whole conversation into its
revision's object and then copies it to ``base`` (plain overwrite: only a shortcut for loading, which reads
``base`` and then the revisions after it, so a stale ``base`` costs a few more reads, never a wrong answer).
"""

from __future__ import annotations

import json
import re

from snapcell.conversation._model import storage_name
from snapcell.conversation._stores import LogConversationStore, _conflict
from snapcell.errors import CheckpointNotFound, ConfigError, ObjectExists
from snapcell.storage import Store, open_store, validate_key

__all__ = ["S3ConversationStore"]

_REVISION = re.compile(r"r(\d{12})\Z")


class S3ConversationStore(LogConversationStore):
    """Conversations in S3 (or any `Store`): a base object per conversation plus one appended object per write.

    Args:
        store: A `Store` (an `S3Store`, typically the pool's own), or a URL for `open_store`.
        prefix: Key prefix of the conversations (default ``conversations/``); the cleanup job never deletes
            anything under it.
    """

    def __init__(self, store: Store | str, *, prefix: str = "conversations/") -> None:
        self.store: Store = open_store(store) if isinstance(store, str) else store
        if not isinstance(self.store, Store):
            raise ConfigError(f"store must be a snapcell Store or a URL, not {type(store).__name__}")
        if not prefix.endswith("/"):
            raise ConfigError(f"prefix must end with '/', not {prefix!r}")
        validate_key(prefix.rstrip("/"))
        self.prefix = prefix

    def _key(self, conversation_id: str, name: str) -> str:
        return f"{self.prefix}{storage_name(conversation_id)}/{name}"

    def _revisions(self, conversation_id: str) -> list[int]:
        found = []
        for info in self.store.scan(self._key(conversation_id, "r")):
            match = _REVISION.match(info.key.rsplit("/", 1)[-1])
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except CheckpointNotFound:
            return None

    def _records(self, conversation_id: str) -> list[bytes]:
        records = []
        start = 0
        base = self._get(self._key(conversation_id, "base"))
        if base is not None:
            try:
                start = int(json.loads(base)["rev"])
                records.append(base)
            except (ValueError, KeyError, TypeError):
                start = 0  # an unreadable shortcut: read every revision instead
        expected = start + 1
        for revision in self._revisions(conversation_id):
            if revision < expected:
                continue
            if revision != expected:
                break  # revisions are contiguous; a gap means a write still landing after it: stop here
            record = self._get(self._key(conversation_id, f"r{revision:012d}"))
            if record is None:
                break
            records.append(record)
            expected += 1
        return records

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        revisions = self._revisions(conversation_id)
        found = revisions[-1] if revisions else 0
        if found != expected:
            raise _conflict(conversation_id, expected, found)
        try:
            self.store.put(self._key(conversation_id, f"r{expected + 1:012d}"), record)
        except ObjectExists:
            raise _conflict(conversation_id, expected, expected + 1) from None
        if full:
            self.store.put(self._key(conversation_id, "base"), record, overwrite=True)

    def _remove(self, conversation_id: str) -> None:
        keys = [info.key for info in self.store.scan(f"{self.prefix}{storage_name(conversation_id)}/")]
        for key in keys:
            self.store.delete(key)

    def __repr__(self) -> str:
        return f"S3ConversationStore({self.store.url!r}, prefix={self.prefix!r})"
