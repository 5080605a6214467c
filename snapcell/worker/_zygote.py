"""The zygote: a clean interpreter that has imported the worker and forks one worker per checkout.

Started as ``python -s -P -m snapcell.worker._zygote CTRL_FD HOST_PID [MODULE,...]`` exactly like a spawned
worker (nothing of the host's environment, no key, no credentials, no session data, BLAS/OpenMP pools limited to one
thread so that fork is safe), it imports the worker (what a first run needs, not the checkpoint code) and says
"ready": the first fork waits for nothing more. It never runs script code. snapcell's deferred modules
(`DEFERRED_MODULES`: pydantic and the picklers), the policy's heavy modules (numpy, pandas) and snapcell's own
warm-up cell (a run and a dump) come second, when the host asks (after its first fork request; the heavy modules
only once a session may need them): one step at a time, in the main thread, only while no fork request waits. A
child forked before them imports them on demand, as a spawned worker does; the zygote forks only while it runs a
single thread. Then it waits on its control socket:

- host -> zygote: a one-byte ``F`` datagram carrying two descriptors (SCM_RIGHTS): the new worker's end
  of a fresh socketpair and the pipe its stderr goes to. The zygote forks; the child starts a session of
  its own (`_worker.serve_session`), which applies every sandbox layer to the child itself after the
  fork: its own uid (derived by the host from the child's pid), Landlock, a seccomp filter naming the
  child's pid, rlimits, pdeathsig on the zygote. The zygote closes both descriptors.
- host -> zygote: ``L``: the second stage without the heavy modules (snapcell's deferred modules, the warm-up);
  ``P``: with them (after an ``L`` too: the heavy modules and a warm-up again). Each step only once.
- zygote -> host, one datagram each, in the wire's format (`snapcell.wire.encode`, the format of every message
  between snapcell's processes): ``{"op": "ready", "preload": [...], "modules": N, ...}`` first (N: the modules
  it has imported);
  ``{"op": "preloaded", "preloaded": [...], "heavy": H, "threads": T}`` when a second stage is done (H: whether
  it included the heavy modules' steps);
  ``{"op": "forked", "pid": P, "rss": R, "preloaded": [...]}`` per fork, in order;
  ``{"op": "exited", "pid": P, "status": S, "maxrss": M}`` when a child is reaped (the zygote is the parent: only
  it can wait for its children; in its loop, or from its SIGCHLD handler during a preload step);
  ``{"op": "fork_failed", "error": ...}``.

The zygote carries pdeathsig on the host. Before anything else it makes a pid namespace and its init, which carries
pdeathsig on the zygote (`snapcell.sandbox.start_pid_namespace`): every child it forks is a member of that
namespace, and so is every process a child starts. The host's death kills the zygote, the zygote's death kills the
init, and the init's death kills everything in the namespace, whatever a child did to its own pdeathsig; a zygote's
death (only an outside kill or the OOM killer could do it) ends its children so too, whose sessions are then
restored like any lost worker's, and the host starts a new zygote. The zygote itself stays in the host's pid
namespace: the pids it reports are the host's. An init that dies alone takes the namespace with it, and the zygote
(which can fork no more) exits. Each child also carries pdeathsig on the zygote, a second line. Nothing a child does
reaches the zygote but its exit status: after its sandbox it cannot signal, trace or open anything outside itself.

Hash randomization is fixed when an interpreter starts, so every child of one zygote shares its
``PYTHONHASHSEED``, which the host chose (its environment's one ``PYTHON*`` variable; the ``-E`` of ``-I`` would
ignore it, which is why the zygote starts with ``-s -P`` and not ``-I``); `random` and `numpy.random`'s global
state are reseeded from the OS in each child, and `secrets`, `os.urandom` and `uuid` read the OS anyway.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import ctypes
import functools
import gc
import importlib
import json
import os
import resource
import select
import signal
import sys
from typing import Any

from snapcell.sandbox import namespace_init_pid, start_pid_namespace
from snapcell.wire import HEAVY_MODULES, encode

__all__ = ["import_worker", "main", "reseed"]

# snapcell's own modules that a first run does not need, so the zygote says "ready" without them: the checkpoint
# code (pydantic, the picklers, zstd) a dump or load imports, asyncio, which a run imports once a cell needs it, and
# the sandbox, which a child imports after the fork. They are the first preload step, so that later children get
# them copy-on-write.
DEFERRED_MODULES = (
    "asyncio",
    "snapcell.checkpoint._format",
    "snapcell.checkpoint._pickle",
    "snapcell.checkpoint._unpickle",
    "snapcell.checkpoint._trial",
    # What each child imports after the fork (its sandbox, its read paths, its reseeding): later ones find it here.
    "snapcell.sandbox._sandbox",
    "sysconfig",
    "random",
    "tempfile",
)
_DEFERRED_STEP = "<snapcell>"
_PR_SET_PDEATHSIG = 1
_MAX_CONTROL_BYTES = 16


def reseed() -> None:
    """Give this process random streams of its own: a forked child starts with its zygote's.

    Only the modules imported before the fork: one imported later (`random` in a zygote's first child) seeds itself
    from the OS then.
    """
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # The legacy global RandomState (Generators made later seed from the OS): a Mersenne Twister state straight
        # from the OS, its first word's top bit set as `seed` does (never all zeros). `numpy.random.seed()` would
        # derive one through a SeedSequence, copying ~40 more of the zygote's pages.
        key = numpy.frombuffer(bytearray(os.urandom(624 * 4)), dtype=numpy.uint32)
        key[0] = 0x80000000
        numpy.random.set_state(("MT19937", key, 624))


def _send(ctrl: _socket.socket, message: dict[str, Any]) -> None:
    ctrl.send(encode(message))


@functools.lru_cache(maxsize=8)
def _names(names: tuple[str, ...]) -> str:
    """A list of module names as `encode` writes it (module names hold no character JSON escapes)."""
    return json.dumps(list(names), separators=(",", ":"))


def _send_forked(ctrl: _socket.socket, pid: int, rss: int, preloaded: list[str]) -> None:
    """`_send` of a "forked" report, formatted directly as `encode` writes it: each page the zygote writes right
    after a fork is copied (its child still shares it), and the encoder wrote ~25 of them per fork."""
    ctrl.send(f'{{"op":"forked","pid":{pid:d},"rss":{rss:d},"preloaded":{_names(tuple(preloaded))}}}'.encode())


def _send_exited(ctrl: _socket.socket, pid: int, status: int, maxrss: int) -> None:
    """`_send` of an "exited" report, formatted directly (see `_send_forked`)."""
    ctrl.send(f'{{"op":"exited","pid":{pid:d},"status":{status:d},"maxrss":{maxrss:d}}}'.encode())


def _recv_fds(ctrl: _socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int]]:
    """``socket.recv_fds`` on the C socket type (the socket module's enums cost a zygote ~5% of its start-up)."""
    fds = array.array("i")
    data, ancillary, _flags, _addr = ctrl.recvmsg(size, _socket.CMSG_LEN(max_fds * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def _arm_pdeathsig(host_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0))
    if os.getppid() != host_pid:  # the host died before the signal was armed
        os._exit(1)


def _child(ctrl: _socket.socket, wake: tuple[int, int], fds: list[int], zygote_pid: int, host_pid: int) -> None:
    """In the forked child: drop the zygote's descriptors and handlers, reseed, serve one session; never returns."""
    code = 70
    try:
        os.setsid()  # its own process group, so the zygote can kill anything it starts
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctrl.close()
        for fd in wake:
            os.close(fd)
        channel_fd, stderr_fd = fds
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        reseed()
        from snapcell.worker._worker import serve_session

        sock = _socket.socket(fileno=channel_fd)
        sock.setblocking(True)
        code = serve_session(sock, parent_pid=zygote_pid, host_pid=host_pid)
    except BaseException:  # the child must never fall back into the zygote's loop
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fork(ctrl: _socket.socket, wake: tuple[int, int], fds: list[int], host_pid: int, preloaded: list[str]) -> None:
    zygote_pid = os.getpid()
    threads = _threads()
    pid = -1
    if threads != 1:  # another thread could hold a lock the child would inherit locked
        _send(ctrl, {"op": "fork_failed", "error": f"the zygote runs {threads} threads; it forks only with one"})
    else:
        try:
            pid = os.fork()
        except OSError as exc:
            _send(ctrl, {"op": "fork_failed", "error": str(exc)[:500]})
    if pid == 0:
        _child(ctrl, wake, fds, zygote_pid, host_pid)
    for fd in fds:
        os.close(fd)
    if pid > 0:
        _send_forked(ctrl, pid, _high_water_rss(), preloaded)


def _high_water_rss() -> int:
    """This process's own peak RSS in bytes (VmHWM), which a forked child's peak starts from.

    Not ``ru_maxrss``: that also counts the peak inherited from the host across the zygote's own fork and exec,
    which a child does not inherit.
    """
    # Read once per fork: plain descriptor calls, no file object (each page written after a fork is copied).
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 16384)
        finally:
            os.close(fd)
        at = status.index(b"\nVmHWM:") + 7
        return int(status[at : status.index(b"\n", at)].split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_reaping = False


def _reap(ctrl: _socket.socket) -> None:
    """Report every child that has exited, after killing its process group (held by the zombie until reaped).

    Also run from the SIGCHLD handler during a preload step; a call nested in another (a signal during a reap)
    returns at once, and the outer one, or the main loop after the step, reports that child.
    """
    global _reaping
    if _reaping:
        return
    _reaping = True
    try:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            if pid == namespace_init_pid():
                # Its namespace is gone, and every child with it (the host hears of them as the channel closes): no
                # fork can succeed any more.
                print("snapcell zygote: the init of its pid namespace died; the zygote exits", file=sys.stderr)
                os._exit(1)
            _send_exited(ctrl, pid, status, usage.ru_maxrss * 1024)
    finally:
        _reaping = False


class _Preloader:
    """The zygote's second stage: heavy modules and the warm-up, one step at a time between fork requests.

    A step runs in the zygote's main thread only when no fork request is waiting (never in a thread beside a
    fork); a child forked before a step imports what that step would have given it on demand, as a spawned
    worker does.
    """

    def __init__(self, modules: list[str]) -> None:
        self.modules = modules
        self.preloaded: list[str] = []
        self._steps: list[str] = []
        self.started = False
        # Whether the heavy modules' steps have been queued (the host asks for them once a session may need them).
        self.heavy = False

    @property
    def pending(self) -> bool:
        return bool(self._steps)

    def start(self, *, heavy: bool = True) -> None:
        """Queue the steps not queued yet: snapcell's deferred modules (once), each heavy module (once, if ``heavy``),
        then the warm-up (a run and a dump), which freezes the heap and reports. A warm-up still queued runs once,
        after the new steps; one already done runs again after them (for the heavy modules' data and views)."""
        steps = []
        if not self.started:
            self.started = True
            steps.append(_DEFERRED_STEP)
        if heavy and not self.heavy:
            self.heavy = True
            steps.extend(self.modules)
        if steps:
            self._steps = [step for step in self._steps if step] + steps + [""]

    def step(self, ctrl: _socket.socket) -> None:
        """Run the next step; after the last, tell the host what was preloaded and how many threads run.

        A step that fails is skipped (its module is not preloaded; a child imports it, or meets its error, on demand)
        and said on stderr: by now the zygote has children, which die with it.
        """
        # A step takes a while; a child that exits meanwhile is reported at once (the host waits for that report to
        # tell why it died, and to finish a check-in), from the signal handler, between the step's bytecodes.
        previous = signal.signal(signal.SIGCHLD, lambda *_: _reap(ctrl))
        try:
            self._step(ctrl)
        finally:
            signal.signal(signal.SIGCHLD, previous)

    def _step(self, ctrl: _socket.socket) -> None:
        name = self._steps.pop(0)
        try:
            if name == _DEFERRED_STEP:
                for module in DEFERRED_MODULES:
                    importlib.import_module(module)
                import sysconfig

                sysconfig.get_paths()  # its config variables, computed once for every later child
                return
            if name:
                importlib.import_module(name)
                self.preloaded.append(name)
                return
            from snapcell.policy import warm_guarded_builtins
            from snapcell.sandbox import warm_filters
            from snapcell.worker import _worker

            _worker.warm_read_paths()  # the sandbox's read-only paths, computed once for every later child
            warm_filters()  # and its seccomp programs, into which each child patches its pid
            warm_guarded_builtins()  # and the builtins each session's namespace starts from
            _worker._warm_up()  # a run and a dump: builds here what a first dump builds on first use (schemas, ...)
            _worker._warm_up_data(self.preloaded)  # and a DataFrame's, when pandas is preloaded
            _build_views(self.preloaded)
        except Exception as exc:  # the zygote must outlive a failed optional step, for its children's sake
            print(f"snapcell zygote: preload step {name or 'warm-up'!r} failed: {exc!r}", file=sys.stderr, flush=True)
            if name:
                return
        from snapcell.sandbox import warm_import_paths

        warm_import_paths()
        _freeze()
        _send(ctrl, {"op": "preloaded", "preloaded": self.preloaded, "heavy": self.heavy, "threads": _threads()})


def _freeze() -> None:
    from snapcell.sandbox import pin_import_paths
    from snapcell.worker import _worker
    from snapcell.worker._hugepages import collapse_resident_heap

    if os.geteuid() == 0:
        # Only a root host's workers switch uid, and so pin their import roots (`snapcell.sandbox.pin_import_paths`).
        # Pinned here, last (nothing is imported after it), the children inherit the roots and the rewritten paths:
        # their own pin then opens and rewrites nothing (~800 page copies and 2 ms of CPU less per child). If it
        # fails, each child pins what is left for itself.
        unpinned = tuple(sys.path)
        with contextlib.suppress(OSError):
            pin_import_paths()
        _worker.warm_read_paths(unpinned)  # a child asks for them by its (pinned) sys.path
    # Everything imported so far is shared with the children copy-on-write; a child's garbage collector would
    # touch (and so copy) every page of it on its first pass. Frozen objects are never traversed. Children
    # forked already keep their own copy of any page this touches.
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    # And with fewer page-table entries for each fork to copy, and each child's exit to drop (see `_hugepages`).
    collapse_resident_heap()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _build_views(preloaded: list[str]) -> None:
    """Build the guarded views of the preloaded modules as a default process-mode session sees them.

    A view of pandas takes about 10 ms to build (a walk of its ~1,000 submodules); built here, before the fork,
    every child shares it instead of building it on its first ``import pandas`` or load of a DataFrame. Views are
    keyed by the policy's modules, so a session under another policy builds its own, as before.
    """
    from snapcell.policy import Policy, with_file_access

    default = with_file_access(Policy.process_default())
    for name in preloaded:
        if default.allows_module(name):
            default.view(name)


def import_worker() -> None:
    """Import what a first fork needs, and nothing more: the worker (what a first run needs), its import paths.

    Everything else (`DEFERRED_MODULES`, the heavy modules, what a run imports on its first use of a module) is
    imported later, by the second stage or a child: each module here delays every pool's first result.
    """
    from snapcell.sandbox import warm_import_paths
    from snapcell.worker import _worker  # noqa: F401  (imported once, for every child)

    warm_import_paths()


def main(argv: list[str] | None = None) -> int:
    """Entry point of a zygote process: ``CTRL_FD HOST_PID [MODULE,...]``.

    It says "ready" once it has imported the worker, so that the first fork waits for nothing else; the heavy
    modules and the full warm-up follow when the host sends ``P`` (or the warm-up alone, ``L``; see `_Preloader`).
    """
    argv = sys.argv[1:] if argv is None else argv
    ctrl = _socket.socket(fileno=int(argv[0]))
    ctrl.setblocking(True)
    host_pid = int(argv[1])
    _arm_pdeathsig(host_pid)
    # First, while this process is small (the init is a copy of it) and has one thread.
    start_pid_namespace("zygote", host_pid)
    modules = [name for name in (argv[2].split(",") if len(argv) > 2 else ()) if name in HEAVY_MODULES]
    preloader = _Preloader(modules)
    gc.disable()  # the imports make only objects that live on: collecting them now would only delay "ready"
    import_worker()
    gc.freeze()  # no collection yet (it would delay the first fork): the second stage collects, then freezes again
    gc.enable()  # before any fork: a child collects its own garbage
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    hello = {"op": "ready", "pid": os.getpid(), "preload": modules, "preloaded": [], "threads": _threads()}
    _send(ctrl, {**hello, "modules": len(sys.modules)})
    while True:
        # A waiting fork request goes before the next preload step; with no step left, wait for one.
        ready, _, _ = select.select([ctrl.fileno(), wake_r], [], [], 0 if preloader.pending else None)
        if not ready:
            preloader.step(ctrl)
            continue
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            _reap(ctrl)
        if ctrl.fileno() in ready:
            try:
                data, fds = _recv_fds(ctrl, _MAX_CONTROL_BYTES, 2)
            except InterruptedError:
                continue
            if not data:
                return 0  # the host closed the channel: the children die with us (pdeathsig)
            if data == b"F" and len(fds) == 2:
                _fork(ctrl, (wake_r, wake_w), fds, host_pid, preloader.preloaded)
                continue
            for fd in fds:
                os.close(fd)
            if data in (b"P", b"L"):
                preloader.start(heavy=data == b"P")


if __name__ == "__main__":
    os._exit(main())
