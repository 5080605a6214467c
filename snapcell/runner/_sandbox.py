"""Sandbox layers a worker process applies to itself before it runs any script.

Called once, inside a freshly spawned worker, after its imports and before the
first script. Each layer is independent: one the kernel refuses is reported as
``"unavailable: <why>"`` and the others still apply, so the caller can start
anyway, warn once and show the report.

- ``pdeathsig``: the worker gets SIGKILL when the host dies.
- ``rlimits``: address space, CPU time, file size, open files; no core dumps.
- ``no_new_privs``: no privilege gain through set-uid programs; needed by the next two.
- ``landlock``: read-only access to the given paths (the Python installation),
  read-write access to the scratch directory, nothing else; no TCP bind or
  connect; no signals or abstract sockets out of the sandbox (by ABI).
- ``seccomp``: no sockets, no exec, no fork (threads still work), no ptrace,
  mounts, namespaces, kernel keyrings, BPF, perf, io_uring, module loading.

Seccomp and Landlock go through raw syscalls with ctypes. libseccomp's Python
binding is built from the libseccomp sources and is not maintained on PyPI,
and a classic BPF filter this small is easier to audit by hand than to pull in
a dependency; the same holds for the three Landlock syscalls.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import resource
import signal
import stat
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from snapcell.errors import ConfigError
from snapcell.runner._limits import Limits

__all__ = ["LAYERS", "SandboxReport", "apply_sandbox", "seccomp_denied_syscalls"]

LAYERS = ("pdeathsig", "rlimits", "no_new_privs", "landlock", "seccomp")

# Read-only paths every worker needs besides the Python installation: the dynamic
# loader's cache and library directories (C extensions such as _sqlite3 or _ssl
# link system libraries), CPU topology (os.cpu_count, BLAS thread pools) and
# time zones. None of them hold secrets.
SYSTEM_READ_PATHS = (
    "/etc/ld.so.cache",
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/etc/localtime",
    "/usr/share/zoneinfo",
    "/sys/devices/system/cpu",
)
_DEVICE_READ = ("/dev/urandom", "/dev/random", "/dev/zero")
_DEVICE_READ_WRITE = ("/dev/null",)

_PR_SET_PDEATHSIG = 1
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
# A parent pid seen as early as possible, for the pdeathsig race when the caller gives none.
_PID_AT_IMPORT = os.getpid()
_PPID_AT_IMPORT = os.getppid()


@dataclass(frozen=True, slots=True)
class SandboxReport:
    """Which sandbox layers a worker runs under.

    Attributes:
        layers: Layer name (one of `LAYERS`) to ``"active"``, ``"off"`` (configured off)
            or ``"unavailable: <why>"``.
        notes: Details worth logging once (Landlock ABI, skipped paths, closed descriptors).
    """

    layers: dict[str, str]
    notes: tuple[str, ...] = field(default=())

    def active(self, name: str) -> bool:
        """Return whether layer ``name`` is in force."""
        return self.layers.get(name) == "active"

    def to_dict(self) -> dict[str, str]:
        """Return a copy of the layer states, for `Pool.isolation_report()` and logs."""
        return dict(self.layers)


def apply_sandbox(
    *,
    limits: Limits,
    scratch_dir: str,
    read_paths: Sequence[str],
    allow_fds: Sequence[int] = (),
    parent_pid: int | None = None,
) -> SandboxReport:
    """Confine the calling process for good; call once, before any other thread exists.

    Every descriptor above 2 that is not in ``allow_fds`` is closed first. Then
    pdeathsig, rlimits, no_new_privs, Landlock and seccomp are applied in that
    order. None of this can be undone by the process or its children.

    Args:
        limits: The session's limits; ``memory_bytes``, ``cpu_time_s``, ``max_file_bytes``
            and ``max_open_files`` become rlimits, and ``max_processes == 0`` makes seccomp
            deny fork (``None`` or more allow it; exec is always denied).
        scratch_dir: Absolute path of an existing directory; the only writable place.
        read_paths: Absolute paths readable (not writable) afterwards, beside `SYSTEM_READ_PATHS`;
            missing ones are skipped. A sibling of a path here stays unreadable.
        allow_fds: Descriptors to keep open (the channel to the host); 0, 1 and 2 are always kept.
        parent_pid: The host's pid; if the worker's parent is already another process when
            pdeathsig is set (the host died during start-up), the worker kills itself. Defaults
            to the parent seen when this module was imported.

    Returns:
        Which layers are active; unavailable ones carry the kernel's reason.

    Raises:
        ConfigError: An argument is invalid or other threads already run (they would
            escape Landlock); nothing was applied.
    """
    scratch, paths, keep = _check_args(scratch_dir, read_paths, allow_fds)
    notes: list[str] = []
    _close_other_fds(keep, notes)
    layers = {
        "pdeathsig": _apply_pdeathsig(parent_pid),
        "rlimits": _apply_rlimits(limits, notes),
        "no_new_privs": _apply_no_new_privs(),
    }
    # Both need no_new_privs (or CAP_SYS_ADMIN); without it the kernel says why.
    layers["landlock"] = _apply_landlock(scratch, paths, notes)
    layers["seccomp"] = _apply_seccomp(deny_fork=limits.max_processes == 0, notes=notes)
    return SandboxReport(layers=layers, notes=tuple(notes))


# ------------------------------------------------------------------ arguments


def _check_args(
    scratch_dir: str, read_paths: Sequence[str], allow_fds: Sequence[int]
) -> tuple[str, list[str], set[int]]:
    if not isinstance(scratch_dir, str) or not os.path.isabs(scratch_dir) or not os.path.isdir(scratch_dir):
        raise ConfigError(f"scratch_dir must be the absolute path of an existing directory, not {scratch_dir!r}")
    paths = [] if isinstance(read_paths, str) else list(read_paths)
    if isinstance(read_paths, str) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
        raise ConfigError(f"read_paths must be a sequence of absolute paths, not {read_paths!r}")
    keep = {0, 1, 2}
    for fd in allow_fds:
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise ConfigError(f"allow_fds must hold descriptor numbers, not {fd!r}")
        try:
            os.fstat(fd)
        except OSError as exc:
            raise ConfigError(f"allow_fds: descriptor {fd} is not open") from exc
        keep.add(fd)
    threads = _thread_count()
    if threads > 1:
        raise ConfigError(
            f"apply_sandbox must run before any other thread starts ({threads} threads exist); Landlock"
            " binds only the calling thread. Start threads afterwards (set OPENBLAS_NUM_THREADS=1 etc."
            " before preloading numpy)."
        )
    return os.path.realpath(scratch_dir), paths, keep


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _close_other_fds(keep: set[int], notes: list[str]) -> None:
    try:
        open_fds = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        open_fds = list(range(3, 65536 if soft == resource.RLIM_INFINITY else min(soft, 65536)))
    closed = []
    for fd in open_fds:
        if fd in keep:
            continue
        try:
            os.close(fd)
        except OSError:
            continue  # the descriptor of the listing itself, or a gap
        closed.append(fd)
    if closed:
        notes.append(f"closed inherited descriptors {closed}")


# ------------------------------------------------------------ simple layers


def _prctl(option: int, arg2: int, arg3: int = 0) -> None:
    args = (ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if _libc.prctl(ctypes.c_int(option), *args):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _unavailable(what: str, exc: OSError) -> str:
    return f"unavailable: {what}: {os.strerror(exc.errno) if exc.errno else exc}"


def _apply_pdeathsig(parent_pid: int | None) -> str:
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError as exc:
        return _unavailable("prctl(PR_SET_PDEATHSIG)", exc)
    expected = parent_pid if parent_pid is not None else _PPID_AT_IMPORT
    if (parent_pid is not None or os.getpid() == _PID_AT_IMPORT) and os.getppid() != expected:
        # The host died before the signal was armed: die as if it had died a moment later.
        os.kill(os.getpid(), signal.SIGKILL)
    return "active"


def _apply_no_new_privs() -> str:
    try:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        return _unavailable("prctl(PR_SET_NO_NEW_PRIVS)", exc)
    return "active"


def _lowered(current: int, wanted: int) -> int:
    if current == resource.RLIM_INFINITY:
        return wanted
    if wanted == resource.RLIM_INFINITY:
        return current
    return min(current, wanted)


def _apply_rlimits(limits: Limits, notes: list[str]) -> str:
    wanted: dict[str, tuple[int, int]] = {"RLIMIT_CORE": (0, 0)}
    if limits.memory_bytes is not None:
        wanted["RLIMIT_AS"] = (limits.memory_bytes, limits.memory_bytes)
    if limits.cpu_time_s is not None:
        # SIGXCPU at the soft limit (the worker may report it), SIGKILL two seconds later.
        soft = math.ceil(limits.cpu_time_s)
        wanted["RLIMIT_CPU"] = (soft, soft + 2)
    if limits.max_file_bytes is not None:
        wanted["RLIMIT_FSIZE"] = (limits.max_file_bytes, limits.max_file_bytes)
    if limits.max_open_files is not None:
        wanted["RLIMIT_NOFILE"] = (limits.max_open_files, limits.max_open_files)
    # RLIMIT_NPROC is left alone: it counts every task of the real uid system-wide (other
    # workers' threads included), so a per-worker value breaks thread creation, and root
    # ignores it. Seccomp's clone rule is the fork block.
    failures = []
    for name, (soft, hard) in wanted.items():
        res = getattr(resource, name)
        try:
            cur_soft, cur_hard = resource.getrlimit(res)
            new_hard = _lowered(cur_hard, hard)
            resource.setrlimit(res, (_lowered(new_hard, soft), new_hard))
        except (OSError, ValueError) as exc:
            failures.append(f"{name}: {exc}")
    if failures:
        notes.append(f"rlimits not applied: {'; '.join(failures)}")
        return f"unavailable: {failures[0]}"
    if len(wanted) == 1:
        notes.append("rlimits: only core dumps are disabled (every limit is None)")
        return "off"
    return "active"


def _syscall(nr: int, *args: int) -> int:
    result = int(_libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args)))
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


# ------------------------------------------------------------------ landlock

_LANDLOCK_CREATE_RULESET = 444  # same numbers on x86_64 and aarch64 (asm-generic table)
_LANDLOCK_ADD_RULE = 445
_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_BLOCK = 1 << 11
_FS_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _apply_landlock(scratch: str, read_paths: list[str], notes: list[str]) -> str:
    try:
        abi = _syscall(_LANDLOCK_CREATE_RULESET, 0, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    except OSError as exc:
        return _unavailable("landlock_create_ruleset", exc)
    handled = _FS_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    handled |= _FS_IOCTL_DEV if abi >= 5 else 0
    # No rule ever grants a port, so handling TCP means no bind and no connect.
    attr = _RulesetAttr(
        handled_access_fs=handled,
        handled_access_net=_NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
        scoped=_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # older kernels reject unknown fields
    read = _FS_READ_FILE | _FS_READ_DIR
    # Scratch gets everything but exec and device nodes (a root worker could mknod the disk).
    rules = [(scratch, handled & ~(_FS_EXECUTE | _FS_MAKE_CHAR | _FS_MAKE_BLOCK))]
    rules += [(p, read) for p in (*read_paths, *SYSTEM_READ_PATHS, *_DEVICE_READ)]
    rules += [(p, _FS_READ_FILE | _FS_WRITE_FILE | (handled & _FS_TRUNCATE)) for p in _DEVICE_READ_WRITE]
    try:
        ruleset_fd = _syscall(_LANDLOCK_CREATE_RULESET, ctypes.addressof(attr), size, 0)
    except OSError as exc:
        return _unavailable("landlock_create_ruleset", exc)
    skipped = []
    try:
        for path, access in rules:
            if not _add_path_rule(ruleset_fd, path, access & handled):
                skipped.append(path)
        _syscall(_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0)
    except OSError as exc:
        return _unavailable(f"landlock ({exc.filename or 'restrict_self'})", exc)
    finally:
        os.close(ruleset_fd)
    scope = ", signal and abstract-socket scoping" if abi >= 6 else ""
    notes.append(f"landlock ABI {abi}: filesystem{', TCP bind/connect' if abi >= 4 else ''}{scope}")
    if skipped:
        notes.append(f"landlock: missing paths skipped: {skipped}")
    return "active"


def _add_path_rule(ruleset_fd: int, path: str, access: int) -> bool:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_RIGHTS  # the kernel rejects directory rights on a file
        rule = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        try:
            _syscall(_LANDLOCK_ADD_RULE, ruleset_fd, _LANDLOCK_RULE_PATH_BENEATH, ctypes.addressof(rule), 0)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        os.close(fd)
    return True


# ------------------------------------------------------------------- seccomp

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
_X32_SYSCALL_BIT = 0x40000000

# Syscalls denied with EPERM, by architecture. Fork-like ones are listed apart
# because max_processes > 0 (or None) allows them.
_DENY = {
    "x86_64": {
        "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "accept4": 288,
        "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "kexec_load": 246, "kexec_file_load": 320, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "setns": 308, "unshare": 272, "bpf": 321, "perf_event_open": 298, "keyctl": 250,
        "add_key": 248, "request_key": 249, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "iopl": 172, "ioperm": 173,
        "open_by_handle_at": 304, "pidfd_getfd": 438,
    },
    "aarch64": {
        "socket": 198, "connect": 203, "accept": 202, "bind": 200, "listen": 201, "accept4": 242,
        "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "kexec_load": 104, "kexec_file_load": 294, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "setns": 268, "unshare": 97, "bpf": 280, "perf_event_open": 241, "keyctl": 219,
        "add_key": 217, "request_key": 218, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225,
        "open_by_handle_at": 265, "pidfd_getfd": 438,
    },
}  # fmt: skip
_DENY_FORK = {"x86_64": {"fork": 57, "vfork": 58}, "aarch64": {}}
_CLONE = {"x86_64": 56, "aarch64": 220}
_SOCKETPAIR = {"x86_64": 53, "aarch64": 199}
_CLONE3 = 435  # ENOSYS, so glibc falls back to clone, whose flags a filter can read

_CLONE_THREAD = 0x00010000
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NAMESPACES = 0x7E020000
_AF_UNIX = 1

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
# Offsets in struct seccomp_data; args[0] low 32 bits come first on little-endian.
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LOW = 16


def _machine() -> str | None:
    machine = os.uname().machine
    machine = "aarch64" if machine == "arm64" else machine
    if machine not in _AUDIT_ARCH or sys.maxsize < 2**32 or sys.byteorder != "little":
        return None
    return machine


def seccomp_denied_syscalls(*, deny_fork: bool = True) -> dict[str, str]:
    """Return what the seccomp filter does to each syscall it does not simply allow, on this machine.

    Args:
        deny_fork: Whether fork-like calls are denied (``Limits.max_processes == 0``).

    Returns:
        Syscall name to its fate (``"EPERM"``, ``"ENOSYS"`` or a condition); empty on an
        unsupported architecture.
    """
    machine = _machine()
    if machine is None:
        return {}
    fates = dict.fromkeys(_DENY[machine], "EPERM")
    if deny_fork:
        fates.update(dict.fromkeys(_DENY_FORK[machine], "EPERM"))
        fates["clone"] = "EPERM unless CLONE_THREAD without namespace flags"
    else:
        fates["clone"] = "EPERM with namespace flags"
    fates["clone3"] = "ENOSYS"
    fates["socketpair"] = "EPERM unless AF_UNIX"
    return fates


def _build_filter(machine: str, *, deny_fork: bool) -> list[tuple[int, int, int, int]]:
    eperm = (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
    allow = (_BPF_RET_K, 0, 0, _RET_ALLOW)
    prog = [
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI (i386, x32 via int 0x80) has other numbers
        (_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        prog += [(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), eperm]
    denied = dict(_DENY[machine])
    if deny_fork:
        denied.update(_DENY_FORK[machine])
    for nr in sorted(denied.values()):
        prog += [(_BPF_JEQ_K, 0, 1, nr), eperm]
    prog += [(_BPF_JEQ_K, 0, 1, _CLONE3), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    prog += [
        (_BPF_JEQ_K, 0, 4, _SOCKETPAIR[machine]),
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
        (_BPF_JEQ_K, 0, 1, _AF_UNIX),  # asyncio's self-pipe; harmless, reaches nothing outside
        allow,
        eperm,
    ]
    if deny_fork:
        prog += [
            (_BPF_JEQ_K, 0, 5, _CLONE[machine]),
            (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
            (_BPF_JSET_K, 2, 0, _CLONE_NAMESPACES),
            (_BPF_JSET_K, 0, 1, _CLONE_THREAD),
            allow,
            eperm,
        ]
    else:
        prog += [
            (_BPF_JEQ_K, 0, 4, _CLONE[machine]),
            (_BPF_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
            (_BPF_JSET_K, 0, 1, _CLONE_NAMESPACES),
            eperm,
            allow,
        ]
    prog.append(allow)
    return prog


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _apply_seccomp(*, deny_fork: bool, notes: list[str]) -> str:
    machine = _machine()
    if machine is None:
        return f"unavailable: no filter for architecture {os.uname().machine} ({sys.maxsize.bit_length() + 1}-bit)"
    insns = _build_filter(machine, deny_fork=deny_fork)
    array = (_SockFilter * len(insns))(*(_SockFilter(*insn) for insn in insns))
    prog = _SockFprog(len(insns), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    try:
        # TSYNC: threads that exist anyway (none should) get the filter too.
        _syscall(_SECCOMP_SYSCALL[machine], 1, 1, ctypes.addressof(prog))
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            return _unavailable("seccomp(SECCOMP_SET_MODE_FILTER)", exc)
        try:
            _prctl(_PR_SET_SECCOMP, 2, ctypes.addressof(prog))
        except OSError as exc2:
            return _unavailable("prctl(PR_SET_SECCOMP)", exc2)
    notes.append(f"seccomp: {machine} filter of {len(insns)} instructions; fork {'denied' if deny_fork else 'allowed'}")
    return "active"
