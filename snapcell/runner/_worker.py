"""The worker process: one session's runner behind a socket, started as ``python -I -m snapcell.runner._worker FD``.

It is spawned fresh (never forked from the host) with an empty environment, imports what it needs,
waits for its session's settings, applies the sandbox, and then serves requests one at a time.
It holds no signing key and no storage client: checkpoints leave it as unsigned bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import os
import queue
import shutil
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from snapcell.checkpoint import BlobRef
from snapcell.errors import (
    CheckpointError,
    ConfigError,
    OutputLimitExceeded,
    SandboxError,
    SnapcellError,
    TimeLimitExceeded,
)
from snapcell.runner._host import CallBudget
from snapcell.runner._interrupt import ScriptInterrupt, Watchdog, start_watchdog
from snapcell.runner._limits import Limits
from snapcell.runner._policy import Policy
from snapcell.runner._runner import Runner
from snapcell.runner._typecheck import declarations_from_namespace
from snapcell.runner._values import to_value
from snapcell.runner._wire import (
    FRAME,
    MAX_CHECKPOINT_REPLY_BYTES,
    MAX_DECLARATIONS_CHARS,
    MAX_DUMP_BLOBS,
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
    split_parts,
    to_plain,
    value_items,
)

__all__ = ["main"]

_WAIT_SLICE_S = 0.05


class Channel:
    """Frames over the socket to the host; sends may come from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

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
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise EOFError
            got += n
        return buf

    def receive(self) -> tuple[dict[str, Any], bytearray]:
        size, blob_size = FRAME.unpack(self._read_exactly(FRAME.size))
        if size > MAX_MESSAGE_BYTES:
            raise EOFError  # a broken host; nothing sensible to do but stop
        message = decode(self._read_exactly(size))
        return message, self._read_exactly(blob_size) if blob_size else bytearray()


