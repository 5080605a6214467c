"""Operator jobs: the expiry and quota cleanup, the usage report, and inspecting a checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.ops._cleanup import (
        DEFAULT_BLOB_GRACE_S,
        DEFAULT_GRACE_S,
        MIN_BLOB_GRACE_S,
        MIN_GRACE_S,
        CleanupReport,
        DayUsage,
        UsageReport,
        cleanup,
        format_bytes,
        usage,
    )
    from snapcell.ops._inspect import InspectReport, inspect_checkpoint

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.ops._cleanup": (
        "DEFAULT_BLOB_GRACE_S",
        "DEFAULT_GRACE_S",
        "MIN_BLOB_GRACE_S",
        "MIN_GRACE_S",
        "CleanupReport",
        "DayUsage",
        "UsageReport",
        "cleanup",
        "format_bytes",
        "usage",
    ),
    "snapcell.ops._inspect": (
        "InspectReport",
        "inspect_checkpoint",
    ),
}

__all__ = [
    "DEFAULT_BLOB_GRACE_S",
    "DEFAULT_GRACE_S",
    "MIN_BLOB_GRACE_S",
    "MIN_GRACE_S",
    "CleanupReport",
    "DayUsage",
    "InspectReport",
    "UsageReport",
    "cleanup",
    "format_bytes",
    "inspect_checkpoint",
    "usage",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
