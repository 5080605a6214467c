"""The trust boundary's host side: every check the host makes of what a worker sent about a checkpoint.

A worker is assumed compromised: it runs any code as its own uid under its filter. What it sends about a
checkpoint, and what the store hands back for one, passes the checks below before the host signs, stores, loads or
keeps any of it. A worker whose dump fails one is replaced (`ForgedBlob`, `ForgedFiles`: the session turns them into
`WorkerLost`); a stored checkpoint that fails one is refused (`CheckpointCorrupt`, `CheckpointExpired`). Each check
does work bounded by the bytes it is given, and nothing here unpickles.

Loading a checkpoint, before any of it reaches a worker:

- `check_id`: the ID's HMAC under one of the keyring's keys, a date at most ``max_clock_skew_s`` ahead of now, and
  an age within the ttl. Stops forged IDs, IDs pointed at another tenant's data, and IDs minted to outlive the ttl.
- `open_checkpoint`: the stored object is refused by its size before it is read (`Verifier.max_checkpoint_bytes`:
  the worker's memory in pickles, plus the manifest and tables), then its HMAC under the ID is checked, then its
  manifest is parsed from the verified bytes. Stops an object planted at a checkpoint key from filling the host's
  memory, and tampered, truncated or swapped bytes before anything parses them.
- A load's reply: the worker says only that it loaded (`Backend.load` returns the manifest it was given). The
  manifest a session keeps is the host's parse of the bytes it verified, never a worker's account of them. The
  checkpoint's blobs are read within their declared size (`BlobIO.fetch`) and the loader checks each one's hash.
- `Verifier.loaded`: the loaded frame blobs (pickles stored as blobs) are scanned against the session's rule, unless
  this pool's host passed the same bytes under an equal policy. Only frames the host itself passed may be referred
  to, unsent, by the next dump; a checkpoint signed by an older key gives none.

A dump's reply, before anything is stored or signed (`Verifier.check_dump`, in this order):

- The body is parsed once, its declared sizes capped by ``Limits.memory_bytes``; a worker's manifest is the one the
  process backend read from this very body (``Dumped.manifest_from_body``). Stops decompression bombs; a body the
  host cannot read is forged.
- `scan_body`: every pickle stream in the body against the loader's rule. A stream with the very bytes of one that
  passed in the session's last dump (or in an earlier turn of the pool, under an equal policy) is not scanned again.
  Stops a signature on a pickle the loader would refuse: a signed checkpoint is safe to load in either mode.
- `check_frame_blobs`: new frame blobs are decoded against their hash and scanned the same way; a frame only referred
  to must be one the host scanned at this session's last load or dump. Stops a dump passing off data (an array's
  bytes) as a pickle the host never saw.
- `check_blob_refs`: every blob the manifest lists is one this session loaded or wrote (its last load's or signed
  dump's), or one the dump sends now. Blob names are capabilities, not guesses: stops a worker that knows or
  guesses another conversation's content from listing that blob and reading it back at its next load (and from
  learning whether the store holds it).
- `check_files`: the workspace file list: normalized, unique paths outside the mounts, no file inside another file's
  path, sizes that match their chunks, every chunk a blob the manifest lists with that size (and no blob listed
  twice), at most `MAX_FILES` files, a total within the quota. Stops forged lists, and a workspace over its quota
  (`WorkspaceQuotaExceeded`: the session is unchanged).
- `check_new_blobs`: every new blob is named by its SHA-256 digest (older checkpoints' xxh3 names load, but nothing
  new is stored under a name one can collide), is listed in the manifest, holds the raw size the manifest says
  (read from the bytes received, before anything is allocated), and decodes to the content hash it is named by.
  Stops a worker storing garbage, or a planted collision, under the name of data other sessions store.

Not here: the bounds of every message (`snapcell.wire`) and the process backend's reply framing
(`backends/_procbackend.py`: part sizes that add up, blob names, a dumped body's manifest read within
`MAX_MANIFEST_ITEMS`), which run before a reply becomes a `Dumped`; the workspace path rule (`snapcell.workspace`),
which the worker applies too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from snapcell._support import ago, duration
from snapcell.checkpoint import (
    CHUNK_BYTES,
    DIGEST_BYTES,
    MAX_MANIFEST_BYTES,
    AnyOf,
    CheckpointId,
    Container,
    Dumped,
    Keyring,
    Manifest,
    PassedFrames,
    Refusal,
    UnscannedFrame,
    blob_raw_size,
    check_frame_blobs,
    declared_raw_bytes,
    decode_blob,
    frame_blob_hashes,
    parse_container,
    scan_body,
    scanned_frames,
)
from snapcell.errors import (
    CheckpointCorrupt,
    CheckpointExpired,
    CheckpointNotFound,
    CheckpointRefused,
    CheckpointVersionError,
    ObjectTooLarge,
    WorkspacePathError,
    WorkspaceQuotaExceeded,
)
from snapcell.interpreter import checkpoint_rule
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.storage import AsyncStore
from snapcell.workspace import MAX_FILES, check_path, effective_quota

__all__ = [
    "HMAC_THREAD_BYTES",
    "ForgedBlob",
    "ForgedFiles",
    "Opened",
    "Verifier",
    "check_files",
    "check_id",
    "check_new_blobs",
    "open_checkpoint",
]

# Verify and sign off the event loop above this size: HMAC-SHA256 runs at about 1 GB/s.
HMAC_THREAD_BYTES = 1024 * 1024
# Scan pickles off the event loop above this many raw bytes (the scan walks opcodes in Python, 40-60 MB/s: at most
# about 0.4 ms on the loop); below it the hand-off to a thread costs about as much as the scan.
_SCAN_THREAD_BYTES = 16 * 1024
# Largest checkpoint read when the session has no memory limit, and room for the header and section table.
_NO_MEMORY_LIMIT_CAP = 64 * 1024**3
_TABLE_SLACK_BYTES = 64 * 1024 * 1024


class ForgedBlob(Exception):
    """A worker sent a dump the host cannot read, or a blob whose content does not match its name: nothing is stored."""


class ForgedFiles(Exception):
    """A worker's workspace file list breaks the rules no honest worker breaks."""


