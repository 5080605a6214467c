"""Sandbox layers a worker process applies to itself before it runs any script.

Called once, inside the process that will serve one session, after its imports and before the first
script (a spawned worker today; a child forked from a zygote later: every layer is applied by the
process to itself, and the seccomp filter names that process's own pid). Layers:

- ``lifetime``: the worker is a member of a pid namespace whose init is snapcell's and dies with the host, so
  the worker and every process it starts end with the host whatever they do (see `_lifetime`); made by the zygote
  or launcher before the worker exists, and only reported here.
- ``pdeathsig``: the worker gets SIGKILL when its parent dies: a second line (the seccomp filter keeps the worker
  from clearing it, but a process it forks has none; ``lifetime`` is the guarantee).
- ``rlimits``: address space, CPU seconds, file size, open files, threads (RLIMIT_NPROC, when the
  worker has a uid of its own); no core dumps.
- ``no_new_privs``: no privilege gain through set-uid programs; needed by Landlock and seccomp.
- ``landlock``: read-only access to the given paths (the Python installation), read-write access to
  the scratch directory, nothing else; no TCP bind or connect; no signals or abstract sockets out of
  the sandbox (by ABI).
- ``privileges``: no capabilities in any set, securebits locked; when the host is root, an
  unprivileged uid and gid with no supplementary groups (see `_privileges`).
- ``scratch_quota``: the scratch directory is a tmpfs of ``Limits.max_scratch_bytes`` (root only).
- ``seccomp``: an allowlist; everything else fails with EPERM (see `_seccomp`).

A layer may be ``"unavailable: <why>"`` only when the kernel truly lacks it (ENOSYS, EOPNOTSUPP, no
Landlock ABI, an architecture without a filter) or the host lacks the privilege it needs (not
root). Any other set-up failure (EINVAL from a wrong structure size, bad flags, EFAULT) raises
`SandboxError`: a broken layer never passes for a missing one. Layers named in ``require`` (from
``SNAPCELL_REQUIRE_SANDBOX``) must not be unavailable, or `SandboxError` is raised too.

Seccomp and Landlock go through raw syscalls with ctypes. libseccomp's Python binding is built from
the libseccomp sources and is not maintained on PyPI, and a classic BPF filter is easy to audit by
hand; the same holds for the three Landlock syscalls.
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import snapcell.sandbox._seccomp as _seccomp
from snapcell.errors import ConfigError, SandboxError
from snapcell.limits import Limits
from snapcell.sandbox._lifetime import layer_state
from snapcell.sandbox._privileges import (
    drop_privileges,
    layer_error,
    mount_scratch,
    pin_import_paths,
    pinned_descriptors,
    sweep_stale_scratch,
    worker_identity,
)

if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass, field

__all__ = [
    "LAYERS",
    "SandboxReport",
    "apply_sandbox",
    "is_active",
    "parse_required",
    "sandbox_failure",
    "seccomp_denied_syscalls",
    "worker_sandbox_settings",
]

LAYERS = ("lifetime", "pdeathsig", "rlimits", "no_new_privs", "landlock", "privileges", "scratch_quota", "seccomp")
# errno values that mean "this kernel does not have the feature"; anything else is a broken set-up.
_MISSING_FEATURE = (errno.ENOSYS, errno.EOPNOTSUPP)

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
_RESOLVED = [_libc.prctl, _libc.syscall]  # made at import (a zygote's), not on each worker's first call
# A parent pid seen as early as possible, for the pdeathsig race when the caller gives none.
_PID_AT_IMPORT = os.getpid()
_PPID_AT_IMPORT = os.getppid()


@dataclass(frozen=True, slots=True)
class SandboxReport:
    """Which sandbox layers a worker runs under.

    Attributes:
        layers: Layer name (one of `LAYERS`) to ``"active"`` or ``"active: <what exactly>"``
            (``"active: uid 1000000879 gid 65534, no capabilities ..."``), ``"off"`` (configured off)
            or ``"unavailable: <why>"``.
        notes: Details worth logging once (skipped paths, closed descriptors).
    """

    layers: dict[str, str]
    notes: tuple[str, ...] = field(default=())

    def active(self, name: str) -> bool:
        """Return whether layer ``name`` is in force."""
        return is_active(self.layers.get(name, ""))

    def to_dict(self) -> dict[str, str]:
        """Return a copy of the layer states, for `Pool.isolation_report()` and logs."""
        return dict(self.layers)


def is_active(state: str) -> bool:
    """Return whether a layer state (as in `SandboxReport.layers` or `Pool.isolation_report()`) is in force."""
    return state == "active" or state.startswith("active:")


def apply_sandbox(
    *,
    limits: Limits,
    scratch_dir: str,
    read_paths: Sequence[str],
    allow_fds: Sequence[int] = (),
    parent_pid: int | None = None,
    host_pid: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
    quota_scratch: bool = False,
    require: Sequence[str] = (),
    prepare_scratch: Callable[[str], Sequence[str]] | None = None,
) -> SandboxReport:
    """Confine the calling process for good; call once, before any other thread exists.

    Every descriptor above 2 that is not in ``allow_fds`` is closed first. Then the scratch tmpfs,
    rlimits, no_new_privs, Landlock, privileges, pdeathsig and seccomp are applied in that order
    (pdeathsig after the uid switch, which clears it). None of this can be undone by the process or its children
    (pdeathsig only as long as the seccomp filter refuses to clear it). The ``lifetime`` layer was made before this
    process existed, by the zygote or launcher that forked it (`_lifetime.start_pid_namespace`); it is only reported
    (and required) here, "off" in a process no snapcell zygote or launcher made.

    Args:
        limits: The session's limits; ``memory_bytes``, ``cpu_time_s``, ``max_file_bytes``,
            ``max_open_files`` and ``max_threads`` become rlimits, ``max_scratch_bytes`` sizes the
            scratch tmpfs, and ``max_processes == 0`` makes seccomp deny fork (exec is always denied).
        scratch_dir: Absolute path of an existing directory; the only writable place.
        read_paths: Absolute paths readable (not writable) afterwards, beside `SYSTEM_READ_PATHS`;
            missing ones are skipped. A sibling of a path here stays unreadable.
        allow_fds: Descriptors to keep open (the channel to the host); 0, 1 and 2 are always kept.
        parent_pid: The pid of the parent pdeathsig follows (the host, or a zygote or launcher between the host
            and this process); if the worker's parent is already another process when pdeathsig is set (it died
            during start-up), the worker kills itself. Defaults to the parent seen when this module was imported.
            A parent outside this process's pid namespace (``getppid()`` is 0) is not checked: the namespace's init
            dies with it (the ``lifetime`` layer).
        host_pid: The host's pid when ``parent_pid`` is a zygote or launcher between the host and this process:
            pdeathsig then fires when that parent dies, and the parent itself dies with the host.
        uid: When this process is root, the uid to switch to (with ``gid``); None keeps uid 0 and
            reports ``privileges`` as ``"off"``. Ignored for a process that is not root.
        gid: The gid to switch to, with ``uid``.
        quota_scratch: Mount a tmpfs of ``limits.max_scratch_bytes`` on ``scratch_dir`` (root only);
            the caller must unmount it when the process ends (`_privileges.detach_mount`).
        require: Layers that must not end up ``"unavailable"`` (see `parse_required`); ``"off"`` (configured
            off by the caller) is accepted.
        prepare_scratch: Called with the scratch path once it is mounted, before any privilege is dropped (the
            workspace lays out its directories and mounts there); returns more read-only paths for Landlock.

    Returns:
        Which layers are active; unavailable ones carry the reason.

    Raises:
        ConfigError: An argument is invalid or other threads already run (they would
            escape Landlock); nothing was applied.
        SandboxError: A layer's set-up failed other than for a missing kernel feature, or a required
            layer is unavailable; the process is partly confined and must exit without running a script.
    """
    scratch, paths, keep = _check_args(scratch_dir, read_paths, allow_fds)
    for name, value in (("uid", uid), ("gid", gid)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**32 - 1):
            raise ConfigError(f"{name} must be a {name} other than 0 (and not -1), or None, not {value!r}")
    required = parse_required(",".join(require))
    notes: list[str] = []
    # Import roots a zygote pinned before the fork: ``sys.path`` and packages lead through them already.
    _close_other_fds(keep | set(pinned_descriptors()), notes)
    arch = _seccomp.machine()
    ids = (uid, gid) if os.geteuid() == 0 and uid is not None and gid is not None else None
    switch = ids is not None
    layers: dict[str, str] = {"lifetime": layer_state()}
    if not quota_scratch or limits.max_scratch_bytes is None:
        layers["scratch_quota"] = "off"
    else:
        layers["scratch_quota"] = mount_scratch(scratch, size_bytes=limits.max_scratch_bytes, uid=uid, gid=gid)
    if ids is not None and not is_active(layers["scratch_quota"]):
        os.chown(scratch, *ids)
    if prepare_scratch is not None:
        paths = [*paths, *prepare_scratch(scratch)]
    layers["rlimits"] = _apply_rlimits(limits, notes, threads=switch)
    layers["no_new_privs"] = _apply_no_new_privs()
    if switch:
        pinned = pin_import_paths()
        notes.append(f"imports: {len(pinned)} import roots reached through /proc/self/fd")
    # Landlock needs no_new_privs (or CAP_SYS_ADMIN), and is set up while every path can still be opened.
    # A mounted scratch is also the current directory (`mount_scratch` moved there): its rule is taken through that,
    # so it names the mount this worker writes to even if the path no longer leads there (detached meanwhile).
    here = os.curdir if is_active(layers["scratch_quota"]) else scratch
    layers["landlock"] = _apply_landlock(here, paths, notes)
    layers["privileges"] = drop_privileges(uid=uid, gid=gid, arch=arch)
    layers["pdeathsig"] = _apply_pdeathsig(parent_pid, host_pid)
    layers["seccomp"] = _apply_seccomp(arch, deny_fork=limits.max_processes == 0, notes=notes)
    report = SandboxReport(layers={name: layers[name] for name in LAYERS}, notes=tuple(notes))
    for name in required:
        # "off" is the caller's own choice (no uid given, a limit set to None); "unavailable" is the machine's.
        if report.layers[name].startswith("unavailable"):
            raise SandboxError(
                f"sandbox layer {name} is required (SNAPCELL_REQUIRE_SANDBOX) but {report.layers[name]}; the worker"
                " did not start",
                layer=name,
            )
    return report


def parse_required(spec: str) -> tuple[str, ...]:
    """Parse a ``SNAPCELL_REQUIRE_SANDBOX`` value: comma-separated layer names, ``all``, or empty.

    Raises:
        ConfigError: A name is not one of `LAYERS`.
    """
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if "all" in names:
        return LAYERS
    unknown = [name for name in names if name not in LAYERS]
    if unknown:
        raise ConfigError(f"SNAPCELL_REQUIRE_SANDBOX names unknown layers {unknown}; known: all, {', '.join(LAYERS)}")
    return tuple(dict.fromkeys(names))


# Worker starts (in this process) between two sweeps of stale scratch mounts, and those left before the next one.
SWEEP_EVERY_STARTS = 16
_STARTS_UNSWEPT = 0


def worker_sandbox_settings(pid: int, scratch_root: str) -> dict[str, Any]:
    """Host side: the sandbox part of a worker's init settings (identity, scratch quota, required layers).

    When the host is root, ``scratch_root`` becomes traversable (mode 0711, not listable) so that the worker's
    uid can reach its own scratch directory by absolute path, and stale scratch mounts of dead hosts are swept on
    the first start and every `SWEEP_EVERY_STARTS` after it.

    Raises:
        ConfigError: ``SNAPCELL_WORKER_UID``/``GID`` or ``SNAPCELL_REQUIRE_SANDBOX`` is invalid.
    """
    global _STARTS_UNSWEPT
    identity = worker_identity(pid)
    root = identity["uid"] is not None
    if root:
        os.chmod(scratch_root, 0o711)
        # Only a leak is at stake (a dead host's tmpfs memory): every pool sweeps when it starts, and then every
        # `SWEEP_EVERY_STARTS` worker starts, rather than reading the whole mount table on each one.
        if _STARTS_UNSWEPT <= 0:
            sweep_stale_scratch()
            _STARTS_UNSWEPT = SWEEP_EVERY_STARTS
        _STARTS_UNSWEPT -= 1
    return {
        **identity,
        "quota_scratch": root,
        "require": list(parse_required(os.environ.get("SNAPCELL_REQUIRE_SANDBOX", ""))),
    }


def sandbox_failure(message: dict[str, Any]) -> SandboxError:
    """Host side: the `SandboxError` a worker's ``sandbox_failed`` message describes (checked, never trusted)."""
    layer, err, text = message.get("layer"), message.get("errno"), message.get("message")
    return SandboxError(
        str(text)[:2000] if isinstance(text, str) else "a worker could not apply its sandbox",
        layer=layer[:100] if isinstance(layer, str) else "unknown",
        errno=err if type(err) is int else None,
    )


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


