"""Operator jobs: the expiry and quota cleanup, the usage report, and inspecting a checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.ops._cleanup import CleanupReport, DayUsage, UsageReport, cleanup, usage
    from snapcell.ops._inspect import InspectReport, inspect_checkpoint

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.ops._cleanup": (
        "CleanupReport",
        "DayUsage",
        "UsageReport",
        "cleanup",
        "usage",
    ),
    "snapcell.ops._inspect": (
        "InspectReport",
        "inspect_checkpoint",
    ),
}

__all__ = [
    "CleanupReport",
    "DayUsage",
    "InspectReport",
    "UsageReport",
    "cleanup",
    "inspect_checkpoint",
    "usage",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