class WorkerBridge:
    """Carries a run's host-function calls to the host and waits for their results."""

    def __init__(self, channel: Channel, host: dict[str, bool], loop: asyncio.AbstractEventLoop, limits: Limits):
        self._channel = channel
        self._host = host
        self._loop = loop
        self._budget = CallBudget(limits.max_host_calls)
        self._limits = limits
        self._next_id = 0
        self._lock = threading.Lock()
        self._waiting: dict[int, Callable[[dict[str, Any]], None]] = {}

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._budget.admit(name, available=name in self._host)
        items = value_items(self._limits)
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
        budget = reply_budget("call", self._limits)
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
        done = threading.Event()
        box: list[dict[str, Any]] = []

        def deliver(message: dict[str, Any]) -> None:
            box.append(message)
            done.set()

        call_id = self._request(name, args, kwargs, deliver)
        try:
            # Short waits keep the thread interruptible by the wall-time watchdog.
            while not done.wait(_WAIT_SLICE_S):
                pass
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)
        return _unpack_result(box[0])

    async def _call_async(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()

        def deliver(message: dict[str, Any]) -> None:
            self._loop.call_soon_threadsafe(_settle, future, message)

        call_id = self._request(name, args, kwargs, deliver)
        try:
            return _unpack_result(await future)
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a host result to the call waiting for it (called by the reader thread)."""
        with self._lock:
            deliver = self._waiting.get(message.get("id", -1))
        if deliver is not None:
            deliver(message)


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
        cls = _HOST_ERRORS.get(str(error.get("type")), RuntimeError)
        text = str(error.get("message", ""))
        raise cls(text if cls is not RuntimeError else f"{error.get('type')}: {text}")
    return message.get("value")


class Worker:
    """Serves one session's requests."""

    def __init__(self, channel: Channel, runner: Runner) -> None:
        self.channel = channel
        self.runner = runner
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.requests: queue.Queue[tuple[dict[str, Any], bytearray] | None] = queue.Queue()
        self.bridge: WorkerBridge | None = None

    def read_forever(self) -> None:
        """Reader thread: results of host calls go to the bridge, requests to the main thread."""
        try:
            while True:
                message, blob = self.channel.receive()
                if message.get("op") == "result":
                    if self.bridge is not None:
                        self.bridge.deliver(message)
                else:
                    self.requests.put((message, blob))
        except (EOFError, OSError, ValueError):
            pass
        # The host is gone or closed the channel: nothing of this session may outlive it.
        os._exit(0)

    def serve(self) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            message, blob = item
            op = message.get("op")
            try:
                reply, out = self.handle(op, message, blob)
                payload = reply if isinstance(reply, bytes) else encode(reply)
                if op in ("dump", "load") and len(payload) > MAX_CHECKPOINT_REPLY_BYTES:
                    raise CheckpointError(
                        f"the checkpoint's manifest is larger than the {MAX_CHECKPOINT_REPLY_BYTES:,} bytes a worker "
                        "may send; keep fewer cells or variables in the session"
                    )
            except SnapcellError as exc:
                payload, out = encode({"op": "error", "error": error_to_plain(exc)}), []
            self.channel.send_payload(payload, *out)
            if op == "close":
                return

    @contextlib.contextmanager
    def watched(self, step: str, limit_name: str, limit_s: float | None) -> Iterator[None]:
        """Stop a dump or load that overruns ``limit_s``: script code (``__reduce__``, ``__setstate__``) runs then.

        Raises:
            TimeLimitExceeded: The step was stopped (the host then replaces this worker).
        """
        watch = _StepWatchdog(limit_s, {"__builtins__": self.runner.builtins})
        try:
            try:
                yield
            finally:
                watch.stop()
        except ScriptInterrupt:
            pass
        except SnapcellError:
            if not watch.fired:
                raise
        if watch.fired:
            raise TimeLimitExceeded(
                f"the {step} was stopped after {limit_s:g} s (Limits.{limit_name})",
                limit=limit_name,
                value=limit_s,
                hint="A script object's __reduce__, __getstate__ or __setstate__ may loop.",
            )

    def handle(
        self, op: Any, message: dict[str, Any], blob: bytearray
    ) -> tuple[dict[str, Any] | bytes, list[bytes | bytearray]]:
        if op == "run":
            return self.run(message), []
        if op == "dump":
            known = [BlobRef.model_validate(ref) for ref in message.get("known_blobs", ())]
            with self.watched("dump", "dump_time_s", self.runner.limits.dump_time_s):
                dumped = self.runner.dump(
                    created_at=float(message["created_at"]),
                    level=int(message["level"]),
                    on_unpicklable="fail" if message.get("on_unpicklable") == "fail" else "skip",
                    known_blobs={ref.hash: ref for ref in known},
                )
            if len(dumped.new_blobs) > MAX_DUMP_BLOBS:
                raise CheckpointError(f"the checkpoint needs more than {MAX_DUMP_BLOBS} new blobs")
            # The body, then each new blob, sent back to back; the reply says where each part ends.
            out: list[bytes | bytearray] = [dumped.body, *dumped.new_blobs.values()]
            reply: dict[str, Any] = {
                "op": "dumped",
                "manifest": dumped.manifest.model_dump_json(),
                "new_blobs": list(dumped.new_blobs),
                "parts": [len(part) for part in out],
                "refresh": dumped.refresh,
            }
            return reply, out
        if op == "load":
            names = [str(n) for n in message.get("blobs", ())]
            try:
                views = split_parts(blob, message.get("parts", [len(blob)]))
            except ValueError as exc:
                raise ConfigError(f"malformed load request: {exc}") from None
            if len(views) != len(names) + 1:
                raise ConfigError("malformed load request: a part for each blob and the body")
            with self.watched("load", "load_time_s", self.runner.limits.load_time_s):
                manifest = self.runner.load(views[0], dict(zip(names, views[1:], strict=True)))
            return {"op": "loaded", "manifest": manifest.model_dump_json()}, []
        if op == "queue":
            self.runner.pending_notes.extend(str(n) for n in message.get("notes", ()))
            self.runner.pending_setup.extend(str(c) for c in message.get("setup_cells", ()))
            return {"op": "queued"}, []
        if op == "declarations":
            text = declarations_from_namespace(self.runner.variables())
            if len(text) > MAX_DECLARATIONS_CHARS:  # the host accepts no more; the stubs keep their first lines
                text = text[: text.rfind("\n", 0, MAX_DECLARATIONS_CHARS) + 1]
            return {"op": "declarations", "text": text}, []
        if op == "reset":
            self.runner = Runner(policy=self.runner.policy, limits=self.runner.limits)
            return {"op": "reset"}, []
        if op == "recycle":
            self.recycle()
            return {"op": "recycled"}, []
        if op == "close":
            return {"op": "closed"}, []
        raise ConfigError(f"unknown request {op!r}")

    def recycle(self) -> None:
        """Forget the session: a new namespace, an empty scratch directory, the default decimal context."""
        self.runner = Runner(policy=self.runner.policy, limits=self.runner.limits)
        decimal.setcontext(decimal.Context())
        for entry in os.scandir("."):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)

    def run(self, message: dict[str, Any]) -> bytes:
        """Run a cell; the encoded ``ran`` reply, kept within what the host accepts for the run's limits."""
        # Never str() what came instead of a script: the runner answers anything but text with a ScriptSyntaxError.
        code: Any = message.get("code")
        limits = Limits(**message["limits"])
        host = {str(k): bool(v) for k, v in message.get("host", {}).items()}
        self.bridge = WorkerBridge(self.channel, host, self.loop, limits)
        try:
            result = self.loop.run_until_complete(
                self.runner.run(
                    code,
                    bridge=self.bridge,
                    host_names=tuple(host),
                    setup=bool(message.get("setup")),
                    limits=limits,
                )
            )
        finally:
            self.bridge = None
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
        reply = {
            "op": "ran",
            "value": value,
            "value_repr": result.value_repr,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "duration_s": result.duration_s,
            "notes": notes[-MAX_NOTES:],
            "error": error_to_plain(result.error) if result.error is not None else None,
            "memory_bytes": _rss_bytes(),
            "namespace_summary": cut_text(result.namespace_summary, MAX_SUMMARY_CHARS),
        }
        payload = encode(reply)
        # A reply over the host's budget would cost this worker its life: the value (the only part without a cap
        # of its own) stays behind instead. Both checks are free for a reply smaller than the value limit.
        budget = reply_budget("run", limits)
        limit = limits.max_value_bytes
        if value is not None and limit is not None and len(payload) > limit:
            if len(encode({"v": value})) > limit or count_items(payload, budget.items) > budget.items:
                reply["value"] = None
                reply["notes"] = [*notes[-(MAX_NOTES - 1) :], too_large]
                payload = encode(reply)
        return payload