def _unavailable_or_raise(layer: str, what: str, exc: OSError) -> str:
    """``"unavailable: ..."`` when the kernel lacks the feature; otherwise raise `SandboxError`."""
    if exc.errno in _MISSING_FEATURE:
        return f"unavailable: {what}: {os.strerror(exc.errno)}"
    raise layer_error(layer, what, exc.errno) from None


def _apply_pdeathsig(parent_pid: int | None, host_pid: int | None = None) -> str:
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError as exc:
        return _unavailable_or_raise("pdeathsig", "prctl(PR_SET_PDEATHSIG)", exc)
    expected = parent_pid if parent_pid is not None else _PPID_AT_IMPORT
    parent = os.getppid()
    if parent == 0:
        # The parent is outside this process's pid namespace (a zygote's or launcher's child), and it is never seen
        # from here, alive or not; its death ends the namespace's init, and so this process, armed or not.
        parent = expected
    elif (parent_pid is not None or os.getpid() == _PID_AT_IMPORT) and parent != expected:
        # The parent died before the signal was armed: die as if it had died a moment later.
        os.kill(os.getpid(), signal.SIGKILL)
    if host_pid is not None and host_pid != parent:
        # A zygote's or launcher's child: that parent has its own pdeathsig on the host, so the host's death reaches
        # this process in two steps.
        return f"active: SIGKILL when its parent (pid {parent}) dies, which dies with the host (pid {host_pid})"
    return f"active: SIGKILL when the host (pid {parent}) dies"


