"""One checked-out session: load a checkpoint, run scripts, dump a new checkpoint; `Session` is its sync twin.

Every check the host makes of what a worker sent about a checkpoint is in one module, `_verify.py` (`Verifier`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.session._pause import Answer, check_pausing
    from snapcell.session._session import DEFAULT_MAX_CLOCK_SKEW_S, AsyncSession, SessionConfig
    from snapcell.session._sync import Session
    from snapcell.session._verify import Verifier

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.session._pause": (
        "Answer",
        "check_pausing",
    ),
    "snapcell.session._session": (
        "DEFAULT_MAX_CLOCK_SKEW_S",
        "AsyncSession",
        "SessionConfig",
    ),
    "snapcell.session._sync": ("Session",),
    "snapcell.session._verify": ("Verifier",),
}

__all__ = [
    "DEFAULT_MAX_CLOCK_SKEW_S",
    "Answer",
    "AsyncSession",
    "Session",
    "SessionConfig",
    "Verifier",
    "check_pausing",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
