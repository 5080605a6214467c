"""Where checkpoint bytes live: the `Store` protocol, its backends, and the expiry and quota cleanup job.

Pick a backend by URL with `open_store` (``file://``, ``s3://``, ``memory://``); wrap it in `AsyncStore` for async
callers. Cleanup and usage are plain functions over any store; `add_commands` puts them on the CLI.
"""

from ._cleanup import DEFAULT_TTL_S, CleanupReport, DayUsage, UsageReport, cleanup, usage
from ._commands import add_commands, parse_duration, parse_size
from ._config import S3Config, open_store
from ._heads import AsyncHeads, Head, HeadStore, MemoryHeads, default_heads, open_heads, validate_conversation_id
from ._heads_s3 import S3Heads
from ._heads_sqlite import SQLiteHeads
from ._local import LocalStore
from ._memory import MemoryStore
from ._protocol import AsyncStore, BoundedGet, ObjectInfo, Store, validate_key
from ._s3 import S3Store, install_lifecycle

__all__ = [
    "DEFAULT_TTL_S",
    "AsyncHeads",
    "AsyncStore",
    "BoundedGet",
    "CleanupReport",
    "DayUsage",
    "Head",
    "HeadStore",
    "LocalStore",
    "MemoryHeads",
    "MemoryStore",
    "ObjectInfo",
    "S3Config",
    "S3Heads",
    "S3Store",
    "SQLiteHeads",
    "Store",
    "UsageReport",
    "add_commands",
    "cleanup",
    "default_heads",
    "install_lifecycle",
    "open_heads",
    "open_store",
    "parse_duration",
    "parse_size",
    "usage",
    "validate_conversation_id",
    "validate_key",
]
