"""The checkpoint container: fixed header, manifest, sections; parsing never unpickles."""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from enum import IntEnum

import cloudpickle
import dill
import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from snapcell.checkpoint._blobs import CHUNK_BYTES, DIGEST_BYTES, LEGACY_DIGEST_BYTES
from snapcell.checkpoint._signing import MAC_BYTES as _MAC_BYTES
from snapcell.errors import CheckpointCorrupt, CheckpointVersionError

__all__ = [
    "FORMAT_VERSION",
    "blob_keys_of",
    "READABLE_VERSIONS",
    "MAGIC",
    "Container",
    "DroppedVariable",
    "FrameInfo",
    "BlobRef",
    "Header",
    "Manifest",
    "PausedRun",
    "Section",
    "SectionKind",
    "VariableInfo",
    "WorkspaceFile",
    "manifest_bytes",
    "parse_container",
    "parse_manifest",
    "with_manifest",
]

MAGIC = b"SNAPCELL"
FORMAT_VERSION = 3
# Versions this release reads: 1 had no blob references; 1 and 2 hold one pickle stream for every variable, 3 one
# frame per group of variables that share objects (`Manifest.frames`).
READABLE_VERSIONS = frozenset({1, 2, 3})
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
BLOB_REF_MIN_BYTES = 4 + LEGACY_DIGEST_BYTES
MAX_SECTIONS = 1_000_000

_FIXED = struct.Struct(">8sHBBbB")
_SECTION = struct.Struct(">BBQQ")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


class SectionKind(IntEnum):
    """What a section holds."""

    STREAM = 0  # the cloudpickle stream: one pickle per variable
    BUFFER = 1  # one out-of-band buffer of the stream (numpy, pandas, arrow)
    DILL = 2  # one variable cloudpickle could not serialize, pickled alone by dill
    BLOB = 3  # a reference (16-byte content hash) to a large buffer stored as a blob
    FRAME_BLOB = 4  # a reference (16-byte content hash) to one pickle frame stored once as a blob (format 3)


class Codec(IntEnum):
    """How a section's bytes are stored."""

    RAW = 0
    ZSTD = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    """The fixed part at the start of every checkpoint, checked before anything else."""

    format_version: int = FORMAT_VERSION
    python: tuple[int, int] = (sys.version_info.major, sys.version_info.minor)
    compression_level: int = 1
    serializer: str = "cloudpickle"
    serializer_version: str = cloudpickle.__version__
    fallback_version: str = dill.__version__
    zstd_version: str = zstandard.__version__

    def pack(self) -> bytes:
        """Encode the header as bytes."""
        fixed = _FIXED.pack(MAGIC, self.format_version, *self.python, self.compression_level, 0)
        strings = (self.serializer, self.serializer_version, self.fallback_version, self.zstd_version)
        return fixed + b"".join(_pack_str(s) for s in strings)

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0, *, check_python: bool = True) -> tuple[Header, int]:
        """Decode a header at ``offset``; return it and the offset after it.

        Raises:
            CheckpointCorrupt: Not a snapcell checkpoint, or cut short.
            CheckpointVersionError: Written in a container format this release cannot read.

        ``check_python`` is kept for callers: another Python minor version is not refused (format 3 restores
        what it can, frame by frame, and names the rest).
        """
        if len(data) - offset < _FIXED.size:
            raise CheckpointCorrupt("the checkpoint is truncated: its header is incomplete")
        magic, version, major, minor, level, _flags = _FIXED.unpack_from(data, offset)
        if magic != MAGIC:
            raise CheckpointCorrupt("these bytes are not a snapcell checkpoint (bad magic)")
        if version not in READABLE_VERSIONS:
            raise CheckpointVersionError(
                f"checkpoint format version {version} is not supported by this snapcell "
                f"(reads versions {sorted(READABLE_VERSIONS)}); load it with the snapcell release that wrote it"
            )
        offset += _FIXED.size
        strings = []
        for _ in range(4):
            text, offset = _unpack_str(data, offset)
            strings.append(text)
        header = cls(
            format_version=version,
            python=(major, minor),
            compression_level=level,
            serializer=strings[0],
            serializer_version=strings[1],
            fallback_version=strings[2],
            zstd_version=strings[3],
        )
        return header, offset


