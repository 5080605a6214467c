"""The host side of worker processes: spawn, talk, kill, and a pool of warm workers.

A worker is a fresh interpreter (``python -I -m snapcell.runner._worker``) started with an empty
environment, no inherited descriptors but its socket, and its own scratch directory. The host never
unpickles what a worker sends (see `_wire`), and it kills a worker that overruns its wall time plus
grace, or that the pool no longer needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from snapcell._telemetry import trace_host_function
from snapcell.checkpoint import BlobRef, Dumped, Manifest
from snapcell.errors import ConfigError, ScriptError, SessionError, WorkerLost
from snapcell.runner._host import HostCall
from snapcell.runner._limits import Limits
from snapcell.runner._policy import Policy
from snapcell.runner._result import RunResult
from snapcell.runner._wire import (
    FRAME,
    MAX_MESSAGE_BYTES,
    MalformedMessage,
    NotPlainData,
    decode,
    encode,
    error_from_plain,
    split_parts,
    to_plain,
)

__all__ = ["ProcessBackend", "WorkerPool", "WorkerProcess"]

log = logging.getLogger("snapcell")

_STARTUP_TIMEOUT_S = 60.0
_REQUEST_TIMEOUT_S = 600.0
_KILL_WAIT_S = 5.0
_READ_CHUNK = 256 * 1024
_DECODE_INLINE_BYTES = 256 * 1024
# A large blob's buffer starts this big and doubles as data arrives, so a claimed size costs nothing until it is sent.
_FIRST_BLOCK = 64 * 1024 * 1024
# Largest blob a worker may send when its session has no memory limit; with one, twice that limit.
_MAX_BLOB_BYTES_UNLIMITED = 64 * 1024**3
_REFILL_DELAY_S = 0.05
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class _Died(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def policy_to_plain(policy: Policy) -> dict[str, Any]:
    """A policy's fields as plain data, to send to a worker."""
    fields = {}
    for field in dataclasses.fields(policy):
        value = getattr(policy, field.name)
        fields[field.name] = sorted(value) if isinstance(value, frozenset) else value
    return to_plain(fields)  # type: ignore[no-any-return]


