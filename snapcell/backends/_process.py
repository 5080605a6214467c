"""The host side of one worker process: spawn, talk, kill (the pool and the backend build on it).

A worker is a fresh interpreter (``python -s -P -m snapcell.worker._worker``, see `_zygotehost.python_command`)
started with an environment the host builds whole (nothing of its own but a few locale settings and the hash seed it
chose), no inherited descriptors but its socket, and its own scratch directory. The host never
unpickles what a worker sends (see `_wire`), and it kills a worker that overruns its wall time plus
grace, or that the pool no longer needs.

The process the host spawns is the worker's launcher (see `snapcell.sandbox.launch_worker`): the worker is its
child, in a pid namespace that ends with it, and it exits as the worker does. The host waits for and kills the
launcher, whose exit status and peak memory are the worker's; it signals and reads ``/proc`` of the worker itself,
by the pid the worker names when it starts, once that is checked to be the launcher's child.

Every worker is assumed hostile. Each frame it sends is checked against the budget of the request in
flight (`_budget.reply_budget`) before anything is allocated, and read as it arrives, so a claimed size
costs nothing until it is sent; host-function calls are counted here against ``max_host_calls``; every
request has a deadline; and why a worker died is decided from what the host sees (its exit status,
its peak memory from ``wait4``), never from what it wrote to stderr, of which only the tail is kept: stderr is a
pipe the host drains (`StderrTail`), never a file on the host's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import resource
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from snapcell.backends._hostcalls import PendingCall, ThreadedCall, answer_threaded, call_host, finish_call
from snapcell.backends._hostchannel import ChannelIO, Died, send_now
from snapcell.backends._procstat import ProcStat, parent_of
from snapcell.backends._stderrtail import StderrTail
from snapcell.backends._zygotehost import ForkedChild, Zygote, child_env, new_hash_seed, python_command
from snapcell.errors import OutputLimitExceeded, SessionError
from snapcell.interpreter import CallCounter, HostCall
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.sandbox import LIVE_WORKER_PIDS, detach_scratch, remove_scratch, sandbox_failure, worker_sandbox_settings
from snapcell.wire import FRAME, Budget, decode, either_budget, encode, imports_library, reply_budget, to_plain

__all__ = ["WorkerProcess", "plain_settings", "policy_to_plain"]

log = logging.getLogger("snapcell")

_STARTUP_TIMEOUT_S = 60.0
_REQUEST_TIMEOUT_S = 600.0
# Requests that do no script work (queue, reset, declarations): a worker that takes longer is stuck or hostile.
_CONTROL_TIMEOUT_S = 30.0
_KILL_WAIT_S = 5.0
# A worker whose channel closed exits at once; one still alive this long after is killed.
_EXIT_WAIT_S = 1.0
_DECODE_INLINE_BYTES = 256 * 1024
# Largest blob a worker may send when its session has no memory limit; with one, twice that limit.
_MAX_BLOB_BYTES_UNLIMITED = 64 * 1024**3
_REFILL_DELAY_S = 0.05
# Host-function calls of one run being served at once; beyond it the host stops reading until one is done.
_MAX_PENDING_CALLS = 1024
# A worker that dies (other than by the host's own kill) with a peak RSS at least this share of its memory
# limit is reported as out of memory.
_MEMORY_DEATH_SHARE = 0.75
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


_Died = Died


def policy_to_plain(policy: Policy) -> dict[str, Any]:
    """A policy's fields as plain data, to send to a worker."""
    fields = {}
    for field in dataclasses.fields(policy):
        value = getattr(policy, field.name)
        fields[field.name] = sorted(value) if isinstance(value, frozenset) else value
    return to_plain(fields)  # type: ignore[no-any-return]


# Settings converted per pair rather than per worker: every worker of a pool is usually set up for the same pair, and
# the conversion (a field walk and a deep copy of each) cost the host more CPU per worker than sending them.
_PLAIN_SETTINGS_KEPT = 32


