"""The worker's side of the workspace: its directory, files as chunks, restore, host file requests, artifacts.

Runs only in the worker (inside the sandbox), which owns the directory; the host never opens a file in it.
Every file is opened component by component with ``O_NOFOLLOW`` relative to the workspace's descriptor,
and must be a regular file (``fstat``): a symlink, FIFO or device the script made is neither followed nor
kept. Files cross to the host as content-addressed blobs, which the host hashes again before storing.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from snapcell.errors import CheckpointCorrupt, WorkspaceError, WorkspacePathError, WorkspaceQuotaExceeded
from snapcell.workspace._paths import MAX_FILES, OUT_DIR, check_path, media_type

if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass, field
if TYPE_CHECKING:
    from snapcell.checkpoint import BlobRef, Dumped, WorkspaceFile

# The checkpoint code (pydantic, zstd) is imported by the first snapshot, stage or attach: a worker's first run does
# not wait for it.

__all__ = ["Snapshot", "Workspace", "attach_snapshot", "empty_dir"]

_STAGING = ".snapcell-restore"


_F = TypeVar("_F", bound=Callable[..., Any])


def _translated(method: _F) -> _F:
    """Turn an OS error in the workspace (a file the script made unreadable, a vanished mount) into a clear one."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise WorkspaceError(f"the workspace could not be read or written{where}: {exc.strerror or exc}") from exc

    return wrapper  # type: ignore[return-value]