class WorkerProcess:
    """One worker process and the channel to it. Use `start`, then `init`, then requests."""

    def __init__(self, scratch_root: str) -> None:
        self._scratch_root = scratch_root
        self.scratch_dir = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.sandbox: dict[str, str] = {}
        self.checkouts = 0
        self._sock: socket.socket | None = None
        # Received bytes not yet consumed live in _rbuf[_rstart:_rend].
        self._rbuf = bytearray(_READ_CHUNK)
        self._rview = memoryview(self._rbuf)
        self._rstart = self._rend = 0
        self._send_lock = asyncio.Lock()
        self._stderr: Any = None
        self.dead = False
        # Largest blob accepted in a frame; none until `init` says how much memory the worker may use.
        self.max_blob_bytes = 0

    async def start(self) -> None:
        """Spawn the interpreter and wait until it has imported snapcell."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stderr = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-m", "snapcell.runner._worker", str(child.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                pass_fds=(child.fileno(),),
                close_fds=True,
                env=_ENV,
                cwd=self._scratch_root,
                start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            raise SessionError(f"could not start a worker process: {exc}") from exc
        finally:
            child.close()
        self.pid = self.process.pid
        parent.setblocking(False)
        self._sock = parent
        message, _ = await self._receive(_STARTUP_TIMEOUT_S)
        if message.get("op") != "started":
            await self.kill()
            raise SessionError(f"a worker process sent {message.get('op')!r} instead of starting")

    async def init(self, *, policy: Policy, limits: Limits) -> None:
        """Give the worker its session settings; it applies its sandbox and reports the layers."""
        self.scratch_dir = tempfile.mkdtemp(prefix="session-", dir=self._scratch_root)
        memory = limits.memory_bytes
        self.max_blob_bytes = _MAX_BLOB_BYTES_UNLIMITED if memory is None else 2 * memory
        await self._send(
            {
                "op": "init",
                "policy": policy_to_plain(policy),
                "limits": to_plain(dataclasses.asdict(limits)),
                "scratch_dir": self.scratch_dir,
            }
        )
        try:
            message, _ = await self._receive(_STARTUP_TIMEOUT_S)
        except _Died as exc:
            tail = self._stderr_tail(1500).strip()
            detail = f":\n{tail}" if tail else ""
            raise SessionError(f"a worker process failed to start ({exc.reason}){detail}") from exc
        if message.get("op") != "ready":
            await self.kill()
            raise SessionError(f"a worker process failed to start: {message}")
        self.sandbox = {str(k): str(v) for k, v in message.get("sandbox", {}).items()}

    async def _send(self, message: dict[str, Any], *parts: bytes | bytearray | memoryview) -> None:
        sock = self._sock
        if sock is None or self.dead:
            raise _Died("crash", "the worker is not running")
        payload = encode(message)
        loop = asyncio.get_running_loop()
        try:
            async with self._send_lock:  # frames from concurrent host-call results must not interleave
                await loop.sock_sendall(sock, FRAME.pack(len(payload), sum(len(p) for p in parts)) + payload)
                for part in parts:
                    if part:
                        await loop.sock_sendall(sock, part)
        except (ConnectionError, OSError) as exc:
            raise _Died(await self._death_reason(), str(exc)) from exc

    async def _read_exactly(self, size: int) -> bytearray:
        sock = self._sock
        if sock is None:
            raise _Died("crash", "the worker is not running")
        buffer, view = self._rbuf, self._rview
        if self._rend - self._rstart >= size:
            # Small frames usually arrive whole: one read serves the header and the message.
            out = buffer[self._rstart : self._rstart + size]
            self._rstart += size
            return out
        loop = asyncio.get_running_loop()
        if size > len(buffer) // 2:
            # A large payload goes straight into its own buffer, after what is already here.
            got = self._rend - self._rstart
            out = bytearray(max(min(size, _FIRST_BLOCK), got))
            out[:got] = view[self._rstart : self._rend]
            self._rstart = self._rend = 0
            while got < size:
                if got == len(out):
                    out.extend(bytes(min(len(out), size - got)))
                target = memoryview(out)[got:]
                try:
                    n = await loop.sock_recv_into(sock, target)
                finally:
                    target.release()  # `extend` above needs the buffer unexported
                if n == 0:
                    raise ConnectionResetError("the worker closed its channel")
                got += n
            return out
        if self._rstart:  # make room at the end
            kept = self._rend - self._rstart
            view[:kept] = view[self._rstart : self._rend]
            self._rstart, self._rend = 0, kept
        while self._rend < size:
            n = await loop.sock_recv_into(sock, view[self._rend :])
            if n == 0:
                raise ConnectionResetError("the worker closed its channel")
            self._rend += n
        out = buffer[:size]
        self._rstart = size
        return out

    async def _receive(self, timeout_s: float | None) -> tuple[dict[str, Any], bytearray]:
        try:
            async with asyncio.timeout(timeout_s):
                size, blob_size = FRAME.unpack(await self._read_exactly(FRAME.size))
                if size > MAX_MESSAGE_BYTES:
                    raise _Died("crash", f"the worker sent a {size}-byte message")
                if blob_size > self.max_blob_bytes:
                    raise _Died(
                        "crash", f"the worker announced a {blob_size}-byte blob (at most {self.max_blob_bytes})"
                    )
                raw = await self._read_exactly(size)
                # A large message (a big run value) is decoded off the event loop, which other sessions share.
                message = decode(raw) if size < _DECODE_INLINE_BYTES else await asyncio.to_thread(decode, raw)
                blob = await self._read_exactly(blob_size) if blob_size else bytearray()
        except TimeoutError:
            await self.kill()
            raise _Died("timeout") from None
        except (ConnectionError, OSError) as exc:
            raise _Died(await self._death_reason(), str(exc)) from exc
        except _Died:
            await self.kill()
            raise
        except Exception as exc:  # a malformed frame from a compromised worker
            await self.kill()
            raise _Died("crash", f"the worker sent malformed data: {exc}") from exc
        return message, blob

    async def request(
        self,
        message: dict[str, Any],
        parts: Sequence[bytes | bytearray | memoryview] = (),
        *,
        timeout_s: float | None = _REQUEST_TIMEOUT_S,
        lookup: Mapping[str, Callable[..., Any]] | None = None,
        calls: list[HostCall] | None = None,
    ) -> tuple[dict[str, Any], bytearray]:
        """Send a request and wait for its reply, serving host-function calls meanwhile.

        Raises:
            _Died: The worker died or overran ``timeout_s`` (it is killed then).
        """
        await self._send(message, *parts)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                reply, reply_blob = await self._receive(remaining)
                if reply.get("op") == "call":
                    task = asyncio.ensure_future(self._serve_call(reply, lookup or {}, calls))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    continue
                return reply, reply_blob
        finally:
            for task in tasks:
                task.cancel()

    async def _serve_call(
        self, message: dict[str, Any], lookup: Mapping[str, Callable[..., Any]], calls: list[HostCall] | None
    ) -> None:
        name = str(message.get("name"))
        func = trace_host_function(name, lookup.get(name))
        start = time.perf_counter()
        reply: dict[str, Any] = {"op": "result", "id": message.get("id")}
        try:
            if func is None:
                raise NameError(f"host function {name!r} is not available in this run")
            args, kwargs = message.get("args") or [], message.get("kwargs") or {}
            value = func(*args, **{str(k): v for k, v in kwargs.items()})
            if inspect.isawaitable(value):
                value = await value
            reply["value"] = to_plain(_plain_friendly(value))
            if calls is not None:
                calls.append(HostCall(name, time.perf_counter() - start))
        except NotPlainData as exc:
            reply["error"] = {"type": "TypeError", "message": f"{name}() returned data that cannot be sent: {exc}"}
            if calls is not None:
                calls.append(HostCall(name, time.perf_counter() - start, f"TypeError: {exc}"))
        except Exception as exc:  # a host function's failure goes to the script, which may catch it
            reply["error"] = {"type": type(exc).__name__, "message": str(exc)[:10_000]}
            if calls is not None:
                calls.append(HostCall(name, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(_Died):
            await self._send(reply)

    async def _death_reason(self) -> str:
        if self.process is None:
            return "crash"
        try:
            code = await asyncio.wait_for(asyncio.to_thread(self.process.wait), _KILL_WAIT_S)
        except TimeoutError:
            return "crash"
        self.dead = True
        tail = self._stderr_tail()
        if tail:
            log.debug("snapcell: worker %s exited with %s; its stderr ends with:\n%s", self.pid, code, tail)
        if code < 0 and -code in (signal.SIGKILL, signal.SIGTERM):
            return "signal"
        if code < 0 and -code == signal.SIGXCPU:
            return "timeout"
        return "memory" if self._stderr_mentions("MemoryError") else "crash"

    def _stderr_tail(self, limit: int = 4096) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            return str(self._stderr.read()[-limit:].decode(errors="replace"))
        except (OSError, ValueError):
            return ""

    def _stderr_mentions(self, text: str) -> bool:
        return text in self._stderr_tail(65536)

    async def kill(self) -> None:
        """Kill the worker and remove its scratch directory; safe to call twice."""
        self.dead = True
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), _KILL_WAIT_S)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self.scratch_dir:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)
            self.scratch_dir = ""


def _plain_friendly(value: Any) -> Any:
    """Turn common host return types (pydantic models, dataclasses) into plain data."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="python")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return type(value)(_plain_friendly(v) for v in value) if type(value) in (list, tuple) else value
    return value


