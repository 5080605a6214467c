"""The worker's end of the channel to the host: frames, a run's host-function calls, and a run's reply.

Frames are read by whichever thread needs one (the main thread between requests and in a run's event loop, the
thread of a sync host call waiting for its result), one at a time; no reader thread hands them over.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from snapcell.errors import OutputLimitExceeded, WorkspaceError
from snapcell.interpreter import PAUSE_ERROR, CallCounter, RunResult, ScriptPaused
from snapcell.limits import Limits
from snapcell.wire import (
    FRAME,
    MAX_ASSIGNED,
    MAX_ASSIGNED_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_SUMMARY_CHARS,
    NotPlainData,
    count_items,
    cut_text,
    decode,
    encode,
    error_to_plain,
    reply_budget,
    to_plain,
    to_value,
    value_items,
)

if TYPE_CHECKING:
    import _socket  # a zygote's child gets the C type, `_socket.socket`: it does not import the socket module
    import asyncio  # a run imports it when it needs the event loop (`_worker.Worker.loop`)

    from snapcell.workspace import Workspace

__all__ = ["Channel", "WorkerBridge", "ran_reply"]

_READ_CHUNK = 64 * 1024

_WAIT_SLICE_S = 0.05


class Channel:
    """Frames over the socket to the host; sends may come from any thread."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        # Frames are read by whichever thread needs one (the main thread between requests and in a run's
        # event loop, a thread waiting for a host-function result); one at a time.
        self.receive_lock = threading.Lock()
        # Bytes a read brought beyond the frame it was for (the start of the next ones).
        self._buffered = bytearray()

    def send(self, message: dict[str, Any], *parts: bytes | bytearray | memoryview) -> None:
        self.send_payload(encode(message), *parts)

    def send_payload(self, payload: bytes, *parts: bytes | bytearray | memoryview) -> None:
        """Send a message already encoded (to check its size first), then its parts."""
        with self._send_lock:
            self._sock.sendall(FRAME.pack(len(payload), sum(len(p) for p in parts)) + payload)
            for part in parts:
                if part:
                    self._sock.sendall(part)

    def _read_exactly(self, size: int) -> bytearray:
        """The next ``size`` bytes: from what a read brought beyond the last frame, then from the socket.

        Small frames come with one ``recv`` for header and body (and whatever follows them); a large one is read
        straight into its own buffer.
        """
        buffered = self._buffered
        if len(buffered) < size:
            if size - len(buffered) > _READ_CHUNK:
                out = bytearray(size)
                got = len(buffered)
                out[:got] = buffered
                buffered.clear()
                view = memoryview(out)
                while got < size:
                    n = self._sock.recv_into(view[got:])
                    if n == 0:
                        raise EOFError
                    got += n
                return out
            while len(buffered) < size:
                chunk = self._sock.recv(_READ_CHUNK)
                if not chunk:
                    raise EOFError
                buffered += chunk
        out = buffered[:size]
        del buffered[:size]
        return out

    def has_frame(self) -> bool:
        """Whether a whole frame has been read already (and the socket may say nothing more is coming)."""
        buffered = self._buffered
        if len(buffered) < FRAME.size:
            return False
        size, blob_size = FRAME.unpack_from(buffered)
        whole: int = FRAME.size + size + blob_size
        return len(buffered) >= whole

    def fileno(self) -> int:
        """The socket's descriptor."""
        return self._sock.fileno()

    def readable(self, timeout_s: float) -> bool:
        """Whether a frame has started to arrive within ``timeout_s``."""
        return bool(self._buffered) or bool(select.select([self._sock], [], [], timeout_s)[0])

    def receive(self) -> tuple[dict[str, Any], bytearray]:
        """Read one frame (the host sends each frame whole, so a frame that has started arrives promptly)."""
        size, blob_size = FRAME.unpack(self._read_exactly(FRAME.size))
        if size > MAX_MESSAGE_BYTES:
            raise EOFError  # a broken host; nothing sensible to do but stop
        message = decode(self._read_exactly(size))
        return message, self._read_exactly(blob_size) if blob_size else bytearray()


