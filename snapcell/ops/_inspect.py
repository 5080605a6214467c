"""``snapcell inspect``: verify a checkpoint and show what it holds, without unpickling anything.

The checkpoint is checked first (the ID's signature, then the HMAC over the bytes, with the keys a pool would use);
only then is its container parsed: header, manifest and section table. Sections are never decompressed and nothing
is unpickled, so inspecting a hostile checkpoint runs none of its code.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from snapcell.checkpoint import ID_BODY, ID_BYTES, MAC_BYTES, CheckpointId, Header, Keyring, Manifest, parse_container
from snapcell.errors import CheckpointCorrupt, CheckpointError, CheckpointNotFound, ConfigError, StorageError
from snapcell.ops._cleanup import format_bytes
from snapcell.storage import DEFAULT_TTL_S, LocalStore, Store, open_store

__all__ = ["DEFAULT_STORE", "InspectReport", "SectionInfo", "inspect_checkpoint"]

DEFAULT_STORE = "file://.snapcell"
_KEY_FILE = ".snapcell-signing-key"  # `LocalStore.secret()`'s file for the signing key


@dataclass(frozen=True, slots=True, kw_only=True)
class SectionInfo:
    """One section of the checkpoint container, as stored.

    Attributes:
        index: Position in the section table.
        kind: ``"stream"`` (the pickle stream), ``"buffer"`` (an out-of-band buffer: numpy, pandas, arrow) or
            ``"dill"`` (one variable pickled by the fallback serializer).
        codec: ``"zstd"`` or ``"raw"``.
        raw_bytes: Size once decompressed.
        stored_bytes: Size in the checkpoint.
    """

    index: int
    kind: str
    codec: str
    raw_bytes: int
    stored_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InspectReport:
    """What `inspect_checkpoint` found.

    Attributes:
        source: Where the bytes came from: the store URL and key, or the file path.
        checkpoint_id: The ID in hex, when one was given.
        verified: True when the ID and the checkpoint's HMAC were both checked and matched.
        verification: One line on the signature check, for people.
        problem: Why the checkpoint is unusable (failed verification, corrupt or foreign container), or None.
        checkpoint_bytes: Size of the stored checkpoint, signature included.
        created_at: Creation time from the ID (seconds since the epoch), when known.
        expires_at: ``created_at`` plus the ttl, when known.
        expired: True when ``expires_at`` has passed; a pool would refuse to load it.
        header: The container header, when it was parsed.
        manifest: The manifest, when it was parsed.
        sections: The container's sections, in order.
        warnings: Lines for people about a checkpoint that parsed but that this interpreter could not load (one
            written by another Python minor version).
    """

    source: str
    checkpoint_id: str | None = None
    verified: bool = False
    verification: str = ""
    problem: str | None = None
    checkpoint_bytes: int = 0
    created_at: float | None = None
    expires_at: float | None = None
    expired: bool = False
    header: Header | None = None
    manifest: Manifest | None = None
    sections: tuple[SectionInfo, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when the checkpoint verified and parsed (it may still be expired)."""
        return self.verified and self.problem is None

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (the manifest as its JSON model)."""
        header = self.header
        return {
            "source": self.source,
            "checkpoint_id": self.checkpoint_id,
            "verified": self.verified,
            "verification": self.verification,
            "problem": self.problem,
            "checkpoint_bytes": self.checkpoint_bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "expired": self.expired,
            "header": None
            if header is None
            else {
                "format_version": header.format_version,
                "python": f"{header.python[0]}.{header.python[1]}",
                "compression_level": header.compression_level,
                "serializer": header.serializer,
                "serializer_version": header.serializer_version,
                "fallback_version": header.fallback_version,
                "zstd_version": header.zstd_version,
            },
            "manifest": None if self.manifest is None else self.manifest.model_dump(mode="json"),
            "sections": [
                {
                    "index": s.index,
                    "kind": s.kind,
                    "codec": s.codec,
                    "raw_bytes": s.raw_bytes,
                    "stored_bytes": s.stored_bytes,
                }
                for s in self.sections
            ],
            "warnings": list(self.warnings),
        }

    def to_json(self) -> str:
        """The report as one JSON object (`to_dict`)."""
        return json.dumps(self.to_dict(), indent=2)

    def render(self, *, now: float | None = None) -> str:
        """The report as text for people."""
        now = time.time() if now is None else now
        lines = [
            _row("checkpoint", self.checkpoint_id or "(no ID given)"),
            _row("source", self.source),
            _row("signature", self.verification),
        ]
        if self.created_at is not None:
            lines.append(_row("created", _when(self.created_at, now)))
        if self.expires_at is not None:
            lines.append(_row("expires", ("EXPIRED " if self.expired else "") + _when(self.expires_at, now)))
        lines.append(_row("size", _size(self.checkpoint_bytes, self.sections, self.manifest)))
        if self.problem is not None:
            lines.append(_row("PROBLEM", self.problem))
        lines.extend(_row("WARNING", warning) for warning in self.warnings)
        if self.header is not None:
            lines.extend(_render_header(self.header, self.manifest))
        if self.manifest is not None:
            lines.extend(_render_manifest(self.manifest))
        if self.sections:
            lines.extend(_render_sections(self.sections))
        return "\n".join(lines)


def inspect_checkpoint(
    checkpoint_id: bytes | bytearray | str | None = None,
    *,
    store: Store | str | None = None,
    path: str | os.PathLike[str] | None = None,
    signing_keys: Sequence[bytes | str] | None = None,
    keyring: Keyring | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    verify: bool = True,
    now: float | None = None,
) -> InspectReport:
    """Verify a checkpoint, then read its header, manifest and section table; nothing is unpickled.

    Give an ID and a store (the checkpoint is fetched from the store), or a checkpoint file with ``path`` (and its
    ID, to verify it). Keys are resolved as a pool resolves them: ``signing_keys``, then ``SNAPCELL_SIGNING_KEY``,
    then the local store's existing key file (for a file inside a local store's ``checkpoints/`` directory, that
    store's); unlike a pool, inspecting never generates a key.

    Args:
        checkpoint_id: The checkpoint's ID, as bytes or hex; required unless ``path`` is given with ``verify=False``.
        store: The store holding the checkpoint (a `Store` or URL); default ``file://.snapcell``.
        path: Read the checkpoint from this file instead of a store.
        signing_keys: Keys to verify with (any of them may match).
        keyring: A ready `Keyring` (a pool's ``keyring``) instead of resolving keys.
        ttl_s: Seconds a checkpoint stays loadable, for ``expires_at`` (default 7 days).
        verify: Check signatures (default). With False the bytes are parsed unverified, which is safe (nothing is
            unpickled) but proves nothing about where they came from.
        now: The current time, for ``expired``.

    Returns:
        The report. A checkpoint that fails verification comes back with ``verified=False`` and ``problem`` set,
        and nothing of it parsed.

    Raises:
        ConfigError: Neither an ID nor a file, a file to verify without its ID, or no signing key (none given, no
            ``SNAPCELL_SIGNING_KEY`` and no ``.snapcell-signing-key`` in the local store).
        CheckpointCorrupt: The ID is not hex, or the wrong length.
        CheckpointNotFound: The store has no checkpoint under the ID (also when the ID fails its signature check:
            a mistyped ID).
        StorageError: The store or the file could not be read.
    """
    now = time.time() if now is None else now
    if checkpoint_id is None and (path is None or verify):
        raise ConfigError(
            "give a checkpoint ID (with its store), or a checkpoint file with its ID (--id HEX); "
            "a file alone cannot be verified, read it with --no-verify"
        )
    if path is not None and store is None:
        # A file needs a store only for its key file: that of the store it sits in, else ./.snapcell's if any.
        store_obj: Store = _enclosing_store(Path(path)) or LocalStore(DEFAULT_STORE.removeprefix("file://"))
    else:
        store_obj = open_store(store or DEFAULT_STORE) if isinstance(store, str) or store is None else store
    if verify and keyring is None:
        keyring = _keyring(store_obj, signing_keys)
    elif not verify:
        keyring = None

    cid, id_problem = _resolve_id(checkpoint_id, keyring)
    if path is not None:
        source = str(Path(path).absolute())
        blob = _read_file(Path(path))
    else:
        if cid is None:  # pragma: no cover - ruled out above
            raise ConfigError("a checkpoint ID is needed to find the checkpoint in a store")
        source = f"{store_obj.url} {cid.storage_key}"
        try:
            blob = store_obj.get(cid.storage_key)
        except CheckpointNotFound as exc:
            if id_problem is None:
                raise
            # Neither signed by a key here nor naming a checkpoint: most likely mistyped (a forged or foreign ID
            # that names a stored checkpoint is reported below, as failing verification).
            raise CheckpointNotFound(
                f"no checkpoint with this ID in {store_obj.url}, and its signature matches no key here: the ID is "
                "mistyped (an ID is copied whole, as dump() or `snapcell head` prints it) or from another store",
                checkpoint_id=cid.raw,
                key=cid.storage_key,
            ) from exc
    if id_problem is not None and cid is not None:
        return _failed(source, cid, len(blob), id_problem, ttl_s, now)

    if keyring is not None and cid is not None:
        try:
            body, signer = keyring.verify_with_key(blob, cid)
        except CheckpointCorrupt as exc:
            problem = str(exc)
            expected = cid.storage_key.rsplit("/", 1)[-1]
            if path is not None and Path(path).name != expected:
                problem += f" (this ID's checkpoint is stored as {expected!r}, not {Path(path).name!r})"
            return _failed(source, cid, len(blob), problem, ttl_s, now)
        verification = f"verified: the ID and the checkpoint's HMAC match {keyring.describe(signer)}"
    else:
        body = memoryview(blob)[:-MAC_BYTES] if len(blob) > MAC_BYTES else memoryview(b"")
        verification = "NOT CHECKED (--no-verify): these bytes may have been altered or forged"
    return _parsed(source, cid, blob, body, verification, verified=keyring is not None, ttl_s=ttl_s, now=now)


def _parsed(
    source: str,
    cid: CheckpointId | None,
    blob: bytes,
    body: memoryview,
    verification: str,
    *,
    verified: bool,
    ttl_s: float,
    now: float,
) -> InspectReport:
    created = cid.created_at if cid is not None else None
    common: dict[str, Any] = {
        "source": source,
        "checkpoint_id": cid.raw.hex() if cid is not None else None,
        "verified": verified,
        "verification": verification,
        "checkpoint_bytes": len(blob),
        "created_at": created,
        "expires_at": None if created is None else created + ttl_s,
        "expired": created is not None and now > created + ttl_s,
    }
    try:
        # Only the manifest is read, so a checkpoint of another Python minor version is shown, with a warning.
        container = parse_container(body, check_python=False)
    except CheckpointError as exc:
        return InspectReport(**common, problem=str(exc))
    sections = tuple(
        SectionInfo(
            index=i,
            kind=s.kind.name.lower(),
            codec=s.codec.name.lower(),
            raw_bytes=s.raw_size,
            stored_bytes=len(s.data),
        )
        for i, s in enumerate(container.sections)
    )
    if created is None:  # an unverified file without an ID: the manifest's (unsigned) time is all there is
        created = container.manifest.created_at
        common.update(created_at=created, expires_at=created + ttl_s, expired=now > created + ttl_s)
    return InspectReport(
        **common,
        header=container.header,
        manifest=container.manifest,
        sections=sections,
        warnings=_python_warnings(container.header),
    )


def _python_warnings(header: Header) -> tuple[str, ...]:
    """A warning when another Python minor version wrote the checkpoint: this interpreter cannot load it."""
    written, running = header.python, (sys.version_info.major, sys.version_info.minor)
    if written == running:
        return ()
    return (
        f"written by Python {written[0]}.{written[1]}, this is Python {running[0]}.{running[1]}: a pool here "
        f"cannot load it (CheckpointVersionError); load it with Python {written[0]}.{written[1]}",
    )


def _failed(source: str, cid: CheckpointId, size: int, problem: str, ttl_s: float, now: float) -> InspectReport:
    return InspectReport(
        source=source,
        checkpoint_id=cid.raw.hex(),
        verified=False,
        verification="FAILED: " + problem,
        problem="verification failed; nothing was parsed (use --no-verify to read the bytes anyway)",
        checkpoint_bytes=size,
        created_at=cid.created_at,
        expires_at=cid.created_at + ttl_s,
        expired=now > cid.created_at + ttl_s,
    )


def _resolve_id(
    checkpoint_id: bytes | bytearray | str | None, keyring: Keyring | None
) -> tuple[CheckpointId | None, str | None]:
    """The ID's fields, and why its signature failed (None when it verified, or was not checked)."""
    if checkpoint_id is None:
        return None, None
    if keyring is None:
        return _unverified_id(checkpoint_id), None
    try:
        return keyring.parse_id(checkpoint_id), None
    except CheckpointCorrupt as exc:
        return _unverified_id(checkpoint_id), str(exc)


def _unverified_id(raw: bytes | bytearray | str) -> CheckpointId:
    """Read an ID's fields without checking its signature (for --no-verify and for reporting a bad ID)."""
    if isinstance(raw, str):
        try:
            raw = bytes.fromhex(raw)
        except ValueError:
            raise CheckpointCorrupt("the checkpoint ID is not valid hex") from None
    raw = bytes(raw)
    if len(raw) != ID_BYTES:
        raise CheckpointCorrupt(f"a checkpoint ID is {ID_BYTES} bytes long, this one has {len(raw)}", checkpoint_id=raw)
    try:
        _version, created_ms, token = ID_BODY.unpack(raw[: ID_BODY.size])
    except struct.error as exc:  # pragma: no cover - the length was checked
        raise CheckpointCorrupt("the checkpoint ID is malformed", checkpoint_id=raw) from exc
    return CheckpointId(raw, created_ms, token)


def _enclosing_store(path: Path) -> LocalStore | None:
    """The local store a checkpoint file sits in (``<root>/checkpoints/<day>/<name>``), if any."""
    parents = path.absolute().parents
    if len(parents) >= 3 and parents[1].name == "checkpoints":
        return LocalStore(parents[2])
    return None


def _keyring(store: Store, signing_keys: Sequence[bytes | str] | None) -> Keyring:
    """The pool's keys (`resolve_keyring`), but never a newly generated one.

    A pool generates a local store's key on first use; here that would write a key file into whatever directory
    was named (any ``.../checkpoints/<x>/<file>`` path looks like a store), and a new key verifies nothing anyway.
    """
    from snapcell.pool import resolve_keyring

    if signing_keys or Keyring.from_env() is not None or not isinstance(store, LocalStore):
        return resolve_keyring(store, signing_keys)
    key_file = store.root / _KEY_FILE
    if not key_file.is_file():
        raise ConfigError(
            f"no signing key to verify with: {key_file} does not exist ({store.root} is not a snapcell store, or "
            "not the one that wrote this checkpoint); pass --store with the store's directory, --signing-key KEY, "
            "or set SNAPCELL_SIGNING_KEY"
        )
    return resolve_keyring(store, signing_keys)


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StorageError(f"cannot read the checkpoint file {path}: {exc.strerror or exc}") from exc


# ------------------------------------------------------------------ text


def _row(label: str, value: str) -> str:
    return f"{label:<11} {value}"


def _when(t: float, now: float) -> str:
    stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    delta = now - t
    return f"{stamp} ({_span(delta)} ago)" if delta >= 0 else f"{stamp} (in {_span(-delta)})"


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _size(total: int, sections: tuple[SectionInfo, ...], manifest: Manifest | None) -> str:
    """The size row: the checkpoint in the store, split into its variables' sections and the rest."""
    if not sections:
        return format_bytes(total)
    stored = sum(s.stored_bytes for s in sections)
    text = (
        f"{format_bytes(total)} in the store: {format_bytes(stored)} of variables "
        f"({format_bytes(sum(s.raw_bytes for s in sections))} before compression) + "
        f"{format_bytes(total - stored)} of manifest, header and signature"
    )
    blobs = getattr(manifest, "blobs", None) or []
    if blobs:
        text += f"; blobs stored apart: {format_bytes(sum(ref.stored_bytes for ref in blobs))}"
    return text


def _render_header(header: Header, manifest: Manifest | None) -> list[str]:
    python = f"{header.python[0]}.{header.python[1]}" + (f" ({manifest.python})" if manifest is not None else "")
    lines = [
        _row("format", f"version {header.format_version}, zstd level {header.compression_level}"),
        _row("python", python),
        _row(
            "libraries",
            f"{header.serializer} {header.serializer_version}, dill {header.fallback_version}, "
            f"zstandard {header.zstd_version}",
        ),
    ]
    return lines


def _render_manifest(manifest: Manifest) -> list[str]:
    lines = [_row("cells", f"{manifest.cell_count} run, {len(manifest.setup_cells)} setup")]
    variables = sorted(manifest.variables, key=lambda v: (-v.size_bytes, v.name))
    lines.append("")
    lines.append(f"variables ({len(variables)}, largest first; pickled sizes before compression)")
    if variables:
        width = min(max(len(v.name) for v in variables), 32)
        type_width = min(max(len(v.type_name) for v in variables), 28)
        for v in variables:
            serializer = "" if v.serializer == "cloudpickle" else f"  [{v.serializer}]"
            size = format_bytes(v.size_bytes)
            lines.append(f"  {v.name[:32]:<{width}}  {v.type_name[:28]:<{type_width}}  {size:>10}{serializer}")
    else:
        lines.append("  (none)")
    if manifest.dropped:
        lines.append("")
        lines.append(f"dropped ({len(manifest.dropped)}: not saved, recreated only by setup cells)")
        for d in manifest.dropped:
            lines.append(f"  {d.name} ({d.type_name}): {d.reason}")
    if manifest.setup_cells:
        lines.append("")
        lines.append(f"setup cells ({len(manifest.setup_cells)})")
        for i, cell in enumerate(manifest.setup_cells, 1):
            source = cell.rstrip().splitlines() or [""]
            lines.append(f"  [{i}] {source[0]}")
            lines.extend(f"      {line}" for line in source[1:])
    files = getattr(manifest, "files", None) or []
    if files:
        lines.append("")
        lines.append(
            f"workspace files ({len(files)}, {format_bytes(sum(f.size_bytes for f in files))}; chunks are blobs)"
        )
        lines.extend(f"  {f.path[:200]}  {format_bytes(f.size_bytes):>10}" for f in files)
    blobs = getattr(manifest, "blobs", None) or []
    if blobs:
        lines.append("")
        lines.append(f"blobs ({len(blobs)}, stored separately and shared between checkpoints)")
        for ref in blobs:
            lines.append(
                f"  {ref.hash}  {format_bytes(ref.raw_bytes):>10} raw  {format_bytes(ref.stored_bytes):>10} stored"
            )
    return lines


def _render_sections(sections: tuple[SectionInfo, ...]) -> list[str]:
    buffers = sum(1 for s in sections if s.kind == "buffer")
    lines = ["", f"sections ({len(sections)}; {buffers} out-of-band buffer{'s' if buffers != 1 else ''})"]
    for s in sections:
        lines.append(
            f"  #{s.index:<3} {s.kind:<7} {s.codec:<5} {format_bytes(s.stored_bytes):>10} stored"
            f"  {format_bytes(s.raw_bytes):>10} raw"
        )
    return lines