@dataclass
class Snapshot:
    """The workspace as stored by a dump: its files, their chunks, and the chunks the store lacks."""

    files: list[WorkspaceFile] = field(default_factory=list)
    refs: dict[str, BlobRef] = field(default_factory=dict)
    new_blobs: dict[str, bytes] = field(default_factory=dict)
    refresh: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def skipped_note(self) -> str:
        """The note for the next run naming what was not saved."""
        shown = ", ".join(self.skipped[:10]) + (f" and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else "")
        return f"workspace entries that are not regular files (symlinks, pipes) were not saved: {shown}"


class Workspace:
    """A session's workspace directory, as the worker sees it.

    Args:
        root: The workspace directory (the script's working directory).
        staging: A directory on the same file system, outside the workspace, for restores.
        mounts: Names of the read-only mounts at the workspace's top level (never stored, never written).
        quota_bytes: Bytes the files may take in a checkpoint; None for no quota.
    """

    def __init__(self, root: str, *, staging: str, mounts: Collection[str] = (), quota_bytes: int | None) -> None:
        self.root = root
        self.staging = staging
        self.mounts = frozenset(mounts)
        self.quota_bytes = quota_bytes
        self._out_before: dict[str, tuple[int, int, int]] = {}

    # ------------------------------------------------------------ walking

    def _walk(self, top: str = "") -> Iterator[tuple[str, os.stat_result | None]]:
        """Yield (path, stat) of regular files, and (path, None) of anything else that is not a directory.

        A file whose path the path rule refuses (`check_path`: a control character in its name) counts as
        "anything else": it is not saved, listed or returned as an artifact, and a dump names it as skipped.
        """
        base = os.path.join(self.root, top) if top else self.root
        try:
            walker = os.fwalk(base, follow_symlinks=False)
            for dirpath, dirnames, filenames, dirfd in walker:
                rel = dirpath[len(self.root) :].strip("/")  # fwalk's paths all start with the root given
                prefix = rel + "/" if rel else ""
                if not prefix:
                    dirnames[:] = [d for d in dirnames if d not in self.mounts]
                    filenames = [f for f in filenames if f not in self.mounts]
                dirnames.sort()
                for name in sorted(filenames):
                    try:
                        info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    yield prefix + name, info if stat.S_ISREG(info.st_mode) and _readable(prefix + name) else None
        except FileNotFoundError:
            return

    @_translated
    def files(self) -> list[tuple[str, int]]:
        """Every regular file (mounts excluded): path and size, sorted by path."""
        return [(path, info.st_size) for path, info in self._walk() if info is not None]

    def used_bytes(self) -> int:
        """Bytes of all regular files (mounts excluded)."""
        return sum(size for _, size in self.files())

    def _check_quota(self, used: int) -> None:
        if self.quota_bytes is not None and used > self.quota_bytes:
            raise WorkspaceQuotaExceeded(
                f"the workspace holds {used:,} bytes of files, over its quota of {self.quota_bytes:,} bytes "
                "(Limits.workspace_bytes); nothing was saved and earlier files are kept. Delete or shrink files "
                "and try again",
                limit="workspace_bytes",
                value=self.quota_bytes,
                used_bytes=used,
                hint="Delete files you no longer need (pathlib.Path('name').unlink()), or keep data in variables.",
            )

    def serve(
        self, op: str, message: dict[str, Any], blob: bytearray
    ) -> tuple[dict[str, Any], list[bytes | bytearray]]:
        """Serve a host file request (``ws_read``, ``ws_write``, ``ws_list``): the reply and its parts.

        Raises:
            WorkspacePathError: The path is malformed, goes through a symlink, or writes into a mount.
            WorkspaceError: No such file, or it could not be read or written.
            WorkspaceQuotaExceeded: A write over the quota.
        """
        if op == "ws_list":
            return {"op": "ws_listed", "files": [[path, size] for path, size in self.files()]}, []
        path = message.get("path")
        if op == "ws_write":
            self.write(check_path(path, mounts=self.mounts, writing=True), blob)
            return {"op": "ws_written"}, []
        limit = message.get("max_bytes")
        data = self.read(check_path(path), max_bytes=limit if type(limit) is int else None)
        return {"op": "ws_read", "size": len(data)}, [data]

    # ------------------------------------------------------------ opening safely

    @contextlib.contextmanager
    def _parent(self, path: str, *, create: bool) -> Iterator[tuple[int, str]]:
        """The directory descriptor holding ``path``'s last component, reached without following any symlink."""
        parts = path.split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in parts[:-1]:
                try:
                    nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise WorkspaceError(f"no file {path!r} in the workspace", path=path) from None
                    os.mkdir(name, 0o700, dir_fd=fd)
                    nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise WorkspacePathError(
                            f"workspace path {path!r} goes through {name!r}, which is a symlink or a file", path=path
                        ) from None
                    raise
                os.close(fd)
                fd = nxt
            yield fd, parts[-1]
        finally:
            os.close(fd)

    @_translated
    def read(self, path: str, *, max_bytes: int | None) -> bytes:
        """The bytes of a regular file (not through a symlink).

        Raises:
            WorkspacePathError: The path is malformed or goes through a symlink.
            WorkspaceError: No such regular file, or larger than ``max_bytes``.
        """
        path = check_path(path)
        with self._parent(path, create=False) as (dirfd, name):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
            except FileNotFoundError:
                raise WorkspaceError(f"no file {path!r} in the workspace", path=path) from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise WorkspacePathError(f"workspace path {path!r} is a symlink", path=path) from None
                raise WorkspaceError(f"cannot read {path!r}: {exc.strerror}", path=path) from None
            with open(fd, "rb", closefd=True) as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise WorkspaceError(f"{path!r} is not a regular file", path=path)
                if max_bytes is not None and info.st_size > max_bytes:
                    raise WorkspaceError(f"{path!r} has {info.st_size:,} bytes, more than {max_bytes:,}", path=path)
                return handle.read(info.st_size if max_bytes is None else max_bytes)

    @_translated
    def write(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Write a file whole (a temporary file renamed into place), within the quota.

        Raises:
            WorkspacePathError: The path is malformed, goes through a symlink, or lies in a mount.
            WorkspaceQuotaExceeded: The workspace would exceed its quota; nothing was written.
            WorkspaceError: The file could not be written (no space left); nothing was written.
        """
        path = check_path(path, mounts=self.mounts, writing=True)
        sizes = dict(self.files())
        self._check_quota(sum(sizes.values()) - sizes.get(path, 0) + len(data))
        with self._parent(path, create=True) as (dirfd, name):
            temp = f".snapcell-{os.urandom(8).hex()}"  # not `secrets`: its import (hmac, OpenSSL) delays the zygote
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dirfd)
                with open(fd, "wb", closefd=True) as handle:
                    handle.write(data)
                os.rename(temp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dirfd)
                raise WorkspaceError(f"cannot write {path!r}: {exc.strerror}", path=path) from None

    # ------------------------------------------------------------ checkpoint

    @_translated
    def snapshot(self, *, known: Mapping[str, BlobRef], level: int, created_at: float) -> Snapshot:
        """Cut every regular file into chunks; chunks the store already has (``known``) are not encoded again.

        Raises:
            WorkspaceQuotaExceeded: The files exceed the quota; nothing is returned.
            WorkspaceError: More than `MAX_FILES` files.
        """
        from snapcell.checkpoint import CHUNK_BYTES, WorkspaceFile

        out = Snapshot()
        entries = []
        for path, info in self._walk():
            if info is None:
                out.skipped.append(path)
            else:
                entries.append((path, info.st_size))
        if len(entries) > MAX_FILES:
            raise WorkspaceError(f"the workspace holds {len(entries):,} files; at most {MAX_FILES:,} are kept")
        self._check_quota(sum(size for _, size in entries))
        for path, size in entries:
            chunks: list[str] = []
            got = 0
            with self._parent(path, create=False) as (dirfd, name):
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
                except OSError:
                    out.skipped.append(path)  # removed or replaced meanwhile
                    continue
                with open(fd, "rb", closefd=True) as handle:
                    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                        out.skipped.append(path)
                        continue
                    # At most the size seen when the quota was checked: a file growing meanwhile is cut there.
                    while got < size:
                        chunk = handle.read(min(CHUNK_BYTES, size - got))
                        if not chunk:
                            break
                        got += len(chunk)
                        chunks.append(self._add_chunk(chunk, out, known, level, created_at))
            out.files.append(WorkspaceFile(path=path, size_bytes=got, chunks=chunks))
        return out

    @staticmethod
    def _add_chunk(chunk: bytes, out: Snapshot, known: Mapping[str, BlobRef], level: int, created_at: float) -> str:
        from snapcell.checkpoint import REFRESH_AFTER_S, BlobRef, encode_blob, hash_buffer

        key = hash_buffer(chunk).hex()
        if key in out.refs:
            return key
        previous = known.get(key)
        if previous is not None and previous.raw_bytes == len(chunk):
            stamp = previous.stamp
            if created_at - stamp > REFRESH_AFTER_S:
                out.refresh.append(key)
                stamp = created_at
            out.refs[key] = previous.model_copy(update={"stamp": stamp})
        else:
            stored = encode_blob(chunk, level)
            out.new_blobs[key] = stored
            out.refs[key] = BlobRef(hash=key, raw_bytes=len(chunk), stored_bytes=len(stored), stamp=created_at)
        return key

    @_translated
    def stage(self, files: list[WorkspaceFile], blobs: Mapping[str, bytes | bytearray | memoryview]) -> None:
        """Write a checkpoint's files into the staging directory, each chunk checked against its hash.

        Raises:
            CheckpointCorrupt: A path is malformed, a chunk is missing or altered; the workspace is untouched.
        """
        from snapcell.checkpoint import CHUNK_BYTES, decode_blob

        self.discard_staging()
        os.mkdir(self.staging, 0o700)
        try:
            for entry in files:
                path = check_path(entry.path)
                with self._staged_parent(path) as (dirfd, name):
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dirfd)
                    with open(fd, "wb", closefd=True) as handle:
                        written = 0
                        for key in entry.chunks:
                            stored = blobs.get(key)
                            if stored is None:
                                raise CheckpointCorrupt(f"chunk {key} of workspace file {path!r} is missing")
                            buf = bytearray(min(CHUNK_BYTES, entry.size_bytes - written))
                            decode_blob(stored, digest=bytes.fromhex(key), into=memoryview(buf))
                            handle.write(buf)
                            written += len(buf)
                        if written != entry.size_bytes:
                            raise CheckpointCorrupt(f"workspace file {path!r} does not have its recorded size")
        except (WorkspacePathError, ValueError, OSError) as exc:
            self.discard_staging()
            raise CheckpointCorrupt(f"the checkpoint's workspace files cannot be restored: {exc}") from exc
        except CheckpointCorrupt:
            self.discard_staging()
            raise

    @contextlib.contextmanager
    def _staged_parent(self, path: str) -> Iterator[tuple[int, str]]:
        root, self.root = self.root, self.staging
        try:
            with self._parent(path, create=True) as found:
                yield found
        finally:
            self.root = root

    @_translated
    def commit_staging(self) -> list[str]:
        """Replace the workspace's files (mounts kept) with the staged ones; returns staged names a mount hides."""
        self.clear()
        hidden = []
        for entry in sorted(os.listdir(self.staging)):
            if entry in self.mounts:
                hidden.append(entry)
                continue
            os.rename(os.path.join(self.staging, entry), os.path.join(self.root, entry))
        self.discard_staging()
        return hidden

    def discard_staging(self) -> None:
        """Remove the staging directory, if any."""
        if os.path.lexists(self.staging):
            import shutil  # not on a run's path: a zygote says ready without it, or bz2 and lzma

            shutil.rmtree(self.staging, ignore_errors=True)

    def clear(self) -> None:
        """Remove every file and directory of the workspace but the mounts."""
        for entry in os.scandir(self.root):
            if entry.name in self.mounts:
                continue
            if entry.is_dir(follow_symlinks=False):
                import shutil  # not on a run's path: a zygote says ready without it, or bz2 and lzma

                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)

    # ------------------------------------------------------------ artifacts

    def _out_state(self) -> dict[str, tuple[int, int, int]]:
        if not os.path.isdir(os.path.join(self.root, OUT_DIR)) or os.path.islink(os.path.join(self.root, OUT_DIR)):
            return {}
        return {
            path: (info.st_size, info.st_mtime_ns, info.st_ino)
            for path, info in self._walk(OUT_DIR)
            if info is not None
        }

    @_translated
    def before_run(self) -> None:
        """Remember ``out/`` as it is, so that `artifacts` returns only what the run wrote."""
        self._out_before = self._out_state()

    @_translated
    def artifacts(
        self, *, max_bytes: int, max_count: int = 256
    ) -> tuple[list[dict[str, object]], list[bytes | bytearray]]:
        """Files under ``out/`` that are new or changed since `before_run`: descriptions, and the bytes of each
        one that fits in what is left of ``max_bytes`` (in order)."""
        found: list[dict[str, object]] = []
        parts: list[bytes | bytearray] = []
        left = max_bytes
        for path, state in sorted(self._out_state().items()):
            if self._out_before.get(path) == state or len(path) > 1024:
                continue
            if len(found) >= max_count:
                break
            size = state[0]
            data = b""
            if size <= left:
                try:
                    data = self.read(path, max_bytes=size)
                except (WorkspaceError, OSError):
                    continue
                if len(data) > left:
                    data = b""
            found.append({"path": path, "size": size, "media_type": media_type(path), "data_bytes": len(data)})
            if data:
                parts.append(data)
                left -= len(data)
        return found, parts


def _readable(path: str) -> bool:
    try:
        check_path(path)
    except WorkspacePathError:
        return False
    return True


def attach_snapshot(dumped: Dumped, snap: Snapshot) -> Dumped:
    """The dump with the workspace's files in its manifest and their chunks among its blobs (body packed again)."""
    from snapcell.checkpoint import HASH_ALGORITHM, Codec, Dumped, SectionKind, pack_container, parse_container

    if not snap.files and not dumped.manifest.files:
        return dumped
    container = parse_container(dumped.body)
    refs = {ref.hash: ref for ref in dumped.manifest.blobs}
    for key, ref in snap.refs.items():
        refs.setdefault(key, ref)
    manifest = dumped.manifest.model_copy(
        update={"files": snap.files, "blobs": list(refs.values()), "hash_algorithm": HASH_ALGORITHM if refs else None}
    )
    sections: list[tuple[SectionKind, Codec, int, bytes | memoryview]] = [
        (s.kind, s.codec, s.raw_size, s.data) for s in container.sections
    ]
    body = pack_container(container.header, manifest, sections)
    new_blobs = {**snap.new_blobs, **dumped.new_blobs}
    refresh = sorted(set(dumped.refresh) | set(snap.refresh))
    return Dumped(body=body, manifest=manifest, new_blobs=new_blobs, refresh=refresh)


def empty_dir(path: str) -> None:
    """Remove everything inside ``path`` (best effort; nothing is followed)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            import shutil  # not on a run's path: a zygote says ready without it, or bz2 and lzma

            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
