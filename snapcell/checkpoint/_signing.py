"""Signed checkpoint IDs and the HMAC that seals checkpoint bytes."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from snapcell.errors import CheckpointCorrupt, ConfigError

__all__ = ["ENV_SIGNING_KEY", "CheckpointId", "Keyring"]

ENV_SIGNING_KEY = "SNAPCELL_SIGNING_KEY"
MIN_KEY_BYTES = 16

_ID_VERSION = 1
ID_BODY = struct.Struct(">BQ16s")
_ID_MAC_BYTES = 16
ID_BYTES = ID_BODY.size + _ID_MAC_BYTES
MAC_BYTES = 32
_ID_DOMAIN = b"snapcell-id\x00"
_CHECKPOINT_DOMAIN = b"snapcell-checkpoint\x00"
_KEY_ID_DOMAIN = b"snapcell-key-id\x00"


@dataclass(frozen=True, slots=True)
class CheckpointId:
    """A parsed, verified checkpoint ID.

    Attributes:
        raw: The opaque bytes handed to applications (``.hex()`` / ``bytes.fromhex()`` round-trip).
        created_ms: Signed creation time, milliseconds since the epoch.
        token: 16 random bytes naming the checkpoint.
    """

    raw: bytes
    created_ms: int
    token: bytes

    @property
    def created_at(self) -> float:
        """Creation time in seconds since the epoch."""
        return self.created_ms / 1000

    @property
    def storage_key(self) -> str:
        """The store key, partitioned by UTC creation date so a whole day can be listed and expired."""
        day = datetime.fromtimestamp(self.created_at, UTC).strftime("%Y-%m-%d")
        return f"checkpoints/{day}/{self.created_ms:013d}-{self.token.hex()}"


class Keyring:
    """Signing keys: the first signs, every key verifies (so keys can be rotated).

    Errors name the keys they tried by key ID (`key_id`: a fingerprint that reveals nothing of the key) and by
    where each came from (``labels``), so a wrong key is told from an altered checkpoint.

    Args:
        keys: Secret keys, each at least 16 bytes (text is UTF-8 encoded).
        labels: Where each key came from, for error messages (``"SNAPCELL_SIGNING_KEY"``); default ``"key N"``.

    Raises:
        ConfigError: No key, a key that is not str or bytes, a key that is too short, a single str/bytes key
            passed instead of a list of keys, or not one label per key.
    """

    def __init__(self, keys: Sequence[bytes | str], *, labels: Sequence[str] | None = None) -> None:
        if isinstance(keys, str | bytes | bytearray | memoryview):
            raise ConfigError("signing keys must be a list of keys, not one key: write [key] (the first one signs)")
        if not isinstance(keys, Iterable):
            raise ConfigError(f"signing keys must be a list of str or bytes keys, not {type(keys).__name__}")
        encoded = []
        for key in keys:
            if isinstance(key, str):
                encoded.append(key.encode())
            elif isinstance(key, bytes | bytearray):
                encoded.append(bytes(key))
            else:
                raise ConfigError(f"each signing key must be str or bytes, not {type(key).__name__}")
        if not encoded:
            raise ConfigError("a Keyring needs at least one signing key")
        for key in encoded:
            if len(key) < MIN_KEY_BYTES:
                raise ConfigError(f"signing keys must be at least {MIN_KEY_BYTES} bytes long; one has {len(key)}")
        self._keys = encoded
        if labels is not None and (isinstance(labels, str) or len(labels) != len(encoded)):
            raise ConfigError("a Keyring needs one label per key")
        self._labels = list(labels) if labels is not None else [f"key {i + 1}" for i in range(len(encoded))]

    def key_id(self, index: int = 0) -> str:
        """The key ID of key ``index`` (0: the signing key): 8 hex digits that identify it and reveal nothing of it."""
        return hashlib.sha256(_KEY_ID_DOMAIN + self._keys[index]).hexdigest()[:8]

    def describe(self, index: int | None = None) -> str:
        """Key ``index`` as people read it, ``"key 1a2b3c4d (SNAPCELL_SIGNING_KEY)"``; every key when None."""
        if index is not None:
            return f"key {self.key_id(index)} ({self._labels[index]})"
        return ", ".join(self.describe(i) for i in range(len(self._keys)))

    def verifying_also(self, key: bytes, label: str) -> Keyring:
        """A keyring that also verifies with ``key`` (after these keys; the signing key stays the first)."""
        if key in self._keys:
            return self
        return Keyring([*self._keys, key], labels=[*self._labels, label])

    def _tried(self) -> str:
        one = len(self._keys) == 1
        return f"the {'key' if one else f'{len(self._keys)} keys'} tried: {self.describe()}"

    @classmethod
    def from_env(cls) -> Keyring | None:
        """Read comma-separated keys from ``SNAPCELL_SIGNING_KEY``; None when it is unset or empty."""
        value = os.environ.get(ENV_SIGNING_KEY, "")
        keys = [k.strip() for k in value.split(",") if k.strip()]
        labels = [ENV_SIGNING_KEY if len(keys) == 1 else f"{ENV_SIGNING_KEY} #{i + 1}" for i in range(len(keys))]
        return cls(keys, labels=labels) if keys else None

    def new_id(self, now: float | None = None) -> CheckpointId:
        """Mint a fresh signed ID created at ``now`` (seconds; default the current time)."""
        created_ms = int((time.time() if now is None else now) * 1000)
        body = ID_BODY.pack(_ID_VERSION, created_ms, secrets.token_bytes(16))
        mac = hmac.new(self._keys[0], _ID_DOMAIN + body, hashlib.sha256).digest()[:_ID_MAC_BYTES]
        return CheckpointId(body + mac, created_ms, body[9:])

    def parse_id(self, raw: bytes | bytearray | str) -> CheckpointId:
        """Verify an ID that came back from a database or a user.

        Args:
            raw: The ID bytes, or their hex text.

        Raises:
            CheckpointCorrupt: The ID is malformed, altered, or was signed by another key.
        """
        if isinstance(raw, str):
            try:
                raw = bytes.fromhex(raw)
            except ValueError:
                raise CheckpointCorrupt("the checkpoint ID is not valid hex") from None
        if not isinstance(raw, bytes | bytearray):
            raise CheckpointCorrupt(f"a checkpoint ID must be bytes, not {type(raw).__name__}")
        raw = bytes(raw)
        if len(raw) != ID_BYTES:
            raise CheckpointCorrupt(
                f"a checkpoint ID is {ID_BYTES} bytes long, this one has {len(raw)}", checkpoint_id=raw
            )
        body, mac = raw[: ID_BODY.size], raw[ID_BODY.size :]
        if not any(
            hmac.compare_digest(hmac.new(key, _ID_DOMAIN + body, hashlib.sha256).digest()[:_ID_MAC_BYTES], mac)
            for key in self._keys
        ):
            raise CheckpointCorrupt(
                "the checkpoint ID's signature matches none of the keys here: it was signed with another key (check "
                f"SNAPCELL_SIGNING_KEY), mistyped, or altered; {self._tried()}",
                checkpoint_id=raw,
            )
        version, created_ms, token = ID_BODY.unpack(body)
        if version != _ID_VERSION:
            raise CheckpointCorrupt(f"unknown checkpoint ID version {version}", checkpoint_id=raw)
        return CheckpointId(raw, created_ms, token)

    def sign(self, body: bytes | bytearray, checkpoint_id: CheckpointId) -> bytes | bytearray:
        """Seal checkpoint bytes to their ID: append HMAC-SHA256(key, ID + body).

        A bytearray body is extended in place (no copy of a large checkpoint) and returned.
        """
        mac = self._mac(self._keys[0], body, checkpoint_id)
        if isinstance(body, bytearray):
            body += mac
            return body
        return body + mac

    def blob_namespace(self, index: int = 0) -> str:
        """The store folder for blobs of checkpoints signed by key ``index`` (0: the signing key).

        Blobs are content-addressed; keeping each key's blobs apart means one tenant can neither read nor
        plant blobs of another that shares the store.
        """
        return hmac.new(self._keys[index], b"snapcell-blobs", hashlib.sha256).hexdigest()[:16]

    def verify_with_key(self, blob: bytes | bytearray, checkpoint_id: CheckpointId) -> tuple[memoryview, int]:
        """Like `verify`, and also say which key (by position) the checkpoint was signed with.

        Raises:
            CheckpointCorrupt: As `verify`.
        """
        if len(blob) <= MAC_BYTES:
            raise CheckpointCorrupt("the checkpoint is truncated or empty", checkpoint_id=checkpoint_id.raw)
        view = memoryview(blob)
        body, mac = view[:-MAC_BYTES], view[-MAC_BYTES:]
        for index, key in enumerate(self._keys):
            if hmac.compare_digest(self._mac(key, body, checkpoint_id), mac):
                return body, index
        raise CheckpointCorrupt(
            "the checkpoint failed verification: its bytes were altered or truncated, or it was signed "
            f"with another key; it was not loaded ({self._tried()})",
            checkpoint_id=checkpoint_id.raw,
        )

    def verify(self, blob: bytes | bytearray, checkpoint_id: CheckpointId) -> memoryview:
        """Check the seal of checkpoint bytes and return the body, before anything parses it.

        Raises:
            CheckpointCorrupt: Tampered, truncated, stored under another ID, or signed with another key.
        """
        return self.verify_with_key(blob, checkpoint_id)[0]

    @staticmethod
    def _mac(key: bytes, body: bytes | bytearray | memoryview, checkpoint_id: CheckpointId) -> bytes:
        mac = hmac.new(key, _CHECKPOINT_DOMAIN + checkpoint_id.raw, hashlib.sha256)
        mac.update(body)
        return mac.digest()
