"""A forked or spawned worker's sandbox, applied once its session's settings arrive (see `_worker.serve_session`)."""

from __future__ import annotations

import os
import sys
from typing import Any

from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.workspace import prepare_scratch

__all__ = ["apply_session_sandbox", "warm_read_paths"]

# Landlock's read-only paths by ``sys.path``: computed once, in the zygote's warm-up step (`warm_read_paths`), rather
# than by every forked child (four expansions of sysconfig's paths, and the copy-on-write faults they cause).
_READ_PATHS: dict[tuple[str, ...], tuple[str, ...]] = {}


def warm_read_paths(unpinned: tuple[str, ...] | None = None) -> None:
    """Compute the sandbox's read-only paths now (in a zygote), so that its forked workers find them ready.

    Args:
        unpinned: ``sys.path`` as it was before `_privileges.pin_import_paths` rewrote it (in a zygote that pins for
            its children): the paths found for those real directories serve the pinned ``sys.path`` too.
    """
    if unpinned is None:
        _read_paths()
        return
    saved = sys.path[:]
    try:
        sys.path[:] = unpinned
        paths = _read_paths()
    finally:
        sys.path[:] = saved
    _READ_PATHS[tuple(sys.path)] = tuple(paths)


def _read_paths() -> list[str]:
    key = tuple(sys.path)
    known = _READ_PATHS.get(key)
    if known is None:
        import sysconfig

        import snapcell

        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.abspath(snapcell.__file__))}
        scheme = sysconfig.get_paths()
        paths.update(path for name in ("stdlib", "platstdlib", "purelib", "platlib") if (path := scheme.get(name)))
        paths.update(p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p)
        known = _READ_PATHS[key] = tuple(sorted(paths))
    return list(known)


def apply_session_sandbox(
    settings: dict[str, Any],
    limits: Limits,
    policy: Policy,
    keep_fds: tuple[int, ...],
    parent_pid: int | None,
    host_pid: int | None = None,
) -> dict[str, str]:
    from snapcell.sandbox import apply_sandbox

    uid, gid = settings.get("uid"), settings.get("gid")
    mounts = settings.get("mounts") or {}
    mount_notes: list[str] = []

    def prepare(scratch: str) -> list[str]:
        paths, notes = prepare_scratch(
            scratch,
            mounts={str(k): str(v) for k, v in mounts.items()},
            uid=uid if isinstance(uid, int) else None,
            gid=gid if isinstance(gid, int) else None,
        )
        mount_notes.extend(notes)
        return paths

    report = apply_sandbox(
        limits=limits,
        scratch_dir=str(settings["scratch_dir"]),
        read_paths=_read_paths(),
        allow_fds=keep_fds,
        parent_pid=parent_pid,
        host_pid=host_pid,
        uid=uid if isinstance(uid, int) else None,
        gid=gid if isinstance(gid, int) else None,
        quota_scratch=bool(settings.get("quota_scratch")),
        require=[str(name) for name in settings.get("require", ())],
        prepare_scratch=prepare,
    )
    layers: dict[str, str] = report.to_dict()
    layers["workspace"] = "active: " + ("; ".join(mount_notes) or "no mounts")
    return layers
