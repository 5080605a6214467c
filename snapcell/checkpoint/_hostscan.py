"""The host's side of the checkpoint rule: every pickle of a dump is scanned before the host signs it.

`scan_body` covers the pickles inside a body; `check_frame_blobs` the frames a format-3 body stores as blobs (new
ones are scanned; ones only referred to must be frames the host scanned before). Nothing here unpickles.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from collections.abc import Container as Lookup
from collections.abc import Set as AbstractSet

from snapcell.checkpoint._blobs import blob_raw_size, decode_blob
from snapcell.checkpoint._format import Container, Section, SectionKind, parse_container
from snapcell.checkpoint._rule import GlobalRule, Refusal
from snapcell.checkpoint._unpickle import _decompress, frame_parts
from snapcell.checkpoint.scan import scan_pickle
from snapcell.errors import CheckpointCorrupt

__all__ = [
    "AnyOf",
    "PassedFrames",
    "UnscannedFrame",
    "check_frame_blobs",
    "declared_raw_bytes",
    "frame_blob_hashes",
    "scan_body",
    "scan_frame_blob",
    "scanned_frames",
    "stream_key",
]


def _parsed(body: bytes | bytearray | memoryview | Container, max_raw_bytes: int | None = None) -> Container:
    """The body's container: parsed here, or as the caller already parsed it (one parse per dump on the host)."""
    return body if isinstance(body, Container) else parse_container(body, max_raw_bytes=max_raw_bytes)


def declared_raw_bytes(container: Container, new_blobs: Mapping[str, bytes | bytearray]) -> int:
    """The raw bytes a dump's scan would decompress: its pickle sections and its new blobs, as declared."""
    sizes = {ref.hash: ref.raw_bytes for ref in container.manifest.blobs}
    inline = sum(s.raw_size for s in container.sections if s.kind not in (SectionKind.FRAME_BLOB, SectionKind.BLOB))
    return inline + sum(sizes.get(name, len(data)) for name, data in new_blobs.items())


def stream_key(head: Section) -> bytes:
    """A format-3 body's pickle stream, named by a cryptographic digest of its codec, size and stored bytes."""
    digest = hashlib.blake2b(bytes((head.codec,)), digest_size=16)
    digest.update(head.raw_size.to_bytes(8, "big"))
    digest.update(head.data)
    return digest.digest()


def scan_body(
    body: bytes | bytearray | memoryview | Container,
    *,
    rule: GlobalRule | Callable[[str], bool],
    max_raw_bytes: int | None = None,
    passed: Lookup[bytes] = (),
    passing: set[bytes] | None = None,
) -> tuple[Refusal, str | None] | None:
    """Apply the loader's rule to every pickle of an unsigned body, without unpickling (the host, before it signs).

    Each pickle section is decompressed in turn (declared sizes are checked first, as at load) and scanned by
    `scan_pickle`; buffers and blob references hold no pickles.

    Args:
        body: The unsigned body, or its parsed container.
        rule: The policy's part of the loader's rule.
        max_raw_bytes: Refuse a body whose sections would decompress to more than this.
        passed: `stream_key` of streams that passed ``rule`` before (a session's previous dump, the pool's earlier
            dumps): a stream with the same key holds the very same bytes and is not scanned again.
        passing: Collects the `stream_key` of every stream of the body that passed (format 3).

    Returns:
        None when every global passes; else the first refusal and the variable whose pickle holds it (when known).

    Raises:
        CheckpointCorrupt: The body is malformed.
        CheckpointVersionError: The body is in a format this release does not read.
    """
    container = _parsed(body, max_raw_bytes)
    manifest = container.manifest
    dill_vars = [v.name for v in manifest.variables if v.serializer == "dill"]
    if container.header.format_version >= 3:
        for frame, parts in zip(manifest.frames, frame_parts(container.sections, manifest), strict=True):
            for head, _buffers in parts:
                if head.kind is not SectionKind.STREAM:
                    continue  # a frame blob: the host scans it when it is new (`scan_frame_blob`)
                key = None
                if passing is not None:
                    key = stream_key(head)
                    if key in passed:
                        passing.add(key)
                        continue
                data = _decompress(head.codec, head.data, head.raw_size, writable=False)
                refusal = scan_pickle(data, rule)
                del data
                if refusal is not None:
                    return refusal, frame.names[0] if len(frame.names) == 1 else None
                if passing is not None and key is not None:
                    passing.add(key)
        cloud_vars: list[str] = []
    else:
        cloud_vars = [v.name for v in manifest.variables if v.serializer == "cloudpickle"]
    dill_index = 0
    for section in container.sections:
        if section.kind is SectionKind.DILL or (section.kind is SectionKind.STREAM and cloud_vars):
            data = _decompress(section.codec, section.data, section.raw_size, writable=False)
            refusal = scan_pickle(data, rule, dill=section.kind is SectionKind.DILL)
            del data
            if section.kind is SectionKind.STREAM:
                names = cloud_vars
            else:
                names, dill_index = dill_vars[dill_index : dill_index + 1], dill_index + 1
                if refusal is not None:
                    refusal = Refusal(refusal.module, refusal.name, refusal.reason, refusal.offset, 0)
            if refusal is not None:
                return refusal, names[refusal.index] if refusal.index < len(names) else None
    return None


