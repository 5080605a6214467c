"""Where checkpoint bytes live: the `Store` protocol, its backends, and the expiry and quota cleanup job.

Pick a backend by URL with `open_store` (``file://``, ``s3://``, ``memory://``); wrap it in `AsyncStore` for async
callers. Cleanup and usage are plain functions over any store; the ``snapcell`` command (`snapcell.cli`) runs them.
"""

from ._cleanup import DEFAULT_TTL_S, CleanupReport, DayUsage, UsageReport, cleanup, usage
from ._config import S3Config
from ._heads import (
    Head,
    HeadStore,
    MemoryHeads,
    RecordHeads,
    TurnRecord,
    validate_conversation_id,
    validate_turn_id,
)
from ._heads_async import AsyncHeads
from ._heads_s3 import S3Heads
from ._heads_sqlite import SQLiteHeads
from ._local import LocalStore
from ._memory import MemoryStore
from ._open import default_heads, open_heads, open_store
from ._protocol import AsyncStore, BoundedGet, ObjectInfo, Store, storage_deadline, validate_key
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
    "RecordHeads",
    "S3Config",
    "S3Heads",
    "S3Store",
    "SQLiteHeads",
    "Store",
    "TurnRecord",
    "UsageReport",
    "cleanup",
    "default_heads",
    "install_lifecycle",
    "open_heads",
    "open_store",
    "storage_deadline",
    "usage",
    "validate_conversation_id",
    "validate_key",
    "validate_turn_id",
]