def _apply_no_new_privs() -> str:
    try:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        return _unavailable_or_raise("no_new_privs", "prctl(PR_SET_NO_NEW_PRIVS)", exc)
    return "active"


def _lowered(current: int, wanted: int) -> int:
    if current == resource.RLIM_INFINITY:
        return wanted
    if wanted == resource.RLIM_INFINITY:
        return current
    return min(current, wanted)


def _apply_rlimits(limits: Limits, notes: list[str], *, threads: bool) -> str:
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
    # RLIMIT_NPROC counts every task of the real uid system-wide, and root ignores it: it bounds this
    # worker's threads only once the worker runs under a uid of its own (``threads``). Sharing the
    # host's uid, it would count the host's threads and every other worker's.
    if limits.max_threads is not None and threads:
        wanted["RLIMIT_NPROC"] = (limits.max_threads, limits.max_threads)
    elif limits.max_threads is not None:
        notes.append("rlimits: max_threads is not enforced (the worker shares the host's uid)")
    for name, (soft, hard) in wanted.items():
        res = getattr(resource, name)
        try:
            _cur_soft, cur_hard = resource.getrlimit(res)
            new_hard = _lowered(cur_hard, hard)
            resource.setrlimit(res, (_lowered(new_hard, soft), new_hard))
        except OSError as exc:
            # Lowering a limit cannot be refused; a failure here is a bug, not a missing feature.
            raise layer_error("rlimits", f"setrlimit({name}, {soft})", exc.errno) from None
        except ValueError as exc:
            raise layer_error("rlimits", f"setrlimit({name}, {soft}): {exc}", None) from None
    if len(wanted) == 1:
        notes.append("rlimits: only core dumps are disabled (every limit is None)")
        return "off"
    shown = ", ".join(f"{name[7:]}={resource.getrlimit(getattr(resource, name))[1]}" for name in wanted)
    return f"active: {shown} (hard limits)"


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
        # ENOSYS: not built in; EOPNOTSUPP: built in but not enabled at boot.
        return _unavailable_or_raise("landlock", "landlock_create_ruleset(VERSION)", exc)
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
        # The kernel has just reported its ABI: any failure now is ours (a wrong size or flags).
        raise layer_error("landlock", f"landlock_create_ruleset(size={size})", exc.errno) from None
    skipped = []
    try:
        for path, access in rules:
            if not _add_path_rule(ruleset_fd, path, access & handled):
                skipped.append(path)
        _syscall(_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0)
    except OSError as exc:
        what = f"landlock_add_rule({exc.filename})" if exc.filename else "landlock_restrict_self"
        raise layer_error("landlock", what, exc.errno) from None
    finally:
        os.close(ruleset_fd)
    scope = ", signal and abstract-socket scoping" if abi >= 6 else ""
    if skipped:
        notes.append(f"landlock: missing paths skipped: {skipped}")
    return f"active: ABI {abi}: filesystem{', TCP bind/connect' if abi >= 4 else ''}{scope}"


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