# The models' schemas are built on first use (defer_build), not at import: a worker, which imports this module before
# its first run, needs them only for a dump or a load (~11 ms of CPU otherwise paid before every zygote says ready).


class VariableInfo(BaseModel):
    """One variable stored in the checkpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    type_name: str
    size_bytes: int = Field(ge=0, description="Pickled size, before compression, out-of-band buffers included.")
    serializer: str = Field(pattern="^(cloudpickle|dill)$")


class DroppedVariable(BaseModel):
    """A variable that could not be serialized and is not in the checkpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    type_name: str
    reason: str


class FrameInfo(BaseModel):
    """One frame of a format-3 checkpoint: variables that share objects, pickled together, apart from the rest.

    A frame is one or more parts, each an independent pickle (a STREAM section, or a FRAME_BLOB reference to a
    pickle stored once as a blob) followed by its own out-of-band buffer sections (BUFFER or BLOB).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    names: list[str] = Field(min_length=1)
    layout: str = Field(
        default="values",
        pattern="^(values|dict|list)$",
        description="values: one part holding a tuple of the variables' values; dict/list: one large variable cut "
        "into parts of items (lists of key-value pairs, or slices), each part its own pickle.",
    )
    buffers: list[int] = Field(min_length=1, description="Per part, how many buffer sections follow it.")


class BlobRef(BaseModel):
    """A large buffer stored once as a content-addressed blob."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    hash: str = Field(
        pattern="^(?:[0-9a-f]{64}|[0-9a-f]{32})$",
        description="Content hash of the raw bytes, hex: SHA-256 (xxh3-128 in checkpoints written before).",
    )
    # A blob is one chunk of a buffer: a manifest claiming more is refused before anything is fetched or allocated.
    raw_bytes: int = Field(ge=0, le=CHUNK_BYTES)
    stored_bytes: int = Field(ge=1, le=CHUNK_BYTES + 1, description="Size in the store (compressed, or raw + 1 byte).")
    stamp: float = Field(description="A time at or before the blob's last write or refresh in the store.")


class WorkspaceFile(BaseModel):
    """A file of the session's workspace, stored as content-addressed chunks (each also listed in ``blobs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    path: str = Field(min_length=1, max_length=1024, description="Relative POSIX path inside the workspace.")
    size_bytes: int = Field(ge=0)
    chunks: list[str] = Field(default=[], description="Content hashes (hex) of its chunks, in order.")


class PausedRun(BaseModel):
    """A run stopped at a pausing host call: the cell and the log of its outside inputs, to resume it by replay.

    The checkpoint's namespace is the one the cell started with.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    cell: str
    setup: bool = False
    pausing: list[str] = []
    log: str = Field(description="The run's host calls, the paused call and its clocks and random sources (wire JSON).")
    # PYTHONHASHSEED's range: anything else would stop the interpreter a resume starts with it.
    hash_seed: int | None = Field(
        default=None,
        ge=0,
        le=2**32 - 1,
        strict=True,
        description="The PYTHONHASHSEED of the worker the run paused in (None: unknown, inline mode); a resume runs "
        "under it, so sets of strings come out in the same order.",
    )


