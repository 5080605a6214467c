"""`SQLiteHeads`: conversation heads in one SQLite file, safe across threads and processes on one machine."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from snapcell._support import fsync_dir, make_dirs
from snapcell.errors import ConfigError, HeadCorrupt, StorageError, StorageUnavailable, map_exceptions

from ._heads import (
    DEFAULT_MAX_HISTORY,
    Head,
    LeaseOnly,
    RecordHeads,
    Transition,
    TurnRecord,
    _Delete,
    turn_states_to_json,
    turns_from_json,
    turns_to_json,
)

__all__ = ["SQLiteHeads", "WouldWait"]

_T = TypeVar("_T")

# An operation run `without_waiting` never checkpoints the WAL (a checkpoint syncs the database file: milliseconds
# of disk on the caller's thread, an event loop). Every this-many-th such operation is refused instead, so that it
# runs in a thread where SQLite's automatic checkpoint may do that work.
_NO_WAIT_RUN = 64
# How many heads' parsed turns a store keeps, and the longest text of a head's turns it keeps them for.
_PARSED_HEADS = 64
_PARSED_TEXT_CHARS = 32_768

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heads (
    conversation_id TEXT PRIMARY KEY,
    checkpoint_id BLOB,
    history TEXT NOT NULL,
    version TEXT NOT NULL,
    updated_at REAL NOT NULL,
    lease_owner TEXT,
    lease_expires_at REAL NOT NULL,
    turns TEXT NOT NULL DEFAULT '[]',
    lease_renewed_at REAL NOT NULL DEFAULT 0,
    turn_states TEXT NOT NULL DEFAULT '{}'
)
"""
# Columns added after the first release, with their definitions, for tables an earlier snapcell made.
_ADDED_COLUMNS = {
    "turns": "TEXT NOT NULL DEFAULT '[]'",
    "lease_renewed_at": "REAL NOT NULL DEFAULT 0",
    "turn_states": "TEXT NOT NULL DEFAULT '{}'",
}
_COLUMNS = (
    "checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at, turns, lease_renewed_at, turn_states"
)
_MARKS = ", ".join("?" * (1 + len(_COLUMNS.split(","))))
_ERRORS: list[tuple[type[BaseException] | tuple[type[BaseException], ...], type[StorageError]]] = [
    ((sqlite3.OperationalError, PermissionError), StorageUnavailable),
    ((sqlite3.Error, OSError), StorageError),
]


_Row = tuple[bytes | None, str, str, float, str | None, float, str, float, str]


def _head(conversation_id: str, row: _Row, path: Path, parsed: _ParsedTurns) -> Head:
    """Decode a row of the heads table (its turns through ``parsed``).

    Raises:
        HeadCorrupt: The row was not written by snapcell (bad JSON or hex in ``history``, wrong column types).
    """
    checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at, turns, lease_renewed_at, states = row
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
            turns=parsed.parse(turns, states),
            lease_renewed_at=float(lease_renewed_at),
        )
    except (ValueError, TypeError) as exc:
        raise HeadCorrupt(
            f"the head of conversation {conversation_id!r} in {path} is not a snapcell head ({exc}); "
            "delete its row or restore the file",
            conversation_id=conversation_id,
        ) from exc


class _ParsedTurns:
    """The turns parsed from recent heads' two columns, by their text: the next operation on a conversation reads what
    the last one wrote (a turn's lease, then its head write), and its records (immutable) need not be parsed again.

    At most `_PARSED_HEADS` heads, of at most `_PARSED_TEXT_CHARS` characters each (up to 64 turn IDs and 8 answers
    of up to 8,000 characters: a head with long answers is parsed each time). Shared by a store's threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_text: OrderedDict[tuple[str, str], tuple[TurnRecord, ...]] = OrderedDict()

    def parse(self, turns: str, states: str) -> tuple[TurnRecord, ...]:
        """The records of the columns' texts.

        Raises:
            TypeError, ValueError: The texts are not `turns_to_json`'s and `turn_states_to_json`'s forms.
        """
        key = (turns, states)
        with self._lock:
            found = self._by_text.get(key)
            if found is not None:
                self._by_text.move_to_end(key)
                return found
        parsed = turns_from_json(json.loads(turns), json.loads(states))
        self.remember(key, parsed)
        return parsed

    def texts(self, turns: tuple[TurnRecord, ...]) -> tuple[str, str]:
        """The columns' texts for ``turns``, remembered with them for the next read."""
        key = json.dumps(turns_to_json(turns)), json.dumps(turn_states_to_json(turns))
        self.remember(key, turns)
        return key

    def remember(self, key: tuple[str, str], turns: tuple[TurnRecord, ...]) -> None:
        if len(key[0]) + len(key[1]) > _PARSED_TEXT_CHARS:
            return
        with self._lock:
            self._by_text[key] = turns
            self._by_text.move_to_end(key)
            while len(self._by_text) > _PARSED_HEADS:
                self._by_text.popitem(last=False)