class WorkerPool:
    """Keeps warm worker processes so a checkout does not pay for an interpreter start-up.

    Args:
        min_warm: Workers kept started ahead of time.
        max_workers: Workers alive at once (checked out plus warm).
        checkout_timeout_s: Seconds `acquire` waits for a free slot before `SessionError`.
        recycle_after: Checkouts a worker serves before it is replaced. 1 (the default) gives every session a
            fresh interpreter. More reuses a worker for later sessions with the same policy and limits: its
            namespace, scratch directory and decimal context are reset, but it is the same interpreter, so
            use it only where the sessions trust each other (one tenant).
    """

    def __init__(self, *, min_warm: int, max_workers: int, checkout_timeout_s: float, recycle_after: int = 1) -> None:
        if min_warm < 0 or max_workers < 1 or min_warm > max_workers:
            raise ConfigError(f"need 0 <= min_warm ({min_warm}) <= max_workers ({max_workers}) and max_workers >= 1")
        if not isinstance(recycle_after, int) or isinstance(recycle_after, bool) or recycle_after < 1:
            raise ConfigError(f"recycle_after must be a whole number >= 1, not {recycle_after!r}")
        self.recycle_after = recycle_after
        # Workers between checkouts, already set up for one (policy, limits); reused by `acquire`.
        self._idle: dict[tuple[Policy, Limits], list[WorkerProcess]] = {}
        self.min_warm = min_warm
        self.max_workers = max_workers
        self.checkout_timeout_s = checkout_timeout_s
        self.scratch_root = tempfile.mkdtemp(prefix="snapcell-workers-")
        self._warm: list[WorkerProcess] = []
        self._busy: set[WorkerProcess] = set()
        self._starting = 0
        self._changed = asyncio.Condition()
        self._fill_task: asyncio.Task[None] | None = None
        self._closed = False
        self._warned: set[str] = set()

    def _live(self) -> int:
        return len(self._warm) + len(self._busy) + self._starting + sum(map(len, self._idle.values()))

    async def _evict_idle(self) -> bool:
        """Kill one idle worker to free a slot for another configuration; True if there was one."""
        for workers in self._idle.values():
            if workers:
                await workers.pop(0).kill()
                return True
        return False

    def fill(self) -> None:
        """Start warm workers in the background up to ``min_warm``."""
        if self._closed or (self._fill_task is not None and not self._fill_task.done()):
            return
        self._fill_task = asyncio.ensure_future(self._fill())

    async def _fill(self) -> None:
        while not self._closed and len(self._warm) + self._starting < self.min_warm and self._live() < self.max_workers:
            worker = await self._spawn()
            if worker is None:
                return
            async with self._changed:
                if self._closed:
                    await worker.kill()
                    return
                self._warm.append(worker)
                self._changed.notify_all()

    async def _spawn(self) -> WorkerProcess | None:
        self._starting += 1
        worker = WorkerProcess(self.scratch_root)
        try:
            await worker.start()
            return worker
        except (SessionError, _Died) as exc:
            log.warning("snapcell: a worker process failed to start: %s", exc)
            await worker.kill()
            return None
        except BaseException:
            await asyncio.shield(worker.kill())  # cancelled mid-start (pool closing): leave no process
            raise
        finally:
            self._starting -= 1

    async def acquire(self, *, policy: Policy, limits: Limits) -> WorkerProcess:
        """Take a warm worker (or start one), give it its settings, and mark it busy.

        Raises:
            SessionError: No worker became free within ``checkout_timeout_s``, or one failed to start.
        """
        if self._closed:
            raise SessionError("the pool is closed")
        reused = self._idle.get((policy, limits))
        if reused:
            again = reused.pop(0)
            self._busy.add(again)
            again.checkouts += 1
            return again
        worker: WorkerProcess | None = None
        try:
            async with asyncio.timeout(self.checkout_timeout_s):
                async with self._changed:
                    while True:
                        if self._warm:
                            worker = self._warm.pop(0)
                            break
                        if self._live() < self.max_workers:
                            self._starting += 1  # reserve the slot while we start one
                            break
                        if await self._evict_idle():
                            continue
                        await self._changed.wait()
                if worker is None:
                    self._starting -= 1
                    worker = await self._spawn()
                    if worker is None:
                        raise SessionError("a worker process failed to start; see the snapcell log")
        except TimeoutError:
            raise SessionError(
                f"no worker process became free within {self.checkout_timeout_s:g} s "
                f"({self.max_workers} are checked out); raise max_workers or check sessions in sooner"
            ) from None
        self._busy.add(worker)
        # Start the replacement a moment later: spawning blocks this loop for a fork and then competes for
        # the CPU, which the session's first run (usually right now) should not pay for.
        asyncio.get_running_loop().call_later(_REFILL_DELAY_S, self.fill)
        try:
            await worker.init(policy=policy, limits=limits)
        except (SessionError, _Died) as exc:
            await self.release(worker)
            raise SessionError(f"a worker process failed to start: {exc}") from exc
        worker.checkouts += 1
        for layer, state in worker.sandbox.items():
            if state.startswith("unavailable") and layer not in self._warned:
                self._warned.add(layer)
                log.warning("snapcell: sandbox layer %s is %s", layer, state)
        return worker

    async def release(self, worker: WorkerProcess, *, reuse_for: tuple[Policy, Limits] | None = None) -> None:
        """End a worker's checkout: it is killed, or reset and kept for ``reuse_for`` under ``recycle_after``."""
        if reuse_for is not None and not worker.dead and worker.checkouts < self.recycle_after and not self._closed:
            try:
                reply, _ = await worker.request({"op": "recycle"}, timeout_s=_KILL_WAIT_S)
            except _Died:
                reply = {}
            if reply.get("op") == "recycled":
                async with self._changed:
                    self._busy.discard(worker)
                    self._idle.setdefault(reuse_for, []).append(worker)
                    self._changed.notify_all()
                return
        await worker.kill()
        async with self._changed:
            self._busy.discard(worker)
            self._changed.notify_all()
        self.fill()

    async def close(self) -> None:
        """Kill every worker; none outlives the pool."""
        self._closed = True
        if self._fill_task is not None:
            self._fill_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._fill_task
        workers = [*self._warm, *self._busy, *(w for idle in self._idle.values() for w in idle)]
        self._warm.clear()
        self._busy.clear()
        self._idle.clear()
        await asyncio.gather(*(w.kill() for w in workers))
        shutil.rmtree(self.scratch_root, ignore_errors=True)