_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_MODE_FILTER = 2


def seccomp_denied_syscalls(*, deny_fork: bool = True) -> dict[str, str]:
    """Return what the seccomp filter does to the calls it does not simply allow; see `_seccomp.denied_syscalls`."""
    return _seccomp.denied_syscalls(deny_fork=deny_fork)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _apply_seccomp(arch: str | None, *, deny_fork: bool, notes: list[str]) -> str:
    if arch is None:
        return f"unavailable: no filter for architecture {os.uname().machine} ({sys.maxsize.bit_length() + 1}-bit)"
    pid = os.getpid()
    packed = _seccomp.packed_filter(arch, pid=pid, deny_fork=deny_fork)
    count = len(packed) // ctypes.sizeof(_SockFilter)
    array = ctypes.create_string_buffer(packed, len(packed))
    prog = _SockFprog(count, ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    try:
        # TSYNC: threads that exist anyway (none should) get the filter too.
        _syscall(_SECCOMP_SYSCALL[arch], _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.addressof(prog))
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise layer_error("seccomp", "seccomp(SECCOMP_SET_MODE_FILTER)", exc.errno) from None
        try:  # kernels before 3.17 have only the prctl
            _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog))
        except OSError as exc2:
            if exc2.errno == errno.EINVAL:  # built without CONFIG_SECCOMP_FILTER
                return "unavailable: prctl(PR_SET_SECCOMP): no seccomp filter support"
            raise layer_error("seccomp", "prctl(PR_SET_SECCOMP)", exc2.errno) from None
    return (
        f"active: allowlist (default EPERM), {arch}, {count} instructions, signals and rlimits only for pid"
        f" {pid}, fork {'denied' if deny_fork else 'allowed'}; prctl, ioctl, fcntl and setsockopt options by"
        " allowlist, socketpair only AF_UNIX stream, sendto only without an address, no sendmsg"
    )
