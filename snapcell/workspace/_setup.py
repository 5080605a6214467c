"""Worker side: lay out the scratch directory (workspace, temp) and attach read-only mounts, before the sandbox.

Called by the worker from `apply_sandbox` (its ``prepare_scratch`` hook), after the scratch tmpfs is mounted
and while the worker still holds the privileges it had at start-up:

- ``scratch/workspace`` is the script's working directory, persisted with the checkpoint;
- ``scratch/tmp`` is ``TMPDIR`` (library caches, temporary files), never persisted;
- each mount ``name -> /host/dir`` appears at ``workspace/name``. A root worker bind-mounts the directory
  read-only (``MS_RDONLY``, nosuid, nodev, noexec; not recursive), so writes fail with ``EROFS`` whatever
  Landlock does; an unprivileged worker makes a symlink instead. Either way the host directory gets a
  read-only Landlock rule (through the symlink, reads resolve there), and the workspace walk never
  follows or stores it.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Mapping

from snapcell.errors import SandboxError

__all__ = ["STAGING_DIR", "TMP_DIR", "WORKSPACE_DIR", "prepare_scratch"]

WORKSPACE_DIR = "workspace"
TMP_DIR = "tmp"
STAGING_DIR = ".restore"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND = 32, 4096
_libc = ctypes.CDLL(None, use_errno=True)
_RESOLVED = [_libc.mount, _libc.umount2]  # made at import (a zygote's), not on each worker's first call


def _bind_read_only(source: str, target: str) -> str | None:
    """Bind-mount ``source`` read-only on ``target``; None when done, else why not (no privilege)."""
    src, dst = os.fsencode(source), os.fsencode(target)
    if _libc.mount(src, dst, None, ctypes.c_ulong(_MS_BIND), None) == -1:
        err = ctypes.get_errno()
        if err in (errno.EPERM, errno.EACCES, errno.ENOSYS):
            return os.strerror(err)
        raise SandboxError(
            f"mount {target!r}: bind of {source!r} failed: {os.strerror(err)}", layer="mounts", errno=err
        )
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc.mount(None, dst, None, ctypes.c_ulong(flags), None) == -1:
        err = ctypes.get_errno()
        _libc.umount2(dst, ctypes.c_int(2))  # never leave it writable
        raise SandboxError(f"mount {target!r}: read-only remount failed: {os.strerror(err)}", layer="mounts", errno=err)
    return None


def prepare_scratch(
    scratch: str, *, mounts: Mapping[str, str], uid: int | None, gid: int | None
) -> tuple[list[str], list[str]]:
    """Create the workspace and temp directories and attach the mounts.

    Args:
        scratch: The scratch directory (the tmpfs, when there is one); it is the current directory, through
            which everything here is reached.
        mounts: Mount name to the host directory's real path (checked by the host).
        uid: The uid the worker will switch to (owner of what is created here), or None.
        gid: Its gid.

    Returns:
        The host directories to make readable (Landlock), and notes on how each mount was attached.

    Raises:
        SandboxError: A mount could not be attached for a reason other than missing privileges.
    """
    # Relative to the current directory, which is the scratch mount itself: never the path again, which another
    # process could have unmounted meanwhile.
    workspace = WORKSPACE_DIR
    made = []
    for path in (workspace, TMP_DIR):
        os.makedirs(path, 0o700, exist_ok=True)
        made.append(path)
    notes = []
    for name, source in sorted(mounts.items()):
        target = os.path.join(workspace, name)
        why = "not root"
        if os.geteuid() == 0:
            os.mkdir(target, 0o500)
            why_not = _bind_read_only(source, target)
            if why_not is None:
                notes.append(f"{name}: read-only bind mount of {source}")
                continue
            os.rmdir(target)
            why = why_not
        os.symlink(source, target)
        notes.append(f"{name}: symlink to {source}, read-only through Landlock ({why})")
    if uid is not None and gid is not None and os.geteuid() == 0:
        for path in made:
            os.chown(path, uid, gid)
    return sorted(set(mounts.values())), notes