# ---------------------------------------------------------------- checkpoint bytes, at load


def check_id(
    keyring: Keyring, checkpoint_id: bytes | bytearray | str, *, now: float, ttl_s: float, max_skew_s: float
) -> CheckpointId:
    """Verify an ID's signature and its date against ``now``; see `AsyncSession.parse_id`.

    Raises:
        CheckpointCorrupt: The ID is malformed, altered or signed with another key, or dated more than
            ``max_skew_s`` in the future.
        CheckpointExpired: The ID is older than ``ttl_s``.
    """
    cid = keyring.parse_id(checkpoint_id)
    if cid.created_at - now > max_skew_s:
        # Signed, but dated in the future: a clock far off, or an ID minted to outlive the ttl.
        raise CheckpointCorrupt(
            f"checkpoint {cid.raw.hex()[:16]}... is dated {ago(cid.created_at - now)} in the future, beyond "
            f"the clock-skew tolerance of {duration(max_skew_s)}; check this host's clock (and the one "
            "that wrote it) or raise max_clock_skew_s",
            checkpoint_id=cid.raw,
        )
    if now - cid.created_at > ttl_s:
        expired_at = cid.created_at + ttl_s
        raise CheckpointExpired(
            f"checkpoint {cid.raw.hex()[:16]}... expired {ago(now - expired_at)} ago "
            f"(checkpoints are kept for {duration(ttl_s)}); start a fresh session",
            checkpoint_id=cid.raw,
            created_at=cid.created_at,
            expired_at=expired_at,
        )
    return cid


@dataclass(frozen=True, slots=True, kw_only=True)
class Opened:
    """A stored checkpoint that passed `open_checkpoint`.

    Attributes:
        body: The body under the verified HMAC (a view of the stored bytes).
        key_index: Position in the keyring of the key that signed it (0: the current signing key).
        container: The body, parsed: its manifest is the one the session keeps.
        stored_bytes: Size of the stored object.
    """

    body: memoryview
    key_index: int
    container: Container
    stored_bytes: int


