"""Kernel confinement of a worker: resource limits, privileges, Landlock, seccomp, scratch, and its pid namespace."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.sandbox._lifetime import host_view_pid, launch_worker, namespace_init_pid, start_pid_namespace
    from snapcell.sandbox._privileges import LIVE_WORKER_PIDS, pin_import_paths, warm_import_paths
    from snapcell.sandbox._sandbox import apply_sandbox, sandbox_failure, worker_sandbox_settings
    from snapcell.sandbox._scratch import (
        detach_scratch,
        make_scratch_root,
        reclaim_scratch_dirs,
        remove_scratch,
        remove_scratch_root,
    )
    from snapcell.sandbox._seccomp import warm_filters

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.sandbox._lifetime": (
        "host_view_pid",
        "launch_worker",
        "namespace_init_pid",
        "start_pid_namespace",
    ),
    "snapcell.sandbox._privileges": (
        "LIVE_WORKER_PIDS",
        "pin_import_paths",
        "warm_import_paths",
    ),
    "snapcell.sandbox._sandbox": (
        "apply_sandbox",
        "sandbox_failure",
        "worker_sandbox_settings",
    ),
    "snapcell.sandbox._scratch": (
        "detach_scratch",
        "make_scratch_root",
        "reclaim_scratch_dirs",
        "remove_scratch",
        "remove_scratch_root",
    ),
    "snapcell.sandbox._seccomp": ("warm_filters",),
}

__all__ = [
    "LIVE_WORKER_PIDS",
    "apply_sandbox",
    "detach_scratch",
    "host_view_pid",
    "launch_worker",
    "make_scratch_root",
    "namespace_init_pid",
    "pin_import_paths",
    "reclaim_scratch_dirs",
    "remove_scratch",
    "remove_scratch_root",
    "sandbox_failure",
    "start_pid_namespace",
    "warm_filters",
    "warm_import_paths",
    "worker_sandbox_settings",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
