"""`PostgresHeads`: conversation heads in one PostgreSQL table, shared by every server that reaches the database."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from snapcell.errors import Conflict, HeadCorrupt

from ._heads import (
    DEFAULT_MAX_HISTORY,
    Head,
    RecordHeads,
    Transition,
    _Delete,
    turn_states_to_json,
    turns_from_json,
    turns_to_json,
)
from ._pgdb import PostgresDatabase

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresHeads"]

SCHEMA_VERSION = 1
# ``write_token`` changes on every write of a row (random, so a row deleted and made again never repeats one): a
# write names the token it read and lands only if the row still has it, as S3's If-Match names an ETag.
_DDL = (
    """CREATE TABLE {table} (
    conversation_id TEXT PRIMARY KEY,
    checkpoint_id BYTEA,
    history BYTEA[] NOT NULL DEFAULT '{{}}',
    version TEXT NOT NULL DEFAULT '',
    updated_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_expires_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    turns JSON NOT NULL DEFAULT '[]',
    lease_renewed_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    turn_states JSON NOT NULL DEFAULT '{{}}',
    write_token TEXT NOT NULL DEFAULT md5(random()::text)
)""",
)
# Columns added after the table was first made, with their definitions: a table without one gains it on first use.
_ADDED_COLUMNS = {"turn_states": "JSON NOT NULL DEFAULT '{}'"}
_COLUMNS = (
    "checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at, turns, lease_renewed_at, turn_states"
)
# Conditional writes that lost a race read again and decide again, up to this many times.
_MAX_ATTEMPTS = 20
# Heads listed per query by `scan` (each its own short statement: no transaction held open across a long scan).
_SCAN_PAGE = 500


def _head(conversation_id: str, row: tuple[Any, ...], where: str) -> Head:
    """Decode the head columns of a row.

    Raises:
        HeadCorrupt: The row was not written by snapcell (a null in ``history``, ``turns`` of another shape).
    """
    checkpoint_id, history, version, updated_at, lease_owner, lease_expires_at, turns, lease_renewed_at, states = row
    try:
        if not isinstance(history, list):
            raise TypeError(f"history is a {type(history).__name__}, not an array")
        return Head(
            checkpoint_id=None if checkpoint_id is None else bytes(checkpoint_id),
            history=tuple(bytes(h) for h in history),
            version=str(version),
            updated_at=float(updated_at),
            lease_owner=None if lease_owner is None else str(lease_owner),
            lease_expires_at=float(lease_expires_at),
            turns=turns_from_json(turns, states),
            lease_renewed_at=float(lease_renewed_at),
        )
    except (ValueError, TypeError) as exc:
        raise HeadCorrupt(
            f"the head of conversation {conversation_id!r} in {where} is not a snapcell head ({exc}); "
            "delete its row or restore it",
            conversation_id=conversation_id,
        ) from exc


class PostgresHeads(RecordHeads):
    """Heads in a PostgreSQL table, one row per conversation: any number of servers share them.

    Every change reads the row, decides, and writes it back only if the row is still as it was read (a random
    token per write, checked by the ``UPDATE``'s ``WHERE``; a new row is inserted only if there is none): a lost
    race reads again and decides again, so no row lock is held across a round trip and nothing waits on a server
    that died mid-change. The table (``snapcell_heads`` by default, created on first use; its comment names the
    schema version) may live next to the application's own tables.

    Args:
        target: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``), or a
            ``psycopg_pool.ConnectionPool`` to share with the application (and with `PostgresConversationStore`);
            a pool passed in is left open by `close`, and its connections may be in autocommit or not (at
            PostgreSQL's default isolation level, read committed).
        table: The table, optionally schema-qualified (lower-case letters, digits and ``_``).
        create: False to use only an existing table (as cleanup does: a mistyped URL must not look like a head
            store without heads).
        max_history: Earlier checkpoint IDs kept per conversation (default 50).
        clock: Returns the current time in seconds; injectable for tests.
        max_connections: The most connections of a pool opened from a URL (default 10).
        connect_timeout_s: Seconds to wait for a connection before `StorageUnavailable` (default 10).

    Raises:
        ConfigError: psycopg is not installed (``pip install 'snapcell[postgres]'``), a setting or the URL is
            malformed, ``create`` is false and the table does not exist, or the table is not a snapcell head table
            this release reads.
        StorageUnavailable: The server cannot be reached or refuses the connection (the message says why), or the
            user may not create or use the table.
    """

    def __init__(
        self,
        target: str | ConnectionPool[Any],
        *,
        table: str = "snapcell_heads",
        create: bool = True,
        max_history: int = DEFAULT_MAX_HISTORY,
        clock: Callable[[], float] = time.time,
        max_connections: int = 10,
        connect_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(max_history=max_history, clock=clock)
        self.table = PostgresDatabase.check_table_name(table)
        self.db = PostgresDatabase(target, max_connections=max_connections, connect_timeout_s=connect_timeout_s)
        try:
            self.db.ensure_table(self.table, "heads", SCHEMA_VERSION, _DDL, create=create)
            self._add_columns()
        except BaseException:
            self.db.close()
            raise
        from psycopg import sql

        name = self.db.identifier(self.table)
        marks = sql.SQL(", ").join(sql.Placeholder() * (len(_COLUMNS.split(", ")) + 2))
        self._select = sql.SQL(f"SELECT {_COLUMNS}, write_token FROM {{}} WHERE conversation_id = %s").format(name)
        self._insert = sql.SQL(
            f"INSERT INTO {{}} (conversation_id, {_COLUMNS}, write_token) VALUES ({{}}) "
            "ON CONFLICT (conversation_id) DO NOTHING"
        ).format(name, marks)
        assignments = ", ".join(f"{column} = %s" for column in [*_COLUMNS.split(", "), "write_token"])
        self._update_row = sql.SQL(
            f"UPDATE {{}} SET {assignments} WHERE conversation_id = %s AND write_token = %s"
        ).format(name)
        self._delete_row = sql.SQL("DELETE FROM {} WHERE conversation_id = %s AND write_token = %s").format(name)
        self._scan_page = sql.SQL(
            f"SELECT conversation_id, {_COLUMNS} FROM {{}} WHERE version != '' AND conversation_id > %s "
            "ORDER BY conversation_id LIMIT %s"
        ).format(name)

    def _add_columns(self) -> None:
        """Add the columns of `_ADDED_COLUMNS` that the table lacks (another server may at once)."""
        from psycopg import sql
        from psycopg.rows import tuple_row

        with self.db.connection(f"prepare table {self.table}") as connection, connection.transaction():
            cursor = connection.cursor(row_factory=tuple_row)
            cursor.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
                (self.table,),
            )
            present = {row[0] for row in cursor.fetchall()}
            for column, definition in _ADDED_COLUMNS.items():
                if column not in present:
                    alter = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} ").format(
                        self.db.identifier(self.table), sql.Identifier(column)
                    )
                    cursor.execute(alter + sql.SQL(definition))

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The connection pool (to open a `PostgresConversationStore` on the same one)."""
        return self.db.pool

    @property
    def url(self) -> str:
        """The database's URL without the password, followed by ``#`` and the table."""
        return f"{self.db.where}#{self.table}"

    @property
    def _where(self) -> str:
        return f"table {self.table} of PostgreSQL at {self.db.where}"

    def _fetch(self, connection: psycopg.Connection[Any], conversation_id: str) -> tuple[Head, str] | None:
        from psycopg.rows import tuple_row

        row = connection.cursor(row_factory=tuple_row).execute(self._select, (conversation_id,)).fetchone()
        if row is None:
            return None
        return _head(conversation_id, row[:-1], self._where), str(row[-1])

    def _read(self, conversation_id: str) -> Head | None:
        with self.db.connection(f"read head {conversation_id!r}") as connection:
            found = self._fetch(connection, conversation_id)
        return None if found is None else found[0]

    def _update(self, conversation_id: str, transition: Transition) -> Head | None:
        for attempt in range(_MAX_ATTEMPTS):
            with self.db.connection(f"update head {conversation_id!r}") as connection:
                found = self._fetch(connection, conversation_id)
                record = None if found is None else found[0]
                if self._after_read is not None:
                    self._after_read(conversation_id, record)
                result = transition(record)
                if result is None or (found is None and isinstance(result, _Delete)):
                    return None
                if self._write(connection, conversation_id, None if found is None else found[1], result):
                    return None if isinstance(result, _Delete) else result
            # Another server wrote (or deleted) the row since it was read: read again and decide again.
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise Conflict(
            f"the head of conversation {conversation_id!r} kept changing under {_MAX_ATTEMPTS} attempts to update "
            "it; nothing was written, retry"
        )

    def _write(
        self, connection: psycopg.Connection[Any], conversation_id: str, token: str | None, result: Head | _Delete
    ) -> bool:
        """Write ``result`` if the row still has ``token`` (None: if there is no row); True when it landed."""
        from psycopg.types.json import Json

        cursor = connection.cursor()
        if isinstance(result, _Delete):
            cursor.execute(self._delete_row, (conversation_id, token))
            return cursor.rowcount == 1
        values = (
            result.checkpoint_id,
            list(result.history),
            result.version,
            result.updated_at,
            result.lease_owner,
            result.lease_expires_at,
            Json(turns_to_json(result.turns)),
            result.lease_renewed_at,
            Json(turn_states_to_json(result.turns)),
            secrets.token_hex(8),
        )
        if token is None:
            cursor.execute(self._insert, (conversation_id, *values))
        else:
            cursor.execute(self._update_row, (*values, conversation_id, token))
        return cursor.rowcount == 1

    def scan(self, *, corrupt: list[HeadCorrupt] | None = None) -> Iterator[tuple[str, Head]]:
        """See `HeadStore.scan`; reads the table in pages of 500 conversations, in order of their IDs."""
        from psycopg.rows import tuple_row

        after = ""
        while True:
            with self.db.connection("list heads") as connection:
                cursor = connection.cursor(row_factory=tuple_row)
                rows = cursor.execute(self._scan_page, (after, _SCAN_PAGE)).fetchall()
            for row in rows:
                try:
                    head = _head(row[0], row[1:], self._where)
                except HeadCorrupt as exc:
                    if corrupt is None:
                        raise
                    corrupt.append(exc)
                    continue
                yield row[0], head
            if len(rows) < _SCAN_PAGE:
                return
            after = rows[-1][0]

    def close(self) -> None:
        """Close the connection pool, if this head store opened it (a pool passed in stays open)."""
        self.db.close()

    def __repr__(self) -> str:
        return f"PostgresHeads({self.db.where!r}, table={self.table!r})"
