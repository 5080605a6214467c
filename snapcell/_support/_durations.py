"""Spans of time as a person reads them in a message: "3 minutes", "1.5 hours", "7 days"."""

from __future__ import annotations

__all__ = ["ago", "duration"]


def ago(seconds: float) -> str:
    """How long ago (or ahead), roughly: "5 minutes", "2.5 hours", "3.0 days"."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def duration(seconds: float) -> str:
    """A ttl as people say it: "7 days", "12 hours", "30 seconds"."""
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
        if seconds >= size:
            amount = seconds / size
            return f"{amount:.3g} {unit}{'' if amount == 1 else 's'}"
    return f"{seconds:.3g} seconds"
