"""Conversations in PostgreSQL: one row per conversation, one row per write, each write one transaction.

``snapcell_conversations`` holds each conversation's revision; ``snapcell_conversations_records`` its records (the
log the other stores keep: the whole conversation as last saved, then one record per `add_messages`, with the turn
state), as JSON an operator can query. A write moves the revision from the one it expects to the next, with
``UPDATE ... WHERE revision = expected`` (a new conversation: an insert that finds no row), inserts its record and,
for a whole conversation, deletes the records before it: all in one transaction, so messages and state land
together or not at all, and of two writers from the same revision one wins and the other gets `Conflict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapcell.conversation._stores import LogConversationStore, _conflict
from snapcell.heads import PostgresDatabase

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresConversationStore"]

SCHEMA_VERSION = 1
_DDL = (
    """CREATE TABLE {table} (
    conversation_id TEXT PRIMARY KEY,
    revision BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)""",
    """CREATE TABLE {records} (
    conversation_id TEXT NOT NULL REFERENCES {table} ON DELETE CASCADE,
    revision BIGINT NOT NULL,
    record JSON NOT NULL,
    PRIMARY KEY (conversation_id, revision)
)""",
)


class PostgresConversationStore(LogConversationStore):
    """Conversations in PostgreSQL tables, next to the application's own; any number of servers share them.

    Args:
        target: ``postgresql://user:password@host:port/dbname`` (or ``postgres://``), or a
            ``psycopg_pool.ConnectionPool`` shared with the application or with `PostgresHeads` (its ``pool``); a
            pool passed in is left open by `close`.
        table: The conversations' table, optionally schema-qualified (lower-case letters, digits and ``_``); their
            records go in the same name followed by ``_records``. Both are created on first use.
        create: False to use only existing tables.
        max_connections: The most connections of a pool opened from a URL (default 10).
        connect_timeout_s: Seconds to wait for a connection before `StorageUnavailable` (default 10).

    Raises:
        ConfigError: psycopg is not installed (``pip install 'snapcell[postgres]'``), a setting or the URL is
            malformed, ``create`` is false and the tables do not exist, or they are not snapcell's.
        StorageUnavailable: The server cannot be reached or refuses the connection (the message says why), or the
            user may not create or use the tables.
    """

    def __init__(
        self,
        target: str | ConnectionPool[Any],
        *,
        table: str = "snapcell_conversations",
        create: bool = True,
        max_connections: int = 10,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.table = PostgresDatabase.check_table_name(table, suffix="_records")
        self.db = PostgresDatabase(target, max_connections=max_connections, connect_timeout_s=connect_timeout_s)
        try:
            self.db.ensure_table(
                self.table, "conversations", SCHEMA_VERSION, _DDL, create=create, names={"records": table + "_records"}
            )
        except BaseException:
            self.db.close()
            raise
        from psycopg import sql

        conversations, records = self.db.identifier(self.table), self.db.identifier(self.table, "_records")
        self._select = sql.SQL("SELECT record::text FROM {} WHERE conversation_id = %s ORDER BY revision").format(
            records
        )
        self._create = sql.SQL(
            "INSERT INTO {} (conversation_id, revision) VALUES (%s, 1) ON CONFLICT (conversation_id) DO NOTHING"
        ).format(conversations)
        self._advance = sql.SQL(
            "UPDATE {} SET revision = revision + 1, updated_at = now() WHERE conversation_id = %s AND revision = %s"
        ).format(conversations)
        self._revision = sql.SQL("SELECT revision FROM {} WHERE conversation_id = %s").format(conversations)
        self._insert = sql.SQL("INSERT INTO {} (conversation_id, revision, record) VALUES (%s, %s, %s::json)").format(
            records
        )
        self._drop_before = sql.SQL("DELETE FROM {} WHERE conversation_id = %s AND revision < %s").format(records)
        self._delete = sql.SQL("DELETE FROM {} WHERE conversation_id = %s").format(conversations)
        self._delete_records = sql.SQL("DELETE FROM {} WHERE conversation_id = %s").format(records)

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The connection pool (to open a `PostgresHeads` on the same one)."""
        return self.db.pool

    def _records(self, conversation_id: str) -> list[bytes]:
        from psycopg.rows import tuple_row

        with self.db.connection(f"read conversation {conversation_id!r}") as connection:
            cursor = connection.cursor(row_factory=tuple_row)
            rows = cursor.execute(self._select, (conversation_id,)).fetchall()
        return [str(row[0]).encode() for row in rows]

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        from psycopg.rows import tuple_row

        revision = expected + 1
        with self.db.connection(f"write conversation {conversation_id!r}") as connection, connection.transaction():
            cursor = connection.cursor(row_factory=tuple_row)
            # The conversation's row is locked from here to the commit: a second writer waits, then finds the
            # revision moved (or the row deleted) and writes nothing.
            if expected == 0:
                cursor.execute(self._create, (conversation_id,))
            else:
                cursor.execute(self._advance, (conversation_id, expected))
            if cursor.rowcount != 1:
                found = cursor.execute(self._revision, (conversation_id,)).fetchone()
                raise _conflict(conversation_id, expected, 0 if found is None else int(found[0]))
            cursor.execute(self._insert, (conversation_id, revision, record.decode()))
            if full:
                cursor.execute(self._drop_before, (conversation_id, revision))

    def _remove(self, conversation_id: str) -> None:
        with self.db.connection(f"delete conversation {conversation_id!r}") as connection, connection.transaction():
            cursor = connection.cursor()
            # The conversation's row first: that waits for a write in progress, and the records' delete that
            # follows (a statement of its own) sees what that write added.
            cursor.execute(self._delete, (conversation_id,))
            cursor.execute(self._delete_records, (conversation_id,))

    def close(self) -> None:
        """Close the connection pool, if this store opened it (a pool passed in stays open)."""
        self.db.close()

    def __repr__(self) -> str:
        return f"PostgresConversationStore({self.db.where!r}, table={self.table!r})"
