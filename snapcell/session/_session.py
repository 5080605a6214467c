"""A checked-out session: load a checkpoint, run scripts, dump a new checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any, Literal, TypeVar

from snapcell._support import ago, duration
from snapcell.backends import Backend, DumpRequest, LoadRequest, RunRequest
from snapcell.checkpoint import (
    MAX_MANIFEST_BYTES,
    AnyOf,
    BlobRef,
    CheckpointId,
    Container,
    Dumped,
    Keyring,
    Manifest,
    PassedFrames,
    Refusal,
    UnscannedFrame,
    check_frame_blobs,
    declared_raw_bytes,
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
    ConfigError,
    ObjectTooLarge,
    RunCancelled,
    SessionError,
    SnapcellError,
    TypingError,
    WorkerLost,
    WorkspaceError,
    WorkspaceQuotaExceeded,
)
from snapcell.interpreter import RunResult, checkpoint_rule, validate_lookup
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.session._blobio import BlobIO, ForgedBlob
from snapcell.storage import AsyncStore
from snapcell.telemetry import note_checkpoint, trace_checkpoint, trace_run
from snapcell.typecheck import TypeChecker
from snapcell.wire import check_script
from snapcell.workspace import FileInfo, ForgedFiles, check_files, check_path, effective_quota, media_type

__all__ = ["DEFAULT_MAX_CLOCK_SKEW_S", "AsyncSession"]

# IDs dated further ahead than this are refused: a clock-skew tolerance, not a way to outlive the ttl.
DEFAULT_MAX_CLOCK_SKEW_S = 300.0

T = TypeVar("T")
HostFunctions = Mapping[str, Callable[..., Any]]
# Verify and sign off the event loop above this size: HMAC-SHA256 runs at about 1 GB/s.
_THREAD_BYTES = 1024 * 1024
# Scan pickles off the event loop above this many raw bytes (the scan walks opcodes in Python, 40-60 MB/s: at most
# about 0.4 ms on the loop); below it the hand-off to a thread costs about as much as the scan.
_SCAN_THREAD_BYTES = 16 * 1024
# Largest checkpoint read when the session has no memory limit, and room for the header and section table.
_NO_MEMORY_LIMIT_CAP = 64 * 1024**3
_TABLE_SLACK_BYTES = 64 * 1024 * 1024


class AsyncSession:
    """One session checked out of an `AsyncPool`; use it from one task at a time.

    Create sessions with `AsyncPool.checkout`, not directly.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        store: AsyncStore,
        keyring: Keyring,
        ttl_s: float,
        clock: Callable[[], float],
        compression_level: int,
        limits: Limits,
        checker: TypeChecker | None,
        policy: Policy | None = None,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
        mounts: Collection[str] = (),
        passed_frames: PassedFrames | None = None,
    ) -> None:
        self._backend = backend
        self._max_skew_s = max_clock_skew_s
        self._mounts = frozenset(mounts)
        # The loader's module rule: every pickle is checked against it before the host signs anything.
        self._policy = policy or Policy()
        self._rule = checkpoint_rule(self._policy)
        # Frames the pool's host scanned under each policy: a load of its own dump need not scan them again.
        self._passed = passed_frames if passed_frames is not None else PassedFrames()
        self._store = store
        self._keyring = keyring
        self._ttl_s = ttl_s
        self._clock = clock
        self._level = compression_level
        self._limits = limits
        self._checker = checker
        self._closed = False
        self._busy = False
        self._setup_since_checkpoint: list[str] = []
        # Blobs this session wrote or loaded: a later dump refers to them instead of storing them again.
        self._blobs: dict[str, BlobRef] = {}
        # Frame blobs (pickles stored as blobs) the host scanned: a dump may refer to these without sending them.
        self._frames: set[str] = set()
        self._dump_frames: set[str] = set()
        # Pickle streams of the last dump's body that passed the rule (`stream_key`): the next dump's unchanged
        # variables send the very same bytes, which are not scanned again. At most one body's worth of digests.
        self._streams: frozenset[bytes] = frozenset()
        self._dump_streams: frozenset[bytes] = frozenset()
        self._blob_io = BlobIO(store, keyring.blob_namespace())
        self.checkpoint_id: bytes | None = None
        self.checkpoint_bytes: int | None = None
        # Bytes the last dump put into the store (the checkpoint and its new blobs).
        self.bytes_stored = 0
        # A worker was lost and replaced since the last run: the next run's result says so.
        self._restarted = False
        self.manifest: Manifest | None = None

    def _start(self) -> None:
        if self._closed:
            raise SessionError("this session was checked in; check out a new one from the pool")
        if self._busy:
            raise SessionError("this session is already running a request; await it before starting another")
        self._busy = True

    def parse_id(self, checkpoint_id: bytes | bytearray | str) -> CheckpointId:
        """Verify an ID's signature and expiry without loading it.

        Raises:
            CheckpointCorrupt: The ID is malformed, altered or signed with another key, or dated in the future
                beyond the pool's ``max_clock_skew_s``.
            CheckpointExpired: The ID is older than the pool's ttl.
        """
        cid = self._keyring.parse_id(checkpoint_id)
        now = self._clock()
        if cid.created_at - now > self._max_skew_s:
            # Signed, but dated in the future: a clock far off, or an ID minted to outlive the ttl.
            raise CheckpointCorrupt(
                f"checkpoint {cid.raw.hex()[:16]}... is dated {ago(cid.created_at - now)} in the future, beyond "
                f"the clock-skew tolerance of {duration(self._max_skew_s)}; check this host's clock (and the one "
                "that wrote it) or raise max_clock_skew_s",
                checkpoint_id=cid.raw,
            )
        if now - cid.created_at > self._ttl_s:
            expired_at = cid.created_at + self._ttl_s
            raise CheckpointExpired(
                f"checkpoint {cid.raw.hex()[:16]}... expired {ago(now - expired_at)} ago "
                f"(checkpoints are kept for {duration(self._ttl_s)}); start a fresh session",
                checkpoint_id=cid.raw,
                created_at=cid.created_at,
                expired_at=expired_at,
            )
        return cid

    async def load_session(self, checkpoint_id: bytes | bytearray | str) -> None:
        """Replace this session's namespace with a checkpoint's.

        Args:
            checkpoint_id: An ID returned by `dump`, as bytes or hex text.

        Raises:
            CheckpointCorrupt: The ID or the checkpoint bytes were altered or signed with another key;
                nothing was unpickled and the session is unchanged.
            CheckpointExpired: The ID is older than the ttl; the session is unchanged.
            CheckpointNotFound: No checkpoint is stored under the ID; the session is unchanged.
            CheckpointVersionError: A checkpoint format this snapcell cannot read; the session is unchanged.
            StorageError: The store failed; the session is unchanged and the call may be retried.
        """
        self._start()
        try:
            await self._load(checkpoint_id)
            self._setup_since_checkpoint = []
        except WorkerLost:
            await self._restore("load")
            raise
        finally:
            self._busy = False

    @trace_checkpoint("snapcell.load")
    async def _load(self, checkpoint_id: bytes | bytearray | str) -> None:
        cid = self.parse_id(checkpoint_id)
        try:
            # Refused by its size before it is read: a checkpoint holds at most the worker's memory in pickles.
            blob = await self._store.get_at_most(cid.storage_key, self._max_checkpoint_bytes())
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
        if len(blob) > _THREAD_BYTES:
            body, key_index = await asyncio.to_thread(self._keyring.verify_with_key, blob, cid)
        else:
            body, key_index = self._keyring.verify_with_key(blob, cid)
        note_checkpoint(body)
        container = parse_container(body)
        refs = container.manifest.blobs
        # Blobs live in the namespace of the key that signed the checkpoint (an older key after a rotation).
        blobs = await BlobIO(self._store, self._keyring.blob_namespace(key_index)).fetch(refs)
        self.manifest = await self._backend.load(LoadRequest(body=body, blobs=blobs, manifest=container.manifest))
        if key_index != 0:
            self._frames = set()
        else:
            frames = frame_blob_hashes(container)
            known = self._passed.known(self._policy, frames)
            if sum(size for digest, size in frames.items() if digest not in known) > _SCAN_THREAD_BYTES:
                self._frames = await asyncio.to_thread(scanned_frames, container, blobs, self._rule, known=known)
            else:
                self._frames = scanned_frames(container, blobs, self._rule, known=known)
            self._passed.add(self._policy, self._frames)
        self.checkpoint_id = cid.raw
        self.checkpoint_bytes = len(blob)
        # Only blobs in the signing key's namespace can be referred to by the next dump.
        self._blobs = {ref.hash: ref for ref in refs} if key_index == 0 else {}

    def _max_checkpoint_bytes(self) -> int:
        """The largest stored checkpoint this session will read: its pickles, manifest and tables."""
        memory = self._limits.memory_bytes
        return (memory if memory is not None else _NO_MEMORY_LIMIT_CAP) + MAX_MANIFEST_BYTES + _TABLE_SLACK_BYTES

    async def _restore(self, during: str) -> None:
        """After a lost worker: reload the last checkpoint and queue the setup cells run since."""
        source = "its last checkpoint" if self.checkpoint_id is not None else "an empty namespace"
        note = f"the Python session restarted (its worker was lost during {during}); it continues from {source}"
        try:
            if self.checkpoint_id is not None:
                await self._load(self.checkpoint_id)
            else:
                await self._backend.reset()
            await self._backend.queue(notes=[note], setup_cells=list(self._setup_since_checkpoint))
            self._restarted = True
        except SnapcellError as exc:
            raise SessionError(f"the session could not be restored after its worker was lost: {exc}") from exc

    async def run(
        self,
        code: str,
        *,
        external_lookup: HostFunctions | None = None,
        setup: bool = False,
        skip_type_check: bool = False,
        limits: Limits | None = None,
        then_dump: bool = False,
    ) -> RunResult:
        """Run a script and report everything it did; script problems do not raise.

        Args:
            code: The script; top-level ``await`` is allowed and a trailing expression is the value.
            external_lookup: Host functions by name (sync or async), callable from the script this run.
            setup: Mark the cell as a setup cell (imports, data loading), run again after a restart.
            skip_type_check: Skip type checking for this run.
            limits: Limits for this run instead of the session's.
            then_dump: A `dump` (with ``on_unpicklable="skip"``) follows: a worker starts it as soon as the run
                ends, in the same request, and that `dump` takes its result, dated when this run started (process
                mode; a round trip fewer). Any other call first waits for that dump and drops it.

        Returns:
            The run's result; ``result.error`` holds a `ScriptError` when the script failed.

        Raises:
            ConfigError: ``external_lookup`` is malformed; nothing ran.
            SessionError: The session was checked in or is busy.
            WorkerLost: The worker died during the run; the session was restored from its last checkpoint (usable,
                without this run's changes) and ``exc.result`` is a `RunResult` with status ``"lost"``; the next
                run's result has ``restarted`` set.
            RunCancelled: The task running this was cancelled: the script was interrupted where it was, its
                variables are kept and the session is usable; ``exc.result`` has status ``"cancelled"``. A worker
                that did not stop within ``grace_s`` was killed: then the status is ``"lost"`` and the session was
                restored from its last checkpoint, as after `WorkerLost`.
        """
        return await self._run(code, external_lookup, setup, skip_type_check, limits, then_dump, True)

    @trace_run
    async def _run(
        self,
        code: str,
        external_lookup: HostFunctions | None,
        setup: bool,
        skip_type_check: bool,
        limits: Limits | None,
        then_dump: bool,
        report: bool,
    ) -> RunResult:
        """`run`; ``report`` False (`feed_run`): only the value and error are read (see `Backend.run`)."""
        lookup = validate_lookup(external_lookup)
        self._start()
        try:
            if limits is not None and not isinstance(limits, Limits):
                raise ConfigError(f"limits must be a snapcell.Limits, not {type(limits).__name__}")
            rejected = check_script(code, limits or self._limits)
            if rejected is not None:  # not text, or too large to send: nothing runs and the session is unchanged
                return RunResult(error=rejected)
            if self._checker is not None and not skip_type_check:
                declarations = await self._backend.declarations()
                try:
                    await self._checker.acheck_or_raise(code, declarations=declarations)
                except TypingError as exc:
                    return RunResult(error=exc)
            started = time.perf_counter()
            restarted, self._restarted = self._restarted, False
            try:
                dump = self._dump_request(self._clock(), "skip") if then_dump else None
                request = RunRequest(
                    code=code, lookup=lookup, setup=setup, limits=limits or self._limits, then_dump=dump, report=report
                )
                result = await self._backend.run(request)
            except WorkerLost as exc:
                exc.result = RunResult(
                    status="lost", duration_s=time.perf_counter() - started, restarted=restarted, error=None
                )
                await self._restore("run")
                raise
            except RunCancelled as exc:
                if exc.result.status == "lost":  # the worker did not stop when asked, and was killed
                    await self._restore("run")
                if restarted:
                    exc.result = dataclasses.replace(exc.result, restarted=True)
                raise
            if restarted:
                result = dataclasses.replace(result, restarted=True)
            if setup and result.error is None and code not in self._setup_since_checkpoint:
                self._setup_since_checkpoint.append(code)
            return result
        finally:
            self._busy = False

    async def feed_run(
        self,
        code: str,
        *,
        external_lookup: HostFunctions | None = None,
        setup: bool = False,
        skip_type_check: bool = False,
        limits: Limits | None = None,
    ) -> Any:
        """Run a script and return the value of its trailing expression (None without one).

        Args: as for `run`.

        Raises:
            ScriptError: The script failed (``ScriptSyntaxError``, ``PolicyError``, ``TypingError`` or
                its own exception); variables assigned before the failure are kept and the session is usable.
            LimitExceeded: A limit stopped the run; the session is usable with earlier variables.
            ConfigError: ``external_lookup`` is malformed; nothing ran.
        """
        result = await self._run(code, external_lookup, setup, skip_type_check, limits, False, False)
        if result.error is not None:
            raise result.error
        return result.value

    def _dump_request(self, created_at: float, on_unpicklable: Literal["skip", "fail"]) -> DumpRequest:
        """A dump of this session's namespace, referring to the blobs it knows and the frames the host passed."""
        return DumpRequest(
            created_at=created_at,
            level=self._level,
            on_unpicklable=on_unpicklable,
            known_blobs=self._blobs,
            passed_frames=self._frames,
        )

    @trace_checkpoint("snapcell.dump")
    async def dump(self, *, on_unpicklable: Literal["skip", "fail"] = "skip") -> bytes:
        """Save the namespace as a new checkpoint and return its ID.

        A variable that cannot be serialized is dropped, named in the manifest and in the next run's
        notes; with ``on_unpicklable="fail"`` nothing is stored instead. After ``run(..., then_dump=True)`` this
        takes the dump the worker started when that run ended (dated when the run started), checked as any other.

        Returns:
            The new checkpoint's opaque, signed ID (``.hex()`` it to store as text).

        The workspace's files (process mode) go into the checkpoint as content-addressed blobs: a file
        unchanged since the last dump or load costs no new bytes in the store.

        Raises:
            UnpicklableValue: With ``on_unpicklable="fail"``; nothing was stored, the session is unchanged.
            CheckpointRefused: A pickle of the namespace names a global the loader would refuse (checked by the
                host before signing); nothing was stored or signed, the session is unchanged.
            WorkspaceQuotaExceeded: The workspace's files exceed ``Limits.workspace_bytes``; nothing was stored,
                the session and its files are unchanged (delete files, then dump again).
            StorageError: The store failed; nothing was stored, the session is unchanged.
        """
        self._start()
        try:
            now = self._clock()
            ahead = self._backend.pending_dump
            try:
                if ahead is not None and ahead.on_unpicklable == on_unpicklable and ahead.known_blobs is self._blobs:
                    # Asked for with the run (``then_dump``), and nothing it depends on changed since.
                    now = ahead.created_at
                    dumped = await self._backend.dumped()
                else:
                    dumped = await self._backend.dump(self._dump_request(now, on_unpicklable))
                await self._verify(dumped)
                if not await self._blob_io.store(dumped, now + self._ttl_s):
                    # A blob this session relied on is gone from the store: write everything again.
                    self._blobs = {}
                    dumped = await self._backend.dump(self._dump_request(now, on_unpicklable))
                    await self._verify(dumped)
                    await self._blob_io.store(dumped, now + self._ttl_s)
            except (ForgedBlob, ForgedFiles) as exc:
                # Only a compromised worker sends a blob that is not what it claims: it goes, nothing is stored.
                await self._backend.discard()
                await self._restore("dump")
                raise WorkerLost(f"{exc}; the worker was replaced and the session restored", reason="crash") from exc
            except WorkerLost:
                await self._restore("dump")
                raise
            body, manifest = dumped.body, dumped.manifest
            note_checkpoint(body)
            cid = self._keyring.new_id(now)
            if len(body) > _THREAD_BYTES:
                blob = await asyncio.to_thread(self._keyring.sign, body, cid)
            else:
                blob = self._keyring.sign(body, cid)
            await self._store.put(cid.storage_key, blob, expires_at=now + self._ttl_s)
            self.bytes_stored = len(blob) + sum(len(data) for data in dumped.new_blobs.values())
            self.checkpoint_id = cid.raw
            self.checkpoint_bytes = len(blob)
            self.manifest = manifest
            self._setup_since_checkpoint = []
            self._blobs = {ref.hash: ref for ref in manifest.blobs}
            self._frames = self._dump_frames
            self._streams = self._dump_streams
            self._passed.add(self._policy, self._frames)
            self._passed.add_streams(self._policy, self._streams)  # the next turn's session skips them too
            return cid.raw
        finally:
            self._busy = False

    async def _verify(self, dumped: Dumped) -> None:
        """Check a dump before anything is stored or signed: every pickle against the loader's rule, the files.

        The body is parsed once, with its declared sizes capped, and every check reads that parse.

        Raises:
            CheckpointRefused: A pickle names a global the loader would refuse.
            ForgedBlob: The body is malformed (a compromised worker).
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
                found = self._check(container, dumped)
            del container  # its views of the body must be gone before signing appends to it
        if not inline:
            found = await asyncio.to_thread(self._scan, dumped)
        if found is None:
            return
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

    def _scan(self, dumped: Dumped) -> tuple[Refusal, str | None] | None:
        """Parse the body once, then scan its pickles and new frame blobs and check its files (CPU work: a thread).

        The parse holds views of the body; it is not returned, so none is left when signing appends to the body.
        """
        return self._check(self._parse(dumped), dumped)

    def _parse(self, dumped: Dumped) -> Container:
        """Parse a dump's body, its declared sizes capped.

        Raises:
            ForgedBlob: The host cannot read it (a compromised worker).
        """
        try:
            # A worker's dump: its manifest was parsed from this body when it arrived, and is not parsed again.
            known = dumped.manifest if dumped.manifest_from_body else None
            return parse_container(dumped.body, max_raw_bytes=self._limits.memory_bytes, manifest=known)
        except (CheckpointCorrupt, CheckpointVersionError) as exc:
            # Only a compromised worker sends a body the host cannot read: it is treated like a forged blob.
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot read: {exc}") from exc

    def _check(self, container: Container, dumped: Dumped) -> tuple[Refusal, str | None] | None:
        """Scan a parsed dump's pickles and new frame blobs against the loader's rule, and check its files."""
        try:
            passing: set[bytes] = set()
            passed = AnyOf(self._streams, self._passed.streams(self._policy))
            found = scan_body(container, rule=self._rule, passed=passed, passing=passing)
            self._dump_streams = frozenset(passing)
        except (CheckpointCorrupt, CheckpointVersionError) as exc:
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot read: {exc}") from exc
        if found is not None:
            return found
        try:
            frame_found, self._dump_frames = check_frame_blobs(container, dumped.new_blobs, self._frames, self._rule)
        except (CheckpointCorrupt, UnscannedFrame) as exc:
            raise ForgedBlob(f"the worker sent a checkpoint the host cannot verify: {exc}") from exc
        if frame_found is not None:
            return frame_found[0], None
        quota = effective_quota(self._limits.workspace_bytes, self._limits.max_scratch_bytes)
        check_files(container.manifest, quota_bytes=quota, mounts=self._mounts)
        return None

    async def write_file(self, path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
        """Write a file into the session's workspace, replacing any file at ``path`` (process mode).

        The script sees it at once (relative to its working directory); it is in the checkpoint after the
        next `dump`. Parent directories are created.

        Args:
            path: A path relative to the workspace (``"data/input.csv"``).
            data: The file's bytes.

        Raises:
            WorkspacePathError: The path is absolute, climbs out with ``..``, goes through a symlink or lies in a
                read-only mount; nothing was written.
            WorkspaceQuotaExceeded: The workspace would exceed its quota; nothing was written, earlier files are kept.
            WorkspaceError: Inline mode (no workspace), or the file could not be written; nothing was written.
        """
        checked = check_path(path, mounts=self._mounts, writing=True)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise WorkspaceError(f"file data must be bytes, not {type(data).__name__}", path=checked)
        quota = effective_quota(self._limits.workspace_bytes, self._limits.max_scratch_bytes)
        if quota is not None and len(data) > quota:
            raise WorkspaceQuotaExceeded(
                f"{checked!r} would have {len(data):,} bytes, over the workspace quota of {quota:,} bytes "
                "(Limits.workspace_bytes); nothing was written",
                limit="workspace_bytes",
                value=quota,
                used_bytes=len(data),
            )
        await self._file_request(self._backend.write_file(checked, data))

    async def read_file(self, path: str | os.PathLike[str]) -> bytes:
        """Return the bytes of a file in the session's workspace (process mode); a mount's files too.

        Raises:
            WorkspacePathError: The path is absolute, climbs out with ``..`` or goes through a symlink.
            WorkspaceError: No such regular file, or inline mode (no workspace).
        """
        checked = check_path(path)
        quota = effective_quota(self._limits.workspace_bytes, self._limits.max_scratch_bytes)
        data: bytes = await self._file_request(self._backend.read_file(checked, max_bytes=quota))
        return data

    async def list_files(self) -> list[FileInfo]:
        """Every regular file in the session's workspace, sorted by path (mounts not included; process mode).

        Raises:
            WorkspaceError: Inline mode (no workspace).
        """
        listing: list[tuple[str, int]] = await self._file_request(self._backend.list_files())
        return [FileInfo(path=path, size_bytes=size, media_type=media_type(path)) for path, size in listing]

    async def _file_request(self, request: Coroutine[Any, Any, T]) -> T:
        try:
            self._start()
        except BaseException:
            request.close()
            raise
        try:
            return await request
        except WorkerLost:
            await self._restore("a file request")
            raise
        finally:
            self._busy = False

    async def reset(self) -> None:
        """Forget every variable and every workspace file, and start from an empty namespace."""
        self._start()
        try:
            await self._backend.reset()
            self.checkpoint_id = None
            self.manifest = None
            self._setup_since_checkpoint = []
            self._blobs = {}
            self._frames = set()
        finally:
            self._busy = False

    def _close(self) -> None:
        self._closed = True