async def open_checkpoint(store: AsyncStore, keyring: Keyring, cid: CheckpointId, *, max_bytes: int) -> Opened:
    """Read a stored checkpoint of at most ``max_bytes``, verify its HMAC under ``cid``, and parse it.

    Raises:
        CheckpointCorrupt: The stored object is larger than ``max_bytes`` (it was not read), or its bytes were
            altered, truncated or signed with another key (nothing was parsed), or they do not parse.
        CheckpointNotFound: Nothing is stored under the ID.
        CheckpointVersionError: A checkpoint format this snapcell cannot read.
        StorageError: The store failed.
    """
    try:
        # Refused by its size before it is read: a checkpoint holds at most the worker's memory in pickles.
        blob = await store.get_at_most(cid.storage_key, max_bytes)
    except ObjectTooLarge as exc:
        raise CheckpointCorrupt(
            f"the object stored for checkpoint {cid.raw.hex()[:16]}... is {exc.size} bytes, more than any "
            f"checkpoint of this session can be ({exc.limit}); it was not read or loaded",
            checkpoint_id=cid.raw,
        ) from exc
    except CheckpointNotFound as exc:
        raise CheckpointNotFound(
            f"no checkpoint is stored for ID {cid.raw.hex()[:16]}...; it was deleted by cleanup or never "
            "written to this store; start a fresh session",
            checkpoint_id=cid.raw,
            key=cid.storage_key,
        ) from exc
    if len(blob) > HMAC_THREAD_BYTES:
        body, key_index = await asyncio.to_thread(keyring.verify_with_key, blob, cid)
    else:
        body, key_index = keyring.verify_with_key(blob, cid)
    return Opened(body=body, key_index=key_index, container=parse_container(body), stored_bytes=len(blob))


# ---------------------------------------------------------------- a dump's new blobs and workspace files


def check_blob_refs(manifest: Manifest, known: Collection[str], new: Collection[str]) -> None:
    """Check that a dump lists only blobs the session may refer to: ``known`` (loaded or written) or ``new``.

    Raises:
        ForgedBlob: A listed blob is neither (a compromised worker naming another session's data).
    """
    for ref in manifest.blobs:
        if ref.hash not in known and ref.hash not in new:
            raise ForgedBlob(f"the worker's dump refers to blob {ref.hash}, which this session never loaded or wrote")


def check_new_blobs(dumped: Dumped) -> None:
    """Decode every new blob of a dump and compare its hash with its name, before anything is stored.

    CPU work (a blob is decoded whole): call it in a thread.

    Raises:
        ForgedBlob: A new blob is not listed in the manifest, or does not hold what its name and the manifest say.
    """
    sizes = {ref.hash: ref.raw_bytes for ref in dumped.manifest.blobs}
    scratch = bytearray()
    for name, data in dumped.new_blobs.items():
        if len(name) != 2 * DIGEST_BYTES:
            # Older checkpoints' xxh3 names still load, but nothing new is stored under a name one can collide.
            raise ForgedBlob(f"the worker sent blob {name[:80]}, which is not named by its SHA-256 digest")
        size = sizes.get(name)
        if size is None:
            raise ForgedBlob(f"the worker sent blob {name}, which its manifest does not list")
        if blob_raw_size(data) != size:
            # Checked against the bytes actually received before allocating: a manifest may claim any size.
            raise ForgedBlob(
                f"the worker sent blob {name} whose content does not match its name: it does not hold the {size} "
                "bytes its manifest says"
            )
        if len(scratch) < size:
            scratch = bytearray(size)
        try:
            decode_blob(data, digest=bytes.fromhex(name), into=memoryview(scratch)[:size])
        except (CheckpointCorrupt, ValueError) as exc:
            raise ForgedBlob(f"the worker sent blob {name} whose content does not match its name: {exc}") from exc