@functools.lru_cache(maxsize=_PLAIN_SETTINGS_KEPT)
def plain_settings(policy: Policy, limits: Limits) -> tuple[dict[str, Any], dict[str, Any]]:
    """``policy`` and ``limits`` as plain data for a worker's ``init``, converted once per pair.

    The dictionaries are shared by every caller with an equal pair: they are only encoded, never changed.
    """
    return policy_to_plain(policy), to_plain(dataclasses.asdict(limits))


class WorkerProcess(ChannelIO):
    """One worker process and the channel to it. Use `start`, then `init`, then requests.

    Args:
        scratch_root: Where its scratch directory is made.
        command: The interpreter and module to spawn (`python_command` of the worker by default).
        zygote: Fork it from this zygote instead of spawning it.
        hash_seed: The ``PYTHONHASHSEED`` a spawned worker starts with (random by default); a forked one has its
            zygote's.
    """

    def __init__(
        self,
        scratch_root: str,
        *,
        command: Sequence[str] | None = None,
        zygote: Zygote | None = None,
        hash_seed: int | None = None,
    ) -> None:
        # The interpreter and module to start; the socket's descriptor and the host's pid are appended.
        self._command = list(command) if command is not None else python_command("snapcell.worker._worker")
        # The seed its interpreter hashes strings with (as the host set it: a command given may ignore it).
        self.hash_seed = zygote.hash_seed if zygote is not None else new_hash_seed() if hash_seed is None else hash_seed
        self._scratch_root = scratch_root
        self.scratch_dir = ""
        # Forked by this zygote instead of spawned (then `process` stays None and `forked` names the child).
        self.zygote = zygote
        self.forked: ForkedChild | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.sandbox: dict[str, str] = {}
        self.checkouts = 0
        # Requests sent so far (a run's CPU reading may serve as the next one's start when none came between).
        self.requests = 0
        # The (policy, limits) this worker was set up for ahead of a checkout (see `WorkerPool`), if any.
        self.settled: tuple[Policy, Limits] | None = None
        super().__init__()
        self._stderr: StderrTail | None = None
        self.dead = False
        # Largest blob accepted in a frame; none until `init` says how much memory the worker may use.
        self.max_blob_bytes = 0
        # The session's limits (from `init`): they size the budget of every reply.
        self.limits = Limits()
        # The limits of the last run request sent (None: none yet): the worker runs under them until one names others.
        self.run_limits: Limits | None = None
        # The budgets of the last run request's frames, and its limits (see `_run_budgets`).
        self._budgets: tuple[Limits, Budget, Budget] | None = None
        self._inherited_rss = 0
        # Its CPU time and peak memory, read by the host from /proc once it has started.
        self.stat: ProcStat | None = None
        # What is left of a `kill` with ``reap_later``: waiting for the worker's exit.
        self.reaping: asyncio.Future[None] | None = None

    def gone(self) -> bool:
        """See `ChannelIO.gone`; also true once the zygote has reported the worker's exit."""
        return (self.forked is not None and self.forked.exited.done()) or super().gone()

    @property
    def start_path(self) -> str:
        """How this worker was started: ``"zygote"`` (forked from a clean zygote) or ``"spawn"``."""
        return "zygote" if self.forked is not None else "spawn"

    async def start(self) -> None:
        """Start the worker (forked from the zygote, or spawned) and wait until it has imported snapcell.

        Raises:
            ZygoteError: The zygote could not fork a worker (the caller may spawn one instead).
            SessionError: A spawned worker could not start.
        """
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stderr = stderr = StderrTail()
        stderr.watch()
        if self.zygote is not None:
            try:
                self.forked = await self.zygote.fork(child, stderr.write_fd)
            except BaseException:
                parent.close()
                raise
            finally:
                child.close()
                stderr.close_write_end()
            self.pid = self.forked.pid
            self._inherited_rss = self.forked.inherited_rss
            await self._wait_started(parent)
            return
        try:
            self.process = subprocess.Popen(
                [*self._command, str(child.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr.write_fd,
                pass_fds=(child.fileno(),),
                close_fds=True,
                env=child_env(_ENV, self.hash_seed),
                cwd=self._scratch_root,
                start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            raise SessionError(f"could not start a worker process: {exc}") from exc
        finally:
            child.close()
            stderr.close_write_end()
        self.pid = self.process.pid  # the launcher's, until the worker names its own (`_wait_started`)
        # A child's peak RSS (from wait4) starts at the host's own, inherited across fork and exec: only a peak
        # above this is the worker's own doing.
        self._inherited_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        await self._wait_started(parent)

    async def _wait_started(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        async with _deadline(_STARTUP_TIMEOUT_S, self):
            message, _, _ = await self._receive(reply_budget("start", self.limits))
        pid = message.get("pid")
        if message.get("op") != "started" or not self._is_the_worker(pid):
            await self.kill()
            raise SessionError(f"a worker process sent {str(message)[:80]!r} instead of starting")
        self.pid = pid
        if self.pid is not None:
            self.stat = ProcStat(self.pid)

    def _is_the_worker(self, pid: Any) -> bool:
        """Whether ``pid`` (from a ``started`` message) names this worker, as the host sees it.

        A forked worker is the process the zygote reported; a spawned one is the process the host started, or (with a
        launcher, the usual case) that process's child: the only other child a launcher has is its namespace's init,
        which sends nothing.
        """
        if type(pid) is not int or pid <= 0:
            return False
        if self.forked is not None:
            return pid == self.forked.pid
        if self.process is None:
            return False
        return pid == self.process.pid or parent_of(pid) == self.process.pid

    async def init(
        self, *, policy: Policy, limits: Limits, mounts: Mapping[str, str] | None = None, pretouch: bool = False
    ) -> None:
        """Give the worker its session settings; it applies its sandbox and reports the layers.

        ``mounts`` (name to a checked host directory) appear read-only in the worker's workspace. ``pretouch``: the
        worker walks a throwaway turn while no request comes (see `snapcell.worker._pretouch`).
        """
        self.scratch_dir = tempfile.mkdtemp(prefix="session-", dir=self._scratch_root)
        if self.pid is not None:
            LIVE_WORKER_PIDS.add(self.pid)  # its scratch mount is not stale while it sets up (see the sweep)
        sandbox_settings = worker_sandbox_settings(self.pid or 0, self._scratch_root)
        memory = limits.memory_bytes
        self.max_blob_bytes = _MAX_BLOB_BYTES_UNLIMITED if memory is None else 2 * memory
        self._budgets = None
        self.limits = limits
        plain_policy, plain_limits = plain_settings(policy, limits)
        await self._send(
            {
                "op": "init",
                "policy": plain_policy,
                "limits": plain_limits,
                "scratch_dir": self.scratch_dir,
                "mounts": dict(mounts or {}),
                "pretouch": pretouch,
                **sandbox_settings,
            }
        )
        try:
            async with _deadline(_STARTUP_TIMEOUT_S, self):
                message, _, _ = await self._receive(reply_budget("init", limits))
        except _Died as exc:
            tail = self._stderr_tail(1500).strip()
            detail = f":\n{tail}" if tail else ""
            raise SessionError(f"a worker process failed to start ({exc.reason}){detail}") from exc
        if message.get("op") == "sandbox_failed":
            await self.kill()
            raise sandbox_failure(message)
        sandbox = message.get("sandbox")
        if message.get("op") != "ready" or type(sandbox) is not dict:
            await self.kill()
            raise SessionError(f"a worker process failed to start: {str(message)[:500]}")
        self.sandbox = {str(k)[:100]: str(v)[:1000] for k, v in sandbox.items()}

    async def _send(self, message: dict[str, Any], *parts: bytes | bytearray | memoryview) -> None:
        sock = self._sock
        if sock is None or self.dead:
            raise _Died("crash", "the worker is not running")
        payload = encode(message)
        frame = FRAME.pack(len(payload), sum(map(len, parts)) if parts else 0) + payload
        try:
            if not parts and not self._send_lock.locked():
                with self._wire:
                    if not self._owed:
                        # Nobody is mid-frame: a frame the socket takes whole needs no lock, as nothing can come
                        # between; its rest is owed, and sent next under the lock.
                        sent = send_now(sock, frame)
                        if sent == len(frame):
                            return
                        self._owed, frame = frame[sent:], b""
            await self._lock_for_send()  # frames from concurrent host-call results must not interleave
            try:
                await self._pay_owed(sock)
                if frame:
                    await self._sendall(sock, frame)
                for part in parts:
                    if part:
                        await self._sendall(sock, part)
            finally:
                self._send_lock.release()
        except (ConnectionError, OSError) as exc:
            raise _Died(await self._death_reason(), str(exc)) from exc

    async def _pay_owed(self, sock: socket.socket) -> None:
        """Send the rest of a frame begun without the send lock, if any (the caller holds the send lock)."""
        with self._wire:
            owed, self._owed = self._owed, b""
        if owed:
            await self._sendall(sock, owed)

    def _answer(self, served: _Served, threaded: ThreadedCall, value: Any, failure: Exception | None) -> None:
        """Settle a sync host function's call and send its result, in the function's thread once it is done.

        The result goes from this thread when no other frame is under way (see `ChannelIO`), and is dropped if the
        request has ended meanwhile (its run was cancelled, or the worker died). Otherwise, or when the function
        returned an awaitable, or the socket took only part of the frame, the event loop finishes (`_answered`).
        """
        settled, records = answer_threaded(threaded, value, failure)
        outcome: dict[str, Any] | PendingCall | None = settled
        frame = b""
        if isinstance(outcome, dict):
            payload = encode(outcome)
            frame = FRAME.pack(len(payload), 0) + payload
        with self._wire:
            if not served.open:
                return
            served.threaded -= 1
            if served.calls is not None:
                served.calls.extend(records)
            sock = self._sock
            if frame and sock is not None and not self.dead and not self._send_lock.locked() and not self._owed:
                try:
                    sent = send_now(sock, frame)
                except OSError:  # the request's next read says what happened
                    sent = len(frame)
                if sent < len(frame):
                    self._owed = frame[sent:]
                outcome = None if sent == len(frame) else outcome
                frame = b""
            if outcome is None and not served.waits_for_room:
                return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the answer any more
            served.loop.call_soon_threadsafe(self._answered, served, outcome, bool(frame))

    def _answered(self, served: _Served, outcome: dict[str, Any] | PendingCall | None, unsent: bool) -> None:
        """In the event loop: finish what a sync host function's thread left (see `_answer`)."""
        served.wake()
        if not served.open or outcome is None:
            return
        if isinstance(outcome, PendingCall):  # a sync function that returned an awaitable: awaited like an async one
            served.track(asyncio.ensure_future(self._finish_call(outcome, served.calls)))
        elif unsent:
            served.track(asyncio.ensure_future(self._send_quietly(outcome)))
        else:  # the socket took part of the frame: the rest is owed
            served.track(asyncio.ensure_future(self._send_quietly(None)))

    async def _send_quietly(self, message: dict[str, Any] | None) -> None:
        """Send ``message`` (None: only what is owed); a failure is left for the request's next read to report."""
        sock = self._sock
        try:
            if message is not None:
                await self._send(message)
            elif sock is not None:
                await self._lock_for_send()
                try:
                    await self._pay_owed(sock)
                finally:
                    self._send_lock.release()
        except (_Died, OSError):
            pass

    async def _receive(self, budget: Budget) -> tuple[dict[str, Any], bytearray, int]:
        """Read one frame within ``budget``: its message, its blob, and the message's length.

        Raises:
            _Died: The worker is gone, or sent a frame over budget or malformed (it is killed then).
        """
        try:
            size, blob_size = FRAME.unpack(await self._read_exactly(FRAME.size))
            # Checked before anything is allocated: a worker that claims more is not following the protocol.
            if size > budget.message_bytes:
                raise _Died("crash", f"it sent a {size:,}-byte message where at most {budget.message_bytes:,} fit")
            if blob_size > budget.blob_bytes:
                raise _Died("crash", f"it announced a {blob_size:,}-byte blob where at most {budget.blob_bytes:,} fit")
            raw = await self._read_exactly(size)
            # A large message (a big run value), or one whose value first imports numpy or pandas, is decoded off
            # the event loop, which other sessions share.
            if size < _DECODE_INLINE_BYTES and not imports_library(raw):
                message = decode(raw, max_items=budget.items)
            else:
                message = await self._patiently(
                    asyncio.ensure_future(asyncio.to_thread(decode, raw, max_items=budget.items))
                )
            del raw
            blob = await self._read_exactly(blob_size) if blob_size else bytearray()
        except (ConnectionError, OSError) as exc:
            raise _Died(await self._death_reason(), str(exc)) from exc
        except _Died:
            await self.kill()
            raise
        except Exception as exc:  # a malformed frame from a compromised worker
            await self.kill()
            raise _Died("crash", f"it sent malformed data: {str(exc)[:200]}") from exc
        return message, blob, size

    async def request(
        self,
        message: dict[str, Any],
        parts: Sequence[bytes | bytearray | memoryview] = (),
        *,
        timeout_s: float | None = _REQUEST_TIMEOUT_S,
        lookup: Mapping[str, Callable[..., Any]] | None = None,
        calls: list[HostCall] | None = None,
        limits: Limits | None = None,
        cancel_grace_s: float | None = None,
        follow_on: bool = False,
    ) -> tuple[dict[str, Any], bytearray]:
        """Send a request and wait for its reply, serving host-function calls meanwhile.

        The reply must fit the request's budget (`reply_budget`); a run's host-function calls must fit
        the call budget and ``max_host_calls``, counted here whatever the worker counts.

        Args:
            message: The request.
            parts: Bytes sent after it as the frame's blob.
            timeout_s: Deadline for sending the request and receiving its reply; None waits for ever.
            lookup: Host functions a run may call.
            calls: Where the host-function calls served are recorded.
            limits: The limits the request runs under (a run's own); the session's by default.
            cancel_grace_s: For a run: the first cancellation of the calling task stops the script instead, and the
                reply is awaited for at most this long after it (see `_hostchannel`); `caller_cancelled` says so.
            follow_on: ``message`` went as the ``then`` of the request before it, which the worker serves right
                after that one succeeded: nothing is sent, and its reply may have arrived already.

        Raises:
            _Died: The worker died, overran ``timeout_s`` or broke the protocol (it is killed then).
        """
        op = message.get("op")
        self.requests += 1
        limits = self.limits if limits is None else limits
        counter = CallCounter(limits.max_host_calls) if op == "run" else None
        calls_budget: Budget | None = None
        if counter is not None:
            budget, calls_budget = self._run_budgets(limits)
        else:
            budget = reply_budget(str(op), limits, self.max_blob_bytes)
        if self._rend != self._rstart and not follow_on:
            await self._refuse("it sent a frame that no request asked for")
        served = _Served(calls, self._wire)
        answer = functools.partial(self._answer, served)
        traced: dict[str, Callable[..., Any] | None] = {}
        # The deadline is entered here rather than through `_deadline` (a generator): this runs for every request.
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                self.serve_run(deadline, cancel_grace_s)
                try:
                    if not follow_on:
                        await self._send(message, *parts)
                    while True:
                        while served.pending() >= _MAX_PENDING_CALLS:
                            try:
                                await served.room(_MAX_PENDING_CALLS)
                            except asyncio.CancelledError:
                                if not self.absorb_cancel():
                                    raise
                        reply, reply_blob, size = await self._receive(budget)
                        if reply.get("op") == "call":
                            refused = _refused_call(reply, size, calls_budget, counter)
                            if refused is not None:
                                await self._refuse(refused)
                            outcome = call_host(reply, lookup or {}, calls, traced, answer)
                            if isinstance(outcome, ThreadedCall):  # a sync function: `_answer` sends its result
                                with self._wire:
                                    served.threaded += 1
                            elif isinstance(outcome, PendingCall):  # an async one: awaited alongside the others
                                served.track(asyncio.ensure_future(self._finish_call(outcome, calls)))
                            else:  # answered already (a failure before any call): no task, no loop turn
                                try:
                                    await self._send(outcome)
                                except _Died:  # the reply, or the next frame read, says what happened
                                    pass
                            continue
                        return reply, reply_blob
                finally:
                    self.run_served()
        except TimeoutError:
            await self.kill()
            raise _Died("timeout") from None
        finally:
            served.close()

    def _run_budgets(self, limits: Limits) -> tuple[Budget, Budget]:
        """A run's budgets under ``limits``: of its frames (its reply or a call), and of a call; the last run's
        again for the same limits (the cached budgets hash every field of both `Limits` and `Budget`)."""
        cached = self._budgets
        if cached is None or cached[0] is not limits:
            calls_budget = reply_budget("call", limits)
            budget = either_budget(reply_budget("run", limits, self.max_blob_bytes), calls_budget)
            cached = self._budgets = (limits, budget, calls_budget)
        return cached[1], cached[2]

    async def _refuse(self, reason: str) -> None:
        """Kill a worker that broke the protocol.

        Raises:
            _Died: Always.
        """
        await self.kill()
        raise _Died("crash", reason)

    async def _finish_call(self, pending: PendingCall, calls: list[HostCall] | None) -> None:
        reply = await finish_call(pending, calls)
        try:
            await self._send(reply)
        except _Died:  # the request's next read says what happened
            pass

    async def _death_reason(self) -> str:
        """Why the worker died, from what the host saw: its exit status and its peak memory (never its stderr)."""
        if self.process is None and self.forked is None:
            return "crash"
        try:
            code, peak_bytes = await asyncio.wait_for(self._wait_exit(), _EXIT_WAIT_S)
        except TimeoutError:  # it closed its channel but lives on: not a worker any more
            await self.kill()
            return "crash"
        self.dead = True
        tail = self._stderr_tail()
        if tail:
            log.debug("snapcell: worker %s exited with %s; its stderr ends with:\n%s", self.pid, code, tail)
        memory = self.limits.memory_bytes
        if (
            code != 0
            and memory is not None
            and peak_bytes is not None
            and peak_bytes > self._inherited_rss
            and peak_bytes >= _MEMORY_DEATH_SHARE * memory
        ):
            return "memory"
        if code < 0 and -code in (signal.SIGKILL, signal.SIGTERM):
            return "signal"
        if code < 0 and -code == signal.SIGXCPU:
            return "timeout"
        return "crash"

    async def _wait_exit(self) -> tuple[int, int | None]:
        """Wait for the worker to exit: its exit code (negative for a signal) and peak RSS in bytes, if known."""
        if self.forked is not None:
            # Reaped by the zygote, its parent, which reports what wait4 said.
            status, peak = await asyncio.shield(self.forked.exited)
            return os.waitstatus_to_exitcode(status), peak
        return await asyncio.to_thread(self._reap)

    def _reap(self) -> tuple[int, int | None]:
        """Wait for the worker to exit: its exit code (negative for a signal) and peak RSS in bytes, if known."""
        process = self.process
        if process is None:
            return 0, None
        if process.returncode is None:
            try:
                _, status, usage = os.wait4(process.pid, 0)
            except ChildProcessError:  # reaped meanwhile by `kill`
                return process.wait(), None
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_maxrss * 1024  # Linux reports kilobytes
        return process.returncode, None

    def _stderr_tail(self, limit: int = 4096) -> str:
        """The last ``limit`` bytes (at most 64 KiB) the worker wrote to stderr; nothing before them is kept."""
        return "" if self._stderr is None else self._stderr.tail(limit)

    async def kill(self, *, reap_later: bool = False) -> None:
        """Kill the worker and remove its scratch directory; safe to call twice.

        ``reap_later``: if its scratch is a tmpfs, detach it now (`detach_scratch`) and leave waiting for its exit
        to the task in `reaping`.
        """
        self.dead = True
        if self.forked is not None:
            self.forked.kill()
            if (
                reap_later
                and self.scratch_dir
                and await asyncio.shield(asyncio.to_thread(detach_scratch, self.scratch_dir))
            ):
                LIVE_WORKER_PIDS.discard(self.pid or 0)
                self.scratch_dir = ""
                self.reaping = asyncio.ensure_future(self.kill())
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.forked.exited), _KILL_WAIT_S)
            self.forked.close()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), _KILL_WAIT_S)
        if self._sock is not None:
            self._unwatch()
            with self._wire:  # no thread sends meanwhile (a descriptor closed under a send may be reused)
                self._sock.close()
                self._sock = None
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # a read in progress finds the channel closed, rather than waiting for ever
        if self.stat is not None:
            self.stat.close()
        if self._stderr is not None:
            self._stderr.close()  # what it kept stays readable (`_stderr_tail`)
        if self.scratch_dir:
            scratch, self.scratch_dir = self.scratch_dir, ""
            LIVE_WORKER_PIDS.discard(self.pid or 0)
            # Unmounting the scratch tmpfs and removing its directory take milliseconds that the event loop,
            # shared by every session, should not wait for.
            await asyncio.shield(asyncio.to_thread(remove_scratch, scratch))


