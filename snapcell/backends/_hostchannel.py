"""The host's end of a worker's channel: non-blocking reads and writes in the event loop, and a run's cancellation.

A request runs in its caller's own task, with no task of its own and no shield around it (each costs loop turns on
every request). A run must still outlive the cancellation of its caller long enough to stop the script and read its
reply, so that the channel is never left mid-frame: a run request names the task it serves (`serve_run`), and the
first cancellation of that task which reaches one of the channel's waits (for bytes to read, for room to write, for
the send lock, for a large frame's decoding, for host-call tasks) is absorbed there (`absorb_cancel`). The wait is
simply made again, so no byte is lost; the worker is asked to stop the script (SIGUSR1), the request's deadline is
brought forward to the run's grace period, and the request goes on to read the run's reply, with `caller_cancelled`
set for the caller to report. A second cancellation, or one of the request's own deadline, is not absorbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from typing import Any

__all__ = ["ChannelIO", "Died", "send_now"]

_READ_CHUNK = 256 * 1024
# A large frame's buffer starts this big and doubles as data arrives, so a claimed size costs nothing until it is
# sent: the host never holds more than twice what the worker actually sent.
_FIRST_BLOCK = 1024 * 1024


class Died(Exception):
    """The worker is gone, overran its deadline or broke the protocol; ``reason`` says which."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class ChannelIO:
    """Reads and writes on a worker's socket from the event loop; `WorkerProcess` builds the protocol on it."""

    pid: int | None
    dead: bool

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        # Received bytes not yet consumed live in _rbuf[_rstart:_rend].
        self._rbuf = bytearray(_READ_CHUNK)
        self._rview = memoryview(self._rbuf)
        self._rstart = self._rend = 0
        # The channel stays registered with the event loop while frames are being read (see `_wait_readable`).
        self._watching: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        # A small frame's wait: the loop's readiness callback itself reads into _rbuf (see `_fill`); what ended
        # the channel (its end, or an error), for the waiting reader to raise.
        self._filling = False
        self._ended: OSError | None = None
        self._send_lock = asyncio.Lock()
        # Frames are sent by the event loop's thread, and by a sync host function's thread for its result (see
        # `WorkerProcess._answer`). Every send on the socket, and its closing, happens under `_wire`; a frame is
        # begun only by a holder of `_send_lock`, or under `_wire` while nobody holds it and nothing is owed. The
        # rest of a frame begun without the send lock that the socket did not take is owed: the next holder of the
        # send lock sends it before anything else.
        self._wire = threading.Lock()
        self._owed = b""
        # The run request in flight: the task it serves, its deadline and its grace period (see `serve_run`).
        self._caller: asyncio.Task[Any] | None = None
        self._deadline: asyncio.Timeout | None = None
        self._grace_s = 0.0
        self.caller_cancelled = False

    # ------------------------------------------------------------------ cancellation

    def serve_run(self, deadline: asyncio.Timeout, grace_s: float | None) -> None:
        """Until `run_served`, absorb the first cancellation of the current task (see the module's docstring).

        ``grace_s`` None: nothing is absorbed (a request other than a run).
        """
        self.caller_cancelled = False
        if grace_s is not None:
            self._caller, self._deadline, self._grace_s = asyncio.current_task(), deadline, grace_s

    def run_served(self) -> None:
        """End what `serve_run` began (plain calls, not a context manager: this runs for every request)."""
        self._caller = self._deadline = None

    def absorb_cancel(self) -> bool:
        """Whether a cancellation that just reached a wait is the run's caller's, and is absorbed (see above)."""
        task = asyncio.current_task()
        deadline = self._deadline
        if task is None or task is not self._caller or self.caller_cancelled or deadline is None or deadline.expired():
            return False
        task.uncancel()
        self.caller_cancelled = True
        if self.pid is not None and not self.dead:
            with contextlib.suppress(OSError):  # it is mid-run, so alive: the pid is still its own
                os.kill(self.pid, signal.SIGUSR1)
        until = asyncio.get_running_loop().time() + self._grace_s
        when = deadline.when()
        deadline.reschedule(until if when is None else min(when, until))
        return True

    async def _lock_for_send(self) -> None:
        """Take the send lock (frames of concurrent host-call results must not interleave)."""
        while True:
            try:
                await self._send_lock.acquire()
                return
            except asyncio.CancelledError:
                if not self.absorb_cancel():
                    raise

    def gone(self) -> bool:
        """Whether an idle worker is no worker to hand out: its end of the channel is closed (it exited: killed
        for memory, by a signal) or bytes wait that no request asked for. No round trip and no wait: one peek."""
        sock = self._sock
        if sock is None or self.dead or self._ended is not None or self._rend != self._rstart:
            return True
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False  # open, and quiet: an idle worker
        except OSError:
            return True
        return True  # the end of the channel, or bytes nobody asked for

    # ------------------------------------------------------------------ writing

    async def _sendall(self, sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data``, waiting for room when the socket's buffer is full."""
        with self._wire:
            sent = send_now(sock, data)
        if sent == len(data):
            return
        with memoryview(data) as view:
            while sent < len(view):
                await self._wait_writable(sock)
                with self._wire:
                    sent += send_now(sock, view[sent:])

    async def _wait_writable(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_writer(fd, _settle, waiter)
        try:
            await self._absorbing(waiter)
        finally:
            loop.remove_writer(fd)

    async def _absorbing(self, waiter: asyncio.Future[None]) -> None:
        """Await ``waiter``; a cancellation of the run's caller that `absorb_cancel` takes ends the wait quietly."""
        try:
            await waiter
        except asyncio.CancelledError:
            if not self.absorb_cancel():
                raise

    # ------------------------------------------------------------------ reading

    async def _read_exactly(self, size: int) -> bytearray:
        sock = self._sock
        if sock is None:
            raise Died("crash", "the worker is not running")
        buffer, view = self._rbuf, self._rview
        if self._rend - self._rstart >= size:
            # Small frames usually arrive whole: one read serves the header and the message.
            out = buffer[self._rstart : self._rstart + size]
            self._rstart += size
            return out
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
                    n = await self._recv_into(sock, target)
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
            await self._fill(sock)
        out = buffer[:size]
        self._rstart = size
        return out

    async def _fill(self, sock: socket.socket) -> None:
        """Read more bytes into ``_rbuf``: at once if some have come, else by the loop's readiness callback.

        Bytes often wait already (a host call frame sent while the host was busy; always, on a loaded host): one
        read takes them, with no loop turn. Otherwise `_on_readable` reads them when the loop sees them and only
        then wakes this task: a readiness report that turns out stale (its bytes were read since the loop polled)
        costs that callback one failed read instead of a wake-up of this task for nothing.

        Raises:
            ConnectionResetError: The worker closed its channel, or the host did (`kill`).
            OSError: Reading failed.
        """
        n = _recv_now(sock, self._rview[self._rend :])
        if n is not None:
            if n == 0:
                raise ConnectionResetError("the worker closed its channel")
            self._rend += n
            return
        before = self._rend
        self._filling = True
        try:
            await self._wait_readable(sock)
        finally:
            self._filling = False
        if self._rend == before:
            ended, self._ended = self._ended, None
            if ended is not None:
                raise ended
            if self._sock is not sock:
                raise ConnectionResetError("the channel was closed")

    async def _recv_into(self, sock: socket.socket, target: memoryview) -> int:
        """Receive what has arrived into ``target``, waiting for the channel to become readable if nothing has."""
        while (n := _recv_now(sock, target)) is None:
            await self._wait_readable(sock)
        return n

    async def _wait_readable(self, sock: socket.socket) -> None:
        """Wait until the channel is readable (or a cancellation of the run's caller was absorbed: look again).

        The channel is registered with the loop once and stays so while someone waits each time it becomes
        readable (most of a request), rather than registered and removed around every wait as
        ``loop.sock_recv_into`` does: two ``epoll_ctl`` calls and a handle fewer per frame.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        if self._watching is not loop:
            self._unwatch()
            loop.add_reader(sock.fileno(), self._on_readable)
            self._watching = loop
        try:
            await self._absorbing(waiter)
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def _on_readable(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            if self._filling and not waiter.done() and self._sock is not None:
                try:
                    n = _recv_now(self._sock, self._rview[self._rend :])
                except OSError as exc:
                    self._ended, n = exc, 0
                else:
                    if n is None:  # a stale report: the reader keeps waiting
                        self._waiter = waiter
                        return
                    if n == 0:
                        self._ended = ConnectionResetError("the worker closed its channel")
                self._rend += n
            if not waiter.done():
                waiter.set_result(None)
            return
        # Nobody waits. Usually the report is stale (the woken reader took the bytes since the loop polled); if
        # bytes (or the end of the channel) are really there, stop watching, or the loop calls again every turn.
        sock = self._sock
        if sock is not None:
            try:
                sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                pass
        self._unwatch()

    def _unwatch(self) -> None:
        loop, self._watching = self._watching, None
        if loop is not None and self._sock is not None:
            loop.remove_reader(self._sock.fileno())

    async def _patiently(self, future: asyncio.Future[Any]) -> Any:
        """Await ``future`` (work that goes on whatever happens to its awaiter), absorbing the caller's cancel."""
        while True:
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.cancelled() or not self.absorb_cancel():
                    raise


def send_now(sock: socket.socket, data: bytes | bytearray | memoryview) -> int:
    """Send what the socket takes of ``data`` now, without waiting: how many bytes (0 when its buffer is full)."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0


def _recv_now(sock: socket.socket, target: memoryview) -> int | None:
    """Receive what has arrived into ``target`` without waiting: how many bytes (0 at the end), None when none yet.

    Raises:
        OSError: Reading failed.
    """
    try:
        return sock.recv_into(target)
    except (BlockingIOError, InterruptedError):
        return None


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
