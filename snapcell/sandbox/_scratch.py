"""Worker scratch directories: named after their host, and reclaimed once that host is gone.

Each worker pool has a scratch directory (``snapcell-workers-<pid>-<start>-*`` in the temp directory) named
after its host process (pid and start time, so a reused pid is told apart) and holding a lock for the host's
lifetime (so a host in another pid namespace sharing the temp directory is not taken for dead). A host that is
killed or crashes cannot remove its own; `reclaim_scratch_dirs` removes those, and every new pool calls it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile

from snapcell.sandbox._privileges import detach_mount, sweep_stale_scratch

__all__ = ["detach_scratch", "remove_scratch", "make_scratch_root", "reclaim_scratch_dirs", "remove_scratch_root"]

log = logging.getLogger("snapcell")

_SCRATCH_PREFIX = "snapcell-workers-"
_SCRATCH_NAME = re.compile(re.escape(_SCRATCH_PREFIX) + r"(\d{1,10})-(\d{1,20})-[a-z0-9_]+")
_LOCK_NAME = "host.lock"


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), or None when that is unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; field 3 on follow its last ")".
    fields = text.rpartition(b")")[2].split()
    try:
        return int(fields[19])  # field 22, starttime
    except (IndexError, ValueError):
        return None


def _host_alive(pid: int, start: int) -> bool:
    """Whether the process that was ``pid`` when it started at ``start`` (0: unknown) still runs."""
    current = _process_start(pid)
    if current is not None:
        return start in (0, current)  # another start time: the pid was reused
    if os.path.isdir("/proc/self"):
        return False  # /proc is there and has no such process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, and belongs to someone else
    return True


def _lock_held(path: str) -> bool:
    """Whether some live process holds the host lock in scratch directory ``path``."""
    try:
        fd = os.open(os.path.join(path, _LOCK_NAME), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def reclaim_scratch_dirs(temp_dir: str | None = None, *, dry_run: bool = False) -> list[str]:
    """Remove the worker scratch directories of hosts that are gone (killed or crashed before closing their pool).

    A directory is removed only when it is this user's, its name says which host made it, that host no longer
    runs (its pid is gone or was reused, by start time) and no process holds its lock. Directories of live hosts,
    of other users, and of snapcell versions that did not name them are left alone. Never raises for a
    directory it cannot read or remove.

    Args:
        temp_dir: Where to look; default the temp directory new pools use (``tempfile.gettempdir()``).
        dry_run: Only list what would be removed (for ``snapcell cleanup --dry-run``).

    Returns:
        The paths removed (or, with ``dry_run``, that would be).
    """
    root = temp_dir if temp_dir is not None else tempfile.gettempdir()
    removed: list[str] = []
    if not dry_run:
        # A killed host leaves its workers' scratch tmpfs mounts behind; unmount them first, or rmtree can't go in.
        sweep_stale_scratch()
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        log.warning("snapcell: cannot list %s for stale worker directories: %s", root, exc)
        return removed
    uid = os.getuid()
    for entry in entries:
        match = _SCRATCH_NAME.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = os.lstat(entry.path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        if _host_alive(int(match.group(1)), int(match.group(2))) or _lock_held(entry.path):
            continue
        if dry_run:
            removed.append(entry.path)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    if removed and not dry_run:
        log.info("snapcell: removed %d worker directories of hosts that are gone", len(removed))
    return removed


def make_scratch_root() -> tuple[str, int]:
    """Create this pool's scratch directory, named after this process, and hold its host lock."""
    pid = os.getpid()
    root = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{pid}-{_process_start(pid) or 0}-")
    fd = os.open(os.path.join(root, _LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return root, fd


def remove_scratch_root(root: str, lock_fd: int, owner_pid: int) -> None:
    """Remove a pool's scratch directory and release its host lock (only in the process that made it)."""
    if os.getpid() != owner_pid:
        return  # a forked child exiting: the directory is still its parent's
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


def remove_scratch(path: str) -> None:
    """Remove a worker's scratch directory, unmounting its tmpfs first; call once the worker is gone."""
    detach_mount(path)
    shutil.rmtree(path, ignore_errors=True)


def detach_scratch(path: str) -> bool:
    """Make a killed worker's scratch tmpfs unreachable at once: detach it (MNT_DETACH), remove its mount point.

    For a worker already sent SIGKILL that need not be reaped first: whatever it still writes lands in the detached
    tmpfs, which no path leads to and the kernel frees when the worker is gone, and Landlock lets it write nowhere
    else (not in the directory underneath, which is empty). A check-in so returns without waiting for the kernel to
    tear down the worker's address space.

    Returns:
        True when ``path`` was a mount and is now gone. False when it was not a mount (the worker writes to the
        directory itself, which may be removed only once the worker is gone) or could not be removed.
    """
    if not detach_mount(path):
        return False
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
