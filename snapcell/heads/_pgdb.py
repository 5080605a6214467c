"""`PostgresDatabase`: a PostgreSQL database as snapcell's stores use it (a connection pool, its errors, its tables).

Shared by `PostgresHeads` and the PostgreSQL conversation store, so that both speak of a database the same way: one
pool per URL (or the application's own pool), connection failures explained, tables created on first use under a
schema version. psycopg 3 is an optional dependency (``pip install 'snapcell[postgres]'``), imported on first use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from snapcell.errors import ConfigError, StorageError, StorageUnavailable, map_exceptions

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresDatabase", "require_psycopg"]

_SCHEMES = ("postgresql://", "postgres://")
# Lower case only, so a name means the same table quoted or not (in SQL, in `to_regclass`, in a person's psql).
_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,50}(\.[a-z_][a-z0-9_]{0,50})?\Z")
_SCHEMA_COMMENT = re.compile(r"snapcell (?P<kind>[a-z ]+), schema (?P<version>\d+)\Z")
# A call that cannot get a connection says why in the driver's words, followed by what to check.
_HINTS = (
    (re.compile(r"password authentication failed"), "check the password: in the URL, PGPASSWORD or ~/.pgpass"),
    (re.compile(r"no pg_hba\.conf entry"), "the server's pg_hba.conf does not let this client in"),
    (re.compile(r'role ".*" does not exist'), "check the user name in the URL, or create that role"),
    (re.compile(r'database ".*" does not exist'), "check the database name in the URL, or create it (createdb NAME)"),
    (re.compile(r"failed to resolve host|could not translate host name"), "check the host name in the URL"),
    (re.compile(r"timeout expired"), "the server did not answer in time: check the host, the port and firewalls"),
)


def require_psycopg() -> None:
    """Check that psycopg 3 and its pool can be imported, or say how to install them.

    Raises:
        ConfigError: psycopg or psycopg_pool is not installed.
    """
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"PostgreSQL needs psycopg 3 with its pool ({exc.name} is not installed): "
            "pip install 'snapcell[postgres]' (or 'psycopg[binary,pool]')"
        ) from None


def _explain(exc: BaseException) -> str:
    """The driver's message on one line, followed by what to check when it is a known connection failure."""
    text = " ".join(str(exc).split())
    hint = next((hint for pattern, hint in _HINTS if pattern.search(text)), "")
    return f"{text} ({hint})" if hint else text


def _redacted(conninfo: dict[str, Any]) -> str:
    """A URL naming the user, host, port and database of connection parameters, never the password."""
    user = f"{conninfo['user']}@" if conninfo.get("user") else ""
    host = str(conninfo.get("host") or "")
    port = f":{conninfo['port']}" if conninfo.get("port") else ""
    return f"postgresql://{user}{host}{port}/{conninfo.get('dbname') or ''}"