class WorkerBridge:
    """Carries a run's host-function calls to the host and waits for their results."""

    def __init__(self, channel: Channel, host: dict[str, bool], loop: asyncio.AbstractEventLoop | None, limits: Limits):
        self._channel = channel
        self._host = host
        self._loop = loop
        self._counter = CallCounter(limits.max_host_calls)
        self._limits = limits
        # The run's limits do not change while it runs: what they allow a call is worked out once.
        self._items = value_items(limits)
        self._call_budget = reply_budget("call", limits)
        self._next_id = 0
        self._lock = threading.Lock()
        self._waiting: dict[int, Callable[[dict[str, Any]], None]] = {}

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._counter.admit(name, available=name in self._host)
        items = self._items
        try:
            plain_args, plain_kwargs = to_plain(list(args), max_items=items), to_plain(kwargs, max_items=items)
        except NotPlainData as exc:
            raise TypeError(f"arguments of host function {name}() must be plain data: {exc}") from None
        if self._host[name]:
            return self._call_async(name, plain_args, plain_kwargs)
        return self._call_sync(name, plain_args, plain_kwargs)

    def _request(self, name: str, args: list[Any], kwargs: dict[str, Any], deliver: Callable[..., None]) -> int:
        with self._lock:
            self._next_id += 1
            call_id = self._next_id
        payload = encode({"op": "call", "id": call_id, "name": name, "args": args, "kwargs": kwargs})
        # The host refuses (and kills the worker for) a call frame over its budget: refuse it here first.
        limit = self._limits.max_value_bytes
        budget = self._call_budget
        if (limit is not None and len(payload) > limit) or count_items(payload, budget.items) > budget.items:
            raise OutputLimitExceeded(
                f"the arguments of host function {name}() are larger than Limits.max_value_bytes ({limit:,} bytes)",
                limit="max_value_bytes",
                value=limit,
                hint="Pass a smaller piece, or let the host function fetch the data itself.",
            )
        with self._lock:
            self._waiting[call_id] = deliver
        self._channel.send_payload(payload)
        return call_id

    def _call_sync(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        # Whichever thread reads the result puts it here (a list's append is atomic); the waiting thread looks
        # after each of its reads, so nothing needs waking.
        box: list[dict[str, Any]] = []
        call_id = self._request(name, args, kwargs, box.append)
        try:
            # The waiting thread reads the result itself (no reader thread to hand it over); short waits keep
            # it interruptible by the wall-time watchdog.
            while not box:
                self.read_one(_WAIT_SLICE_S)
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)
        return _unpack_result(box[0])

    async def _call_async(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        import asyncio

        loop = self._loop
        assert loop is not None, "a run with async host functions has the event loop"
        future: asyncio.Future[dict[str, Any]] = loop.create_future()

        def deliver(message: dict[str, Any]) -> None:
            if asyncio.events._get_running_loop() is loop:  # read in the loop's own thread: no wake-up needed
                loop.call_soon(_settle, future, message)
            else:  # a sync host call made from a thread of the script read it
                loop.call_soon_threadsafe(_settle, future, message)

        call_id = self._request(name, args, kwargs, deliver)
        try:
            return _unpack_result(await future)
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a host result to the call waiting for it."""
        with self._lock:
            deliver = self._waiting.get(message.get("id", -1))
        if deliver is not None:
            deliver(message)

    def read_one(self, timeout_s: float) -> None:
        """Read and deliver one host result if one arrives within ``timeout_s`` (any thread; one at a time).

        A closed channel means the host is gone: the worker exits at once, as nothing of its session may
        outlive the host.
        """
        if not self._channel.receive_lock.acquire(timeout=timeout_s):
            return
        try:
            if not self._channel.readable(timeout_s):
                return
            messages = [self._channel.receive()[0]]
            # Frames a read brought along are taken now: the loop calls this only when the socket is readable.
            while self._channel.has_frame():
                messages.append(self._channel.receive()[0])
        except (EOFError, OSError, ValueError):
            os._exit(0)
        finally:
            self._channel.receive_lock.release()
        for message in messages:
            if message.get("op") == "result":
                self.deliver(message)


def _settle(future: asyncio.Future[dict[str, Any]], message: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(message)


_HOST_ERRORS: dict[str, type[Exception]] = {
    name: cls
    for name, cls in vars(__import__("builtins")).items()
    if isinstance(cls, type) and issubclass(cls, Exception) and not name.startswith("_")
}


def _unpack_result(message: dict[str, Any]) -> Any:
    if "error" in message:
        error = message["error"]
        if error.get("type") == PAUSE_ERROR:
            raise ScriptPaused(str(error.get("message", "")))  # the host pauses the run at this call
        cls = _HOST_ERRORS.get(str(error.get("type")), RuntimeError)
        text = str(error.get("message", ""))
        raise cls(text if cls is not RuntimeError else f"{error.get('type')}: {text}")
    return message.get("value")


def ran_reply(
    result: RunResult, limits: Limits, *, memory_bytes: int | None, workspace: Workspace | None
) -> tuple[bytes, list[bytes | bytearray]]:
    """The encoded ``ran`` reply to a run and the bytes of its artifacts (the files it wrote under ``out/``).

    The value crosses as plain data (`to_value`); one over ``limits.max_value_bytes``, or that would take the reply
    over the host's budget (which would cost this worker its life), stays behind with a note instead. An empty field
    is left out: the host reads each with its default.
    """
    notes = [cut_text(str(n), MAX_NOTE_CHARS) for n in result.notes]
    too_large = (
        f"the value is larger than Limits.max_value_bytes ({limits.max_value_bytes or 0:,} bytes), so only its "
        "repr came back; return a smaller piece of it"
    )
    try:
        value = to_value(
            result.value,
            max_items=value_items(limits),
            max_bytes=limits.max_value_bytes,
            top_repr=result.value_repr,
        )
    except OverflowError:
        value = None
        notes.append(too_large)
    reply: dict[str, Any] = {"op": "ran", "value": value, "duration_s": result.duration_s, "memory_bytes": memory_bytes}
    if result.value_repr is not None:  # even "" (a value whose repr is empty)
        reply["value_repr"] = result.value_repr
    # Less to encode here and decode there: a 1+1 reply has five fields.
    for key, item in (
        ("stdout", result.stdout),
        ("stderr", result.stderr),
        ("notes", notes[-MAX_NOTES:]),
        ("error", error_to_plain(result.error) if result.error is not None else None),
        ("namespace_summary", cut_text(result.namespace_summary, MAX_SUMMARY_CHARS)),
        ("assigned", [name[:MAX_ASSIGNED_CHARS] for name in result.assigned[:MAX_ASSIGNED]]),
        ("inputs", result.inputs),
    ):
        if item:
            reply[key] = item
    parts: list[bytes | bytearray] = []
    if workspace is not None:
        with contextlib.suppress(WorkspaceError):  # artifacts are a courtesy: never a reason to fail a run
            files, parts = workspace.artifacts(max_bytes=limits.max_artifact_bytes)
            if files:
                reply["files"] = files
    payload = encode(reply)
    # Both checks are free for a reply smaller than the value limit.
    budget = reply_budget("run", limits)
    limit = limits.max_value_bytes
    if value is not None and limit is not None and len(payload) > limit:
        if len(encode({"v": value})) > limit or count_items(payload, budget.items) > budget.items:
            reply["value"] = None
            reply["notes"] = [*notes[-(MAX_NOTES - 1) :], too_large]
            payload = encode(reply)
    return payload, parts
