"""A checked-out session: load a checkpoint, run scripts, dump a new checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any, Literal, TypeVar

from snapcell.backends import Backend, DumpRequest, LoadRequest, RunRequest
from snapcell.checkpoint import BlobRef, CheckpointId, Dumped, Keyring, Manifest, with_manifest
from snapcell.errors import (
    ConfigError,
    ResumeDiverged,
    RunCancelled,
    SessionError,
    SnapcellError,
    TypingError,
    WorkerLost,
    WorkspaceError,
    WorkspaceQuotaExceeded,
)
from snapcell.interpreter import PausedCall, RunResult, validate_lookup
from snapcell.limits import Limits
from snapcell.session._blobio import BlobIO
from snapcell.session._pause import Answer, Pause, Replayer, check_pausing, pause_from_record, pause_record
from snapcell.session._verify import HMAC_THREAD_BYTES, ForgedBlob, ForgedFiles, Verifier, check_id, open_checkpoint
from snapcell.storage import AsyncStore
from snapcell.telemetry import note_checkpoint, trace_checkpoint, trace_run
from snapcell.typecheck import TypeChecker
from snapcell.wire import check_script
from snapcell.workspace import FileInfo, check_path, media_type

__all__ = ["DEFAULT_MAX_CLOCK_SKEW_S", "AsyncSession", "SessionConfig"]

# IDs dated further ahead than this are refused: a clock-skew tolerance, not a way to outlive the ttl.
DEFAULT_MAX_CLOCK_SKEW_S = 300.0

T = TypeVar("T")
HostFunctions = Mapping[str, Callable[..., Any]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """What every session of a pool shares: where its checkpoints go, how they are signed, dated and compressed.

    The pool builds one (from its validated arguments) and hands it to each session it checks out.

    Attributes:
        store: Where checkpoints and their blobs are stored.
        keyring: The signing keys: the first signs, any verifies.
        ttl_s: How long a checkpoint is kept, in seconds; an older ID is refused.
        clock: The time now, in seconds since the epoch.
        compression_level: zstd level of dumps.
        max_clock_skew_s: How far ahead of ``clock`` an ID may be dated, in seconds.
    """

    store: AsyncStore
    keyring: Keyring
    ttl_s: float
    clock: Callable[[], float]
    compression_level: int
    max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S


class AsyncSession:
    """One session checked out of an `AsyncPool`; use it from one task at a time.

    Create sessions with `AsyncPool.checkout`, not directly.

    Args:
        backend: Where the session's runner lives.
        config: What the pool's sessions share: store, signing keys, ttl, clock, compression.
        limits: The session's limits (a run may bring its own).
        verifier: The checks of this session's checkpoints, and what they already passed (one per session).
        checker: The type checker every script is checked with, if any.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        config: SessionConfig,
        limits: Limits,
        verifier: Verifier,
        checker: TypeChecker | None = None,
    ) -> None:
        self._backend = backend
        self._config = config
        self._limits = limits
        self._verifier = verifier
        self._checker = checker
        self._closed = False
        self._busy = False
        self._setup_since_checkpoint: list[str] = []
        # A run may have changed the namespace since the last dump or load (``dump_first`` has something to save).
        self._changed = False
        # Blobs this session wrote or loaded: a later dump refers to them instead of storing them again.
        self._blobs: dict[str, BlobRef] = {}
        self._blob_io = BlobIO(config.store, config.keyring.blob_namespace())
        self.checkpoint_id: bytes | None = None
        self.checkpoint_bytes: int | None = None
        # Bytes the last dump put into the store (the checkpoint and its new blobs).
        self.bytes_stored = 0
        # A worker was lost and replaced since the last run: the next run's result says so.
        self._restarted = False
        self.manifest: Manifest | None = None
        # A run stopped at a pausing host call; the namespace it started with is `checkpoint_id`'s.
        self._paused: Pause | None = None

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
        config = self._config
        return check_id(
            config.keyring, checkpoint_id, now=config.clock(), ttl_s=config.ttl_s, max_skew_s=config.max_clock_skew_s
        )

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
            paused = self.manifest.paused if self.manifest is not None else None
            self._paused = pause_from_record(paused) if paused is not None else None
            self._changed = False
        except WorkerLost:
            await self._restore("load")
            raise
        finally:
            self._busy = False

    @trace_checkpoint("snapcell.load")
    async def _load(self, checkpoint_id: bytes | bytearray | str) -> None:
        cid = self.parse_id(checkpoint_id)
        config = self._config
        opened = await open_checkpoint(config.store, config.keyring, cid, max_bytes=self._verifier.max_checkpoint_bytes)
        note_checkpoint(opened.body)
        refs = opened.container.manifest.blobs
        # Blobs live in the namespace of the key that signed the checkpoint (an older key after a rotation).
        blobs = await BlobIO(config.store, config.keyring.blob_namespace(opened.key_index)).fetch(refs)
        self.manifest = await self._backend.load(
            LoadRequest(body=opened.body, blobs=blobs, manifest=opened.container.manifest)
        )
        await self._verifier.loaded(opened.container, blobs, opened.key_index)
        self.checkpoint_id = cid.raw
        self.checkpoint_bytes = opened.stored_bytes
        self._changed = False
        # Only blobs in the signing key's namespace can be referred to by the next dump.
        self._blobs = {ref.hash: ref for ref in refs} if opened.key_index == 0 else {}

    async def _restore(self, during: str) -> None:
        """After a lost worker: reload the last checkpoint and queue the setup cells run since."""
        if self.checkpoint_id is not None:
            source = "its last checkpoint (variables and files changed since are lost)"
        else:  # nothing was ever dumped: say what to do about it next time
            source = "an empty namespace (nothing had been saved; run(..., dump_first=True) saves before a risky cell)"
        note = f"the Python session restarted (its worker was lost during {during}); it continues from {source}"
        try:
            if self.checkpoint_id is not None:
                await self._load(self.checkpoint_id)
            else:
                await self._backend.reset()
            await self._backend.queue(notes=[note], setup_cells=list(self._setup_since_checkpoint))
            self._restarted = True
            self._changed = False  # the last checkpoint, or nothing: a dump now would save nothing new
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
        pausing: Collection[str] | None = None,
        dump_first: bool = False,
        raise_on_lost: bool = False,
    ) -> RunResult:
        """Run a script and report everything it did; script problems and a lost worker do not raise.

        Args:
            code: The script; top-level ``await`` is allowed and a trailing expression is the value.
            external_lookup: Host functions by name (sync or async), callable from the script this run.
            setup: Mark the cell as a setup cell (imports, data loading), run again after a restart.
            skip_type_check: Skip type checking for this run.
            limits: Limits for this run instead of the session's.
            then_dump: A `dump` (with ``on_unpicklable="skip"``) follows: a worker starts it as soon as the run
                ends, in the same request, and that `dump` takes its result, dated when this run started (process
                mode; a round trip fewer). Any other call first waits for that dump and drops it.
            dump_first: Before a risky cell (a setup cell that loads data, say), `dump` the namespace when a run
                changed it since the last dump or load, so a worker lost during this run costs only this run's
                changes (also before the session's first dump). Takes the time and store bytes of a dump.
            raise_on_lost: Raise `WorkerLost` when the worker dies, instead of returning a result with status
                ``"lost"``.
            pausing: Names of host functions that pause the run (they need no entry in ``external_lookup``; one
                there is never called). A call of one stops the script there: the result's status is ``"paused"``
                and ``result.paused`` names the call; `dump` then writes a paused checkpoint and `resume` goes on
                from the call. Such a run records its host calls, clocks and random sources (see the docs' "Pause
                and resume"); it starts from a checkpoint, so a session that ran cells since its last `dump` or
                `load_session` (or never had one) dumps first.

        Returns:
            The run's result; ``result.error`` holds a `ScriptError` when the script failed. When the worker died
            during the run, ``result.status`` is ``"lost"`` (and ``result.ok`` False), a note says what happened, and
            the session was restored from its last checkpoint: usable, without this run's changes; the next run's
            result has ``restarted`` set.

        Raises:
            ConfigError: ``external_lookup`` or ``pausing`` is malformed; nothing ran.
            SessionError: The session was checked in or is busy, or is paused (`resume` it, or load a checkpoint).
            WorkerLost: With ``raise_on_lost``, the worker died during the run; the session was restored as above
                and ``exc.result`` is the `RunResult` with status ``"lost"``. Without it, a worker lost during the
                ``dump_first`` dump (the session is restored the same way).
            RunCancelled: The task running this was cancelled: the script was interrupted where it was, its
                variables are kept and the session is usable; ``exc.result`` has status ``"cancelled"``. A worker
                that did not stop within ``grace_s`` was killed: then the status is ``"lost"`` and the session was
                restored from its last checkpoint, as after `WorkerLost`.
        """
        names = check_pausing(pausing)
        replayer = None
        if names:
            self._check_not_paused()
            if self._changed or self.checkpoint_id is None:
                await self.dump()  # the namespace the cell starts with must be a checkpoint's, to resume from
            replayer = Replayer(validate_lookup(external_lookup), names)
            external_lookup, then_dump = replayer.functions(), False
        try:
            result = await self._run(
                code,
                external_lookup,
                setup,
                skip_type_check,
                limits,
                then_dump,
                True,
                dump_first=dump_first,
                replayer=replayer,
            )
        except WorkerLost as exc:
            if raise_on_lost or not isinstance(exc.result, RunResult):
                raise
            return dataclasses.replace(exc.result, notes=(*exc.result.notes, f"the worker was lost: {exc}"))
        if replayer is not None and replayer.paused is not None:
            self._paused = Pause(
                cell=code,
                setup=setup,
                pausing=names,
                calls=tuple(replayer.calls),
                call=replayer.paused,
                inputs=result.inputs,
                hash_seed=self._backend.hash_seed,
            )
            return _paused_result(result, replayer)
        return result

    async def resume(
        self,
        value: Any = None,
        *,
        error: BaseException | None = None,
        external_lookup: HostFunctions | None = None,
        skip_type_check: bool = False,
        limits: Limits | None = None,
    ) -> RunResult:
        """Go on with a paused run: the paused host call returns ``value`` (or raises ``error``) in the script.

        The cell runs again from the namespace it started with. Each host call it made before the pause is answered
        from the log (its name and arguments checked against it; the function is not called again), its clocks and
        random sources return what they returned (in process mode, in a worker that hashes strings with the run's seed,
        so sets of strings come out in the same order), the paused call returns the answer, and from there the cell goes
        on live. It may pause again (status ``"paused"``; each resume adds to the log). The result is the whole
        cell's: what it printed before the pause appears once.

        Args:
            value: What the paused call returns (plain data).
            error: An exception the paused call raises instead (the script sees the builtin exception of that
                name, else a ``RuntimeError`` naming it, as for any host function's failure).
            external_lookup: The host functions, as for `run` (the pausing ones need not be there).
            skip_type_check: Skip type checking for this run.
            limits: Limits for this run instead of the session's.

        Returns:
            The result of the rest of the run.

        Raises:
            SessionError: The session is not paused, was checked in or is busy.
            ConfigError: The answer is not plain data, or ``external_lookup`` is malformed; nothing ran.
            ResumeDiverged: The replay left the log (a host call the log does not have, other arguments, or the cell
                ended before the paused call); the session is still paused at the same call, as before.
            WorkerLost: As for `run`; the session is still paused.
        """
        pause = self._paused
        if pause is None:
            raise SessionError("nothing to resume: this session holds no paused run (load a paused checkpoint)")
        answer = Answer.checked(value, error)
        replayer = Replayer(validate_lookup(external_lookup), pause.pausing, pause, answer)
        self._start()
        try:
            # The replay hashes strings as the run did (sets of strings in the same order): in process mode, in a
            # worker started with the run's seed, whose namespace is then loaded.
            moved = pause.hash_seed is not None and await self._backend.use_hash_seed(pause.hash_seed)
            # The paused run, or a diverged replay, changed the namespace: back to the cell's start.
            if self._changed or moved:
                checkpoint_id = self.checkpoint_id
                if checkpoint_id is None:
                    raise SessionError("the paused run's checkpoint is gone")
                manifest = self.manifest
                await self._load(checkpoint_id)
                self.manifest = manifest  # a paused checkpoint's own manifest, not its base's
        except WorkerLost:
            await self._restore("load")
            raise
        finally:
            self._busy = False
        result = await self._run(
            pause.cell,
            replayer.functions(),
            pause.setup,
            skip_type_check,
            limits,
            False,
            True,
            replayer=replayer,
            resumed=pause,
        )
        if not replayer.replayed_all:
            self._paused = pause
            difference = replayer.difference
            if difference is None:
                ended = f" ({result.error.exc_type}: {result.error.exc_message})" if result.error else ""
                difference = f"the cell ended{ended} before the paused call {pause.call.name}()"
            raise ResumeDiverged(
                f"resuming the paused run diverged from its log: {difference}; the session is still paused",
                difference=difference,
                call_index=replayer.difference_at,
            )
        if (
            pause.inputs is not None
            and result.inputs is not None
            and pause.inputs.get("hash") != result.inputs.get("hash")
        ):
            result = dataclasses.replace(
                result,
                notes=(
                    *result.notes,
                    "resumed in an interpreter that hashes strings with another seed: set orders before the pause "
                    "may differ from the first run's",
                ),
            )
        if replayer.paused is not None:
            self._paused = Pause(
                cell=pause.cell,
                setup=pause.setup,
                pausing=pause.pausing,
                calls=tuple(replayer.calls),
                call=replayer.paused,
                inputs=result.inputs,
                hash_seed=self._backend.hash_seed,
            )
            return _paused_result(result, replayer)
        self._paused = None
        return result

    @property
    def paused(self) -> PausedCall | None:
        """The pausing host call the session's run waits at (a `PausedCall`), or None."""
        return self._paused.call if self._paused is not None else None

    def _check_not_paused(self) -> None:
        if self._paused is not None:
            call = self._paused.call
            raise SessionError(
                f"the session is paused at {call.name}(): resume() it, dump() it, or load another checkpoint first"
            )

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
        *,
        dump_first: bool = False,
        replayer: Replayer | None = None,
        resumed: Pause | None = None,
    ) -> RunResult:
        """`run`; ``report`` False (`feed_run`): only the value and error are read (see `Backend.run`).

        With ``replayer`` the run may pause (its host functions are the replayer's), replaying ``resumed``.
        """
        lookup = validate_lookup(external_lookup)
        if resumed is None:
            self._check_not_paused()
        if dump_first and self._changed:
            await self.dump()  # a crash in this run now costs only its own changes
        self._start()
        try:
            if limits is not None and not isinstance(limits, Limits):
                raise ConfigError(f"limits must be a snapcell.Limits, not {type(limits).__name__}")
            rejected = check_script(code, limits or self._limits)
            if rejected is not None:  # not text, or too large to send: nothing runs and the session is unchanged
                return RunResult(error=rejected)
            types = None
            if self._checker is not None and not skip_type_check:
                declarations = await self._backend.declarations()
                try:
                    _, types = await self._checker.acheck_with_types(code, declarations=declarations)
                except TypingError as exc:
                    return RunResult(error=exc)
            started = time.perf_counter()
            restarted, self._restarted = self._restarted, False
            try:
                dump = self._dump_request(self._config.clock(), "skip") if then_dump else None
                request = RunRequest(
                    code=code,
                    lookup=lookup,
                    setup=setup,
                    limits=limits or self._limits,
                    then_dump=dump,
                    report=report,
                    types=types,
                    inputs=None if replayer is None else (resumed.inputs if resumed is not None else None) or {},
                )
                self._changed = True
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
            paused = replayer is not None and (replayer.paused is not None or not replayer.replayed_all)
            if setup and result.error is None and not paused and code not in self._setup_since_checkpoint:
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
        dump_first: bool = False,
    ) -> Any:
        """Run a script and return the value of its trailing expression (None without one).

        Args: as for `run`.

        Raises:
            ScriptError: The script failed (``ScriptSyntaxError``, ``PolicyError``, ``TypingError`` or
                its own exception); variables assigned before the failure are kept and the session is usable.
            LimitExceeded: A limit stopped the run; the session is usable with earlier variables.
            ConfigError: ``external_lookup`` is malformed; nothing ran.
            WorkerLost: The worker died during the run; the session was restored as `run` describes.
        """
        result = await self._run(
            code, external_lookup, setup, skip_type_check, limits, False, False, dump_first=dump_first
        )
        if result.error is not None:
            raise result.error
        return result.value

    def _dump_request(self, created_at: float, on_unpicklable: Literal["skip", "fail"]) -> DumpRequest:
        """A dump of this session's namespace, referring to the blobs it knows and the frames the host passed."""
        return DumpRequest(
            created_at=created_at,
            level=self._config.compression_level,
            on_unpicklable=on_unpicklable,
            known_blobs=self._blobs,
            passed_frames=self._verifier.frames,
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
        if self._paused is not None:
            return await self._dump_paused(self._paused)
        self._start()
        try:
            config = self._config
            now = config.clock()
            ahead = self._backend.pending_dump
            try:
                if ahead is not None and ahead.on_unpicklable == on_unpicklable and ahead.known_blobs is self._blobs:
                    # Asked for with the run (``then_dump``), and nothing it depends on changed since.
                    now = ahead.created_at
                    dumped = await self._backend.dumped()
                else:
                    dumped = await self._backend.dump(self._dump_request(now, on_unpicklable))
                await self._verifier.check_dump(dumped, known_blobs=self._blobs)
                if not await self._blob_io.store(dumped, now + config.ttl_s):
                    # A blob this session relied on is gone from the store: write everything again.
                    self._blobs = {}
                    dumped = await self._backend.dump(self._dump_request(now, on_unpicklable))
                    await self._verifier.check_dump(dumped, known_blobs=self._blobs)
                    await self._blob_io.store(dumped, now + config.ttl_s)
            except (ForgedBlob, ForgedFiles) as exc:
                # Only a compromised worker sends a blob that is not what it claims: it goes, nothing is stored.
                await self._backend.discard()
                await self._restore("dump")
                raise WorkerLost(f"{exc}; the worker was replaced and the session restored", reason="crash") from exc
            except WorkerLost:
                await self._restore("dump")
                raise
            note_checkpoint(dumped.body)
            checkpoint_id = await self._sign_and_store(dumped, now)
            self._setup_since_checkpoint = []
            self._changed = False
            self._verifier.dump_signed()
            return checkpoint_id
        finally:
            self._busy = False

    async def _dump_paused(self, pause: Pause) -> bytes:
        """`dump` of a paused session: the namespace the cell started with (its checkpoint's), the cell and the log.

        The new checkpoint is the one the run started from with the paused run added to its manifest: its sections
        and blobs are taken as they are (nothing is pickled or unpickled again), and its blobs are refreshed to
        live as long as it does.
        """
        self._start()
        try:
            config = self._config
            base = self.checkpoint_id
            if base is None:
                raise SessionError("the paused run's checkpoint is gone")
            now = config.clock()
            opened = await open_checkpoint(
                config.store, config.keyring, self.parse_id(base), max_bytes=self._verifier.max_checkpoint_bytes
            )
            manifest = opened.container.manifest.model_copy(update={"paused": pause_record(pause), "created_at": now})
            body = with_manifest(opened.body, manifest)
            refs = manifest.blobs
            if opened.key_index == 0:
                dumped = Dumped(body=body, manifest=manifest, refresh=[ref.hash for ref in refs])
            else:  # its blobs live in an older key's namespace: copy them into the signing key's
                blobs = await BlobIO(config.store, config.keyring.blob_namespace(opened.key_index)).fetch(refs)
                dumped = Dumped(body=body, manifest=manifest, new_blobs=blobs)
            if not await self._blob_io.store(dumped, now + config.ttl_s):
                raise SessionError("a blob of the paused run's checkpoint is gone from the store; it cannot be saved")
            return await self._sign_and_store(dumped, now)
        finally:
            self._busy = False

    async def _sign_and_store(self, dumped: Dumped, now: float) -> bytes:
        """Sign a dump's body under a new ID and store it; the session stands on it from now. Its new ID."""
        config = self._config
        body = dumped.body
        cid = config.keyring.new_id(now)
        if len(body) > HMAC_THREAD_BYTES:  # a large body is hashed off the event loop
            blob = await asyncio.to_thread(config.keyring.sign, body, cid)
        else:
            blob = config.keyring.sign(body, cid)
        await config.store.put(cid.storage_key, blob, expires_at=now + config.ttl_s)
        self.bytes_stored = len(blob) + sum(len(data) for data in dumped.new_blobs.values())
        self.checkpoint_id = cid.raw
        self.checkpoint_bytes = len(blob)
        self.manifest = dumped.manifest
        self._blobs = {ref.hash: ref for ref in dumped.manifest.blobs}
        return cid.raw

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
        checked = check_path(path, mounts=self._verifier.mounts, writing=True)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise WorkspaceError(f"file data must be bytes, not {type(data).__name__}", path=checked)
        quota = self._verifier.quota_bytes
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
        quota = self._verifier.quota_bytes
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

    async def ping(self) -> bool:
        """Whether the session's worker is alive and answers: one round trip that changes nothing (inline: True).

        Worth a call before reusing a session that sat idle: a worker can die between requests (killed for memory,
        by a signal), and a run sent to it would fail as `WorkerLost`, as if the run had killed it.

        Returns:
            True when the worker answered. False when it is gone (it died, or did not answer within a few seconds
            and was killed): the session's next request then restores its last checkpoint (`WorkerLost`, as after
            any loss), so check it in instead if what it held matters.

        Raises:
            SessionError: The session was checked in or is busy.
        """
        self._start()
        try:
            return await self._backend.ping()
        finally:
            self._busy = False

    async def reset(self) -> None:
        """Forget every variable and every workspace file, and start from an empty namespace."""
        self._start()
        try:
            await self._backend.reset()
            self.checkpoint_id = None
            self.manifest = None
            self._paused = None
            self._changed = False
            self._setup_since_checkpoint = []
            self._blobs = {}
            self._verifier.forget()
        finally:
            self._busy = False

    def _close(self) -> None:
        self._closed = True


def _paused_result(result: RunResult, replayer: Replayer) -> RunResult:
    """A run that stopped at a pausing call: no value, no error (what the script did after the pause is dropped)."""
    return dataclasses.replace(result, status="paused", paused=replayer.paused, value=None, value_repr=None, error=None)