def check_files(manifest: Manifest, *, quota_bytes: int | None, mounts: Collection[str] = ()) -> int:
    """Check a dump's workspace files against its blob list and the quota; return their total size.

    Raises:
        ForgedFiles: The list is malformed (only a broken or compromised worker sends one).
        WorkspaceQuotaExceeded: The files are over the quota.
    """
    files = manifest.files
    if len(files) > MAX_FILES:
        raise ForgedFiles(f"{len(files)} workspace files, more than {MAX_FILES}")
    raw = {ref.hash: ref.raw_bytes for ref in manifest.blobs}
    if len(raw) != len(manifest.blobs):
        raise ForgedFiles("a blob is listed twice")
    seen: set[str] = set()
    total = 0
    for entry in files:
        try:
            path = check_path(entry.path, mounts=mounts, writing=True)
        except WorkspacePathError as exc:
            raise ForgedFiles(str(exc)) from None
        if path != entry.path or path in seen:
            raise ForgedFiles(f"workspace path {entry.path[:200]!r} is not normalized or not unique")
        seen.add(path)
        expected = -(-entry.size_bytes // CHUNK_BYTES)
        if len(entry.chunks) != expected:
            raise ForgedFiles(f"workspace file {path!r} has {len(entry.chunks)} chunks for {entry.size_bytes} bytes")
        for index, key in enumerate(entry.chunks):
            want = min(CHUNK_BYTES, entry.size_bytes - index * CHUNK_BYTES)
            if raw.get(key) != want:
                raise ForgedFiles(f"chunk {key[:40]!r} of workspace file {path!r} is not a listed blob of its size")
        total += entry.size_bytes
    for path in seen:  # "a" and "a/b" cannot both be files
        parent = path.rpartition("/")[0]
        while parent:
            if parent in seen:
                raise ForgedFiles(f"workspace file {parent!r} is also a directory")
            parent = parent.rpartition("/")[0]
    if quota_bytes is not None and total > quota_bytes:
        raise WorkspaceQuotaExceeded(
            f"the workspace holds {total:,} bytes of files, over its quota of {quota_bytes:,} bytes "
            "(Limits.workspace_bytes); nothing was saved",
            limit="workspace_bytes",
            value=quota_bytes,
            used_bytes=total,
        )
    return total


# ---------------------------------------------------------------- one session's checks, and what they passed


class Verifier:
    """One session's checks of its checkpoints' pickles and files, and what they already passed.

    Create one per checked-out session (`AsyncPool.checkout` does); use it from that session's task only.

    Args:
        policy: The session's policy: its checkpoint rule (the loader's module rule) is applied to every pickle
            before the host signs it.
        limits: The session's limits: ``memory_bytes`` caps what a checkpoint may declare, the workspace quota
            (`effective_quota`) the total of its files.
        mounts: Names of the session's read-only mounts: no file of a dump may lie in one.
        passed: What this pool's host passed, by policy, shared by its sessions (a load of the pool's own dump, and
            the next turn's dump, need not scan those bytes again).
    """

    def __init__(
        self, *, policy: Policy, limits: Limits, mounts: Collection[str] = (), passed: PassedFrames | None = None
    ) -> None:
        self.policy = policy
        self.rule = checkpoint_rule(policy)
        self.limits = limits
        self.mounts = frozenset(mounts)
        self.passed = passed if passed is not None else PassedFrames()
        # Frame blobs (pickles stored as blobs) the host scanned: a dump may refer to these without sending them.
        self.frames: set[str] = set()
        # Pickle streams of the last dump's body that passed the rule (`stream_key`): the next dump's unchanged
        # variables send the very same bytes, which are not scanned again. At most one body's worth of digests.
        self.streams: frozenset[bytes] = frozenset()
        # What the dump being checked passed: the session's own once that dump is signed (`dump_signed`).
        self._dump_frames: set[str] = set()
        self._dump_streams: frozenset[bytes] = frozenset()

    @property
    def quota_bytes(self) -> int | None:
        """The workspace quota in force (None: no quota)."""
        return effective_quota(self.limits.workspace_bytes, self.limits.max_scratch_bytes)

    @property
    def max_checkpoint_bytes(self) -> int:
        """The largest stored checkpoint this session will read: its pickles, manifest and tables."""
        memory = self.limits.memory_bytes
        return (memory if memory is not None else _NO_MEMORY_LIMIT_CAP) + MAX_MANIFEST_BYTES + _TABLE_SLACK_BYTES

    async def loaded(self, container: Container, blobs: Mapping[str, bytes], key_index: int) -> None:
        """Take the frames of a checkpoint the session loaded: those the rule passes may be referred to unsent.

        Args:
            container: The verified body, parsed (`Opened.container`).
            blobs: The blobs the load fetched, by hash hex.
            key_index: Position of the key that signed it: a checkpoint signed by an older key gives no frames (its
                blobs live in that key's namespace, which the next dump does not write to).
        """
        if key_index != 0:
            self.frames = set()
            return
        frames = frame_blob_hashes(container)
        known = self.passed.known(self.policy, frames)
        if sum(size for digest, size in frames.items() if digest not in known) > _SCAN_THREAD_BYTES:
            self.frames = await asyncio.to_thread(scanned_frames, container, blobs, self.rule, known=known)
        else:
            self.frames = scanned_frames(container, blobs, self.rule, known=known)
        self.passed.add(self.policy, self.frames)

    def forget(self) -> None:
        """The namespace was reset: a dump may refer to no frame unsent."""
        self.frames = set()

    async def check_dump(self, dumped: Dumped, *, known_blobs: Collection[str] = ()) -> None:
        """Check a dump before anything is stored or signed: its pickles, files, blob references and new blobs.

        The body is parsed once, with its declared sizes capped, and every check reads that parse.

        Args:
            dumped: What the worker sent.
            known_blobs: The blobs (hash hex) the session loaded or wrote: the dump may refer to these unsent.

        Raises:
            CheckpointRefused: A pickle names a global the loader would refuse.
            ForgedBlob: The body is malformed, or a new blob does not match its name (a compromised worker).
            ForgedFiles: The workspace file list is malformed.
            WorkspaceQuotaExceeded: The workspace files are over the quota.
        """
        found = None
        # A small dump is scanned on the event loop (a thread hand-off costs more); a large one, or a few bytes
        # that declare much data to decompress, in a thread.
        inline = len(dumped.body) + sum(map(len, dumped.new_blobs.values())) <= _SCAN_THREAD_BYTES
        if inline:
            container = self._parse(dumped)
            inline = declared_raw_bytes(container, dumped.new_blobs) <= _SCAN_THREAD_BYTES
            if inline:
                found = self._check(container, dumped, known_blobs)
            del container  # its views of the body must be gone before signing appends to it
        if not inline:
            found = await asyncio.to_thread(self._scan, dumped, known_blobs)
        if found is not None:
            refusal, variable = found
            where = f"variable {variable!r}" if variable else "the checkpoint"
            raise CheckpointRefused(
                f"{where} refers to {refusal.describe()}, which a checkpoint may not hold; nothing was stored. "
                "Delete or recreate that variable (or allow its module in the policy) and dump again",
                module=refusal.module,
                name=refusal.name,
                reason=refusal.reason,
                variable_names=[variable] if variable else [],
            )
        if dumped.new_blobs:
            await asyncio.to_thread(check_new_blobs, dumped)

    def dump_signed(self) -> None:
        """The dump `check_dump` passed last was signed: later dumps, and the pool's next sessions, build on it."""
        self.frames = self._dump_frames
        self.streams = self._dump_streams
        self.passed.add(self.policy, self.frames)
        self.passed.add_streams(self.policy, self.streams)  # the next turn's session skips them too

    def _scan(self, dumped: Dumped, known_blobs: Collection[str]) -> tuple[Refusal, str | None] | None:
        """Parse the body once, then scan its pickles and new frame blobs and check its files (CPU work: a thread).

        The parse holds views of the body; it is not returned, so none is left when signing appends to the body.
        """
        return self._check(self._parse(dumped), dumped, known_blobs)

    def _parse(self, dumped: Dumped) -> Container:
        """Parse a dump's body, its declared sizes capped.

        Raises:
            ForgedBlob: The host cannot read it (a compromised worker).
        """
        try:
            # A worker's dump: its manifest was parsed from this body when it arrived, and is not parsed again.
            known = dumped.manifest if dumped.manifest_from_body else None
            return parse_container(dumped.body, max_raw_bytes=self.limits.memory_bytes, manifest=known)
        except (CheckpointCorrupt, CheckpointVersionError) as exc:
            # Only a compromised worker sends a body the host cannot read: it is treated like a forged blob.
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot read: {exc}") from exc

    def _check(
        self, container: Container, dumped: Dumped, known_blobs: Collection[str]
    ) -> tuple[Refusal, str | None] | None:
        """Scan a parsed dump's pickles and new frame blobs against the loader's rule; check its blobs and files."""
        try:
            passing: set[bytes] = set()
            passed = AnyOf(self.streams, self.passed.streams(self.policy))
            found = scan_body(container, rule=self.rule, passed=passed, passing=passing)
            self._dump_streams = frozenset(passing)
        except (CheckpointCorrupt, CheckpointVersionError) as exc:
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot read: {exc}") from exc
        if found is not None:
            return found
        try:
            frame_found, self._dump_frames = check_frame_blobs(container, dumped.new_blobs, self.frames, self.rule)
        except (CheckpointCorrupt, UnscannedFrame) as exc:
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot verify: {exc}") from exc
        if frame_found is not None:
            return frame_found[0], None
        check_blob_refs(container.manifest, known_blobs, dumped.new_blobs)
        check_files(container.manifest, quota_bytes=self.quota_bytes, mounts=self.mounts)
        return None
