"""New directory entries made durable: a file's own sync keeps its bytes, its directory's sync keeps its name.

Every host-side store that makes a file or a directory for durable state (checkpoints, blobs, heads, conversations)
goes through these, so none of them forgets the parent: without the parent's sync, a power loss can take a new
directory, and the files in it, on file systems that do not order metadata as ext4 does.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["fsync_dir", "make_dirs"]


def make_dirs(directory: Path, mode: int = 0o700) -> None:
    """Create ``directory`` and its missing parents, syncing each new one's parent so the new entry is durable."""
    missing = []
    at = directory
    while not at.exists() and at.parent != at:
        missing.append(at)
        at = at.parent
    directory.mkdir(parents=True, exist_ok=True, mode=mode)
    for new in reversed(missing):  # top down: an entry is synced once the directory holding it is
        fsync_dir(new.parent)


def fsync_dir(directory: Path) -> None:
    """Sync ``directory``'s entries; a platform or file system that cannot sync a directory is left as it is."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
