"""Privilege layers of the worker sandbox: no capabilities, an unprivileged uid, a bounded scratch directory.

Used by `_sandbox.apply_sandbox` inside the worker, and by the host for the worker's identity and scratch.

When the host runs as root, each worker switches to an unprivileged uid (by default one of its own,
``WORKER_UID_BASE + pid``, so that ``RLIMIT_NPROC``, which counts every task of a real uid, bounds
this worker's threads alone; ``SNAPCELL_WORKER_UID`` fixes one uid for all workers instead) and the
gid ``SNAPCELL_WORKER_GID`` (default 65534, "nogroup"), with no supplementary groups. Every
capability set is emptied (effective, permitted, inheritable, ambient, bounding) and the securebits
are locked so none can come back.

An unprivileged uid cannot walk into the Python installation when it lies under a directory only
root may enter (``/root/.pyenv``, mode 0700), and the stdlib is imported lazily. So before the
switch, every import root (each ``sys.path`` directory and the directory of each imported top-level
package) is opened, and ``sys.path`` and packages' ``__path__`` are pointed at
``/proc/self/fd/N/...``: the kernel resolves that magic link to the open directory without walking
its ancestors again, and Landlock then judges the real file as usual.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Mapping
from typing import Any

from snapcell.errors import ConfigError, SandboxError

__all__ = [
    "WORKER_UID_BASE",
    "detach_mount",
    "drop_privileges",
    "layer_error",
    "mount_scratch",
    "pin_import_paths",
    "sweep_stale_scratch",
    "worker_identity",
]

# Base of the automatic per-worker uids (``WORKER_UID_BASE + pid``): inside the range systemd leaves to
# container user namespaces, far from regular and system users, below 2**31.
WORKER_UID_BASE = 1_000_000_000
_DEFAULT_GID = 65534

_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT and NO_CAP_AMBIENT_RAISE set, and locked with NO_SETUID_FIXUP and KEEP_CAPS (both off): uid 0 never
# regains capabilities, a uid change always clears them, and no ambient capability can be raised.
_SECUREBITS = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)
_CAPSET = {"x86_64": 126, "aarch64": 91}
_CAPGET = {"x86_64": 125, "aarch64": 90}
_CAP_VERSION_3 = 0x20080522
_CAP_SETPCAP = 8
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_UMOUNT_NOFOLLOW = 8
_SCRATCH_DEVICE = "snapcell-scratch"
# ENOSYS/EOPNOTSUPP: the kernel lacks the feature. ENODEV: no tmpfs. EPERM: root without CAP_SYS_ADMIN (a
# container), which may not mount: the host lacks the privilege, as a non-root host does.
_MISSING = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENODEV, errno.EPERM)

_libc = ctypes.CDLL(None, use_errno=True)
# ctypes makes (and keeps) a function object for a name on its first use: made here, at import (in a zygote, once),
# rather than by every forked worker.
_RESOLVED = [getattr(_libc, name) for name in ("prctl", "mount", "umount2", "syscall")]


def layer_error(layer: str, what: str, err: int | None) -> SandboxError:
    """The error for a layer whose set-up failed for a reason other than a missing kernel feature."""
    reason = f"{os.strerror(err)} (errno {err})" if err else "failed"
    return SandboxError(
        f"sandbox layer {layer} could not be applied: {what}: {reason}; the worker did not start. This is a bug"
        " or an unusual kernel configuration, not a missing feature; report it with `uname -a`.",
        layer=layer,
        errno=err,
    )


def _check(layer: str, what: str, result: int) -> int:
    if result == -1:
        raise layer_error(layer, what, ctypes.get_errno())
    return result


def _prctl(option: int, arg2: int, arg3: int = 0) -> int:
    args = (ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0))
    return int(_libc.prctl(ctypes.c_int(option), *args))


# ------------------------------------------------------------------ host side


def worker_identity(pid: int, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the uid and gid the worker ``pid`` should switch to, from the host's environment.

    Args:
        pid: The worker's process id (the automatic uid is ``WORKER_UID_BASE + pid``).
        environ: Where ``SNAPCELL_WORKER_UID`` / ``SNAPCELL_WORKER_GID`` are read; `os.environ` by default.

    Returns:
        ``{"uid": int, "gid": int}`` when this process is root, else ``{"uid": None, "gid": None}`` (a worker
        of an unprivileged host keeps the host's uid and only sheds its capabilities).

    Raises:
        ConfigError: A variable is not a whole number, or names uid or gid 0.
    """
    env = os.environ if environ is None else environ
    if os.geteuid() != 0:
        return {"uid": None, "gid": None}
    auto = WORKER_UID_BASE + pid
    # In a user namespace (a container's root) only mapped uids exist; fall back to "nobody" there.
    ids = {"uid": auto if _uid_mapped(auto) else _DEFAULT_GID, "gid": _DEFAULT_GID}
    for key in ("uid", "gid"):
        raw = env.get(f"SNAPCELL_WORKER_{key.upper()}", "").strip()
        if not raw:
            continue
        if not raw.isdigit() or not 0 < int(raw) < 2**32 - 1:
            raise ConfigError(f"SNAPCELL_WORKER_{key.upper()} must be a {key} other than 0, not {raw!r}")
        ids[key] = int(raw)
    return ids


