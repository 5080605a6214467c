"""Runs a script in a namespace: compile, execute, capture, the watchdog, the result.

The same code runs inline (in the host) and inside a worker. It knows nothing of storage or of processes:
checkpoints leave it as unsigned bytes. Its names are imported on first use (`snapcell._support._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.interpreter._host import (
        PAUSE_ERROR,
        CallCounter,
        HostCall,
        HostFunction,
        LocalBridge,
        PauseRequested,
        ScriptPaused,
        validate_lookup,
    )
    from snapcell.interpreter._interrupt import Watchdog, start_watchdog
    from snapcell.interpreter._replay import inputs_off
    from snapcell.interpreter._result import Artifact, PausedCall, RunResult
    from snapcell.interpreter._runner import DROPPED_PREFIX, Runner, checkpoint_rule, dropped_note, lost_at_load

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.interpreter._host": (
        "PAUSE_ERROR",
        "CallCounter",
        "HostCall",
        "HostFunction",
        "LocalBridge",
        "PauseRequested",
        "ScriptPaused",
        "validate_lookup",
    ),
    "snapcell.interpreter._interrupt": (
        "Watchdog",
        "start_watchdog",
    ),
    "snapcell.interpreter._replay": ("inputs_off",),
    "snapcell.interpreter._result": (
        "Artifact",
        "PausedCall",
        "RunResult",
    ),
    "snapcell.interpreter._runner": (
        "DROPPED_PREFIX",
        "Runner",
        "checkpoint_rule",
        "dropped_note",
        "lost_at_load",
    ),
}

__all__ = [
    "DROPPED_PREFIX",
    "PAUSE_ERROR",
    "Artifact",
    "CallCounter",
    "HostCall",
    "HostFunction",
    "LocalBridge",
    "PauseRequested",
    "PausedCall",
    "RunResult",
    "Runner",
    "ScriptPaused",
    "Watchdog",
    "checkpoint_rule",
    "dropped_note",
    "inputs_off",
    "lost_at_load",
    "start_watchdog",
    "validate_lookup",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
