"""Where checkpoint bytes live: the `Store` protocol, its backends, and the expiry and quota cleanup job.

Pick a backend by URL with `open_store` (``file://``, ``s3://``, ``memory://``); wrap it in `AsyncStore` for async
callers. Cleanup and usage are plain functions over any store; `add_commands` puts them on the CLI.
"""

from ._cleanup import CleanupReport, DayUsage, UsageReport, cleanup, usage
from ._commands import add_commands, parse_duration, parse_size
from ._config import S3Config, open_store
from ._local import LocalStore
from ._memory import MemoryStore
from ._protocol import AsyncStore, ObjectInfo, Store, validate_key
from ._s3 import S3Store, install_lifecycle

__all__ = [
    "AsyncStore",
    "CleanupReport",
    "DayUsage",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "S3Config",
    "S3Store",
    "Store",
    "UsageReport",
    "add_commands",
    "cleanup",
    "install_lifecycle",
    "open_store",
    "parse_duration",
    "parse_size",
    "usage",
    "validate_key",
]