class ProcessBackend:
    """A session's runner in a worker process; replaces the worker when it dies."""

    def __init__(self, pool: WorkerPool, *, policy: Policy, limits: Limits) -> None:
        self._pool = pool
        self._policy = policy
        self._limits = limits
        self.worker: WorkerProcess | None = None

    async def start(self) -> None:
        """Acquire the session's worker."""
        self.worker = await self._pool.acquire(policy=self._policy, limits=self._limits)

    async def _request(
        self,
        message: dict[str, Any],
        parts: Sequence[bytes | bytearray | memoryview] = (),
        *,
        expect: str,
        timeout_s: float | None = _REQUEST_TIMEOUT_S,
        lookup: Mapping[str, Callable[..., Any]] | None = None,
        calls: list[HostCall] | None = None,
    ) -> tuple[dict[str, Any], bytearray]:
        """Send a request and return its reply, whose op must be ``expect``.

        Raises:
            WorkerLost: The worker died, overran ``timeout_s`` or sent a malformed reply; it is killed.
            SnapcellError: The worker reported this error; the worker is kept.
        """
        if self.worker is None:
            await self.start()
        worker = self.worker
        if worker is None:
            raise SessionError("no worker process")
        try:
            reply, reply_blob = await worker.request(message, parts, timeout_s=timeout_s, lookup=lookup, calls=calls)
        except _Died as exc:
            await self._pool.release(worker)
            self.worker = None
            raise _lost(exc, message.get("op"), timeout_s) from None
        except BaseException:
            # Cancelled mid-request: the worker's state is unknown, so it goes.
            await self._pool.release(worker)
            self.worker = None
            raise
        op = reply.get("op")
        if op == "error":
            try:
                error = error_from_plain(reply.get("error"))
            except MalformedMessage as exc:
                raise await self._malformed(message.get("op"), exc) from None
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
        return _lost(_Died("crash", f"it sent a malformed reply: {str(exc)[:200]}"), op, None)

    async def run(
        self, code: str, *, lookup: Mapping[str, Callable[..., Any]], setup: bool, limits: Limits
    ) -> RunResult:
        host = {name: inspect.iscoroutinefunction(func) for name, func in lookup.items()}
        timeout = None if limits.wall_time_s is None else limits.wall_time_s + limits.grace_s + 1.0
        calls: list[HostCall] = []
        reply, _ = await self._request(
            {
                "op": "run",
                # A str subclass is sent as its text; anything else is not a script, which the worker says.
                "code": str.__str__(code) if isinstance(code, str) else None,
                "host": host,
                "setup": setup,
                "limits": _limits_plain(limits),
            },
            expect="ran",
            timeout_s=timeout,
            lookup=lookup,
            calls=calls,
        )
        try:
            return _run_result(reply, limits, calls)
        except (MalformedMessage, ValueError, TypeError) as exc:
            raise await self._malformed("run", exc) from None

    async def dump(
        self,
        *,
        created_at: float,
        level: int,
        on_unpicklable: Literal["skip", "fail"],
        known_blobs: Mapping[str, BlobRef],
    ) -> Dumped:
        reply, payload = await self._request(
            {
                "op": "dump",
                "created_at": created_at,
                "level": level,
                "on_unpicklable": on_unpicklable,
                "known_blobs": [ref.model_dump() for ref in known_blobs.values()],
            },
            expect="dumped",
        )
        try:
            return _dumped(reply, payload)
        except (MalformedMessage, ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise await self._malformed("dump", exc) from None

    async def load(self, body: bytes | bytearray | memoryview, blobs: Mapping[str, bytes]) -> Manifest:
        names = list(blobs)
        sizes = [len(body), *(len(blobs[name]) for name in names)]
        reply, _ = await self._request(
            {"op": "load", "parts": sizes, "blobs": names}, [body, *(blobs[name] for name in names)], expect="loaded"
        )
        try:
            return Manifest.model_validate_json(_text(reply, "manifest"))
        except (MalformedMessage, ValueError) as exc:
            raise await self._malformed("load", exc) from None

    async def queue(self, *, notes: list[str], setup_cells: list[str]) -> None:
        """Ask the runner to add notes and run setup cells before the next cell."""
        await self._request({"op": "queue", "notes": notes, "setup_cells": setup_cells}, expect="queued")

    async def reset(self) -> None:
        await self._request({"op": "reset"}, expect="reset")

    async def declarations(self) -> str:
        reply, _ = await self._request({"op": "declarations"}, expect="declarations")
        return str(reply.get("text", ""))

    async def close(self) -> None:
        if self.worker is not None:
            worker, self.worker = self.worker, None
            await self._pool.release(worker, reuse_for=(self._policy, self._limits))

    async def discard(self) -> None:
        if self.worker is not None:
            worker, self.worker = self.worker, None
            await self._pool.release(worker)  # killed, never reused

    @property
    def sandbox(self) -> dict[str, str]:
        """The sandbox layers of the current worker."""
        return dict(self.worker.sandbox) if self.worker is not None else {}


@functools.lru_cache(maxsize=64)
def _limits_plain(limits: Limits) -> dict[str, Any]:
    """A `Limits` as plain data; cached, since a session sends the same frozen limits with every run."""
    plain: dict[str, Any] = to_plain(dataclasses.asdict(limits))
    return plain


def _lost(exc: _Died, op: Any, timeout_s: float | None) -> WorkerLost:
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
        f"the session's worker process was lost during {op}: {what}{detail}; the session restarts from its last "
        "checkpoint and setup cells, and the cell that caused it is not run again",
        reason=exc.reason,
    )


