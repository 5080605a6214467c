"""Small helpers every layer may use: lazy exports, the no-compile dataclass, durations, the sync loop, the table
of pickled helpers.

Its names are imported on first use, like every package's: a worker imports the sync loop (asyncio) only if it
needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import _lazy

if TYPE_CHECKING:
    from snapcell._support._callables import is_async_callable
    from snapcell._support._cancelled import RunCancelled
    from snapcell._support._durable import fsync_dir, make_dirs
    from snapcell._support._durations import ago, duration
    from snapcell._support._lazy import lazy_exports
    from snapcell._support._pickled import HELPERS_MODULE, pickled_helper, pickled_helpers
    from snapcell._support._record import dataclass, field
    from snapcell._support._syncloop import SyncLoop
    from snapcell._support._version import VERSION

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell._support._callables": ("is_async_callable",),
    "snapcell._support._cancelled": ("RunCancelled",),
    "snapcell._support._durable": (
        "fsync_dir",
        "make_dirs",
    ),
    "snapcell._support._durations": (
        "ago",
        "duration",
    ),
    "snapcell._support._lazy": ("lazy_exports",),
    "snapcell._support._pickled": (
        "HELPERS_MODULE",
        "pickled_helper",
        "pickled_helpers",
    ),
    "snapcell._support._record": (
        "dataclass",
        "field",
    ),
    "snapcell._support._syncloop": ("SyncLoop",),
    "snapcell._support._version": ("VERSION",),
}

__all__ = [
    "HELPERS_MODULE",
    "VERSION",
    "RunCancelled",
    "SyncLoop",
    "ago",
    "dataclass",
    "duration",
    "field",
    "fsync_dir",
    "is_async_callable",
    "lazy_exports",
    "make_dirs",
    "pickled_helper",
    "pickled_helpers",
]

__getattr__, __dir__ = _lazy.lazy_exports(__name__, _EXPORTS, globals())
