"""A session's runner in a worker process: requests, replies checked as untrusted, recovery on loss.

A dump or a load runs script code (``__reduce__``, ``__setstate__``): the worker stops one that overruns
``Limits.dump_time_s`` / ``load_time_s``, and the host kills a worker that has not answered by that limit
plus ``grace_s``. Either way the worker is replaced and the caller gets `WorkerLost` naming the limit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from snapcell._support import is_async_callable
from snapcell.backends._backend import DumpRequest, LoadRequest, RunRequest
from snapcell.backends._process import _CONTROL_TIMEOUT_S, _REQUEST_TIMEOUT_S, WorkerProcess, _Died, log
from snapcell.backends._workerpool import WorkerPool
from snapcell.checkpoint import Dumped, Manifest, manifest_bytes, parse_manifest
from snapcell.errors import (
    CheckpointCorrupt,
    CheckpointVersionError,
    RunCancelled,
    ScriptError,
    SessionError,
    SnapcellError,
    TimeLimitExceeded,
    WorkerLost,
    WorkspacePathError,
)
from snapcell.interpreter import Artifact, HostCall, RunResult
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.wire import (
    MAX_ARTIFACTS,
    MAX_ASSIGNED,
    MAX_ASSIGNED_CHARS,
    MAX_DUMP_BLOBS,
    MAX_LIST_FILES,
    MAX_MANIFEST_ITEMS,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_SUMMARY_CHARS,
    MalformedMessage,
    count_items,
    error_from_plain,
    split_parts,
    to_plain,
)
from snapcell.workspace import check_path, media_type

__all__ = ["ProcessBackend"]

# Frame hashes a dump request names as passed by the host (see `Backend.dump`); past this the worker scans the rest.
MAX_PASSED_FRAMES = 4096
# `ProcessBackend.ping`: a request that changes nothing, and how long an idle worker may take to answer it.
_PING: dict[str, Any] = {"op": "queue", "notes": [], "setup_cells": []}
_PING_TIMEOUT_S = 5.0


class ProcessBackend:
    """A session's runner in a worker process; replaces the worker when it dies."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        policy: Policy,
        limits: Limits,
        mounts: Mapping[str, str] | None = None,
        modules: Collection[str] | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._limits = limits
        self.mounts = dict(mounts or {})
        # The modules the session is expected to import (see `WorkerPool.acquire`); a replacement worker's too.
        self._modules = None if modules is None else frozenset(modules)
        self.worker: WorkerProcess | None = None
        # The worker's CPU seconds read after the last run, with that worker and its request count then.
        self._cpu_mark: tuple[WorkerProcess, int, float] | None = None
        # A dump asked for with the last run (its ``then``): the worker, the request, and what it was asked.
        self._then: tuple[WorkerProcess, dict[str, Any], DumpRequest] | None = None

    async def start(self, *, hash_seed: int | None = None) -> None:
        """Acquire the session's worker (one whose interpreter hashes strings with ``hash_seed``, if given)."""
        self.worker = await self._pool.acquire(
            policy=self._policy,
            limits=self._limits,
            mounts=self.mounts,
            hash_seed=hash_seed,
            modules=self._modules,
        )

    @property
    def hash_seed(self) -> int | None:
        """The ``PYTHONHASHSEED`` the current worker was started with (None before there is one)."""
        return self.worker.hash_seed if self.worker is not None else None

    async def use_hash_seed(self, seed: int) -> bool:
        """See `Backend.use_hash_seed`: a new worker, unless the current one hashes with ``seed`` already."""
        worker = self.worker
        if worker is not None and not worker.dead and worker.hash_seed == seed:
            return False
        await self.discard()
        await self.start(hash_seed=seed)
        return True

    async def _request(
        self,
        message: dict[str, Any],
        parts: Sequence[bytes | bytearray | memoryview] = (),
        *,
        expect: str,
        timeout_s: float | None = _REQUEST_TIMEOUT_S,
        lookup: Mapping[str, Callable[..., Any]] | None = None,
        calls: list[HostCall] | None = None,
        limits: Limits | None = None,
        limit_name: str = "",
        cancel_grace_s: float | None = None,
        then: tuple[dict[str, Any], DumpRequest] | None = None,
        follow_on: bool = False,
        run_limits: Limits | None = None,
    ) -> tuple[dict[str, Any], bytearray]:
        """Send a request and return its reply, whose op must be ``expect``.

        Args:
            message: The request.
            parts: Bytes sent after it.
            expect: The op of a good reply.
            timeout_s: Deadline for the reply (the request's own limit plus grace).
            lookup: Host functions a run may call.
            calls: Where the host-function calls served are recorded.
            limits: The limits the request runs under; the session's by default.
            limit_name: The `Limits` field behind ``timeout_s``, named when it is overrun.
            cancel_grace_s: For a run: how long its reply is awaited after its caller is cancelled (see
                `WorkerProcess.request`).
            then: A dump the worker does right after this request succeeds (its request, sent as ``then``, and
                what was asked); `dumped` reads its reply.
            follow_on: ``message`` is the ``then`` of the request before: read its reply, send nothing.
            run_limits: For a run: its limits, added to ``message`` only when they are not those of the last run sent
                to this worker (which keeps them): a session sends the same limits with nearly every run.

        Raises:
            WorkerLost: The worker died, overran ``timeout_s`` or sent a malformed reply; it is killed.
            SnapcellError: The worker reported this error; the worker is kept.
        """
        if not follow_on:
            await self._drain()
        if self.worker is None:
            await self.start()
        worker = self.worker
        if worker is None:
            raise SessionError("no worker process")
        if run_limits is not None and worker.run_limits is not run_limits and worker.run_limits != run_limits:
            message["limits"] = _limits_plain(run_limits)
            worker.run_limits = run_limits
        if then is not None:
            message = {**message, "then": then[0]}
            self._then = (worker, then[0], then[1])
        try:
            reply, reply_blob = await worker.request(
                message,
                parts,
                timeout_s=timeout_s,
                lookup=lookup,
                calls=calls,
                limits=limits,
                cancel_grace_s=cancel_grace_s,
                follow_on=follow_on,
            )
        except _Died as exc:
            self._then = None
            await self._pool.release(worker)
            self.worker = None
            raise _lost(exc, message.get("op"), timeout_s, limit_name) from None
        except BaseException:
            # Cancelled mid-request: the worker's state is unknown, so it goes.
            self._then = None
            await self._pool.release(worker)
            self.worker = None
            raise
        op = reply.get("op")
        if op == "error":
            self._then = None  # the worker serves a request's ``then`` only after it succeeded
            try:
                error = error_from_plain(reply.get("error"))
            except MalformedMessage as exc:
                raise await self._malformed(message.get("op"), exc) from None
            if limit_name and isinstance(error, TimeLimitExceeded) and error.limit == limit_name:
                # The worker stopped a dump or load that overran its limit; what it was running (a script's
                # __reduce__ or __setstate__) may have left it in any state, so it goes like a lost worker.
                await self.discard()
                raise _lost(_Died("timeout"), message.get("op"), timeout_s, limit_name) from None
            raise error
        if op != expect:
            raise await self._malformed(message.get("op"), MalformedMessage(f"a {str(op)[:40]!r} reply"))
        return reply, reply_blob

    async def _malformed(self, op: Any, exc: Exception) -> WorkerLost:
        """Kill a worker that sent a malformed reply (broken or compromised) and say so as a lost worker."""
        worker, self.worker = self.worker, None
        if worker is not None:
            await self._pool.release(worker)
        log.warning("snapcell: worker sent a malformed reply to %s: %s", op, exc)
        return _lost(_Died("crash", f"it sent a malformed reply: {str(exc)[:200]}"), op, None, "")

    async def run(self, request: RunRequest) -> RunResult:
        code, lookup, limits, then_dump = request.code, request.lookup, request.limits, request.then_dump
        host = {name: is_async_callable(func) for name, func in lookup.items()}
        timeout = None if limits.wall_time_s is None else limits.wall_time_s + limits.grace_s + 1.0
        calls: list[HostCall] = []
        if self.worker is None:
            await self.start()
        worker = self.worker
        # Without ``report`` neither reading is taken: two preads of /proc and their parsing, per run.
        stat = worker.stat if worker is not None and request.report else None
        mark = self._cpu_mark
        if mark is not None and worker is mark[0] and worker.requests == mark[1]:
            cpu_before: float | None = mark[2]  # no request since the last run's reading: the same number again
        else:
            cpu_before = stat.cpu_seconds() if stat is not None else None
        # The request runs in this task. A cancellation of it stops the script (its namespace is kept) and the run's
        # reply is awaited for the grace period (see `_hostchannel`); a worker that does not answer is killed (lost).
        message: dict[str, Any] = {
            "op": "run",
            # A str subclass is sent as its text; anything else is not a script, which the worker says.
            "code": str.__str__(code) if isinstance(code, str) else None,
            "host": host,
            "setup": request.setup,
        }
        if request.inputs is not None:
            message["inputs"] = dict(request.inputs)
        if request.types:
            message["types"] = dict(request.types)
        if not request.report:
            message["report"] = False  # nor does the worker summarize, read its clock or memory, or walk out/
        try:
            reply, blob = await self._request(
                message,
                expect="ran",
                timeout_s=timeout,
                lookup=lookup,
                calls=calls,
                limits=limits,
                limit_name="wall_time_s",
                cancel_grace_s=limits.grace_s + 1.0,
                run_limits=limits,
                then=None if then_dump is None else (_dump_message(then_dump), then_dump),
            )
        except WorkerLost:
            if worker is None or not worker.caller_cancelled:
                raise
            # It did not stop in time (C code, say) and was killed: a cancellation whose run is lost.
            await self.discard()
            raise RunCancelled(RunResult(status="lost", external_calls=tuple(calls))) from None
        cancelled = worker is not None and worker.caller_cancelled
        cpu_after = stat.cpu_seconds() if stat is not None else None
        self._cpu_mark = (worker, worker.requests, cpu_after) if worker is not None and cpu_after is not None else None
        cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
        peak = stat.peak_rss() if stat is not None else None
        try:
            result = _run_result(reply, limits, calls, blob, cpu_time_s=cpu, peak_memory_bytes=peak)
        except (MalformedMessage, ValueError, TypeError) as exc:
            raise await self._malformed("run", exc) from None
        if cancelled:
            raise RunCancelled(result)
        return result

    async def write_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        await self._request({"op": "ws_write", "path": path}, [data], expect="ws_written", timeout_s=_CONTROL_TIMEOUT_S)

    async def read_file(self, path: str, *, max_bytes: int | None) -> bytes:
        reply, blob = await self._request(
            {"op": "ws_read", "path": path, "max_bytes": max_bytes}, expect="ws_read", timeout_s=_CONTROL_TIMEOUT_S
        )
        if reply.get("size") != len(blob) or (max_bytes is not None and len(blob) > max_bytes):
            raise await self._malformed("ws_read", MalformedMessage("a file of another size than it says"))
        return bytes(blob)

    async def list_files(self) -> list[tuple[str, int]]:
        reply, _ = await self._request({"op": "ws_list"}, expect="ws_listed", timeout_s=_CONTROL_TIMEOUT_S)
        listing = reply.get("files")
        if type(listing) is not list or len(listing) > MAX_LIST_FILES:
            raise await self._malformed("ws_list", MalformedMessage(f"a listing of more than {MAX_LIST_FILES}"))
        out = []
        for item in listing:
            if (
                type(item) is not list
                or len(item) != 2
                or type(item[0]) is not str
                or type(item[1]) is not int
                or item[1] < 0
            ):
                raise await self._malformed("ws_list", MalformedMessage("a listing entry is not [path, size]"))
            try:
                path = check_path(item[0])
            except WorkspacePathError:
                raise await self._malformed("ws_list", MalformedMessage("a listing names a malformed path")) from None
            if path != item[0]:
                raise await self._malformed("ws_list", MalformedMessage("a listing names a path not in normal form"))
            out.append((path, item[1]))
        return out

    async def dump(self, request: DumpRequest) -> Dumped:
        return await self._dump(_dump_message(request))

    @property
    def pending_dump(self) -> DumpRequest | None:
        then = self._then
        return then[2] if then is not None and then[0] is self.worker else None

    async def dumped(self) -> Dumped:
        then, self._then = self._then, None
        if then is None or then[0] is not self.worker:
            raise SessionError("no dump is under way: the last run asked for none, or it was taken already")
        return await self._dump(then[1], follow_on=True)

    async def _dump(self, message: dict[str, Any], *, follow_on: bool = False) -> Dumped:
        reply, payload = await self._request(
            message,
            expect="dumped",
            timeout_s=_step_timeout(self._limits, self._limits.dump_time_s),
            limit_name="dump_time_s",
            follow_on=follow_on,
        )
        try:
            return _dumped(reply, payload)
        except (MalformedMessage, ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise await self._malformed("dump", exc) from None

    async def _drain(self) -> None:
        """Read and drop the reply of a dump asked for with the last run that nobody took: the worker sent it.

        Raises:
            WorkerLost: The worker died meanwhile (the request after it is not sent).
        """
        if self.pending_dump is None:
            self._then = None
            return
        try:
            await self.dumped()
        except WorkerLost:
            raise
        except SnapcellError as exc:  # that dump's own failure (a variable that cannot be pickled) is nobody's
            log.debug("snapcell: a dump nobody took failed: %s", exc)

    async def load(self, request: LoadRequest) -> Manifest:
        body, blobs = request.body, request.blobs
        names = list(blobs)
        sizes = [len(body), *(len(blobs[name]) for name in names)]
        # The reply says only that the load succeeded (a control reply's budget): what the checkpoint holds is
        # ``request.manifest``, the host's own parse of the body it verified.
        await self._request(
            {"op": "load", "parts": sizes, "blobs": names},
            [body, *(blobs[name] for name in names)],
            expect="loaded",
            timeout_s=_step_timeout(self._limits, self._limits.load_time_s),
            limit_name="load_time_s",
        )
        return request.manifest

    async def queue(self, *, notes: list[str], setup_cells: list[str]) -> None:
        """Ask the runner to add notes and run setup cells before the next cell."""
        await self._request(
            {"op": "queue", "notes": notes, "setup_cells": setup_cells}, expect="queued", timeout_s=_CONTROL_TIMEOUT_S
        )

    async def reset(self) -> None:
        await self._request({"op": "reset"}, expect="reset", timeout_s=_CONTROL_TIMEOUT_S)

    async def ping(self) -> bool:
        """One round trip to the worker: an empty ``queue`` request, which changes nothing.

        A worker that died, answers out of step or not within `_PING_TIMEOUT_S` is killed, but stays this session's
        worker: the next request finds it dead and is `WorkerLost`, as after any loss, so the session never runs
        on with a fresh worker as if it held its namespace.
        """
        worker = self.worker
        if worker is None or worker.dead or self.pending_dump is not None:
            return False
        try:
            reply, _ = await worker.request(_PING, timeout_s=_PING_TIMEOUT_S)
        except _Died:
            reply = {}
        if reply.get("op") == "queued":
            return True
        if not worker.dead:
            await worker.kill()
        return False

    async def declarations(self) -> str:
        reply, _ = await self._request({"op": "declarations"}, expect="declarations", timeout_s=_CONTROL_TIMEOUT_S)
        return str(reply.get("text", ""))

    async def close(self) -> None:
        if self.pending_dump is not None:
            await self.discard()  # its dump reply is still on the way: not a worker to hand to the next session
        if self.worker is not None:
            worker, self.worker = self.worker, None
            reuse_for = None if self.mounts else (self._policy, self._limits)
            await self._pool.release(worker, reuse_for=reuse_for, reap_later=True)

    async def discard(self) -> None:
        self._then = None
        if self.worker is not None:
            worker, self.worker = self.worker, None
            await self._pool.release(worker)  # killed, never reused

    @property
    def start_path(self) -> str:
        """How the current worker started: "zygote (pid N, preloaded ...)" or "spawn"."""
        worker = self.worker
        if worker is None:
            return "none"
        zygote = worker.zygote
        if worker.forked is None or zygote is None:
            return "spawn"
        return f"zygote (pid {zygote.pid}, preloaded: {zygote.preload_report})"

    @property
    def sandbox(self) -> dict[str, str]:
        """The sandbox layers of the current worker."""
        return dict(self.worker.sandbox) if self.worker is not None else {}


@functools.lru_cache(maxsize=64)
def _limits_plain(limits: Limits) -> dict[str, Any]:
    """A `Limits` as plain data; cached, since a session sends the same frozen limits with every run."""
    plain: dict[str, Any] = to_plain(dataclasses.asdict(limits))
    return plain


def _dump_message(request: DumpRequest) -> dict[str, Any]:
    return {
        "op": "dump",
        "created_at": request.created_at,
        "level": request.level,
        "on_unpicklable": request.on_unpicklable,
        "known_blobs": [ref.model_dump() for ref in request.known_blobs.values()],
        "passed_frames": list(itertools.islice(request.passed_frames, MAX_PASSED_FRAMES)),
    }


def _step_timeout(limits: Limits, limit_s: float | None) -> float | None:
    """The host's deadline for a dump or load: the worker's own limit, plus grace, plus a second to reach the host."""
    return None if limit_s is None else limit_s + limits.grace_s + 1.0


def _lost(exc: _Died, op: Any, timeout_s: float | None, limit_name: str) -> WorkerLost:
    if exc.reason == "timeout" and limit_name in ("dump_time_s", "load_time_s") and timeout_s is not None:
        step = "dump" if limit_name == "dump_time_s" else "load of the checkpoint"
        limit = timeout_s - 1.0
        return WorkerLost(
            f"the {step} did not finish within Limits.{limit_name} (plus grace_s: {limit:g} s), so its worker "
            "process was stopped and replaced; a script object's __reduce__, __getstate__ or __setstate__ may "
            "loop. The session continues from its last good checkpoint and setup cells",
            reason="timeout",
        )
    reasons = {
        "timeout": f"it did not stop within {timeout_s:g} s (the wall-time limit, plus grace_s, plus a second to "
        "reach the host)"
        if timeout_s
        else "it timed out",
        "memory": "it ran out of memory",
        "signal": "it was killed by a signal",
        "crash": "it crashed",
    }
    what = reasons.get(exc.reason, "it died")
    detail = f" ({exc.detail})" if exc.detail and exc.reason == "crash" else ""
    return WorkerLost(
        f"the session's worker process was lost during {str(op)[:40]}: {what}{detail}; the session restarts from its "
        "last checkpoint and setup cells, and the cell that caused it is not run again",
        reason=exc.reason,
    )


def _body_manifest(body: memoryview) -> Manifest:
    """The manifest of a dumped body, its items counted before it is parsed (the reply carries no copy of it).

    Reply framing: a reply that fails here never becomes a `Dumped`. Taken from the body the host signs, so the
    host's view of the checkpoint is the stored one; the session's checks of the dump (`Verifier.check_dump`) take
    it for the body's full parse, which does not parse it again.

    Raises:
        MalformedMessage: The body's manifest cannot be read, or holds more than `MAX_MANIFEST_ITEMS` items.
        CheckpointCorrupt: It is not a valid `Manifest` (a ValueError).
    """
    try:
        _, raw, _ = manifest_bytes(body)
    except (CheckpointCorrupt, CheckpointVersionError) as exc:
        raise MalformedMessage(f"the dumped body cannot be read: {exc}") from None
    if count_items(raw, MAX_MANIFEST_ITEMS) > MAX_MANIFEST_ITEMS:
        raise MalformedMessage(f"the manifest holds more than {MAX_MANIFEST_ITEMS} items")
    try:
        return parse_manifest(raw)
    except CheckpointCorrupt as exc:
        raise MalformedMessage(str(exc)) from None


def _artifacts(reply: dict[str, Any], limits: Limits, blob: bytearray) -> tuple[Artifact, ...]:
    """The artifacts a ``ran`` reply describes, their bytes cut from its blob (checked: sizes add up, within caps).

    Raises:
        MalformedMessage: The descriptions or their bytes are malformed.
    """
    described = reply.get("files") or []
    if type(described) is not list or len(described) > MAX_ARTIFACTS:
        raise MalformedMessage(f"files must be a list of at most {MAX_ARTIFACTS}")
    found, offset = [], 0
    for item in described:
        if type(item) is not dict:
            raise MalformedMessage("an artifact must be described by a dict")
        path, size, media, data_bytes = (item.get(k) for k in ("path", "size", "media_type", "data_bytes"))
        if type(path) is not str or type(media) is not str or type(size) is not int or type(data_bytes) is not int:
            raise MalformedMessage("an artifact needs a path, size, media type and data size")
        if not path.startswith("out/") or check_path(path) != path or not 0 <= data_bytes <= size:
            raise MalformedMessage(f"artifact {path[:100]!r} is malformed")
        # The host knows the media type from the path: one the worker made up (another type for a client to
        # render, a line break to forge a line of the answer) is not following the protocol.
        if media != media_type(path):
            raise MalformedMessage(f"artifact {path[:100]!r} has the wrong media type")
        data = bytes(blob[offset : offset + data_bytes]) if data_bytes or size == 0 else None
        offset += data_bytes
        found.append(Artifact(path=path, size_bytes=size, media_type=media, data=data))
    if offset != len(blob) or offset > limits.max_artifact_bytes:
        raise MalformedMessage("the artifacts' bytes do not add up")
    return tuple(found)


def _run_result(
    reply: dict[str, Any],
    limits: Limits,
    calls: list[HostCall],
    blob: bytearray,
    *,
    cpu_time_s: float | None = None,
    peak_memory_bytes: int | None = None,
) -> RunResult:
    """The `RunResult` in a worker's ``ran`` reply, with the artifacts in its blob and the host's usage readings.

    Raises:
        MalformedMessage: The reply is not one.
        WorkspacePathError: An artifact's path is malformed.
    """
    error = error_from_plain(reply["error"]) if reply.get("error") is not None else None
    if error is not None and not isinstance(error, ScriptError):
        error = ScriptError(str(error))
    notes = reply.get("notes") or []
    if type(notes) is not list or len(notes) > MAX_NOTES:
        raise MalformedMessage(f"notes must be a list of at most {MAX_NOTES}")
    memory = reply.get("memory_bytes")
    assigned = reply.get("assigned") or []
    if type(assigned) is not list or len(assigned) > MAX_ASSIGNED:
        raise MalformedMessage(f"assigned must be a list of at most {MAX_ASSIGNED} names")
    cap = limits.max_output_bytes
    return RunResult(
        value=reply.get("value"),
        value_repr=_cap(reply.get("value_repr"), limits.max_value_repr_bytes),
        stdout=_cap(reply.get("stdout"), cap) or "",
        stderr=_cap(reply.get("stderr"), cap) or "",
        duration_s=float(reply.get("duration_s") or 0.0),
        external_calls=tuple(calls),
        notes=tuple(str(n)[:MAX_NOTE_CHARS] for n in notes),
        error=error,
        memory_bytes=memory if type(memory) is int else None,
        namespace_summary=str(reply.get("namespace_summary") or "")[:MAX_SUMMARY_CHARS],
        assigned=tuple(str(name)[:MAX_ASSIGNED_CHARS] for name in assigned),
        files=_artifacts(reply, limits, blob),
        inputs=_inputs(reply.get("inputs")),
        cpu_time_s=cpu_time_s,
        peak_memory_bytes=peak_memory_bytes,
    )


# What a pausable run's record may hold (`snapcell.interpreter._replay.Inputs.export`).
_INPUT_KEYS = frozenset(
    {"seed", "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "urandom", "hash"}
)


def _inputs(given: Any) -> dict[str, Any] | None:
    """A pausable run's record of its clocks and random sources (only replayed to the same cell's script).

    Raises:
        MalformedMessage: It is not such a record.
    """
    if given is None:
        return None
    if type(given) is not dict or not set(given) <= _INPUT_KEYS:
        raise MalformedMessage("inputs must be a record of clocks and random sources")
    return given


def _dumped(reply: dict[str, Any], payload: bytearray) -> Dumped:
    """The checkpoint in a worker's ``dumped`` reply and its blob: the body, then each new blob.

    The part sizes the reply declares must add up to the bytes received before any part is copied, and a
    blob may be named once. The body is the payload itself, cut after its part, not a copy.

    Raises:
        MalformedMessage: The reply or its parts are not well formed.
        ValueError: The manifest is not a valid `Manifest`.
    """
    names = reply.get("new_blobs", [])
    refresh = reply.get("refresh", [])
    if type(names) is not list or type(refresh) is not list:
        raise MalformedMessage("new_blobs and refresh must be lists")
    if len(names) > MAX_DUMP_BLOBS or len(refresh) > MAX_DUMP_BLOBS:
        raise MalformedMessage(f"a dump names at most {MAX_DUMP_BLOBS} new blobs and {MAX_DUMP_BLOBS} refreshed ones")
    if not all(type(n) is str and 0 < len(n) <= MAX_NAME_CHARS for n in (*names, *refresh)):
        raise MalformedMessage("blob names must be short non-empty text")
    if len(set(names)) != len(names):
        raise MalformedMessage("the same blob is named twice among the new blobs")
    parts = split_parts(payload, reply.get("parts", [len(payload)]))
    if len(parts) != len(names) + 1:
        raise MalformedMessage(f"{len(parts)} parts for {len(names)} new blobs")
    manifest = _body_manifest(parts[0])
    new_blobs = {name: bytes(part) for name, part in zip(names, parts[1:], strict=True)}
    body_bytes = parts[0].nbytes
    for part in parts:
        part.release()
    del payload[body_bytes:]
    return Dumped(body=payload, manifest=manifest, new_blobs=new_blobs, refresh=list(refresh), manifest_from_body=True)


def _cap(text: Any, limit: int | None) -> str | None:
    if text is None:
        return None
    kept: str = str(text)
    if limit is not None and len(kept) > limit + 200:
        return kept[-limit:]
    return kept