# The uid ranges of ``uid_map`` files read so far. A namespace's map is written once and never changes (the kernel
# refuses a second write), so it is read once per process rather than once per worker start; an empty map (not
# written yet) is read again next time.
_UID_RANGES: dict[str, list[tuple[int, int]]] = {}


def _uid_mapped(uid: int, uid_map: str = "/proc/self/uid_map") -> bool:
    ranges = _UID_RANGES.get(uid_map)
    if ranges is None:
        try:
            with open(uid_map) as lines:
                rows = [line.split() for line in lines]
        except OSError:
            return True  # no user namespaces here: every uid exists
        ranges = [(int(r[0]), int(r[2])) for r in rows if len(r) == 3 and all(f.isdigit() for f in r)]
        if ranges:
            _UID_RANGES[uid_map] = ranges
    return any(first <= uid < first + count for first, count in ranges)


def detach_mount(path: str) -> bool:
    """Detach (MNT_DETACH) the mount on ``path`` itself, never through a symlink; whether there was one to detach.

    One system call: the kernel refuses a path that is not a mount's root (EINVAL), and a host that may not unmount
    (EPERM) has no mounts to detach, so ``path`` need not be checked first.
    """
    return bool(path) and _libc.umount2(os.fsencode(path), ctypes.c_int(_MNT_DETACH | _UMOUNT_NOFOLLOW)) == 0