class PostgresDatabase:
    """A PostgreSQL database through a psycopg connection pool, with its errors in snapcell's terms.

    Given a URL, it checks that the server answers (so a wrong host, user or password fails here, with the server's
    reason), then opens a pool of autocommit connections that it closes in `close`. Given a
    ``psycopg_pool.ConnectionPool`` (to share one with the application), it uses that pool and leaves it open.

    Args:
        target: ``postgresql://user:password@host:port/dbname?param=value`` (or ``postgres://``; every libpq
            parameter works, and libpq's ``PG*`` variables and ``~/.pgpass`` fill in what the URL leaves out), or a
            pool.
        max_connections: The most connections an opened pool keeps (default 10; it starts with one).
        connect_timeout_s: Seconds to wait for a connection, from the pool or to the server (default 10).

    Raises:
        ConfigError: psycopg is not installed, or the URL or a setting is malformed.
        StorageUnavailable: The server cannot be reached or refuses the connection; the message says why.
    """

    def __init__(
        self,
        target: str | ConnectionPool[Any],
        *,
        max_connections: int = 10,
        connect_timeout_s: float = 10.0,
    ) -> None:
        require_psycopg()
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigError(f"max_connections must be a positive integer, not {max_connections!r}")
        if not isinstance(connect_timeout_s, int | float) or connect_timeout_s <= 0:
            raise ConfigError(f"connect_timeout_s must be a positive number of seconds, not {connect_timeout_s!r}")
        self.connect_timeout_s = float(connect_timeout_s)
        self._kwargs: dict[str, Any] = {}
        if isinstance(target, ConnectionPool):
            self.pool: ConnectionPool[Any] = target
            self._owns_pool = False
            # Either may be a function that the pool calls for each new connection (rotating credentials).
            conninfo, kwargs = target.conninfo, target.kwargs
            self._conninfo = conninfo() if callable(conninfo) else conninfo
            self._kwargs = dict((kwargs() if callable(kwargs) else kwargs) or {})
            with map_exceptions([(psycopg.Error, ConfigError)], "the pool's connection parameters are malformed"):
                self.where = _redacted(conninfo_to_dict(self._conninfo, **self._kwargs))
            return
        if not isinstance(target, str) or not target.startswith(_SCHEMES):
            # Never the whole string: it may hold a password.
            if not isinstance(target, str):
                shown = f"a value of type {type(target).__name__}"
            elif "://" in target:
                shown = f"{target.partition('://')[0]}://..."
            else:
                shown = "a string without postgresql://"
            raise ConfigError(
                "a PostgreSQL database is a URL postgresql://user@host:port/dbname or a psycopg_pool.ConnectionPool, "
                f"not {shown}"
            )
        with map_exceptions([(psycopg.Error, ConfigError)], "malformed PostgreSQL URL"):
            params = conninfo_to_dict(target)
        self.where = _redacted(params)
        self._conninfo = target
        if "connect_timeout" not in params:  # libpq's own deadline for a new connection (whole seconds, at least 2)
            self._kwargs["connect_timeout"] = max(2, round(self.connect_timeout_s))
        self._owns_pool = True
        # Connect once before the pool does, in the foreground: the pool only retries in the background, and would
        # say no more than "no connection within 10 s".
        self._connect("connect").close()
        check = getattr(ConnectionPool, "check_connection", None)  # psycopg_pool >= 3.2
        self.pool = ConnectionPool(
            target,
            kwargs={**self._kwargs, "autocommit": True},
            min_size=1,
            max_size=max_connections,
            open=True,
            # A connection the server dropped (a restart, a failover) is noticed and replaced before it is used.
            check=check,
            timeout=self.connect_timeout_s,
            name="snapcell",
            num_workers=2,
        )

    def _connect(self, what: str) -> psycopg.Connection[Any]:
        """A new connection outside the pool.

        Raises:
            StorageUnavailable: The server cannot be reached or refused it; the message says why.
        """
        import psycopg

        try:
            connection: psycopg.Connection[Any] = psycopg.connect(
                self._conninfo, **{**self._kwargs, "autocommit": True}
            )
        except psycopg.Error as exc:
            raise StorageUnavailable(f"cannot {what} to PostgreSQL at {self.where}: {_explain(exc)}") from exc
        return connection

    def _why_no_connection(self) -> str:
        """Why the pool gave no connection in time: the server's answer to a new connection, or a busy pool."""
        try:
            self._connect("connect").close()
        except StorageUnavailable as exc:
            return str(exc).partition(": ")[2]
        return (
            f"the server accepts connections: all {self.pool.max_size} of the pool's were busy "
            "(raise max_connections, or run fewer turns at once)"
        )

    @contextmanager
    def connection(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the pool for one operation; psycopg's errors become `StorageError`.

        ``what`` says what was being done (``"read head 'c'"``), for the message.

        Raises:
            StorageUnavailable: No connection within ``connect_timeout_s`` (the message says why: one more
                connection is tried, outside the pool, to find out), the connection broke, the server refused
                access, or a statement timed out.
            StorageError: Any other database error.
        """
        from psycopg_pool import PoolTimeout

        with map_exceptions(_errors(), f"cannot {what} in PostgreSQL at {self.where}"):
            try:
                with self.pool.connection(timeout=self.connect_timeout_s) as connection:
                    yield connection
            except PoolTimeout as exc:
                raise StorageUnavailable(
                    f"cannot {what} in PostgreSQL at {self.where}: no connection within {self.connect_timeout_s:g} s "
                    f"({self._why_no_connection()})"
                ) from exc

    @staticmethod
    def check_table_name(table: str, *, suffix: str = "") -> str:
        """Check a table name (``name`` or ``schema.name``: lower-case letters, digits and ``_``) and return it.

        ``suffix``: the name is also used with this appended (for a second table), which must fit as well.

        Raises:
            ConfigError: The name is malformed or too long.
        """
        if not isinstance(table, str) or not _TABLE.match(table + suffix):
            raise ConfigError(
                f"invalid table name {table!r}: use lower-case letters, digits and '_' (up to {51 - len(suffix)}), "
                "optionally after a schema name and a dot"
            )
        return table

    @staticmethod
    def identifier(table: str, suffix: str = "") -> sql.Identifier:
        """The quoted SQL name of a table checked by `check_table_name`, with ``suffix`` appended to its name."""
        from psycopg import sql

        schema, dot, name = table.rpartition(".")
        return sql.Identifier(*((schema, name + suffix) if dot else (name + suffix,)))

    def ensure_table(
        self,
        table: str,
        kind: str,
        version: int,
        ddl: Sequence[str],
        *,
        create: bool,
        names: Mapping[str, str] | None = None,
    ) -> None:
        """Make sure ``table`` exists and was made by snapcell for ``kind`` at a schema this release reads.

        The schema version is the table's comment (``snapcell heads, schema 1``). A missing table is created with
        ``ddl``: statements that name it ``{table}`` (and other tables by the keys of ``names``, each formatted
        with the quoted name), run in one transaction under an advisory lock, so processes starting at once create
        it once.

        Raises:
            ConfigError: ``create`` is false and the table is missing, or the table is not snapcell's ``kind``, or
                it was made by a newer snapcell.
            StorageError: The database failed (a user without the right to create the table, say).
        """
        from psycopg import sql
        from psycopg.rows import tuple_row

        quoted = self.identifier(table)
        others = {key: self.identifier(name) for key, name in (names or {}).items()}
        with self.connection(f"prepare table {table}") as connection, connection.transaction():
            cursor = connection.cursor(row_factory=tuple_row)
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('snapcell tables'))")
            cursor.execute(
                "SELECT obj_description(to_regclass(%s), 'pg_class'), to_regclass(%s) IS NOT NULL", (table, table)
            )
            comment, exists = cursor.fetchone() or (None, False)
            if not exists:
                if not create:
                    raise ConfigError(
                        f"no snapcell {kind} in PostgreSQL at {self.where}: the table {table} does not exist; "
                        "check the URL's database and the table name"
                    )
                for statement in ddl:
                    cursor.execute(sql.SQL(statement).format(table=quoted, **others))
                cursor.execute(
                    sql.SQL("COMMENT ON TABLE {table} IS {comment}").format(
                        table=quoted, comment=sql.Literal(f"snapcell {kind}, schema {version}")
                    )
                )
                return
        found = _SCHEMA_COMMENT.match(comment or "")
        if found is None or found["kind"] != kind:
            raise ConfigError(
                f"the table {table} in PostgreSQL at {self.where} is not snapcell's {kind} (its comment is "
                f"{comment!r}, not 'snapcell {kind}, schema N'); give another table name"
            )
        if int(found["version"]) > version:
            raise ConfigError(
                f"the table {table} in PostgreSQL at {self.where} was made by a newer snapcell (schema "
                f"{found['version']}; this one reads schema {version}): upgrade snapcell"
            )

    def close(self) -> None:
        """Close the pool if this object opened it (not one that was passed in)."""
        if self._owns_pool:
            self.pool.close()

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.where!r})"


def _errors() -> list[tuple[type[BaseException] | tuple[type[BaseException], ...], type[StorageError]]]:
    """How psycopg's errors map to snapcell's: a lost or refused connection, a denied table, a timeout (lock or
    statement) are `StorageUnavailable`; everything else is a `StorageError`."""
    import psycopg

    return [
        ((psycopg.OperationalError, psycopg.errors.InsufficientPrivilege), StorageUnavailable),
        (psycopg.Error, StorageError),
    ]
