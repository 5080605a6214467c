"""Where checkpoint bytes live: the `Store` protocol and its backends, over opaque keys and bytes.

Pick a backend by URL with `open_store` (``file://``, ``s3://``, ``memory://``); wrap it in `AsyncStore` for async
callers. Heads (`snapcell.heads`), conversations and the cleanup job (`snapcell.ops`) build on it; it imports
nothing of snapcell but `snapcell.errors` and `snapcell._support`.
"""

from ._config import S3Config
from ._local import LocalStore
from ._memory import MemoryStore
from ._open import open_store
from ._protocol import (
    DEFAULT_TTL_S,
    AsyncStore,
    BoundedGet,
    BulkDelete,
    ObjectInfo,
    Store,
    storage_deadline,
    validate_key,
    validate_prefix,
)
from ._s3 import S3Store, install_lifecycle

__all__ = [
    "DEFAULT_TTL_S",
    "AsyncStore",
    "BoundedGet",
    "BulkDelete",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "S3Config",
    "S3Store",
    "Store",
    "install_lifecycle",
    "open_store",
    "storage_deadline",
    "validate_key",
    "validate_prefix",
]