def _worker_alive(pid: int, uid: int) -> bool:
    """Whether process ``pid`` runs with real uid ``uid``, or still with the host's (a zombie is not the worker).

    A worker mounts its scratch as root and only then switches to ``uid``: in between, a sweep by any other
    worker start on the machine must not take it for dead. A pid reused by another process of the host's uid
    keeps the mount until that process ends: a mount kept a while, never a live worker's unmounted.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status.read().splitlines() if ":" in line)
    except OSError:
        return False
    real_uid = fields.get("Uid", "").split()[:1]
    return not fields.get("State", "").strip().startswith(("Z", "X")) and real_uid in ([str(uid)], [str(os.getuid())])


# Pids of the workers this host process has started and not yet released: their mounts are never stale, even in
# the moment between a worker mounting its scratch and switching to its uid (when it still runs as root).
LIVE_WORKER_PIDS: set[int] = set()


def sweep_stale_scratch(mounts_file: str = "/proc/self/mounts") -> list[str]:
    """Unmount scratch tmpfs mounts left by workers that are gone (their host was killed before it could).

    Only mounts this module made (device ``snapcell-scratch``) with an automatic worker uid are touched,
    and only when the worker they name (``uid - WORKER_UID_BASE``) no longer exists and is not one of this
    process's own (`LIVE_WORKER_PIDS`).

    Returns:
        The mount points unmounted.
    """
    swept: list[str] = []
    try:
        with open(mounts_file) as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return swept
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[0] != _SCRATCH_DEVICE or fields[2] != "tmpfs":
            continue
        uid = next((int(o[4:]) for o in fields[3].split(",") if o.startswith("uid=") and o[4:].isdigit()), 0)
        pid = uid - WORKER_UID_BASE
        if uid > WORKER_UID_BASE and pid not in LIVE_WORKER_PIDS and not _worker_alive(pid, uid):
            point = fields[1].encode().decode("unicode_escape")  # mounts escapes spaces as \040
            if detach_mount(point):
                swept.append(point)
    return swept


# ----------------------------------------------------------------- worker side


def mount_scratch(scratch: str, *, size_bytes: int, uid: int | None, gid: int | None) -> str:
    """Mount a tmpfs of ``size_bytes`` on ``scratch`` (the current directory moves onto it).

    The mount lives in the host's mount namespace, so the host sees the files as before; the host
    unmounts it when the worker ends (`detach_mount`).

    Returns:
        ``"active"``, or ``"unavailable: ..."`` when this process may not mount (not root) or the kernel
        has no tmpfs.

    Raises:
        SandboxError: The mount failed for another reason.
    """
    if os.geteuid() != 0:
        return "unavailable: mounting a tmpfs needs root (the host is not root); scratch is bounded per file only"
    inodes = max(1024, min(size_bytes // 16384, 1 << 20))
    options = f"size={size_bytes},nr_inodes={inodes},mode=0700"
    if uid is not None and gid is not None:
        options += f",uid={uid},gid={gid}"
    flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if _libc.mount(_SCRATCH_DEVICE.encode(), os.fsencode(scratch), b"tmpfs", flags, options.encode()) == -1:
        err = ctypes.get_errno()
        if err in _MISSING:
            return f"unavailable: mount(tmpfs): {os.strerror(err)}"
        raise layer_error("scratch_quota", "mount(tmpfs)", err)
    os.chdir(scratch)
    return f"active: tmpfs of {size_bytes} bytes, {inodes} inodes"


# Resolved import paths, filled by `warm_import_paths` in a zygote so that its forked workers need not resolve the
# same few hundred package directories again (an lstat per path component) on every checkout.
_REALPATHS: dict[str, str] = {}


def _realpath(path: str) -> str:
    real = _REALPATHS.get(path)
    if real is None:
        real = _REALPATHS[path] = os.path.realpath(path)
    return real


# Which imported modules are packages, by name and module object (a getattr may run a module's lazy __getattr__).
_PACKAGES: dict[str, tuple[object, bool]] = {}


def _is_package(name: str, module: object) -> bool:
    known = _PACKAGES.get(name)
    if known is not None and known[0] is module:
        return known[1]
    return isinstance(getattr(module, "__path__", None), list)


# The imported packages as `warm_import_paths` last found them, and how many modules were imported then. A forked
# worker whose ``sys.modules`` has not grown since takes this list rather than walking every module: the walk writes
# each module's reference count, and so copies one page per module from its zygote (~700 faults, ~1.5 ms).
_PACKAGE_LIST: list[tuple[str, object]] = []
_MODULES_SEEN = 0
_RETIRED_FINDER_CACHES: list[dict[str, Any]] = []


def warm_import_paths() -> None:
    """Resolve ``sys.path`` and every imported package's ``__path__`` now, for `pin_import_paths` after a fork."""
    global _MODULES_SEEN
    for entry in sys.path:
        if entry:
            _realpath(entry)
    modules = list(sys.modules.items())
    _PACKAGE_LIST.clear()
    for name, module in modules:
        paths = getattr(module, "__path__", None)
        _PACKAGES[name] = (module, isinstance(paths, list))
        if isinstance(paths, list):
            _PACKAGE_LIST.append((name, module))
            for entry in paths:
                if isinstance(entry, str):
                    _realpath(entry)
    _MODULES_SEEN = len(modules)


