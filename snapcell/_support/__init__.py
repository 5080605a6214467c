"""Small helpers every layer may use: lazy exports, the no-compile dataclass, durations, the sync loop.

Its names are imported on first use, like every package's: a worker imports the sync loop (asyncio) only if it
needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import _lazy

if TYPE_CHECKING:
    from snapcell._support._lazy import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell._support._lazy": ("lazy_exports",),
}

__all__ = [
    "lazy_exports",
]

__getattr__, __dir__ = _lazy.lazy_exports(__name__, _EXPORTS, globals())
