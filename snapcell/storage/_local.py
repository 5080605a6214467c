"""`LocalStore`: objects as files under a directory, written atomically."""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapcell._support import fsync_dir, make_dirs
from snapcell.errors import (
    CheckpointNotFound,
    ConfigError,
    ObjectExists,
    SnapcellError,
    StorageError,
    StorageUnavailable,
    map_exceptions,
)

from ._protocol import SEGMENT, ObjectInfo, check_timeout_s, too_large, validate_key, validate_prefix

__all__ = ["LocalStore"]

_DIR_MODE = 0o700
_FILE_MODE = 0o600
_TEMP_PREFIX = ".tmp-"
_SECRET_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
_OS_ERRORS: list[tuple[type[BaseException] | tuple[type[BaseException], ...], type[StorageError]]] = [
    (PermissionError, StorageUnavailable),
    (OSError, StorageError),
]
# OS errors whose cause a person should be told in plain words, with the error class that fits.
_EXPLAINED: dict[int, tuple[type[StorageError], str]] = {
    errno.ENOSPC: (StorageError, "the disk is full: free space (snapcell cleanup, a --quota) and retry"),
    errno.EDQUOT: (StorageError, "the disk quota is exhausted: free space (snapcell cleanup, a --quota) and retry"),
    errno.EROFS: (StorageUnavailable, "the store's file system is mounted read-only"),
}


@contextmanager
def _os_errors(message: str) -> Iterator[None]:
    """`map_exceptions` for file operations, saying in plain words when the disk is full or read-only."""
    with map_exceptions(_OS_ERRORS, message):
        try:
            yield
        except OSError as exc:
            if isinstance(exc, SnapcellError) or exc.errno not in _EXPLAINED:
                raise
            target, advice = _EXPLAINED[exc.errno]
            error = target(f"{message}: {exc}; {advice}")
            error.errno = exc.errno
            raise error from exc