def frame_blob_hashes(body: bytes | bytearray | memoryview | Container) -> dict[str, int]:
    """The frame blobs (pickles stored as blobs) a body refers to: hash hex to raw size; parses, never unpickles.

    Raises:
        CheckpointCorrupt: The body is malformed.
        CheckpointVersionError: The body is in a format this release does not read.
    """
    container = _parsed(body)
    return {bytes(s.data).hex(): s.raw_size for s in container.sections if s.kind is SectionKind.FRAME_BLOB}


def scan_frame_blob(
    stored: bytes | bytearray | memoryview, digest_hex: str, raw_size: int, rule: GlobalRule | Callable[[str], bool]
) -> Refusal | None:
    """Decode a stored frame blob (checking its hash) and apply the loader's rule to its pickle.

    Raises:
        CheckpointCorrupt: The blob is malformed or does not match its hash.
    """
    if blob_raw_size(stored) != raw_size:
        raise CheckpointCorrupt(f"frame blob {digest_hex} does not hold the {raw_size} bytes its checkpoint says")
    out = bytearray(raw_size)
    decode_blob(stored, digest=bytes.fromhex(digest_hex), into=memoryview(out))
    return scan_pickle(out, rule)


class UnscannedFrame(Exception):
    """A dump refers to a frame blob that is neither new (sent to be scanned) nor one the host scanned before."""


def check_frame_blobs(
    body: bytes | bytearray | memoryview | Container,
    new_blobs: Mapping[str, bytes | bytearray | memoryview],
    scanned: Collection[str],
    rule: GlobalRule | Callable[[str], bool],
) -> tuple[tuple[Refusal, str] | None, set[str]]:
    """The host's check of the pickles a dump stores as blobs, before it signs (`scan_body` covers the body's own).

    A frame blob the dump sends is new: it is decoded (its hash checked) and scanned. One it only refers to must be
    one the host scanned before (``scanned``: frames of its earlier dumps and of the checkpoint it loaded): a worker
    may not pass off a blob stored as data (an array's bytes) as a pickle. The signature then covers the list of
    frame hashes, each scanned once.

    Returns:
        The first refusal with the frame's hash (or None), and every frame hash the body refers to.

    Raises:
        CheckpointCorrupt: The body or a new frame blob is malformed or does not match its hash.
        UnscannedFrame: The body refers to a frame blob the host never scanned.
    """
    frames = frame_blob_hashes(body)
    for digest, raw_size in frames.items():
        stored = new_blobs.get(digest)
        if stored is None:
            if digest not in scanned:
                raise UnscannedFrame(f"the dump refers to frame blob {digest}, which the host never scanned")
            continue
        refusal = scan_frame_blob(stored, digest, raw_size, rule)
        if refusal is not None:
            return (refusal, digest), set(frames)
    return None, set(frames)


