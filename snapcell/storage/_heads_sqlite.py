"""`SQLiteHeads`: conversation heads in one SQLite file, safe across threads and processes on one machine."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from snapcell.errors import ConfigError, HeadCorrupt, StorageError, StorageUnavailable, map_exceptions

from ._heads import DEFAULT_MAX_HISTORY, Head, RecordHeads, Transition, _Delete

__all__ = ["SQLiteHeads"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heads (
    conversation_id TEXT PRIMARY KEY,
    checkpoint_id BLOB,
    history TEXT NOT NULL,
    version TEXT NOT NULL,
    updated_at REAL NOT NULL,
    lease_owner TEXT,
    lease_expires_at REAL NOT NULL
)
"""
_COLUMNS = "checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at"
_ERRORS: list[tuple[type[BaseException] | tuple[type[BaseException], ...], type[StorageError]]] = [
    ((sqlite3.OperationalError, PermissionError), StorageUnavailable),
    ((sqlite3.Error, OSError), StorageError),
]


def _head(conversation_id: str, row: tuple[bytes | None, str, str, float, str | None, float], path: Path) -> Head:
    """Decode a row of the heads table.

    Raises:
        HeadCorrupt: The row was not written by snapcell (bad JSON or hex in ``history``, wrong column types).
    """
    checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at = row
    try:
        ids = json.loads(history)
        if not isinstance(ids, list):
            raise TypeError(f"history is a {type(ids).__name__}, not a list")
        return Head(
            checkpoint_id=None if checkpoint_id is None else bytes(checkpoint_id),
            history=tuple(bytes.fromhex(h) for h in ids),
            version=str(version),
            updated_at=float(updated_at),
            lease_owner=None if lease_owner is None else str(lease_owner),
            lease_expires_at=float(lease_expires_at),
        )
    except (ValueError, TypeError) as exc:
        raise HeadCorrupt(
            f"the head of conversation {conversation_id!r} in {path} is not a snapcell head ({exc}); "
            "delete its row or restore the file",
            conversation_id=conversation_id,
        ) from exc


def _set_wal(db: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch to WAL; SQLite reports a busy database at once for this (no busy handler), so wait here.

    Two processes opening a new file at the same moment otherwise fail with "database is locked".
    """
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class SQLiteHeads(RecordHeads):
    """Heads in a SQLite file: the embedded default, next to a local store (``<root>/.heads.sqlite3``).

    Every change runs in a ``BEGIN IMMEDIATE`` transaction (read, decide, write under SQLite's write lock), the
    journal is in WAL mode so readers never block, and a busy database is waited for up to ``busy_timeout_s``.
    Several processes on one machine may share the file; do not put it on a network file system.

    Args:
        path: The database file; created, with its directory, on first use (mode 0o600).
        create: False to open only an existing file (as cleanup does: a mistyped path must not look like a head
            store without heads).
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        busy_timeout_s: Seconds to wait for another process's write lock before `StorageUnavailable`.
        clock: Returns the current time in seconds; injectable for tests.

    Raises:
        ConfigError: ``create`` is false and the file does not exist.
        StorageUnavailable: The file cannot be opened or created.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_history: int = DEFAULT_MAX_HISTORY,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        super().__init__(max_history=max_history, clock=clock)
        self.path = Path(path).expanduser().absolute()
        self._lock = threading.Lock()
        if not create and not self.path.is_file():
            raise ConfigError(
                f"no head store at {self.path}: the file does not exist; check the path (sqlite:///absolute/path)"
            )
        with map_exceptions(_ERRORS, f"cannot open the head store {self.path}"):
            target: str | Path = self.path
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                os.close(fd)
            else:
                target = self.path.as_uri() + "?mode=rw"  # never create it, even if it vanished just now
            # autocommit mode: transactions are explicit, so BEGIN IMMEDIATE means what it says.
            self._db = sqlite3.connect(
                target, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, uri=not create
            )
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            _set_wal(self._db, busy_timeout_s)
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute(_SCHEMA)

    @property
    def url(self) -> str:
        """``sqlite://`` followed by the absolute path."""
        return f"sqlite://{self.path}"

    def _read(self, conversation_id: str) -> Head | None:
        with self._lock, map_exceptions(_ERRORS, f"cannot read head {conversation_id!r} from {self.path}"):
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM heads WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
        return None if row is None else _head(conversation_id, row, self.path)

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        with self._lock, map_exceptions(_ERRORS, f"cannot update head {conversation_id!r} in {self.path}"):
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            committed = False
            try:
                row = db.execute(
                    f"SELECT {_COLUMNS} FROM heads WHERE conversation_id = ?", (conversation_id,)
                ).fetchone()
                result = transition(None if row is None else _head(conversation_id, row, self.path))
                if isinstance(result, _Delete):
                    db.execute("DELETE FROM heads WHERE conversation_id = ?", (conversation_id,))
                elif result is not None:
                    db.execute(
                        f"INSERT OR REPLACE INTO heads (conversation_id, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (
                            conversation_id,
                            result.checkpoint_id,
                            json.dumps([h.hex() for h in result.history]),
                            result.version,
                            result.updated_at,
                            result.lease_owner,
                            result.lease_expires_at,
                        ),
                    )
                db.execute("COMMIT")
                committed = True
            finally:
                if not committed:
                    db.execute("ROLLBACK")
        return None if isinstance(result, _Delete) else result

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`."""
        with self._lock, map_exceptions(_ERRORS, f"cannot list heads in {self.path}"):
            rows = self._db.execute(f"SELECT conversation_id, {_COLUMNS} FROM heads WHERE version != ''").fetchall()
        heads = []
        for row in rows:
            try:
                heads.append((row[0], _head(row[0], row[1:], self.path)))
            except HeadCorrupt as exc:
                if corrupt is None:
                    raise
                corrupt.append(exc)
        return iter(heads)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"SQLiteHeads({str(self.path)!r})"
