"""The host side of one worker process: spawn, talk, kill (the pool and the backend build on it).

A worker is a fresh interpreter (``python -I -m snapcell.runner._worker``) started with an empty
environment, no inherited descriptors but its socket, and its own scratch directory. The host never
unpickles what a worker sends (see `_wire`), and it kills a worker that overruns its wall time plus
grace, or that the pool no longer needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
from typing import Any

from snapcell._telemetry import trace_host_function
from snapcell.errors import SessionError
from snapcell.runner._host import HostCall
from snapcell.runner._limits import Limits
from snapcell.runner._policy import Policy
from snapcell.runner._wire import (
    FRAME,
    MAX_MESSAGE_BYTES,
    NotPlainData,
    decode,
    encode,
    to_plain,
)

__all__ = ["WorkerProcess", "policy_to_plain"]

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
            log.error(
                "snapcell: the host function %s returned data that cannot be sent to the script (%s); this is a bug "
                "in the application: return plain data (numbers, strings, bytes, lists, dicts, dates, Decimals)",
                name,
                exc,
            )
            text = f"{name}() returned data that cannot be sent: {exc}"
            reply["error"] = {"type": "TypeError", "message": text}
            if calls is not None:
                calls.append(HostCall(name, time.perf_counter() - start, f"TypeError: {text}"))
        except Exception as exc:  # a host function's failure goes to the script, which may catch it
            if func is not None:  # no function of that name is the script's mistake, not the application's
                log.warning(
                    "snapcell: the host function %s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc
                )
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
