"""Workspace rules the host and the worker share: what a path may be, how many files, the quota in force.

A workspace path is relative, POSIX, made of non-empty components other than ``.`` and ``..``, without NUL,
at most 1024 characters and 64 components, each at most 255 bytes. It holds no control character, line or
paragraph separator or bidirectional override: a path is shown to people and models (an artifact's name in an
answer, a file listing), and such characters would let a file's name forge lines or reorder what is shown.
``a//b`` and ``./a`` are normalized to ``a/b`` and ``a``; the checkpoint stores only normalized paths.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from snapcell.errors import ConfigError, WorkspacePathError

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = [
    "FileInfo",
    "MAX_FILES",
    "MAX_MOUNTS",
    "MAX_PATH_CHARS",
    "OUT_DIR",
    "check_mounts",
    "check_path",
    "effective_quota",
    "media_type",
]

MAX_PATH_CHARS = 1024
MAX_DEPTH = 64
MAX_FILES = 10_000
MAX_MOUNTS = 16
# Files the script writes here during a run come back as artifacts (`RunResult.files`).
OUT_DIR = "out"
_MEDIA_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "svg": "image/svg+xml",
    "webp": "image/webp",
    "pdf": "application/pdf",
    "csv": "text/csv",
    "tsv": "text/tab-separated-values",
    "txt": "text/plain",
    "md": "text/markdown",
    "html": "text/html",
    "json": "application/json",
    "xml": "application/xml",
    "parquet": "application/vnd.apache.parquet",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "zip": "application/zip",
}


def effective_quota(workspace_bytes: int | None, max_scratch_bytes: int | None) -> int | None:
    """The workspace quota in force: the smaller of the persisted quota and the scratch size (None: no quota)."""
    bounds = [b for b in (workspace_bytes, max_scratch_bytes) if b is not None]
    return min(bounds) if bounds else None


def media_type(path: str) -> str:
    """The media type of a file by its extension (a fixed table: the system's mime.types is not readable here)."""
    _, dot, ext = path.rpartition(".")
    return _MEDIA_TYPES.get(ext.lower(), "application/octet-stream") if dot else "application/octet-stream"


@dataclass(frozen=True, slots=True, kw_only=True)
class FileInfo:
    """A file in a session's workspace.

    Attributes:
        path: Its path relative to the workspace (``"data/clean.csv"``).
        size_bytes: Its size.
        media_type: Its media type from the extension (``"text/csv"``).
    """

    path: str
    size_bytes: int
    media_type: str


def check_path(path: object, *, mounts: Collection[str] = (), writing: bool = False) -> str:
    """Return the normalized form of a workspace path, or refuse it.

    Args:
        path: The path (text or a path object), relative to the workspace.
        mounts: Names of the session's read-only mounts (top-level directories).
        writing: The path is to be written: a path inside a mount is refused.

    Raises:
        WorkspacePathError: The path is empty, absolute, climbs out with ``..``, is too long, or writes into a mount.
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        raise WorkspacePathError(f"a workspace path must be text, not {type(path).__name__}")
    shown = text[:200]
    if not text or len(text) > MAX_PATH_CHARS or "\x00" in text:
        raise WorkspacePathError(
            f"workspace path {shown!r} must be 1 to {MAX_PATH_CHARS} characters without NUL", path=shown
        )
    if text.startswith("/"):
        raise WorkspacePathError(
            f"workspace path {shown!r} is absolute; give a path relative to the workspace, such as 'data.csv'",
            path=shown,
        )
    unreadable = _unreadable().search(text)
    if unreadable is not None:
        raise WorkspacePathError(
            f"workspace path {shown!r} holds the character {unreadable.group()!r} (U+{ord(unreadable.group()):04X}): "
            "control characters, line separators and direction overrides are not allowed in file names",
            path=shown,
        )
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise WorkspacePathError(f"workspace path {shown!r} climbs out of the workspace with '..'", path=shown)
    if not parts or len(parts) > MAX_DEPTH or any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in parts):
        raise WorkspacePathError(f"workspace path {shown!r} names no file, or is too deep or long", path=shown)
    if writing and parts[0] in mounts:
        raise WorkspacePathError(
            f"workspace path {shown!r} is inside the read-only mount {parts[0]!r}; write elsewhere", path=shown
        )
    return "/".join(parts)


@functools.cache
def _unreadable() -> re.Pattern[str]:
    """Characters a path shown to a reader may not hold (C0 and C1 controls, DEL, line and paragraph separators,
    bidirectional embeddings, overrides and isolates); compiled on first use."""
    return re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@functools.cache
def _mount_name() -> re.Pattern[str]:
    """A mount's name; compiled on first use: a zygote says ready without it."""
    return re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_mounts(mounts: object) -> dict[str, str]:
    """Validate ``checkout(mounts=...)``: names to host directories, resolved to real absolute paths.

    Raises:
        ConfigError: ``mounts`` is not a mapping of simple names to existing absolute directories.
    """
    if mounts is None:
        return {}
    if not isinstance(mounts, Mapping):
        raise ConfigError(f"mounts must map names to host directories, not {type(mounts).__name__}")
    if len(mounts) > MAX_MOUNTS:
        raise ConfigError(f"at most {MAX_MOUNTS} mounts per session, not {len(mounts)}")
    checked: dict[str, str] = {}
    for name, source in mounts.items():
        if not isinstance(name, str) or not _mount_name().match(name) or name == OUT_DIR:
            raise ConfigError(
                f"mount name {name!r} must be a simple name such as 'data' (letters, digits, '.', '_', '-'; not 'out')"
            )
        if not isinstance(source, str | os.PathLike) or not os.path.isabs(os.fspath(source)):
            raise ConfigError(f"mount {name!r}: the host directory must be an absolute path, not {source!r}")
        real = os.path.realpath(os.fspath(source))
        if not os.path.isdir(real):
            raise ConfigError(f"mount {name!r}: {os.fspath(source)!r} is not an existing directory")
        checked[name] = real
    return checked
