"""The host's scanner: the checkpoint rule applied to a pickle stream without unpickling it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.checkpoint.scan._hostscan import scan_body
    from snapcell.checkpoint.scan._scan import scan_pickle

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.checkpoint.scan._hostscan": ("scan_body",),
    "snapcell.checkpoint.scan._scan": ("scan_pickle",),
}

__all__ = [
    "scan_body",
    "scan_pickle",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