def _add_columns(db: sqlite3.Connection) -> None:
    """Add the columns of `_ADDED_COLUMNS` to a table an earlier snapcell made (another process may at once)."""
    present = {row[1] for row in db.execute("PRAGMA table_info(heads)")}
    for name, definition in _ADDED_COLUMNS.items():
        if name in present:
            continue
        try:
            db.execute(f"ALTER TABLE heads ADD COLUMN {name} {definition}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):
                raise


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


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back after a failed statement, keeping the original error.

    SQLite may already have rolled back by itself (a full disk, an I/O error); a ROLLBACK then fails with "no
    transaction is active", which would hide the real cause, so it is only sent while a transaction is open.
    """
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:  # the error being raised says what went wrong; this one would only hide it
            pass


# PRAGMA synchronous levels. In WAL mode, NORMAL commits without syncing the WAL: a power loss or OS crash may undo
# the last commits (the file stays consistent). FULL syncs the WAL at each commit: what a head write needs, since the
# checkpoint it names was synced before it and the answer of its turn is given after it.
_NORMAL = 1
_FULL = 2
# SQLite's default: a commit that leaves this many pages in the WAL copies them into the database file.
_AUTOCHECKPOINT = 1000


class WouldWait(Exception):
    """An operation run `SQLiteHeads.without_waiting` would have waited (for the connection, for another process's
    write lock) or is due to run where it may wait; nothing was read or changed."""


@dataclass(eq=False, slots=True)
class _SharedDB:
    """One connection to a database file, shared by every `SQLiteHeads` on that file in this process."""

    key: tuple[int, int, int]
    db: sqlite3.Connection
    busy_ms: int
    refs: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The connection's automatic WAL checkpoint is off (0) while operations run without waiting, else SQLite's default.
    autocheckpoint: int = _AUTOCHECKPOINT
    # The connection's synchronous level: NORMAL (1) for reads and leases, FULL (2) for head writes (see `_update`).
    synchronous: int = _NORMAL
    # Operations run without waiting since the last one that was sent to a thread instead.
    unwaited: int = 0


def _configure(shared: _SharedDB, *, busy_ms: int, autocheckpoint: int, durable: bool) -> None:
    """Set the connection's busy timeout, automatic WAL checkpoint and synchronous level for the next operation, each
    only when it differs from the last one's (call with the lock held, outside a transaction: SQLite ignores a
    synchronous level set inside one)."""
    db = shared.db
    if shared.busy_ms != busy_ms:
        db.execute(f"PRAGMA busy_timeout = {busy_ms}")
        shared.busy_ms = busy_ms
    if shared.autocheckpoint != autocheckpoint:
        db.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
        shared.autocheckpoint = autocheckpoint
    level = _FULL if durable else _NORMAL
    if shared.synchronous != level:
        db.execute(f"PRAGMA synchronous = {level}")
        shared.synchronous = level


# Set on a thread while it runs an operation `without_waiting`.
_NO_WAIT = threading.local()


# POSIX locks belong to a process and a file, not to a descriptor: closing *any* descriptor of the file drops every
# lock the process holds on it, and another process may then delete the WAL under a live connection (committed
# turns vanish). So the file is opened only through SQLite, once per process, and shared; keyed by process and
# the file's identity, so a symlink or another spelling of the path finds the same connection, and a forked child
# never uses its parent's.
_SHARED: dict[tuple[int, int, int], _SharedDB] = {}
_SHARED_LOCK = threading.Lock()


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (os.getpid(), info.st_dev, info.st_ino)


def _open_hint(path: Path) -> str:
    """Why a head store's file cannot be opened, when the file system says (SQLite only says "unable to open")."""
    directory = path.parent
    try:
        while not directory.exists() and directory.parent != directory:
            directory = directory.parent
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return f" ({directory} is on a read-only file system: give a path on a writable one)"
    except OSError:
        pass
    if not os.access(directory, os.W_OK | os.X_OK):
        return f" (this process (uid {os.geteuid()}) may not enter or write {directory}: check its permissions)"
    return ""