def _packages() -> list[Any]:
    """The imported packages: those `warm_import_paths` listed if no module was imported or removed since."""
    modules = sys.modules
    if len(modules) == _MODULES_SEEN and all(modules.get(name) is module for name, module in _PACKAGE_LIST):
        return [module for _, module in _PACKAGE_LIST]
    return [m for name, m in list(modules.items()) if _is_package(name, m)]


# The import roots this process has pinned (real directory -> O_PATH descriptor), the `sys.modules` size and the
# ``sys.path`` entries as the last pin left them. A zygote pins before it forks: its children inherit the descriptors
# and the rewritten paths, and a child's own pin then opens, rewrites and replaces nothing unless it imported since.
_ROOTS: dict[str, int] = {}
_PINNED_MODULES = -1
_PINNED_PATH: list[str] = []
_FD_LINKS = "/proc/self/fd/"


def pinned_descriptors() -> list[int]:
    """The descriptors of the import roots pinned so far (inherited from a zygote, or opened here); keep them open."""
    return list(_ROOTS.values())


def _pinned_already(entry: object, own: set[str]) -> bool:
    """Whether ``entry`` is a path through one of this process's pinned roots (no realpath needed)."""
    if not isinstance(entry, str) or not entry.startswith(_FD_LINKS):
        return False
    return entry[len(_FD_LINKS) :].split(os.sep, 1)[0] in own


def _through_root(path: Any) -> str | None:
    """``path`` as a link through the pinned root that holds it, or None."""
    real = _realpath(path)
    for root, fd in _ROOTS.items():
        if real == root or real.startswith(root + os.sep):
            return f"{_FD_LINKS}{fd}{real[len(root) :]}"
    return None


def _add_root(path: Any, own: set[str]) -> None:
    real = _realpath(path)
    if real in _ROOTS or _through_root(real) is not None or not os.path.isdir(real):
        return
    fd = _ROOTS[real] = os.open(real, os.O_PATH | os.O_DIRECTORY)
    own.add(str(fd))


def _repin(paths: list[Any], new: list[Any]) -> bool:
    """Give ``paths`` the entries ``new`` if they differ (a write copies the list's page from the zygote)."""
    if new == paths:
        return False
    paths[:] = new
    return True


def pin_import_paths() -> list[int]:
    """Point ``sys.path`` and packages' ``__path__`` at ``/proc/self/fd/N`` links to open directories.

    Incremental: entries pinned by an earlier call (in this process, or in the zygote it was forked from) are left
    alone, a list is rewritten only when one of its entries changes, and ``sys.path_importer_cache`` is replaced only
    then. With nothing imported and ``sys.path`` unchanged since the last pin, it touches no module at all.

    Returns:
        Every pinned root's descriptor (the earlier ones too); they must stay open.

    Raises:
        OSError: An import root could not be opened; the roots opened before it stay pinned.
    """
    global _PINNED_MODULES
    if _PINNED_MODULES == len(sys.modules) and sys.path == _PINNED_PATH:
        return pinned_descriptors()
    own = {str(fd) for fd in _ROOTS.values()}

    def pin(entry: Any) -> Any:
        return entry if _pinned_already(entry, own) else _through_root(entry) or entry

    stale = [
        m.__path__ for m in _packages() if any(isinstance(e, str) and not _pinned_already(e, own) for e in m.__path__)
    ]
    for entry in [e for e in sys.path if e] + [e for paths in stale for e in paths if isinstance(e, str)]:
        if not _pinned_already(entry, own) and _through_root(entry) is None:
            _add_root(entry, own)
    changed = _repin(sys.path, [pin(e) for e in sys.path if e])
    for paths in stale:
        changed = _repin(paths, [pin(e) if isinstance(e, str) else e for e in paths]) or changed
    if changed:
        # A fresh cache rather than clear(): the old finders (all of real paths no import names any more) are kept as
        # they are, in pages shared with the zygote; freeing them would copy ~500 of those pages.
        _RETIRED_FINDER_CACHES.append(sys.path_importer_cache)
        sys.path_importer_cache = {}
    _PINNED_MODULES = len(sys.modules)
    _PINNED_PATH[:] = sys.path
    return pinned_descriptors()