class Manifest(BaseModel):
    """What a checkpoint holds; readable without unpickling anything."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    version: int = 1
    created_at: float
    python: str
    libraries: dict[str, str]
    variables: list[VariableInfo]
    dropped: list[DroppedVariable] = []
    setup_cells: list[str] = []
    cells: list[str] = Field(default=[], description="Recent cell sources, so restored tracebacks show lines.")
    cell_count: int = 0
    future_flags: int = 0
    hash_algorithm: str | None = None
    blobs: list[BlobRef] = Field(default=[], description="Blobs the checkpoint refers to, once each.")
    files: list[WorkspaceFile] = Field(default=[], description="The workspace's files; their chunks are blobs.")
    frames: list[FrameInfo] = Field(default=[], description="Format 3: how the pickle sections group variables.")
    definitions: list[str] = Field(
        default=[],
        description="Top-level def/class/import statements of the cells, latest per name: re-run when a function "
        "or class cannot be restored (another Python, a narrower policy).",
    )
    types: dict[str, str] = Field(
        default={}, description="Static types of variables, as the type checker saw them made from the host stubs."
    )
    paused: PausedRun | None = Field(default=None, description="Set when the checkpoint holds a paused run.")

    def to_json(self) -> bytes:
        """Encode as stable JSON (field order fixed by the model); a checkpoint that holds no paused run has no
        ``paused`` field, as before there was one."""
        return self.model_dump_json(exclude=None if self.paused is not None else {"paused"}).encode()


@dataclass(frozen=True, slots=True)
class Section:
    """One section of a parsed container; ``data`` is a view into the checkpoint bytes."""

    kind: SectionKind
    codec: Codec
    raw_size: int
    data: memoryview


@dataclass(frozen=True, slots=True)
class Container:
    """A parsed, not yet unpickled, checkpoint body."""

    header: Header
    manifest: Manifest
    sections: list[Section]


def pack_container(
    header: Header, manifest: Manifest, sections: list[tuple[SectionKind, Codec, int, bytes | memoryview]]
) -> bytearray:
    """Assemble an unsigned checkpoint body from its parts (a bytearray, so a signature can be appended in place)."""
    manifest_bytes = manifest.to_json()
    table = b"".join(_SECTION.pack(kind, codec, raw, len(data)) for kind, codec, raw, data in sections)
    parts = [header.pack(), _U32.pack(len(manifest_bytes)), manifest_bytes, _U32.pack(len(sections)), table]
    body = bytearray(b"".join(parts))
    for _, _, _, data in sections:
        body += data
    return body


def manifest_bytes(body: bytes | bytearray | memoryview, *, check_python: bool = True) -> tuple[Header, bytes, int]:
    """The header of an unsigned body, its manifest's JSON (not parsed) and the offset just after it.

    Raises:
        CheckpointCorrupt: The bytes are malformed, truncated or declare too large a manifest.
        CheckpointVersionError: A container format this release cannot read.
    """
    view = memoryview(body)
    header, offset = Header.unpack(view, check_python=check_python)
    (manifest_len,), offset = _read(_U32, view, offset)
    if manifest_len > MAX_MANIFEST_BYTES or offset + manifest_len > len(view):
        raise CheckpointCorrupt("the checkpoint is truncated or its manifest is too large")
    return header, bytes(view[offset : offset + manifest_len]), offset + manifest_len


def with_manifest(body: bytes | bytearray | memoryview, manifest: Manifest) -> bytearray:
    """The same unsigned body with another manifest: the sections are not touched (nothing is unpickled).

    Raises:
        CheckpointCorrupt: The body is malformed or truncated.
        CheckpointVersionError: A container format this release cannot read.
    """
    view = memoryview(body)
    _, _, end = manifest_bytes(view, check_python=False)
    _, start = Header.unpack(view, check_python=False)
    encoded = manifest.to_json()
    out = bytearray(view[:start])
    out += _U32.pack(len(encoded))
    out += encoded
    out += view[end:]
    return out


def parse_manifest(raw: bytes) -> Manifest:
    """Parse a body's manifest JSON (see `manifest_bytes`).

    Raises:
        CheckpointCorrupt: It is not a valid `Manifest`, or lists a blob twice.
    """
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        # Named, so the problem can be told (a seed out of range, say); bounded, as a key in the path may be long.
        where = ".".join(map(str, first["loc"]))[:200]
        raise CheckpointCorrupt(
            f"the checkpoint manifest is invalid: {exc.error_count()} problem(s), the first at {where}: {first['msg']}"
        ) from exc
    if len({ref.hash for ref in manifest.blobs}) != len(manifest.blobs):
        # Each blob is listed once; a list repeating one blob would make a loader fetch and hold it again and again.
        raise CheckpointCorrupt("the checkpoint manifest lists a blob more than once")
    return manifest


def parse_container(
    body: bytes | bytearray | memoryview,
    *,
    max_raw_bytes: int | None = None,
    check_python: bool = True,
    manifest: Manifest | None = None,
) -> Container:
    """Parse an unsigned checkpoint body without decompressing or unpickling.

    Args:
        body: The verified body (signature already stripped).
        max_raw_bytes: Refuse a checkpoint whose sections would decompress to more than this.
        check_python: Kept for callers; another Python minor version is no longer refused (format 3 restores
            what it can, frame by frame, and names the rest).
        manifest: The manifest already parsed from these very bytes (`parse_manifest`): not parsed again.

    Raises:
        CheckpointCorrupt: The bytes are malformed, truncated or declare too much data.
        CheckpointVersionError: A container format this release cannot read.
    """
    view = memoryview(body)
    header, raw, offset = manifest_bytes(view, check_python=check_python)
    if manifest is None:
        manifest = parse_manifest(raw)
    (count,), offset = _read(_U32, view, offset)
    if count > MAX_SECTIONS or offset + count * _SECTION.size > len(view):
        raise CheckpointCorrupt("the checkpoint is truncated: its section table is incomplete")
    table = []
    for _ in range(count):
        fields, offset = _read(_SECTION, view, offset)
        table.append(fields)
    sections = []
    total_raw = 0
    for kind, codec, raw_size, stored in table:
        if offset + stored > len(view):
            raise CheckpointCorrupt("the checkpoint is truncated: a section is cut short")
        try:
            section = Section(SectionKind(kind), Codec(codec), raw_size, view[offset : offset + stored])
        except ValueError as exc:
            raise CheckpointCorrupt(f"the checkpoint has an unknown section type: {exc}") from exc
        if section.kind in (SectionKind.FRAME_BLOB, SectionKind.BLOB):
            _check_reference(section, header.format_version)
            sections.append(section)
            offset += stored
            total_raw += raw_size
            continue
        if section.codec is Codec.RAW and raw_size != stored:
            raise CheckpointCorrupt("the checkpoint declares a raw section of the wrong size")
        sections.append(section)
        offset += stored
        total_raw += raw_size
    if offset != len(view):
        raise CheckpointCorrupt("the checkpoint has trailing bytes after its last section")
    if max_raw_bytes is not None and total_raw > max_raw_bytes:
        raise CheckpointCorrupt(
            f"the checkpoint would decompress to {total_raw} bytes, over the cap of {max_raw_bytes}; "
            "raise the memory limit to load it"
        )
    return Container(header, manifest, sections)


def _check_reference(section: Section, version: int) -> None:
    """A reference section's own shape (the blob reference's chunks are checked where it is read)."""
    if section.kind is SectionKind.FRAME_BLOB:
        if (
            len(section.data) not in (DIGEST_BYTES, LEGACY_DIGEST_BYTES)
            or version < 3
            or section.codec is not Codec.RAW
        ):
            raise CheckpointCorrupt("the checkpoint has a malformed frame reference")
    elif len(section.data) < BLOB_REF_MIN_BYTES or version < 2:
        raise CheckpointCorrupt("the checkpoint has a malformed blob reference")


def _pack_str(text: str) -> bytes:
    raw = text.encode()[:65535]
    return _U16.pack(len(raw)) + raw


def _unpack_str(data: bytes | memoryview, offset: int) -> tuple[str, int]:
    (length,), offset = _read(_U16, data, offset)
    if offset + length > len(data):
        raise CheckpointCorrupt("the checkpoint is truncated: its header is incomplete")
    try:
        return bytes(data[offset : offset + length]).decode(), offset + length
    except UnicodeDecodeError as exc:
        raise CheckpointCorrupt("the checkpoint header is not valid text") from exc


def _read(fmt: struct.Struct, data: bytes | memoryview, offset: int) -> tuple[tuple[int, ...], int]:
    if offset + fmt.size > len(data):
        raise CheckpointCorrupt("the checkpoint is truncated")
    return fmt.unpack_from(data, offset), offset + fmt.size


def blob_keys_of(stored: bytes | bytearray | memoryview) -> list[str]:
    """The content hashes (hex) of the blobs a stored checkpoint refers to, read without verifying it.

    For cleanup, which must keep every blob any checkpoint may need, whatever the namespace: a blob whose
    key ends in one of these names is kept. Nothing is unpickled, and a forged checkpoint can at worst keep
    blobs alive.

    Raises:
        CheckpointCorrupt: The bytes are not a readable checkpoint.
        CheckpointVersionError: A checkpoint format this snapcell cannot read.
    """
    view = memoryview(stored)
    if len(view) <= _MAC_BYTES:
        raise CheckpointCorrupt("the checkpoint is truncated or empty")
    manifest = parse_container(view[:-_MAC_BYTES], check_python=False).manifest
    return [ref.hash for ref in manifest.blobs]