def _attach(path: Path, *, create: bool, busy_timeout_s: float) -> _SharedDB:
    """Return this process's connection to ``path``, opening (and with ``create``, creating) it on first use.

    Raises:
        ConfigError: ``create`` is false and the file does not exist.
        StorageUnavailable: The file cannot be opened or created.
    """
    with _SHARED_LOCK:
        with map_exceptions(_ERRORS, f"cannot open the head store {path}{_open_hint(path)}"):
            key = _identity(path)  # a directory the process may not enter fails here
        shared = _SHARED.get(key) if key is not None else None
        if shared is not None:
            shared.refs += 1
            return shared
        if key is None and not create:
            raise ConfigError(
                f"no head store at {path}: the file does not exist; check the path (sqlite:///absolute/path)"
            )
        with map_exceptions(_ERRORS, f"cannot open the head store {path}{_open_hint(path)}"):
            if create:
                make_dirs(path.parent)
            # create: SQLite creates the file itself; otherwise never create it, even if it vanished just now.
            # Autocommit mode: transactions are explicit, so BEGIN IMMEDIATE means what it says.
            target = str(path) if create else path.as_uri() + "?mode=rw"
            db = sqlite3.connect(
                target, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, uri=not create
            )
            try:
                if key is None:
                    # A new file: private before anything is written to it (the WAL and SHM files copy its mode).
                    db.execute("PRAGMA schema_version").fetchone()
                    os.chmod(path, 0o600)
                    fsync_dir(path.parent)  # SQLite syncs the file, not its new name in the directory
                db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
                _set_wal(db, busy_timeout_s)
                db.execute("PRAGMA synchronous = NORMAL")
                db.execute(_SCHEMA)
                _add_columns(db)
                key = _identity(path)
                if key is None:
                    raise FileNotFoundError(f"{path} vanished while it was being opened")
            except BaseException:
                db.close()
                raise
        shared = _SharedDB(key=key, db=db, busy_ms=int(busy_timeout_s * 1000))
        _SHARED[key] = shared
        return shared


def _detach(shared: _SharedDB) -> None:
    with _SHARED_LOCK:
        shared.refs -= 1
        if shared.refs > 0:
            return
        if _SHARED.get(shared.key) is shared:
            del _SHARED[shared.key]
    with shared.lock:
        shared.db.close()


