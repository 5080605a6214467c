"""`S3Heads`: one small JSON object per conversation, changed only by conditional writes, so S3 coordinates."""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

from snapcell.errors import CheckpointNotFound, ConfigError, Conflict, HeadCorrupt, ObjectExists
from snapcell.storage import S3Store

from ._heads import (
    DEFAULT_MAX_HISTORY,
    Head,
    RecordHeads,
    Transition,
    _Delete,
    turn_states_to_json,
    turns_from_json,
    turns_to_json,
)

__all__ = ["S3Heads"]

_FORMAT = 1
_MAX_ATTEMPTS = 20


def _encode(head: Head, write: str) -> bytes:
    """A head's object; ``write`` is this write's own token (see `S3Heads._update`)."""
    doc = {
        "format": _FORMAT,
        "checkpoint_id": None if head.checkpoint_id is None else head.checkpoint_id.hex(),
        "history": [h.hex() for h in head.history],
        "version": head.version,
        "updated_at": head.updated_at,
        "lease": None
        if head.lease_owner is None
        else {"owner": head.lease_owner, "expires_at": head.lease_expires_at, "renewed_at": head.lease_renewed_at},
        "turns": turns_to_json(head.turns),
        "turn_states": turn_states_to_json(head.turns),
        # Every write differs, so every write gets a new ETag even when nothing else changed: If-Match has no ABA.
        # The token also tells a write that landed from another writer's, when its answer was lost.
        "write": write,
    }
    return json.dumps(doc, sort_keys=True).encode()


def _decode(data: bytes, key: str, conversation_id: str) -> tuple[Head, str | None]:
    """A head object's head, and the token of the write that wrote it (None in an object of another writer)."""
    try:
        doc = json.loads(data)
        lease = doc.get("lease") or {}
        write = doc.get("write")
        head = Head(
            checkpoint_id=None if doc["checkpoint_id"] is None else bytes.fromhex(doc["checkpoint_id"]),
            history=tuple(bytes.fromhex(h) for h in doc["history"]),
            version=str(doc["version"]),
            updated_at=float(doc["updated_at"]),
            lease_owner=lease.get("owner"),
            lease_expires_at=float(lease.get("expires_at", 0.0)),
            turns=turns_from_json(doc.get("turns", []), doc.get("turn_states")),
            lease_renewed_at=float(lease.get("renewed_at", 0.0)),
        )
        return head, write if isinstance(write, str) else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HeadCorrupt(
            f"the head object {key!r} is not a snapcell head ({exc}); delete it or restore it",
            conversation_id=conversation_id,
        ) from exc


def _landed(result: Head | _Delete, write: str, found: tuple[Head, str, str | None] | None) -> bool:
    """Whether a write refused with 412/409/404 had landed after all, judged by the object read back after it.

    A put landed when the object carries its token. A refused delete finds the object gone: it is gone as asked
    (deleted by this call, or by another at the same moment).
    """
    if isinstance(result, _Delete):
        return found is None
    return found is not None and found[2] == write


