"""The host's checks of the workspace files a worker puts in a checkpoint, before the host signs it.

The worker is hostile: its file list must be normalized, unique paths, no file inside another file's path,
nothing inside a mount, sizes that match their chunks, every chunk listed once in the checkpoint's blobs,
at most `MAX_FILES` files, and a total within the quota.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from snapcell.errors import WorkspacePathError, WorkspaceQuotaExceeded
from snapcell.workspace._paths import MAX_FILES, check_path

if TYPE_CHECKING:
    from snapcell.checkpoint import Manifest

__all__ = ["ForgedFiles", "check_files", "effective_quota"]


class ForgedFiles(Exception):
    """A worker's workspace file list breaks the rules no honest worker breaks."""


def effective_quota(workspace_bytes: int | None, max_scratch_bytes: int | None) -> int | None:
    """The workspace quota in force: the smaller of the persisted quota and the scratch size (None: no quota)."""
    bounds = [b for b in (workspace_bytes, max_scratch_bytes) if b is not None]
    return min(bounds) if bounds else None


def check_files(manifest: Manifest, *, quota_bytes: int | None, mounts: Collection[str] = ()) -> int:
    """Check a dump's workspace files against its blob list and the quota; return their total size.

    Raises:
        ForgedFiles: The list is malformed (only a broken or compromised worker sends one).
        WorkspaceQuotaExceeded: The files are over the quota.
    """
    from snapcell.checkpoint import CHUNK_BYTES  # the host side only: a worker imports this module too

    files = manifest.files
    if len(files) > MAX_FILES:
        raise ForgedFiles(f"{len(files)} workspace files, more than {MAX_FILES}")
    raw = {ref.hash: ref.raw_bytes for ref in manifest.blobs}
    if len(raw) != len(manifest.blobs):
        raise ForgedFiles("a blob is listed twice")
    seen: set[str] = set()
    total = 0
    for entry in files:
        try:
            path = check_path(entry.path, mounts=mounts, writing=True)
        except WorkspacePathError as exc:
            raise ForgedFiles(str(exc)) from None
        if path != entry.path or path in seen:
            raise ForgedFiles(f"workspace path {entry.path[:200]!r} is not normalized or not unique")
        seen.add(path)
        expected = -(-entry.size_bytes // CHUNK_BYTES)
        if len(entry.chunks) != expected:
            raise ForgedFiles(f"workspace file {path!r} has {len(entry.chunks)} chunks for {entry.size_bytes} bytes")
        for index, key in enumerate(entry.chunks):
            want = min(CHUNK_BYTES, entry.size_bytes - index * CHUNK_BYTES)
            if raw.get(key) != want:
                raise ForgedFiles(f"chunk {key[:40]!r} of workspace file {path!r} is not a listed blob of its size")
        total += entry.size_bytes
    for path in seen:  # "a" and "a/b" cannot both be files
        parent = path.rpartition("/")[0]
        while parent:
            if parent in seen:
                raise ForgedFiles(f"workspace file {parent!r} is also a directory")
            parent = parent.rpartition("/")[0]
    if quota_bytes is not None and total > quota_bytes:
        raise WorkspaceQuotaExceeded(
            f"the workspace holds {total:,} bytes of files, over its quota of {quota_bytes:,} bytes "
            "(Limits.workspace_bytes); nothing was saved",
            limit="workspace_bytes",
            value=quota_bytes,
            used_bytes=total,
        )
    return total
