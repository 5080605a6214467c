"""The host's scanner: the checkpoint rule applied to a pickle stream without unpickling it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.checkpoint.scan._scan import PLAIN_UNREFUSED_BYTES, scan_pickle, scan_pickle_data
    from snapcell.checkpoint.scan._scanplain import compile_patterns

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.checkpoint.scan._scan": (
        "PLAIN_UNREFUSED_BYTES",
        "scan_pickle",
        "scan_pickle_data",
    ),
    "snapcell.checkpoint.scan._scanplain": ("compile_patterns",),
}

__all__ = [
    "PLAIN_UNREFUSED_BYTES",
    "compile_patterns",
    "scan_pickle",
    "scan_pickle_data",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