def drop_privileges(*, uid: int | None, gid: int | None, arch: str | None) -> str:
    """Leave no capability in any set and, when root, switch to ``uid``/``gid`` with no supplementary groups.

    Call after every path this process needs has been opened (Landlock rules, `pin_import_paths`).

    Returns:
        ``"active: ..."`` (uid and capabilities dropped, or no capabilities held by a non-root process),
        ``"off"`` (root and no uid given: capabilities dropped, uid 0 kept).

    Raises:
        SandboxError: A step failed, or capabilities remain afterwards.
    """
    root = os.geteuid() == 0
    # Shrinking the bounding set and locking securebits need CAP_SETPCAP, which a hardened container's root may
    # lack; then the bounding set stays, unusable: permitted and effective are emptied, and exec is denied.
    setpcap = arch is not None and bool(_capabilities(arch)[0] & (1 << _CAP_SETPCAP))
    if setpcap:
        _check("privileges", "prctl(PR_SET_SECUREBITS)", _prctl(_PR_SET_SECUREBITS, _SECUREBITS))
        cap = 0
        while _prctl(_PR_CAPBSET_DROP, cap) == 0:  # EINVAL past the last capability this kernel knows
            cap += 1
        if ctypes.get_errno() != errno.EINVAL or cap == 0:
            raise layer_error("privileges", f"prctl(PR_CAPBSET_DROP, {cap})", ctypes.get_errno())
    if _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL) == -1 and ctypes.get_errno() != errno.EINVAL:
        raise layer_error("privileges", "prctl(PR_CAP_AMBIENT_CLEAR_ALL)", ctypes.get_errno())
    if root and uid is not None and gid is not None:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            what = f"switching to uid {uid} gid {gid} (mapped in this user namespace? see SNAPCELL_WORKER_UID)"
            raise layer_error("privileges", what, exc.errno) from None
    if arch is not None:
        _set_capabilities_to_zero(arch)
    left = _capabilities(arch)
    if any(left) or (setpcap and _bounding_set()):
        raise layer_error("privileges", f"capabilities left after the drop: {left}", None)
    if root and uid is None:
        return "off"
    sets = "effective, permitted, inheritable, ambient" + (", bounding; securebits locked" if setpcap else "")
    if not root:
        return f"active: uid {os.getuid()} (the host's, which is not root), no capabilities ({sets})"
    return f"active: uid {os.getuid()} gid {os.getgid()}, no supplementary groups, no capabilities ({sets})"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CapPair = _CapData * 2  # the array type made once, not on every worker's first capget


def _set_capabilities_to_zero(arch: str) -> None:
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = _CapPair()
    result = _libc.syscall(ctypes.c_long(_CAPSET[arch]), ctypes.byref(header), ctypes.byref(data))
    _check("privileges", "capset", int(result))


def _capabilities(arch: str | None) -> tuple[int, int, int]:
    """Effective, permitted and inheritable sets of this thread (zeros where capget is unknown)."""
    if arch is None:
        return (0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = _CapPair()
    _check("privileges", "capget", int(_libc.syscall(ctypes.c_long(_CAPGET[arch]), ctypes.byref(header), data)))
    low, high = data[0], data[1]
    return (
        low.effective | high.effective << 32,
        low.permitted | high.permitted << 32,
        low.inheritable | high.inheritable << 32,
    )


def _bounding_set() -> int:
    caps, cap = 0, 0
    while (held := _prctl(_PR_CAPBSET_READ, cap)) >= 0:
        caps |= held << cap
        cap += 1
    return caps