def scanned_frames(
    body: bytes | bytearray | memoryview | Container,
    blobs: Mapping[str, bytes | bytearray | memoryview],
    rule: GlobalRule | Callable[[str], bool],
    *,
    known: Collection[str] = (),
) -> set[str]:
    """The frame blobs of a loaded checkpoint that pass the rule (a later dump may refer to them unchanged).

    Args:
        body: The verified body, or its parsed container.
        blobs: The stored blobs the load fetched, by hash hex.
        rule: The session's rule.
        known: Frame hashes this host already scanned and found to pass the same rule (`PassedFrames`): kept when
            their blob was fetched, without being decoded and scanned again.
    """
    passed = set()
    for digest, raw_size in frame_blob_hashes(body).items():
        stored = blobs.get(digest)
        if stored is None:
            continue
        if digest in known:
            passed.add(digest)
            continue
        try:
            if scan_frame_blob(stored, digest, raw_size, rule) is None:
                passed.add(digest)
        except CheckpointCorrupt:
            continue  # the load reports it
    return passed


class AnyOf:
    """Membership in any of several containers (a session's last dump, its pool's), without building their union."""

    __slots__ = ("_containers",)

    def __init__(self, *containers: Lookup[Hashable]) -> None:
        self._containers = containers

    def __contains__(self, key: object) -> bool:
        return any(key in container for container in self._containers)


class _Passed:
    """Names (hashes, digests) that passed a policy's rule, by policy; past a bound, everything is forgotten."""

    def __init__(self, max_names: int) -> None:
        self._max_names = max_names
        self._passed: dict[Hashable, dict[Hashable, None]] = {}
        self._count = 0

    def view(self, policy: Hashable) -> AbstractSet[Hashable]:
        """The names that passed ``policy``'s rule (a view: it follows later `add`s)."""
        passed = self._passed.get(policy)
        return passed.keys() if passed is not None else frozenset()

    def add(self, policy: Hashable, names: Collection[Hashable]) -> None:
        if self._count + len(names) > self._max_names:
            self._passed = {}
            self._count = 0
            if len(names) > self._max_names:
                return
        passed = self._passed.setdefault(policy, {})
        before = len(passed)
        passed.update(dict.fromkeys(names))
        self._count += len(passed) - before


class PassedFrames:
    """Frame blobs and pickle streams this host scanned and found to pass a policy's rule, by policy; one per pool,
    bounded.

    A frame blob is named by the hash of its pickle and always decoded against that hash. A checkpoint this pool
    dumped refers to frames the host scanned before signing it; when a session with the same policy loads it, they
    need not be decoded and scanned a second time (a fifth of a 100k-dict load). A pickle stream of a body is named
    by its `stream_key`: the next turn's dump, in another session, sends the very same stream for each variable it
    did not change, which is not scanned again either. Streams are kept apart from frames, each under its own bound:
    every turn adds streams, and they must not push the frames out. What was scanned under another policy is not
    known to this one: its rule may be wider.
    """

    def __init__(self, max_frames: int = 16384) -> None:
        self._frames = _Passed(max_frames)
        self._streams = _Passed(max_frames)

    def known(self, policy: Hashable, digests: Iterable[str]) -> set[str]:
        """The ``digests`` that passed ``policy``'s rule here before."""
        passed = self._frames.view(policy)
        return {d for d in digests if d in passed} if passed else set()

    def add(self, policy: Hashable, digests: Collection[str]) -> None:
        """Record frames that passed ``policy``'s rule; past the bound, everything is forgotten (loads scan again)."""
        self._frames.add(policy, digests)

    def streams(self, policy: Hashable) -> AbstractSet[Hashable]:
        """The `stream_key` of every stream that passed ``policy``'s rule here (a view: it follows later adds)."""
        return self._streams.view(policy)

    def add_streams(self, policy: Hashable, keys: Collection[bytes]) -> None:
        """Record streams that passed ``policy``'s rule; past the bound, every stream is forgotten."""
        self._streams.add(policy, keys)