class _Served:
    """One request's host calls in flight: tasks of async ones, a count of sync ones in threads."""

    __slots__ = ("_room", "_wire", "calls", "loop", "open", "tasks", "threaded", "waits_for_room")

    def __init__(self, calls: list[HostCall] | None, wire: threading.Lock) -> None:
        self.calls = calls
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        # Sync calls in threads, and `open`: changed under the channel's `_wire` (threads read them).
        self.threaded = 0
        self.open = True
        self.waits_for_room = False
        self._wire = wire
        self._room: asyncio.Future[None] | None = None

    def pending(self) -> int:
        return len(self.tasks) + self.threaded

    def track(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.wake()

    def wake(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def room(self, limit: int) -> None:
        """Wait until fewer than ``limit`` calls are in flight."""
        if self._room is None:
            self._room = self.loop.create_future()
        with self._wire:  # a thread that finishes a call from now on wakes this wait
            self.waits_for_room = True
            full = self.pending() >= limit
        try:
            if full:
                await self._room
        finally:
            self.waits_for_room = False

    def close(self) -> None:
        """The request has ended: stop waiting for its calls (a sync one's thread runs on; its result is dropped)."""
        with self._wire:
            self.open = False
        for task in self.tasks:
            task.cancel()


def _refused_call(message: dict[str, Any], size: int, budget: Budget | None, counter: CallCounter | None) -> str | None:
    """Check a host-function call frame and count it against ``max_host_calls``: why it is refused, if it is.

    A plain function, not a coroutine: it runs for every call, and refusing (killing the worker) is the caller's.
    ``budget`` and ``counter`` are None outside a run.
    """
    if budget is None or counter is None:
        return "it sent a host-function call outside a run"
    if size > budget.message_bytes:
        return f"it sent a {size:,}-byte host-function call where at most {budget.message_bytes:,} fit"
    if type(message.get("args", [])) is not list or type(message.get("kwargs", {})) is not dict:
        return "it sent a host-function call whose arguments are not a list and a dict"
    try:
        counter.admit(str(message.get("name"))[:100], available=True)
    except OutputLimitExceeded as exc:
        return f"it made more host-function calls than Limits.max_host_calls ({exc.value})"
    return None


@contextlib.asynccontextmanager
async def _deadline(timeout_s: float | None, worker: WorkerProcess) -> AsyncIterator[asyncio.Timeout]:
    """Kill ``worker`` and raise ``_Died("timeout")`` when the block overruns ``timeout_s`` (None: no deadline)."""
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            yield deadline
    except TimeoutError:
        await worker.kill()
        raise _Died("timeout") from None
