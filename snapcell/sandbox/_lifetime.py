"""The lifetime layer: a worker, and every process it starts, ends when its host does, whatever it did to itself.

A worker's own pdeathsig is no guarantee: a compromised worker may clear it with prctl, and a process it forks has
none. So every worker lives in a pid namespace whose init is snapcell's own code: a process that never runs a
script, only reaps (`_serve_as_init`), and carries pdeathsig on the trusted process that made it, which carries
pdeathsig on the host. When a namespace's init dies, the kernel SIGKILLs every other process in it, whatever their
signal handlers, pdeathsig or session; no process can leave its pid namespace, and a worker's uid, seccomp filter
and Landlock domain keep it from signalling the init or its maker::

    host -- zygote (pdeathsig: host) -- init, pid 1 of the namespace (pdeathsig: zygote)
                     `-- worker, worker, ... (the zygote's children, members of the init's namespace)

    host -- launcher (pdeathsig: host) -- init, pid 1 of the namespace (pdeathsig: launcher)
                       `-- worker (a spawned worker: the launcher forks it, waits for it and exits as it did)

The zygote and the launcher stay in the host's pid namespace (`unshare(CLONE_NEWPID)` moves only the children made
afterwards), so every pid they see and report (fork's, wait4's) is the host's. A worker learns its own pid as the
host sees it from /proc (`host_view_pid`); inside, ``os.getpid()`` is its number in the namespace, and that is the
number its seccomp filter names.

Making a pid namespace takes CAP_SYS_ADMIN: on a host that is not root, or a kernel without pid namespaces, the
layer is "unavailable" and the workers end with the host only through pdeathsig. Any other failure is raised.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import select
import signal
from typing import NoReturn

__all__ = ["host_view_pid", "launch_worker", "layer_state", "namespace_init_pid", "start_pid_namespace"]

_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
# Why unshare(CLONE_NEWPID) failed, for the errors that mean the machine lacks the feature or the privilege.
_MISSING = {
    errno.EPERM: "a pid namespace needs CAP_SYS_ADMIN: the host is not root, or a container's root without it",
    errno.EINVAL: "the kernel has no pid namespaces",
    errno.ENOSYS: "the kernel has no pid namespaces",
    errno.ENOSPC: "the limit of nested pid namespaces is reached",
    errno.EUSERS: "the limit of nested pid namespaces is reached",
}

_libc = ctypes.CDLL(None, use_errno=True)
_RESOLVED = [_libc.prctl, _libc.unshare]  # made at import (the zygote's), not on first use

# This process's lifetime layer, once `start_pid_namespace` has run (children forked afterwards inherit it), and the
# pid of the namespace's init as this process sees it (0: none).
_state: str | None = None
_init_pid = 0


def layer_state() -> str:
    """The lifetime layer of a worker made by this process (or forked from it): "active: ...", "unavailable: ...",
    or "off" when no snapcell zygote or launcher made it (`apply_sandbox` called directly)."""
    return "off" if _state is None else _state


def namespace_init_pid() -> int:
    """The pid of the namespace's init (as this process sees it), or 0 when there is none."""
    return _init_pid


