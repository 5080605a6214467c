"""`snapcell.errors.RunCancelled`, apart because it subclasses `asyncio.CancelledError` (importing it imports asyncio).

`snapcell.errors` gives it out on first use; it is named and pickled as ``snapcell.errors.RunCancelled``.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["RunCancelled"]


class RunCancelled(asyncio.CancelledError):
    """Raised by `AsyncSession.run` when its task was cancelled: the script was interrupted, the namespace kept.

    A `asyncio.CancelledError`, so cancellation still propagates; ``result`` (status ``"cancelled"``) says what the
    run printed and which variables it had assigned. The session is usable; dump it to keep what the run got to.

    Attributes:
        result: The run's `RunResult` up to the cancellation.
    """

    def __init__(self, result: Any) -> None:
        super().__init__("the run was cancelled")
        self.result = result


RunCancelled.__module__ = "snapcell.errors"