class SQLiteHeads(RecordHeads):
    """Heads in a SQLite file: the embedded default, next to a local store (``<root>/.heads.sqlite3``).

    Every change runs in a ``BEGIN IMMEDIATE`` transaction (read, decide, write under SQLite's write lock), the
    journal is in WAL mode so readers never block, and a busy database is waited for up to ``busy_timeout_s``.
    Several processes on one machine may share the file; do not put it on a network file system. Within a process,
    every `SQLiteHeads` on one file shares one connection (SQLite's locks belong to the process, and opening and
    closing the file a second time would drop them), used by one thread at a time.

    Args:
        path: The database file; created, with its directory, on first use (mode 0o600).
        create: False to open only an existing file (as cleanup does: a mistyped path must not look like a head
            store without heads).
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        busy_timeout_s: Seconds to wait for another process's write lock before `StorageUnavailable` (default 10).
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
        if not isinstance(busy_timeout_s, int | float) or busy_timeout_s < 0:
            raise ConfigError(f"busy_timeout_s must be a non-negative number of seconds, not {busy_timeout_s!r}")
        self._busy_ms = int(busy_timeout_s * 1000)
        self._shared: _SharedDB | None = _attach(self.path, create=create, busy_timeout_s=busy_timeout_s)
        self._parsed = _ParsedTurns()

    def without_waiting(self, call: Callable[[], _T]) -> _T:
        """``call()`` (an operation of this store) on this thread, if it needs no waiting; else `WouldWait`.

        For an event loop, which must not block: the connection must be free at once and another process's write
        lock is not waited for (SQLite's busy timeout is 0 meanwhile). Nothing is read or changed by an operation
        that raises `WouldWait`, so the caller runs it again where it may wait (a thread). Such an operation never
        syncs the file: a head write (synced at its commit) is always refused, and the WAL is never checkpointed
        (every 64th operation is refused instead, to run where SQLite's own checkpoint may do that).

        Raises:
            WouldWait: The operation would have waited, or is the one due to run in a thread.
        """
        shared = self._shared
        if shared is None or self._after_read is not None:
            raise WouldWait  # closed (the thread says so), or a test's hook that may block
        if shared.unwaited >= _NO_WAIT_RUN:
            shared.unwaited = 0
            raise WouldWait
        _NO_WAIT.active = True
        try:
            result = call()
        finally:
            _NO_WAIT.active = False
        shared.unwaited += 1
        return result

    @contextmanager
    def _connection(self, what: str, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """Hold the shared connection for one operation; translate SQLite errors, keeping their cause.

        ``durable``: the operation writes a head, which must survive a power loss: its commit syncs the WAL (and so
        never runs `without_waiting`, on an event loop).
        """
        shared = self._shared
        if shared is None:
            raise StorageError(f"cannot {what}: the head store {self.path} is closed")
        if getattr(_NO_WAIT, "active", False):
            if durable:
                raise WouldWait  # a sync of the file: not on the caller's thread
            with self._connection_now(shared, what) as db:
                yield db
            return
        with shared.lock, map_exceptions(_ERRORS, f"cannot {what} in {self.path}"):
            # Head stores on one file may wait for different times.
            _configure(shared, busy_ms=self._busy_ms, autocheckpoint=_AUTOCHECKPOINT, durable=durable)
            yield shared.db

    @contextmanager
    def _connection_now(self, shared: _SharedDB, what: str) -> Iterator[sqlite3.Connection]:
        """`_connection` for `without_waiting`: the connection if it is free, no busy wait, no checkpoint."""
        if not shared.lock.acquire(blocking=False):
            raise WouldWait
        try:
            with map_exceptions(_ERRORS, f"cannot {what} in {self.path}"):
                try:
                    # Not synced either, whatever the last operation on the connection (a head write) set.
                    _configure(shared, busy_ms=0, autocheckpoint=0, durable=False)
                    yield shared.db
                except sqlite3.OperationalError as exc:
                    # The primary code (the low byte of an extended one, such as SQLITE_BUSY_SNAPSHOT).
                    if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                        raise WouldWait from exc  # the operation rolled back: nothing changed
                    raise
        finally:
            shared.lock.release()

    @property
    def url(self) -> str:
        """``sqlite://`` followed by the absolute path."""
        return f"sqlite://{self.path}"

    def _read(self, conversation_id: str) -> Head | None:
        with self._connection(f"read head {conversation_id!r}") as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM heads WHERE conversation_id = ?", (conversation_id,)).fetchone()
        return None if row is None else _head(conversation_id, row, self.path, self._parsed)

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        # A head write is synced before it returns; a lease needs no more than the file's consistency (`LeaseOnly`).
        with self._connection(f"update head {conversation_id!r}", durable=not isinstance(transition, LeaseOnly)) as db:
            # The read happens inside the write transaction: nobody can move the row between read and write.
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    f"SELECT {_COLUMNS} FROM heads WHERE conversation_id = ?", (conversation_id,)
                ).fetchone()
                record = None if row is None else _head(conversation_id, row, self.path, self._parsed)
                if self._after_read is not None:
                    self._after_read(conversation_id, record)
                result = transition(record)
                if isinstance(result, _Delete):
                    db.execute("DELETE FROM heads WHERE conversation_id = ?", (conversation_id,))
                elif result is not None:
                    # What the transition kept (a lease keeps all but the lease) is written as it was read.
                    if record is not None and result.turns is record.turns:
                        turns, states = row[6], row[8]
                    else:
                        turns, states = self._parsed.texts(result.turns)
                    if record is not None and result.history is record.history:
                        history = row[1]
                    else:
                        history = json.dumps([h.hex() for h in result.history])
                    db.execute(
                        f"INSERT OR REPLACE INTO heads (conversation_id, {_COLUMNS}) VALUES ({_MARKS})",
                        (
                            conversation_id,
                            result.checkpoint_id,
                            history,
                            result.version,
                            result.updated_at,
                            result.lease_owner,
                            result.lease_expires_at,
                            turns,
                            result.lease_renewed_at,
                            states,
                        ),
                    )
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        return None if isinstance(result, _Delete) else result

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`."""
        with self._connection("list heads") as db:
            rows = db.execute(f"SELECT conversation_id, {_COLUMNS} FROM heads WHERE version != ''").fetchall()
        heads = []
        for row in rows:
            try:
                heads.append((row[0], _head(row[0], row[1:], self.path, self._parsed)))
            except HeadCorrupt as exc:
                if corrupt is None:
                    raise
                corrupt.append(exc)
        return iter(heads)

    def close(self) -> None:
        """Let go of the shared connection; the last head store on the file in this process closes it."""
        shared, self._shared = self._shared, None
        if shared is not None:
            _detach(shared)

    def __repr__(self) -> str:
        return f"SQLiteHeads({str(self.path)!r})"