# Opened before the sandbox (which hides /proc) and kept: each pread gives the current numbers.
_statm_fd: int | None = None


def _rss_bytes() -> int | None:
    if _statm_fd is None:
        return None
    try:
        return int(os.pread(_statm_fd, 200, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def policy_from_plain(data: dict[str, Any]) -> Policy:
    """Rebuild the session's policy from the host's plain description."""
    fields: dict[str, Any] = {k: frozenset(v) if isinstance(v, list) else v for k, v in data.items()}
    return Policy(**fields)


def _read_paths(policy: Policy) -> list[str]:
    import sysconfig

    import snapcell

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.abspath(snapcell.__file__))}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            paths.add(path)
    paths.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
    return sorted(paths)


def _apply_sandbox(
    settings: dict[str, Any], limits: Limits, policy: Policy, keep_fds: tuple[int, ...], parent_pid: int | None
) -> dict[str, str]:
    from snapcell.runner._sandbox import apply_sandbox

    uid, gid = settings.get("uid"), settings.get("gid")
    report = apply_sandbox(
        limits=limits,
        scratch_dir=str(settings["scratch_dir"]),
        read_paths=_read_paths(policy),
        allow_fds=keep_fds,
        parent_pid=parent_pid,
        uid=uid if isinstance(uid, int) else None,
        gid=gid if isinstance(gid, int) else None,
        quota_scratch=bool(settings.get("quota_scratch")),
        require=[str(name) for name in settings.get("require", ())],
    )
    layers: dict[str, str] = report.to_dict()
    return layers


class _StepWatchdog(Watchdog):
    """The watchdog of a dump or load: the whole step runs on the script's behalf, so any frame may be interrupted."""

    def _script_on_stack(self) -> bool:
        return True


class _NoHost:
    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NameError(name)


def _warm_up() -> None:
    """Run a throwaway cell and dump, so a session's first run does not pay for lazy imports and caches.

    No wall-time limit: the watchdog thread must not start before the sandbox, which wants a single thread.
    """
    runner = Runner(policy=Policy(), limits=Limits(wall_time_s=None))
    asyncio.run(runner.run("x = [1]\nx", bridge=_NoHost(), host_names=()))
    runner.dump(created_at=0.0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process."""
    argv = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(argv[0]))
    sock.setblocking(True)
    channel = Channel(sock)
    _warm_up()
    channel.send({"op": "started", "pid": os.getpid()})
    try:
        settings, _ = channel.receive()
    except (EOFError, OSError, ValueError):
        return 0
    if settings.get("op") != "init":
        return 2
    policy = policy_from_plain(settings["policy"])
    limits = Limits(**settings["limits"])
    os.chdir(str(settings["scratch_dir"]))
    global _statm_fd
    try:
        _statm_fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        _statm_fd = None
    keep = (sock.fileno(),) if _statm_fd is None else (sock.fileno(), _statm_fd)
    parent_pid = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else None
    try:
        report = _apply_sandbox(settings, limits, policy, keep, parent_pid)
    except (SandboxError, ConfigError) as exc:
        # No script may run half-confined: say why, and stop.
        failure = {"layer": getattr(exc, "layer", None), "errno": getattr(exc, "errno", None)}
        channel.send({"op": "sandbox_failed", "message": str(exc), **failure})
        return 4
    runner = Runner(policy=policy, limits=limits)
    worker = Worker(channel, runner)
    start_watchdog()  # threads only now that the sandbox is in place; the first run does not wait for it
    threading.Thread(target=worker.read_forever, name="snapcell-reader", daemon=True).start()
    channel.send({"op": "ready", "sandbox": report})
    worker.serve()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except CheckpointError:
        code = 3
    sys.stdout.flush()
    os._exit(code)
