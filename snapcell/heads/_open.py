"""Opening head stores: the one that goes with a checkpoint store, or the one a URL names."""

from __future__ import annotations

from snapcell.errors import ConfigError
from snapcell.storage import LocalStore, MemoryStore, S3Store, open_store

from ._heads import HeadStore, MemoryHeads

__all__ = ["default_heads", "open_heads"]


def default_heads(store: object) -> HeadStore:
    """The head store that goes with a checkpoint store.

    A `LocalStore` gets `SQLiteHeads` in ``<root>/.heads.sqlite3`` (a dot-file, so store scans, usage and quota
    ignore it), an `S3Store` gets `S3Heads` under its prefix, a `MemoryStore` gets `MemoryHeads`.

    Raises:
        ConfigError: The store is of another kind; pass ``heads=`` explicitly.
    """
    from ._s3 import S3Heads
    from ._sqlite import SQLiteHeads

    if isinstance(store, LocalStore):
        return SQLiteHeads(store.root / ".heads.sqlite3")
    if isinstance(store, S3Store):
        return S3Heads(store)
    if isinstance(store, MemoryStore):
        return MemoryHeads()
    raise ConfigError(f"no default head store for {store!r}; pass heads=SQLiteHeads(path) or heads=S3Heads(store)")


def open_heads(url: str, *, must_exist: bool = False, **options: object) -> HeadStore:
    """Open the head store a URL names: ``sqlite:///abs/path``, ``sqlite://rel/path``, ``s3://bucket/prefix``
    (heads under ``prefix/heads/``; ``options`` go to `open_store`), ``postgresql://user@host:port/dbname`` or
    ``postgres://...`` (`PostgresHeads`; ``options`` go to it, ``table=`` say) or ``memory://``.

    With ``must_exist`` (cleanup's mode, where a head store that is wrongly empty would let heads be deleted), a
    SQLite file or a PostgreSQL table is never created and ``memory://``, always empty, is refused.

    Raises:
        ConfigError: Unknown scheme or malformed URL; with ``must_exist``, no such SQLite file or PostgreSQL table,
            or ``memory://``; psycopg is not installed for a PostgreSQL URL.
        StorageUnavailable: The PostgreSQL server cannot be reached or refuses the connection.
    """
    from ._postgres import PostgresHeads
    from ._s3 import S3Heads
    from ._sqlite import SQLiteHeads

    scheme, sep, rest = url.partition("://") if isinstance(url, str) else ("", "", "")
    if scheme == "sqlite" and rest and not options:
        return SQLiteHeads(rest, create=not must_exist)
    if scheme == "memory" and not options:
        if must_exist:
            raise ConfigError("a memory:// head store is always empty here; give the head store the sessions use")
        return MemoryHeads()
    if scheme in ("postgresql", "postgres") and rest:
        return PostgresHeads(url, create=not must_exist, **options)  # type: ignore[arg-type]
    if scheme == "s3":
        store = open_store(url, **options)  # type: ignore[arg-type]
        if isinstance(store, S3Store):
            heads = S3Heads(store)
            heads._owns_store = True
            return heads
    raise ConfigError(
        f"invalid head store URL {url!r}; use sqlite:///path, s3://bucket/prefix, "
        "postgresql://user@host:port/dbname or memory://"
    )