class S3Heads(RecordHeads):
    """Heads as ``<prefix>/heads/<conversation_id>.json`` objects, updated only by compare-and-swap.

    A new object is written with ``If-None-Match: *``, a change with ``If-Match: <ETag>`` of the version that was
    read; a lost race (HTTP 412 or 409) re-reads and decides again (unless the object read back is this write's own:
    its answer was lost and the client's retry of it refused), so many servers can share conversations with S3
    as the only coordinator. The lease lives in the same object. Needs an S3 service with conditional writes (AWS
    S3 since 2024, MinIO, moto 5.2 and later).

    Args:
        store: The `S3Store` whose bucket, prefix and client to use (the checkpoints' store, usually).
        bucket: Instead of ``store``: the bucket name.
        prefix: With ``bucket``: the key prefix.
        client: With ``bucket``: a ready boto3 S3 client.
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        clock: Returns the current time in seconds; injectable for tests.

    Raises:
        ConfigError: Neither ``store`` nor ``bucket`` is given, or both are.
    """

    def __init__(
        self,
        store: S3Store | None = None,
        *,
        bucket: str | None = None,
        prefix: str = "",
        client: object | None = None,
        max_history: int = DEFAULT_MAX_HISTORY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(max_history=max_history, clock=clock)
        if (store is None) == (bucket is None):
            raise ConfigError("give S3Heads either an S3Store or a bucket (with prefix and client), not both")
        self._store = store if store is not None else S3Store(bucket or "", prefix, client=client)
        self._owns_store = store is None

    @property
    def url(self) -> str:
        """The store's URL followed by ``/heads``."""
        return f"{self._store.url}/heads"

    def _key(self, conversation_id: str) -> str:
        return self._store._full(f"heads/{conversation_id}.json")

    def _fetch(self, conversation_id: str) -> tuple[Head, str, str | None] | None:
        """The head object: its head, its ETag and its write token; None when there is none."""
        key = self._key(conversation_id)
        try:
            with self._store._errors("get head", key):
                response = self._store.client.get_object(Bucket=self._store.bucket, Key=key)
                body = response["Body"]
                try:
                    data = body.read()
                finally:
                    body.close()
        except CheckpointNotFound:
            return None
        head, write = _decode(data, key, conversation_id)
        return head, str(response["ETag"]), write

    def _read(self, conversation_id: str) -> Head | None:
        found = self._fetch(conversation_id)
        return None if found is None else found[0]

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        key = self._key(conversation_id)
        client = self._store.client
        # The last write refused with 412/409/404, and its token: the client retries a request whose answer was
        # lost, and that retry is refused because the first attempt landed. Such a write is this call's success.
        refused: tuple[Head | _Delete, str] | None = None
        for attempt in range(_MAX_ATTEMPTS):
            found = self._fetch(conversation_id)
            if refused is not None and _landed(*refused, found):
                return None if isinstance(refused[0], _Delete) else refused[0]
            if self._after_read is not None:
                self._after_read(conversation_id, None if found is None else found[0])
            result = transition(None if found is None else found[0])
            if result is None or (found is None and isinstance(result, _Delete)):
                return None
            condition: dict[str, Any] = {"IfNoneMatch": "*"} if found is None else {"IfMatch": found[1]}
            write = secrets.token_hex(8)
            try:
                with self._store._errors("conditional write of head", key):
                    if isinstance(result, _Delete):
                        client.delete_object(Bucket=self._store.bucket, Key=key, **condition)
                        return None
                    client.put_object(
                        Bucket=self._store.bucket,
                        Key=key,
                        Body=_encode(result, write),
                        ContentType="application/json",
                        **condition,
                    )
                    return result
            except (ObjectExists, CheckpointNotFound):
                # Someone else wrote (412/409) or deleted (404) it since our read, or our own write landed and its
                # retry was refused: read again, and decide again unless the object is this write's.
                refused = (result, write)
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
        raise Conflict(
            f"the head of conversation {conversation_id!r} kept changing under {_MAX_ATTEMPTS} attempts to update "
            "it; nothing was written, retry"
        )

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`; lists ``heads/`` and reads each object."""
        for info in self._store.scan("heads/"):
            name = info.key.removeprefix("heads/")
            if not name.endswith(".json") or "/" in name:
                continue
            conversation_id = name.removesuffix(".json")
            try:
                head = self._read(conversation_id)
            except HeadCorrupt as exc:
                if corrupt is None:
                    raise
                corrupt.append(exc)
                continue
            if head is not None and head.version:
                yield conversation_id, head

    def close(self) -> None:
        """Close the client if this object created it (not a store that was passed in)."""
        if self._owns_store:
            self._store.close()

    def __repr__(self) -> str:
        return f"S3Heads({self.url!r})"
