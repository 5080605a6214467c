"""One checked-out session: load a checkpoint, run scripts, dump a new checkpoint; `Session` is its sync twin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.session._session import DEFAULT_MAX_CLOCK_SKEW_S, AsyncSession
    from snapcell.session._sync import Session

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.session._session": (
        "DEFAULT_MAX_CLOCK_SKEW_S",
        "AsyncSession",
    ),
    "snapcell.session._sync": ("Session",),
}

__all__ = [
    "DEFAULT_MAX_CLOCK_SKEW_S",
    "AsyncSession",
    "Session",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