class LocalStore:
    """Store each object as a file under ``root``; a reader never sees a half-written object.

    Writes go to a ``.tmp-<random>`` file in the target directory, are fsynced, then linked into place (create-only:
    the link fails if the key exists) or renamed over the target (``overwrite=True``). Directories are created on
    demand with mode 0o700 and files with 0o600. Dot-files (temporary files, secrets) are invisible to `scan`.

    Args:
        root: The directory holding the store; created on the first write.
        timeout_s: Deadline of each call in seconds for async callers (`AsyncStore` stops waiting and raises
            `StorageTimeout`, e.g. on a hung network file system); None (the default) for none. Sync calls are
            not interrupted.

    Raises:
        ConfigError: ``root`` is not a usable path (not text, empty, contains a NUL byte, or names an unknown
            user's home directory), or ``timeout_s`` is not a positive number.
    """

    def __init__(self, root: str | os.PathLike[str], *, timeout_s: float | None = None) -> None:
        check_timeout_s(timeout_s)
        self._root = _root_path(root)
        self.timeout_s = timeout_s

    @property
    def root(self) -> Path:
        """The store's directory (absolute)."""
        return self._root

    @property
    def url(self) -> str:
        """``file://`` followed by the absolute root path."""
        return f"file://{self._root}"

    # ------------------------------------------------------------------ paths

    def _path(self, key: str) -> Path:
        validate_key(key)
        parts = key.split("/")
        path = self._root.joinpath(*parts)
        # validate_key already rules out "..", so only a symlink under the root could lead outside it. Resolving the
        # whole path (an lstat per component from "/", twice, in Python) on every call cost more than the put it
        # guarded: the key's own components are checked instead, and only a path through a symlink is resolved.
        with _os_errors(f"cannot resolve key {key!r} under {self._root}"):
            if not _through_symlink(str(self._root), parts):
                return path
            resolved_root = self._root.resolve()
            resolved = path.resolve()
        if not resolved.is_relative_to(resolved_root):
            raise StorageUnavailable(f"key {key!r} resolves to {resolved}, outside the store root {resolved_root}")
        return path

    # ------------------------------------------------------------ operations

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        """See `Store.put`; ``expires_at`` is not recorded (cleanup goes by file modification time)."""
        path = self._path(key)
        with _os_errors(f"cannot write {key!r} to {self.url}"):
            _write_atomic(path, data, overwrite=overwrite, what=f"object {key!r} in {self.url}")

    def get(self, key: str) -> bytes:
        """See `Store.get`."""
        path = self._path(key)
        with _os_errors(f"cannot read {key!r} from {self.url}"):
            try:
                return path.read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                raise CheckpointNotFound(f"no object {key!r} in {self.url}", key=key) from exc

    def get_at_most(self, key: str, max_bytes: int) -> bytes:
        """See `BoundedGet.get_at_most`: the size comes from the open file, so a swap in between cannot fool it."""
        path = self._path(key)
        with map_exceptions(_OS_ERRORS, f"cannot read {key!r} from {self.url}"):
            try:
                with open(path, "rb") as file:
                    size = os.fstat(file.fileno()).st_size
                    if size > max_bytes:
                        raise too_large(key, size, max_bytes, self.url)
                    data = file.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                raise CheckpointNotFound(f"no object {key!r} in {self.url}", key=key) from exc
        if len(data) > max_bytes:  # grew while being read
            raise too_large(key, len(data), max_bytes, self.url)
        return data

    def touch(self, key: str) -> None:
        """See `Store.touch`: set the file's modification time to now."""
        path = self._path(key)
        with _os_errors(f"cannot touch {key!r} in {self.url}"):
            try:
                os.utime(path)
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise CheckpointNotFound(f"no object {key!r} in {self.url}", key=key) from exc

    def delete(self, key: str) -> None:
        """See `Store.delete`; empty directories left behind are removed too."""
        path = self._path(key)
        with _os_errors(f"cannot delete {key!r} from {self.url}"):
            try:
                path.unlink()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return  # already gone: deleting is idempotent
        self._prune(path.parent)

    def _prune(self, directory: Path) -> None:
        # Best effort: a directory that is not empty, or that a writer just refilled, stays.
        while directory != self._root and directory.is_relative_to(self._root):
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """See `Store.scan`; ``created_at`` is the file's modification time."""
        validate_prefix(prefix)
        start = prefix.rpartition("/")[0]
        directory = self._root.joinpath(*start.split("/")) if start else self._root
        return self._walk(directory, f"{start}/" if start else "", prefix)

    def _walk(self, directory: Path, base: str, prefix: str) -> Iterator[ObjectInfo]:
        with _os_errors(f"cannot list {directory} in {self.url}"):
            try:
                with os.scandir(directory) as it:
                    # Dot-files (temporary files, secrets) and names no key could have are not objects.
                    entries = [(e, e.is_dir(follow_symlinks=False)) for e in it if SEGMENT.match(e.name)]
            except (FileNotFoundError, NotADirectoryError):
                return  # never created, or removed by a concurrent delete
        # Sorting a directory as "name/" makes the depth-first walk yield keys in global sort order.
        entries.sort(key=lambda item: item[0].name + "/" if item[1] else item[0].name)
        for entry, is_dir in entries:
            key = base + entry.name
            if is_dir:
                if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                    yield from self._walk(Path(entry.path), key + "/", prefix)
            elif key.startswith(prefix) and entry.is_file(follow_symlinks=False):
                with _os_errors(f"cannot stat {key!r} in {self.url}"):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # deleted since the directory was listed
                yield ObjectInfo(key=key, size=st.st_size, created_at=st.st_mtime)

    def reclaim_temp_files(self, older_than_s: float, *, now: float | None = None, dry_run: bool = False) -> int:
        """Delete the ``.tmp-*`` files that writes interrupted by a crash left behind; return how many.

        A write renames or unlinks its temporary file within moments, so one older than ``older_than_s`` (by
        modification time) belongs to no write in progress. `scan` hides these files, so nothing else reclaims them.

        Args:
            older_than_s: Minimum age in seconds of a temporary file to delete.
            now: Current time in seconds since the epoch (default: the clock).
            dry_run: Count them, delete nothing.

        Raises:
            StorageError: The store's directory cannot be listed or a file cannot be deleted.
        """
        cutoff = (time.time() if now is None else now) - older_than_s
        found = 0
        with _os_errors(f"cannot reclaim temporary files in {self.url}"):
            for directory, _dirs, files in os.walk(self._root):
                for name in files:
                    if not name.startswith(_TEMP_PREFIX):
                        continue
                    path = os.path.join(directory, name)
                    try:
                        st = os.lstat(path)
                        if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
                            continue
                        if not dry_run:
                            os.unlink(path)
                    except FileNotFoundError:
                        continue  # its write finished, or another cleanup took it
                    found += 1
        return found

    def secret_path(self, name: str = "signing-key") -> Path:
        """Where the store's secret ``name`` lives (it may not exist yet: `secret` makes it)."""
        return self._root / f".snapcell-{name}"

    def secret(self, name: str = "signing-key", size: int = 32) -> bytes:
        """Return the store's secret ``name``, generating ``size`` random bytes on first use.

        The secret lives in ``<root>/.snapcell-<name>`` with mode 0o600 and is created create-only: when two
        processes race, both end up with the winner's bytes.

        Args:
            name: Which secret; letters, digits, ``_`` and ``-``.
            size: Length in bytes of a newly generated secret.

        Returns:
            The secret's bytes.

        Raises:
            ConfigError: ``name`` or ``size`` is invalid, or the file is not the current user's own private file
                (another owner, readable or writable by group or others, or not a regular file): a key someone
                else planted or can read is never used.
            StorageError: The file cannot be read or created, or exists but is empty.
        """
        if not _SECRET_NAME.match(name):
            raise ConfigError(f"secret name must be letters, digits, '_' or '-', not {name!r}")
        if size < 16:
            raise ConfigError(f"a secret must be at least 16 bytes, not {size}")
        path = self.secret_path(name)
        with map_exceptions(_OS_ERRORS, f"cannot read or create the secret {path}"):
            try:
                data = _read_private(path)
            except FileNotFoundError:
                try:
                    _write_atomic(path, secrets.token_bytes(size), overwrite=False, what=f"secret {path}")
                except ObjectExists:
                    pass  # another process won the race; use its secret
                data = _read_private(path)
        if not data:
            raise StorageError(f"the secret file {path} is empty; delete it so a new one is generated")
        return data

    def close(self) -> None:
        """Do nothing; a local store holds no open handles between calls."""

    def __repr__(self) -> str:
        return f"LocalStore({str(self._root)!r})"


