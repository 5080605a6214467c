"""Runs a script in a namespace: compile, execute, capture, the watchdog, the result.

The same code runs inline (in the host) and inside a worker. It knows nothing of storage or of processes:
checkpoints leave it as unsigned bytes. Its names are imported on first use (`snapcell._support._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.interpreter._host import HostCall, HostFunction
    from snapcell.interpreter._result import Artifact, RunResult
    from snapcell.interpreter._runner import Runner

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.interpreter._host": (
        "HostCall",
        "HostFunction",
    ),
    "snapcell.interpreter._result": (
        "Artifact",
        "RunResult",
    ),
    "snapcell.interpreter._runner": ("Runner",),
}

__all__ = [
    "Artifact",
    "HostCall",
    "HostFunction",
    "RunResult",
    "Runner",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