def _text(reply: dict[str, Any], key: str) -> str:
    value = reply.get(key)
    if type(value) is not str:
        raise MalformedMessage(f"{key} must be text, not {type(value).__name__}")
    return value


def _run_result(reply: dict[str, Any], limits: Limits, calls: list[HostCall]) -> RunResult:
    """The `RunResult` in a worker's ``ran`` reply.

    Raises:
        MalformedMessage: The reply is not one.
    """
    error = error_from_plain(reply["error"]) if reply.get("error") is not None else None
    if error is not None and not isinstance(error, ScriptError):
        error = ScriptError(str(error))
    notes = reply.get("notes") or []
    if type(notes) is not list:
        raise MalformedMessage("notes must be a list")
    memory = reply.get("memory_bytes")
    cap = limits.max_output_bytes
    return RunResult(
        value=reply.get("value"),
        value_repr=_cap(reply.get("value_repr"), limits.max_value_repr_bytes),
        stdout=_cap(reply.get("stdout"), cap) or "",
        stderr=_cap(reply.get("stderr"), cap) or "",
        duration_s=float(reply.get("duration_s") or 0.0),
        external_calls=tuple(calls),
        notes=tuple(str(n)[:10_000] for n in notes),
        error=error,
        memory_bytes=memory if type(memory) is int else None,
        namespace_summary=str(reply.get("namespace_summary") or "")[:1000],
    )


def _dumped(reply: dict[str, Any], payload: bytearray) -> Dumped:
    """The checkpoint in a worker's ``dumped`` reply and its blob: the body, then each new blob.

    Raises:
        MalformedMessage: The reply or its parts are not well formed.
        ValueError: The manifest is not a valid `Manifest`.
    """
    names = reply.get("new_blobs", [])
    refresh = reply.get("refresh", [])
    if type(names) is not list or type(refresh) is not list:
        raise MalformedMessage("new_blobs and refresh must be lists")
    parts = split_parts(payload, reply.get("parts", [len(payload)]))
    if len(parts) != len(names) + 1:
        raise MalformedMessage(f"{len(parts)} parts for {len(names)} new blobs")
    manifest = Manifest.model_validate_json(_text(reply, "manifest"))
    return Dumped(
        body=bytearray(parts[0]),
        manifest=manifest,
        new_blobs={str(name): bytes(part) for name, part in zip(names, parts[1:], strict=True)},
        refresh=[str(h) for h in refresh],
    )


def _cap(text: Any, limit: int | None) -> str | None:
    if text is None:
        return None
    kept: str = str(text)
    if limit is not None and len(kept) > limit + 200:
        return kept[-limit:]
    return kept