def _read_private(path: Path) -> bytes:
    """Read a secret file only if it is a regular file owned by this user that nobody else can read or write.

    The checks are made on the open file (no symlink followed), so a swap between check and read cannot fool them.

    Raises:
        ConfigError: The file is not private to this user; the message says how to fix it.
        FileNotFoundError: There is no file.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        uid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the secret {path} is not a regular file; delete it so a new one is generated")
        if st.st_uid != uid:
            raise ConfigError(
                f"the secret {path} belongs to uid {st.st_uid}, not to this user (uid {uid}), so someone else may "
                f"have planted or read it; if it is yours, `chown {uid} {path}` and `chmod 600 {path}`, otherwise "
                "delete it (checkpoints signed with it stop loading) so a new one is generated"
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the secret {path} has mode {stat.S_IMODE(st.st_mode):o}: group or others can read or write it, "
                f"so it may have been read or replaced; `chmod 600 {path}` if you trust its contents, otherwise "
                "delete it (checkpoints signed with it stop loading) so a new one is generated"
            )
        return file.read()


def _through_symlink(root: str, parts: list[str]) -> bool:
    """Whether the path ``parts`` name under ``root`` goes through a symlink (one lstat per existing component).

    What does not exist yet cannot lead anywhere, so the walk stops there; a component that is not a directory
    (a file where a directory was expected) ends it too, as the operation will fail on it.
    """
    current = root
    for part in parts:
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return False
        if stat.S_ISLNK(mode):
            return True
        if not stat.S_ISDIR(mode):
            return False
    return False


def _root_path(root: object) -> Path:
    """Validate and absolutize a store root, so a bad path fails here and not deep inside the first operation."""
    if not isinstance(root, str | os.PathLike):
        raise ConfigError(f"a local store root must be a path, not {type(root).__name__}")
    text = os.fspath(root)
    if not isinstance(text, str):
        raise ConfigError(f"a local store root must be a text path, not {type(text).__name__}")
    if not text:
        raise ConfigError("a local store root must not be empty; give a directory such as ./snapcell-store")
    if "\x00" in text:
        raise ConfigError(f"a local store root must not contain a NUL byte: {text!r}")
    try:
        return Path(text).expanduser().absolute()
    except (RuntimeError, ValueError, OSError) as exc:  # expanduser of an unknown ~user; a path the OS refuses
        raise ConfigError(f"invalid local store root {text!r}: {exc}") from exc


def _write_atomic(path: Path, data: bytes | bytearray, *, overwrite: bool, what: str) -> None:
    """Write ``data`` to a temporary file next to ``path``, fsync it, then link or rename it into place.

    Raises:
        ObjectExists: ``path`` exists and ``overwrite`` is false; it is untouched and the temporary file is gone.
        OSError: Anything else; the temporary file is removed.
    """
    fd, tmp = _open_temp(path.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise ObjectExists(f"{what} already exists; checkpoints are never overwritten") from exc
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass  # os.replace consumed it
    fsync_dir(path.parent)


def _open_temp(directory: Path) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    # The directory usually exists (one per day): it is created only when the open says it is missing.
    for attempt in range(4):
        if attempt:
            # Missing, or pruned by a concurrent delete between mkdir and open: create it (again).
            make_dirs(directory, _DIR_MODE)
        tmp = directory / f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
        try:
            return os.open(tmp, flags, _FILE_MODE), tmp
        except FileNotFoundError:
            continue
    raise OSError(errno.ENOENT, "directory keeps disappearing", str(directory))
