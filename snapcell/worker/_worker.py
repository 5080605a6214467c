"""The worker process: one session's runner behind a socket, started as ``python -s -P -m snapcell.worker._worker FD``.

It is spawned fresh (never forked from the host) with none of the host's environment, imports what it needs,
waits for its session's settings, applies the sandbox, and then serves requests one at a time.
It holds no signing key and no storage client: checkpoints leave it as unsigned bytes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import sys
from collections.abc import Coroutine, Generator, Iterator
from typing import TYPE_CHECKING, Any

from snapcell.errors import (
    CheckpointError,
    ConfigError,
    SandboxError,
    SnapcellError,
    TimeLimitExceeded,
    WorkspaceError,
)
from snapcell.interpreter import Runner, RunResult, Watchdog, start_watchdog
from snapcell.limits import Limits
from snapcell.policy import Policy, ScriptInterrupt
from snapcell.sandbox import host_view_pid, launch_worker
from snapcell.wire import (
    MAX_CHECKPOINT_REPLY_BYTES,
    MAX_DECLARATIONS_CHARS,
    MAX_DUMP_BLOBS,
    decode,
    encode,
    error_to_plain,
    split_parts,
)
from snapcell.worker._loopfree import finish_without_loop, runs_without_loop
from snapcell.worker._pretouch import pretouch
from snapcell.worker._tempdir import set_tempdir
from snapcell.worker._workerchannel import Channel, WorkerBridge, ran_reply
from snapcell.worker._workersetup import apply_session_sandbox, warm_read_paths
from snapcell.workspace import (
    STAGING_DIR,
    TMP_DIR,
    WORKSPACE_DIR,
    Workspace,
    attach_snapshot,
    effective_quota,
    empty_dir,
)

if TYPE_CHECKING:
    import _socket  # a zygote's child gets the C type, `_socket.socket`: it does not import the socket module
    import asyncio  # imported by the first run that needs the event loop (`Worker.loop`), not before

__all__ = ["main", "warm_read_paths"]  # the zygote's warm-up step computes the read paths through this module


async def _carry_on(run: Coroutine[Any, Any, RunResult], waiting: Any) -> RunResult:
    """Finish, in a task, a coroutine whose first step ran by hand and now waits for ``waiting``."""
    return await _Resumed(run, waiting)


class _Resumed:
    """Awaiting it carries on a started coroutine: each thing it waits for is waited for by the awaiting task."""

    __slots__ = ("_run", "_waiting")

    def __init__(self, run: Coroutine[Any, Any, RunResult], waiting: Any) -> None:
        self._run = run
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, RunResult]:
        run, waiting = self._run, self._waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # thrown in by the task (its cancellation): passed on for the run to handle
                step = functools.partial(run.throw, exc)
            else:
                step = functools.partial(run.send, sent)
            try:
                waiting = step()
            except StopIteration as done:
                result: RunResult = done.value
                return result


class Worker:
    """Serves one session's requests."""

    def __init__(self, channel: Channel, runner: Runner, workspace: Workspace | None = None) -> None:
        self.channel = channel
        self.runner = runner
        self.workspace = workspace
        self.bridge: WorkerBridge | None = None
        self._limits_plain: dict[str, Any] | None = None
        self._limits_run = runner.limits
        # The limits the host named last in a run request (see `next_request`).
        self._host_limits: dict[str, Any] | None = None
        # The host cancels a run with SIGUSR1 (a "cancel" frame, which hosts no longer send, is skipped): no thread
        # reads the channel while a synchronous cell runs, but a signal handler runs between its bytecodes.
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: self.runner.cancel())

    @functools.cached_property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of runs that need one (see `_loopfree`), made (asyncio imported) on first use."""
        import asyncio

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop

    def next_request(self) -> tuple[dict[str, Any], bytearray]:
        """Read the next request in this (the main) thread; results of finished host calls are skipped.

        The host is gone or closed the channel: the worker exits, as nothing of its session may outlive it.
        """
        while True:
            try:
                with self.channel.receive_lock:
                    message, blob = self.channel.receive()
            except (EOFError, OSError, ValueError):
                os._exit(0)
            op = message.get("op")
            if op == "run":
                # The host names a run's limits only when they differ from those of the last run it sent.
                if "limits" in message:
                    self._host_limits = message["limits"]
                elif self._host_limits is not None:
                    message["limits"] = self._host_limits
            if op not in ("result", "cancel"):  # a cancel arrives as SIGUSR1 (see __init__)
                return message, blob

    def serve(self) -> None:
        while True:
            message, blob = self.next_request()
            op = message.get("op")
            # A request may name a follow-on (a run, the dump after it), served as soon as it succeeded: the host
            # reads both replies without a round trip between them.
            while self.answer(op, message, blob) and type(then := message.get("then")) is dict:
                message, blob = then, bytearray()
                op = message.get("op")
            if op == "close":
                return

    def answer(self, op: Any, message: dict[str, Any], blob: bytearray) -> bool:
        """Serve one request and send its reply; False if that reply is an error."""
        try:
            reply, out = self.handle(op, message, blob)
            payload = reply if isinstance(reply, bytes) else encode(reply)
            if op == "dump" and len(payload) > MAX_CHECKPOINT_REPLY_BYTES:
                raise CheckpointError(
                    f"the checkpoint's manifest is larger than the {MAX_CHECKPOINT_REPLY_BYTES:,} bytes a worker "
                    "may send; keep fewer cells or variables in the session"
                )
        except SnapcellError as exc:
            self.channel.send_payload(encode({"op": "error", "error": error_to_plain(exc)}))
            return False
        self.channel.send_payload(payload, *out)
        return True

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
            return self.run(message)
        if op == "dump":
            return self.dump(message)
        if op == "load":
            return self.load(message, blob)
        if op in ("ws_read", "ws_write", "ws_list"):
            if self.workspace is None:
                raise WorkspaceError("this worker has no workspace")
            return self.workspace.serve(op, message, blob)
        if op == "queue":
            self.runner.pending_notes.extend(str(n) for n in message.get("notes", ()))
            self.runner.pending_setup.extend(str(c) for c in message.get("setup_cells", ()))
            return {"op": "queued"}, []
        if op == "declarations":
            from snapcell.typecheck import declarations_from_namespace  # a type-checked session only

            text = declarations_from_namespace(self.runner.variables(), types=self.runner.static_types)
            if len(text) > MAX_DECLARATIONS_CHARS:  # the host accepts no more; the stubs keep their first lines
                text = text[: text.rfind("\n", 0, MAX_DECLARATIONS_CHARS) + 1]
            return {"op": "declarations", "text": text}, []
        if op == "reset":
            self.runner = self.new_runner()
            if self.workspace is not None:
                with contextlib.suppress(OSError):
                    self.workspace.clear()  # a fresh session has no files either
            return {"op": "reset"}, []
        if op == "recycle":
            self.recycle()
            return {"op": "recycled"}, []
        if op == "close":
            return {"op": "closed"}, []
        raise ConfigError(f"unknown request {op!r}")

    def dump(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | bytearray]]:
        """Dump the namespace and the workspace's files: the reply, then the body and each new blob."""
        from snapcell.checkpoint import BlobRef  # pydantic: not imported before a session's first dump

        known = [BlobRef.model_validate(ref) for ref in message.get("known_blobs", ())]
        known_blobs = {ref.hash: ref for ref in known}
        created_at, level = float(message["created_at"]), int(message["level"])
        with self.watched("dump", "dump_time_s", self.runner.limits.dump_time_s):
            # Files first: a workspace over its quota stops the dump before any script code runs.
            snap = (
                self.workspace.snapshot(known=known_blobs, level=level, created_at=created_at)
                if (self.workspace is not None)
                else None
            )
            dumped = self.runner.dump(
                created_at=created_at,
                level=level,
                on_unpicklable="fail" if message.get("on_unpicklable") == "fail" else "skip",
                known_blobs=known_blobs,
                passed_frames=_frame_hashes(message.get("passed_frames")),
            )
            if snap is not None:
                dumped = attach_snapshot(dumped, snap)
                if snap.skipped:
                    self.runner.pending_notes.append(snap.skipped_note())
        if len(dumped.new_blobs) > MAX_DUMP_BLOBS:
            raise CheckpointError(f"the checkpoint needs more than {MAX_DUMP_BLOBS} new blobs")
        # The body, then each new blob, sent back to back; the reply says where each part ends.
        out: list[bytes | bytearray] = [dumped.body, *dumped.new_blobs.values()]
        # No manifest: the host reads the one in the body, which is what it signs.
        reply: dict[str, Any] = {
            "op": "dumped",
            "new_blobs": list(dumped.new_blobs),
            "parts": [len(part) for part in out],
            "refresh": dumped.refresh,
        }
        return reply, out

    def load(self, message: dict[str, Any], blob: bytearray) -> tuple[dict[str, Any], list[bytes | bytearray]]:
        """Load a verified checkpoint: its files are staged (and checked) first, then the namespace, then the swap."""
        from snapcell.checkpoint import parse_container  # pydantic: not imported before a session's first load

        names = [str(n) for n in message.get("blobs", ())]
        try:
            views = split_parts(blob, message.get("parts", [len(blob)]))
        except ValueError as exc:
            raise ConfigError(f"malformed load request: {exc}") from None
        if len(views) != len(names) + 1:
            raise ConfigError("malformed load request: a part for each blob and the body")
        blobs = dict(zip(names, views[1:], strict=True))
        with self.watched("load", "load_time_s", self.runner.limits.load_time_s):
            manifest = parse_container(views[0]).manifest
            if self.workspace is not None:
                self.workspace.stage(manifest.files, blobs)  # checked before anything changes
            try:
                self.runner.load(views[0], blobs, manifest=manifest)
            except BaseException:
                if self.workspace is not None:
                    self.workspace.discard_staging()
                raise
            if self.workspace is not None:
                hidden = self.workspace.commit_staging()
                if hidden:
                    self.runner.pending_notes.append(
                        f"saved files under {', '.join(hidden)} are hidden by this session's read-only mounts"
                    )
        # No manifest: the host parsed the one in the body it verified, and believes no other.
        return {"op": "loaded"}, []

    def new_runner(self) -> Runner:
        """A runner with an empty namespace and this worker's policy, limits and file access."""
        return Runner(policy=self.runner.policy, limits=self.runner.limits, file_access=self.runner.file_access)

    def recycle(self) -> None:
        """Forget the session: a new namespace, an empty scratch directory, the default decimal context."""
        import decimal  # not imported before a session needs it

        self.runner = self.new_runner()
        decimal.setcontext(decimal.Context())
        if self.workspace is not None:
            self.workspace.clear()
            self.workspace.discard_staging()
            empty_dir(os.path.join("..", TMP_DIR))
        else:
            empty_dir(".")

    def run_limits(self, plain: dict[str, Any] | None) -> Limits:
        """The limits a run request names (the session's if none); the last run's object again when they are equal."""
        if plain is None:
            return self.runner.limits
        if plain != self._limits_plain:
            self._limits_run = Limits(**plain)
            self._limits_plain = plain
        return self._limits_run

    def drive(self, run: Coroutine[Any, Any, RunResult], bridge: WorkerBridge, *, loop_free: bool = False) -> RunResult:
        """Run the runner's coroutine, with the event loop only if the cell waits for something.

        A synchronous cell never waits, so its run ends in the coroutine's first step: no task, no loop iteration,
        no reader on the channel (its host calls read their own results). Meanwhile the loop counts as running, so
        what the runner asks of asyncio (the tasks that exist, to reap any the script left) and what a script asks
        (``asyncio.get_running_loop()``, ``asyncio.run`` refused) answer as they do inside the loop. A cell that
        waits is carried on by a task in that same context, with the loop reading results of async host calls.

        ``loop_free`` (a cell `runs_without_loop` cleared, before anything made the loop): no loop at all, so
        a worker's first cells do not import asyncio.
        """
        context = contextvars.copy_context()
        if loop_free:
            return context.run(finish_without_loop, run)
        import asyncio  # imported already: the loop is made

        asyncio.events._set_running_loop(self.loop)
        try:
            waiting = context.run(run.send, None)
        except StopIteration as done:
            result: RunResult = done.value
            return result
        finally:
            asyncio.events._set_running_loop(None)
        # Results of async host calls are read by the run's own event loop when they arrive.
        self.loop.add_reader(self.channel.fileno(), bridge.read_one, 0)
        try:
            return self.loop.run_until_complete(self.loop.create_task(_carry_on(run, waiting), context=context))
        finally:
            self.loop.remove_reader(self.channel.fileno())

    def run(self, message: dict[str, Any]) -> tuple[bytes, list[bytes | bytearray]]:
        """Run a cell; the encoded ``ran`` reply (within what the host accepts for the run's limits) and the
        bytes of its artifacts."""
        # Never str() what came instead of a script: the runner answers anything but text with a ScriptSyntaxError.
        code: Any = message.get("code")
        limits = self.run_limits(message.get("limits"))
        host = {str(k): bool(v) for k, v in message.get("host", {}).items()}
        # Once a run has made the loop, every later run uses it too.
        loop_free = "loop" not in vars(self) and not any(host.values()) and runs_without_loop(self.runner, code)
        self.bridge = bridge = WorkerBridge(self.channel, host, None if loop_free else self.loop, limits)
        # False (`feed_run`): the host reads only the value, so neither the namespace summary and CPU clock (the
        # runner's), nor the memory reading and the walks of out/ for artifacts (these) are made.
        report = message.get("report") is not False
        workspace = self.workspace if report else None
        if workspace is not None:
            with contextlib.suppress(WorkspaceError):  # artifacts are a courtesy: never a reason to fail a run
                workspace.before_run()
        try:
            result = self.drive(
                self.runner.run(
                    code,
                    bridge=bridge,
                    host_names=tuple(host),
                    setup=bool(message.get("setup")),
                    limits=limits,
                    report=report,
                    inputs=message.get("inputs"),
                    types=_types(message.get("types")),
                ),
                bridge,
                loop_free=loop_free,
            )
        finally:
            self.bridge = None
        return ran_reply(result, limits, memory_bytes=_rss_bytes() if report else None, workspace=workspace)