def host_view_pid() -> int:
    """This process's pid as the host sees it: through /proc, which is mounted for the host's pid namespace.

    In a worker in a namespace of its own, ``os.getpid()`` is its number there; /proc names it by the host's.
    """
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def _arm_pdeathsig() -> None:
    if _libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def start_pid_namespace(maker: str, host_pid: int | None) -> str:
    """Put this process's later children in a new pid namespace, and start the namespace's init now.

    Call it in a trusted process (the zygote, a spawned worker's launcher) that carries pdeathsig on the host, before
    any other thread exists and before it forks anything else. The init carries pdeathsig on this process.

    Args:
        maker: What this process is, for the layer's description ("zygote", "launcher").
        host_pid: The host's pid, for the description.

    Returns:
        The layer's state (also what `layer_state` says from now on, here and in every later child).

    Raises:
        OSError: Making the namespace or its init failed other than for a missing feature or privilege.
    """
    global _state, _init_pid
    try:
        maker_fd = os.pidfd_open(os.getpid())  # how the init tells that its maker died before its pdeathsig was armed
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        _state = f"unavailable: pidfd_open: {os.strerror(exc.errno)}; workers end with the host through pdeathsig only"
        return _state
    try:
        if _libc.unshare(ctypes.c_int(_CLONE_NEWPID)) == -1:
            err = ctypes.get_errno()
            if err not in _MISSING:
                raise OSError(err, f"unshare(CLONE_NEWPID): {os.strerror(err)}")
            _state = (
                f"unavailable: unshare(CLONE_NEWPID): {os.strerror(err)} ({_MISSING[err]}); workers end with the host"
                " through pdeathsig only"
            )
            return _state
        pid = os.fork()
        if pid == 0:
            _serve_as_init(maker_fd)
    finally:
        os.close(maker_fd)
    _init_pid = pid
    host = f", which dies with the host (pid {host_pid})" if host_pid else ""
    _state = (
        f"active: pid namespace whose init (pid {pid}) dies with the {maker} (pid {os.getpid()}){host}; its end"
        " kills every worker in it and every process they started"
    )
    return _state


def _serve_as_init(maker_fd: int) -> NoReturn:
    """The namespace's init: reap the orphans handed to it until its maker dies (pdeathsig); never returns."""
    try:
        _arm_pdeathsig()
        if select.select([maker_fd], [], [], 0)[0]:  # the maker died before the signal was armed
            os._exit(0)
        _close_fds(keep=())
        _libc.prctl(ctypes.c_int(_PR_SET_NAME), ctypes.c_char_p(b"snapcell-init"), 0, 0, 0)  # for ps and top
        # An init ignores every signal it has no handler for (but SIGKILL from outside its namespace): Python's SIGINT
        # handler goes, and SIGCHLD, blocked, stays pending for `sigwait` rather than being dropped.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        while True:
            _reap_all()
            signal.sigwait({signal.SIGCHLD})
    finally:
        os._exit(0)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def launch_worker(host_pid: int | None) -> int | None:
    """Run a spawned worker in a pid namespace of its own: fork it, and wait here as its launcher.

    Called first thing in a spawned worker process (``python -s -P -m snapcell.worker._worker``), before it reads its
    channel or starts a thread. This process arms pdeathsig on the host, makes the namespace and its init, and forks
    the worker, which returns from here; the launcher waits for the worker, ends the namespace and exits as the
    worker did (its exit code, or its signal), so the host's ``wait4`` sees the worker's end and peak memory. Where
    no namespace can be made, this process returns and serves as the worker itself.

    Args:
        host_pid: The host's pid (None: unknown; then nothing is armed here).

    Returns:
        In the worker: the pid (as the host sees it) of the process whose death its own pdeathsig should follow, the
        launcher's, or the host's when there is no launcher.
    """
    if host_pid is not None:
        _arm_pdeathsig()
        if os.getppid() != host_pid:  # the host died before the signal was armed
            os._exit(1)
    start_pid_namespace("launcher", host_pid)
    init = _init_pid
    if not init:
        return host_pid
    launcher = os.getpid()
    worker = os.fork()
    if worker == 0:
        return launcher
    _close_fds(keep=(2,))  # the channel above all: the host must see it close when the worker dies
    _, status, _ = os.wait4(worker, 0)
    os.kill(init, signal.SIGKILL)
    os.waitpid(init, 0)  # an init is reaped only once every other process of its namespace is gone
    _exit_as(status)


def _exit_as(status: int) -> NoReturn:
    """Exit as a process that ended with wait status ``status`` did: with its code, or by its signal."""
    if not os.WIFSIGNALED(status):
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    sig = os.WTERMSIG(status)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSEGV, SIGXCPU, ...: no core file of the launcher
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ
        os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def _close_fds(keep: tuple[int, ...]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(1024))
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError, ValueError):
                os.close(fd)
