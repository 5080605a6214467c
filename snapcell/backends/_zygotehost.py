"""The host side of a zygote (see `_zygote`): start it, ask it for forked workers, learn how they exit.

The zygote is trusted-clean (it never runs script code), but its children are hostile: the pid a
``forked`` reply names is checked with ``pidfd_open`` and ``/proc/<pid>/status`` (its parent must be
the zygote) before the host believes it, and the child is killed through that pidfd, which cannot name
a recycled pid. The zygote reaps its children and reports their exit status and peak RSS, which the
host uses as it uses ``wait4`` for a spawned worker. Its reports are messages in the wire's format, read with
`snapcell.wire.decode` within a small item budget, as every message between snapcell's processes is.

The zygote and spawned workers start as ``python -s -P -m ...`` (`python_command`) with an environment the host
builds whole (`child_env`), which holds the hash seed the host chose for the interpreter: string hashing, so the
order of a set of strings, is fixed when an interpreter starts, and a paused run must be resumed under its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from snapcell.backends._procstat import parent_of
from snapcell.backends._stderrtail import StderrTail
from snapcell.wire import THREAD_ENV, decode

__all__ = [
    "MAX_HASH_SEED",
    "ForkedChild",
    "Zygote",
    "ZygoteError",
    "child_env",
    "new_hash_seed",
    "python_command",
]

# The largest seed ``PYTHONHASHSEED`` takes (it takes 0 to 2**32 - 1; anything else stops the interpreter at start).
MAX_HASH_SEED = 2**32 - 1

_STARTUP_TIMEOUT_S = 60.0
_FORK_TIMEOUT_S = 30.0
# How long after its first fork the zygote is asked for its second stage (`_zygote._Preloader`): by then that fork's
# session has usually had its first result, which the second stage's imports would otherwise compete with for the
# CPU (on a busy machine; an idle one runs them on another core). Later children fork between its steps either way.
_PRELOAD_DELAY_S = 0.05
_MAX_REPLY_BYTES = 4096
# Values a report may hold: a handful of fields and the names of the heavy modules.
_MAX_REPLY_ITEMS = 64


def python_command(module: str) -> list[str]:
    """How the host starts an interpreter that runs ``module``: a worker or the zygote (its arguments follow).

    Not ``python -I``: it is ``-E -s -P``, and ``-E`` would ignore the ``PYTHONHASHSEED`` the host sets. ``-s`` (no
    user site directory) and ``-P`` (neither the working directory nor a script's directory on ``sys.path``) keep
    the rest of it; ``-E``'s part is the environment's, built whole by `child_env`: none of the host's ``PYTHON*``
    variables (``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONINSPECT``, ...) reaches the interpreter.
    """
    return [sys.executable, "-s", "-P", "-m", module]


def child_env(env: Mapping[str, str], hash_seed: int) -> dict[str, str]:
    """The whole environment of a worker's or the zygote's interpreter: ``env`` (the host's fixed one, never
    `os.environ`) without any ``PYTHON*`` variable, and ``PYTHONHASHSEED``, the only one the interpreter reads."""
    kept = {name: value for name, value in env.items() if not name.startswith("PYTHON")}
    return {**kept, "PYTHONHASHSEED": str(hash_seed)}


def new_hash_seed() -> int:
    """A random hash seed for a new interpreter (a zygote, or a worker spawned without one named)."""
    return int.from_bytes(os.urandom(4), "big")


class ZygoteError(Exception):
    """The zygote could not start or fork (internal: the pool falls back to spawning a worker)."""


class ForkedChild:
    """A worker forked by a zygote: its verified pid, a pidfd on it, and the future of its exit report."""

    def __init__(
        self,
        pid: int,
        pidfd: int,
        inherited_rss: int,
        exited: asyncio.Future[tuple[int, int | None]],
        preloaded: tuple[str, ...] = (),
    ) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.inherited_rss = inherited_rss
        # (wait status, peak RSS in bytes or None), set when the zygote reaps it or dies.
        self.exited = exited
        # The heavy modules its zygote had imported when it forked it (it imports the others on demand).
        self.preloaded = preloaded

    def kill(self) -> None:
        """SIGKILL the child through its pidfd (never a recycled pid); its process group goes when it is reaped."""
        if self.pidfd >= 0 and not self.exited.done():
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Close the pidfd."""
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class Zygote:
    """One zygote process for one set of preloaded modules.

    Args:
        preload: Heavy modules the zygote imports (see `snapcell.wire.preload_modules`).
        cwd: Its working directory (the pool's scratch root).
        env: Its environment (the workers' empty one); the thread limits of `snapcell.wire.THREAD_ENV` are added.
        hash_seed: The ``PYTHONHASHSEED`` it starts with, which every child it forks shares; a random one by default.
    """

    def __init__(
        self, preload: tuple[str, ...], *, cwd: str, env: Mapping[str, str], hash_seed: int | None = None
    ) -> None:
        self.preload = preload
        self._cwd = cwd
        self.hash_seed = new_hash_seed() if hash_seed is None else hash_seed
        self._env = child_env({**env, **THREAD_ENV}, self.hash_seed)
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0
        # The heavy modules it imports once a session may need them (those installed), and those it has imported.
        self.preloading: list[str] = []
        self.preloaded: list[str] = []
        # Those it would import (what it said at ready), and whether a session may need them (see `want_heavy`).
        self._heavy: list[str] = []
        self._heavy_wanted = False
        self._stage_sent = b""
        # How many modules it had imported when it said ready (``sys.modules``; what every pool's first fork waits for).
        self.modules_at_ready = 0
        self._preload_requested = False
        self._preload_timer: asyncio.TimerHandle | None = None
        self._ctrl: socket.socket | None = None
        self._stderr: StderrTail | None = None
        self._forks: deque[asyncio.Future[dict[str, Any]]] = deque()
        self._exits: dict[int, asyncio.Future[tuple[int, int | None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.forks = 0

    @property
    def alive(self) -> bool:
        """Whether the zygote still runs and its channel is open."""
        return (
            self.process is not None
            and self.process.poll() is None
            and self._reader is not None
            and not self._reader.done()
        )

    @property
    def preload_report(self) -> str:
        """The heavy modules it preloads, for `isolation_report`: "numpy, pandas", "... (importing)", "nothing yet
        (... once a session may need them)" or "nothing"."""
        if self.preloading:
            return ", ".join(self.preloading) + " (importing)"
        if not self.preloaded and self._heavy and not self._heavy_wanted:
            return f"nothing yet ({', '.join(self._heavy)} once a session may need them)"
        return ", ".join(self.preloaded) or "nothing"

    async def start(self, *, meanwhile: Callable[[], None] | None = None) -> None:
        """Spawn the zygote and wait until it has imported the worker (the heavy modules follow its first fork).

        Args:
            meanwhile: Host-side work to do while the zygote starts (on another core: this process only waits then).

        Raises:
            ZygoteError: It could not start, or did not come up clean (single-threaded).
        """
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._stderr = stderr = StderrTail()
        stderr.watch()
        command = [*python_command("snapcell.worker._zygote"), str(child.fileno()), str(os.getpid())]
        try:
            self.process = subprocess.Popen(
                [*command, ",".join(self.preload)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr.write_fd,
                pass_fds=(child.fileno(),),
                close_fds=True,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )
        except OSError as exc:
            host.close()
            raise ZygoteError(f"could not start a zygote: {exc}") from exc
        finally:
            child.close()
            stderr.close_write_end()
        self.pid = self.process.pid
        host.setblocking(False)
        self._ctrl = host
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                await self.close()
                raise
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(_STARTUP_TIMEOUT_S):
                data = await loop.sock_recv(host, _MAX_REPLY_BYTES)
            ready = decode(data, max_items=_MAX_REPLY_ITEMS) if data else {}
        except (TimeoutError, OSError, ValueError) as exc:
            await self.close()
            raise ZygoteError(f"the zygote did not start: {exc!r}{self._stderr_tail()}") from None
        if type(ready) is not dict or ready.get("op") != "ready" or ready.get("threads") != 1:
            await self.close()
            raise ZygoteError(f"the zygote did not come up clean: {str(ready)[:300]}{self._stderr_tail()}")
        self._heavy = [str(m) for m in ready.get("preload", [])]
        self.preloading = []
        self.preloaded = [str(m) for m in ready.get("preloaded", [])]
        modules = ready.get("modules")
        self.modules_at_ready = modules if type(modules) is int else 0
        self._reader = asyncio.ensure_future(self._read())

    def _stderr_tail(self) -> str:
        tail = "" if self._stderr is None else self._stderr.tail(1500).strip()
        return f":\n{tail}" if tail else ""

    async def _read(self) -> None:
        """Dispatch the zygote's reports until its channel closes; then fail whatever still waits."""
        ctrl = self._ctrl
        if ctrl is None:
            return
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(ctrl, _MAX_REPLY_BYTES)
                if not data:
                    break
                self._dispatch(decode(data, max_items=_MAX_REPLY_ITEMS), loop)
        except (OSError, ValueError):
            pass
        finally:
            # The zygote is gone: its children got SIGKILL with it (pdeathsig).
            for future in self._forks:
                if not future.done():
                    future.set_exception(ZygoteError("the zygote exited"))
            self._forks.clear()
            for exited in self._exits.values():
                if not exited.done():
                    exited.set_result((signal.SIGKILL, None))
            self._exits.clear()

    def _dispatch(self, message: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        op = message.get("op")
        if op in ("forked", "fork_failed") and self._forks:
            if op == "forked" and type(message.get("pid")) is int:
                # Registered before any report of its exit can arrive (the zygote reports in order).
                self._exits[message["pid"]] = loop.create_future()
            future = self._forks.popleft()
            if not future.done():
                future.set_result(message)
        elif op == "preloaded" and type(message.get("preloaded")) is list:
            self.preloaded = [str(m) for m in message["preloaded"]]
            if message.get("heavy") is True:  # else a stage without them: asked for since, they may still come
                self.preloading = []
        elif op == "exited" and type(message.get("pid")) is int:
            exited = self._exits.pop(message["pid"], None)
            status, maxrss = message.get("status"), message.get("maxrss")
            if exited is not None and not exited.done() and type(status) is int:
                exited.set_result((status, maxrss if type(maxrss) is int else None))

    async def fork(self, channel: socket.socket, stderr_fd: int) -> ForkedChild:
        """Fork a worker that serves ``channel`` (the worker's end) and writes its stderr to ``stderr_fd``.

        Raises:
            ZygoteError: The zygote is gone, could not fork, or named a process that is not its child.
        """
        ctrl = self._ctrl
        if ctrl is None or not self.alive:
            raise ZygoteError("the zygote is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        async with self._lock:  # the request and its place in the queue of replies go together
            try:
                socket.send_fds(ctrl, [b"F"], [channel.fileno(), stderr_fd])
            except OSError as exc:
                raise ZygoteError(f"could not reach the zygote: {exc}") from exc
            self._forks.append(future)
            if not self._preload_requested:
                # Only after the first fork, which so waits for nothing: the zygote imports the heavy modules
                # between later fork requests.
                self._preload_requested = True
                self._preload_timer = loop.call_later(_PRELOAD_DELAY_S, self._request_preload)
        try:
            async with asyncio.timeout(_FORK_TIMEOUT_S):
                reply = await future
        except TimeoutError:
            await self.close()
            raise ZygoteError("the zygote did not answer a fork request") from None
        if reply.get("op") != "forked":
            raise ZygoteError(f"the zygote could not fork: {str(reply.get('error'))[:300]}")
        pid = reply["pid"]
        exited = self._exits.get(pid)
        if exited is None:
            raise ZygoteError(f"the zygote named pid {pid} twice")
        preloaded = reply.get("preloaded")
        modules = tuple(str(m) for m in preloaded) if type(preloaded) is list else ()
        child = ForkedChild(pid, -1, int(reply.get("rss") or 0), exited, modules)
        self.forks += 1
        try:
            child.pidfd = os.pidfd_open(pid)
            if parent_of(pid) != self.pid:
                raise ZygoteError(f"process {pid} is not a child of the zygote (pid {self.pid})")
            signal.pidfd_send_signal(child.pidfd, 0)  # still the process the pidfd was opened on
        except (OSError, ZygoteError) as exc:
            child.close()
            raise ZygoteError(f"could not verify the forked worker {pid}: {exc}") from exc
        return child

    def want_heavy(self) -> None:
        """Say that a session forked from this zygote may need its heavy modules: it imports them (once).

        Until then its second stage leaves them out: a server whose sessions never name numpy or pandas never
        imports them, which takes the CPU of its first turns and tens of MiB.
        """
        if self._heavy_wanted:
            return
        self._heavy_wanted = True
        self.preloading = [m for m in self._heavy if m not in self.preloaded]
        if self._stage_sent == b"L":  # the stage without them was asked for already: now them too
            self._send_stage(b"P")

    def _request_preload(self) -> None:
        """Ask the zygote for its second stage (once, `_PRELOAD_DELAY_S` after its first fork): with its heavy modules
        if a session may need them by then (see `want_heavy`)."""
        self._preload_timer = None
        self._send_stage(b"P" if self._heavy_wanted else b"L")

    def _send_stage(self, stage: bytes) -> None:
        self._stage_sent = stage
        if self._ctrl is not None:
            with contextlib.suppress(OSError):  # a zygote gone meanwhile fails the next fork's reply instead
                self._ctrl.send(stage)

    async def close(self) -> None:
        """Kill the zygote (its children die with it) and close its channel; safe to call twice."""
        if self._preload_timer is not None:
            self._preload_timer.cancel()
            self._preload_timer = None
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), 5.0)
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._stderr is not None:
            self._stderr.close()