# Opened before the sandbox (which hides /proc) and kept: each pread gives the current numbers.
_statm_fd: int | None = None


def _read_status() -> str | None:
    """The memory lines of ``/proc/self/status``, made from ``statm`` and the peak from ``getrusage``.

    Scripts read them (`Runner` ``read_status``); the worker opens nothing more of ``/proc`` for them.
    """
    if _statm_fd is None:
        return None
    try:
        size, resident, _shared, text, _lib, data = (int(n) for n in os.pread(_statm_fd, 200, 0).split()[:6])
        import resource  # the sandbox imported it already

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    except (OSError, ValueError):
        return None
    kib = os.sysconf("SC_PAGE_SIZE") // 1024
    lines = {
        "VmSize": size * kib,
        "VmHWM": max(peak_kib, resident * kib),
        "VmRSS": resident * kib,
        "VmData": data * kib,
        "VmExe": text * kib,
    }
    return "".join(f"{key}:\t{value:8d} kB\n" for key, value in lines.items())


def _rss_bytes() -> int | None:
    if _statm_fd is None:
        return None
    try:
        return int(os.pread(_statm_fd, 200, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _types(value: Any) -> dict[str, str] | None:
    """The static types a run message carries (None: the cell was not type-checked)."""
    if type(value) is not dict:
        return None
    return {k: v for k, v in value.items() if type(k) is str and type(v) is str}


def policy_from_plain(data: dict[str, Any]) -> Policy:
    """Rebuild the session's policy from the host's plain description."""
    fields: dict[str, Any] = {k: frozenset(v) if isinstance(v, list) else v for k, v in data.items()}
    return Policy(**fields)


class _StepWatchdog(Watchdog):
    """The watchdog of a dump or load: the whole step runs on the script's behalf, so any frame may be interrupted."""

    def _script_on_stack(self) -> bool:
        return True


class _NoHost:
    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NameError(name)


def _warm_up() -> None:
    """Run a throwaway cell, dump and load it, so a session's first run does not pay for lazy imports and caches.

    No wall-time limit: the watchdog thread must not start before the sandbox, which wants a single thread.
    """
    import asyncio

    runner = Runner(policy=Policy(), limits=Limits(wall_time_s=None))
    # ``y`` is large enough to be a frame blob: its manifest entry's model is built on first use.
    asyncio.run(runner.run("x = [1]\ny = 'y' * 20_000\nx", bridge=_NoHost(), host_names=()))
    dumped = runner.dump(created_at=0.0)
    runner.load(dumped.body, dumped.new_blobs)  # and the load path: a fresh worker's first step is a load
    decode(encode({"op": "warm-up"}))  # the JSON decoder every worker's first message is read with, built once


def _warm_up_data(preloaded: list[str]) -> None:
    """With pandas preloaded (a zygote's second stage): a DataFrame made, summed, dumped, loaded, dumped again.

    What pandas and numpy build on first use (block managers' caches, reduction dispatch, the pickling paths, the
    guarded views of the default policy) is then built once here and shared with every child: a fresh worker's first
    DataFrame turn took ~15% fewer copy-on-write faults and ~0.5 ms less CPU (load, run and dump of a 1,000-row
    DataFrame). Costs the zygote ~18 ms once. Starts no thread (the zygote forks only with one).
    """
    if "pandas" not in preloaded:
        return
    import asyncio
    import linecache

    from snapcell.policy import with_file_access

    runner = Runner(policy=with_file_access(Policy.process_default()), limits=Limits(wall_time_s=None))
    cell = (
        "import numpy as np\nimport pandas as pd\n"
        "df = pd.DataFrame({'id': range(50), 'name': [f'r{i}' for i in range(50)], 'v': np.arange(50) * 0.5})\n"
        "[float(df['v'].sum()), len(df)]"
    )
    asyncio.run(runner.run(cell, bridge=_NoHost(), host_names=()))
    dumped = runner.dump(created_at=0.0)
    runner.load(dumped.body, dumped.new_blobs)
    asyncio.run(runner.run("float(df['v'].sum())", bridge=_NoHost(), host_names=()))
    runner.dump(created_at=0.0)
    for name in [name for name in linecache.cache if name.startswith("<cell-")]:
        del linecache.cache[name]


def main(argv: list[str] | None = None) -> int:
    """Entry point of a spawned worker process: ``FD [HOST_PID]``.

    The process the host started becomes the worker's launcher: the worker is its child, in a pid namespace that
    ends with it (`snapcell.sandbox.launch_worker`), and it exits as the worker does.
    """
    argv = sys.argv[1:] if argv is None else argv
    host_pid = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else None
    # Before anything reads the channel or starts a thread: only the worker returns from here.
    parent_pid = launch_worker(host_pid)
    import socket  # a spawned worker's (a zygote's child gets its socket from `_zygote`)

    sock = socket.socket(fileno=int(argv[0]))
    sock.setblocking(True)
    _warm_up()
    return serve_session(sock, parent_pid=parent_pid, host_pid=host_pid)


def serve_session(sock: _socket.socket, *, parent_pid: int | None, host_pid: int | None = None) -> int:
    """Serve one session on ``sock``: say "started", take the settings, apply the sandbox, answer requests.

    A spawned worker calls it after its imports; a child forked from a zygote (`_zygote`) calls it right after the
    fork, with ``parent_pid`` the zygote's pid and ``host_pid`` the host's. Workspace or other per-session set-up that
    must happen before the sandbox goes between receiving ``init`` and `apply_session_sandbox` below.

    Returns:
        The process's exit code.
    """
    channel = Channel(sock)
    # The pid the host knows it by (in a pid namespace of its own, ``os.getpid()`` is another number).
    channel.send({"op": "started", "pid": host_view_pid()})
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
    try:
        report = apply_session_sandbox(settings, limits, policy, keep, parent_pid, host_pid)
    except (SandboxError, ConfigError) as exc:
        # No script may run half-confined: say why, and stop.
        failure = {"layer": getattr(exc, "layer", None), "errno": getattr(exc, "errno", None)}
        channel.send({"op": "sandbox_failed", "message": str(exc), **failure})
        return 4
    # The workspace (laid out by the sandbox's prepare step) is the script's working directory.
    # Reached from the current directory (the scratch tmpfs), never again by absolute path: the worker's own
    # mount is what matters, whatever happens to the path in the host's mount table.
    scratch = str(settings["scratch_dir"])
    os.chdir(WORKSPACE_DIR)
    os.environ["TMPDIR"] = os.path.join(scratch, TMP_DIR)
    os.environ["MPLCONFIGDIR"] = os.path.join(scratch, TMP_DIR, "matplotlib")
    os.environ.setdefault("MPLBACKEND", "Agg")  # charts are files here: no display
    # Set, not left to tempfile's own search (it probes each candidate by writing a file, which can fail here). A
    # zygote's first child has not imported tempfile (nor random, which it imports): set when something first does.
    set_tempdir(os.environ["TMPDIR"])
    workspace = Workspace(
        ".",
        staging=os.path.join("..", STAGING_DIR),
        mounts=[str(name) for name in (settings.get("mounts") or {})],
        quota_bytes=effective_quota(limits.workspace_bytes, limits.max_scratch_bytes),
    )
    runner = Runner(policy=policy, limits=limits, file_access=True, read_status=_read_status)
    worker = Worker(channel, runner, workspace)
    start_watchdog()  # threads only now that the sandbox is in place; the first run does not wait for it
    channel.send({"op": "ready", "sandbox": report})
    if settings.get("pretouch") is True:  # asked for by the pool: it costs more CPU than it saves
        pretouch(worker)  # while no request comes: the first turn's copy-on-write faults, taken now
    worker.serve()
    return 0


_HEX_DIGITS = frozenset("0123456789abcdef")


def _frame_hashes(value: Any) -> list[str]:
    """The frame hashes of a dump request's ``passed_frames``: 64 hex digits each (32 in older checkpoints), at most
    4096 (others ignored)."""
    if type(value) is not list:
        return []
    return [h for h in value[:4096] if type(h) is str and len(h) in (32, 64) and set(h) <= _HEX_DIGITS]


if __name__ == "__main__":
    try:
        code = main()
    except CheckpointError:
        code = 3
    sys.stdout.flush()
    os._exit(code)
