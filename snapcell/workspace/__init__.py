"""Session files: a workspace directory persisted with the checkpoint as blobs, read-only mounts, artifacts.

The worker owns the directory (`Workspace`); the host checks the file list a worker reports with this package's
path rule (in `snapcell.session`, with every other check of a dump) and never opens a file in it. Its names are
imported on first use (`snapcell._support._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.workspace._local import Workspace, attach_snapshot, empty_dir
    from snapcell.workspace._paths import (
        MAX_FILES,
        OUT_DIR,
        FileInfo,
        check_mounts,
        check_path,
        effective_quota,
        media_type,
    )
    from snapcell.workspace._setup import STAGING_DIR, TMP_DIR, WORKSPACE_DIR, prepare_scratch

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.workspace._local": (
        "Workspace",
        "attach_snapshot",
        "empty_dir",
    ),
    "snapcell.workspace._paths": (
        "MAX_FILES",
        "OUT_DIR",
        "FileInfo",
        "check_mounts",
        "check_path",
        "effective_quota",
        "media_type",
    ),
    "snapcell.workspace._setup": (
        "STAGING_DIR",
        "TMP_DIR",
        "WORKSPACE_DIR",
        "prepare_scratch",
    ),
}

__all__ = [
    "MAX_FILES",
    "OUT_DIR",
    "STAGING_DIR",
    "TMP_DIR",
    "WORKSPACE_DIR",
    "FileInfo",
    "Workspace",
    "attach_snapshot",
    "check_mounts",
    "check_path",
    "effective_quota",
    "empty_dir",
    "media_type",
    "prepare_scratch",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
