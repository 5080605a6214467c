"""The guardrail: which imports, builtins and attributes a script may use, source rewrites, the runtime guard.

A guardrail that gives the model a clear `PolicyError`, never a boundary on its own: the boundary is the worker
process (`snapcell.sandbox`, `snapcell.worker`). Its names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.policy._guard import (
        GUARD_GLOBALS,
        INTERNAL_NAMES,
        SAFE_DUNDERS,
        attribute_problem,
        is_dunder,
        name_denied,
        register_recording_hooks,
        register_stand_in,
        warm_guarded_builtins,
    )
    from snapcell.policy._policy import DEFAULT_MODULES, Policy, with_file_access
    from snapcell.policy._ticks import EXPIRED_NAME, TICK_NAME, ScriptInterrupt, apply_checks, instrument, tick

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.policy._guard": (
        "GUARD_GLOBALS",
        "INTERNAL_NAMES",
        "SAFE_DUNDERS",
        "attribute_problem",
        "is_dunder",
        "name_denied",
        "register_recording_hooks",
        "register_stand_in",
        "warm_guarded_builtins",
    ),
    "snapcell.policy._policy": (
        "DEFAULT_MODULES",
        "Policy",
        "with_file_access",
    ),
    "snapcell.policy._ticks": (
        "EXPIRED_NAME",
        "TICK_NAME",
        "ScriptInterrupt",
        "apply_checks",
        "instrument",
        "tick",
    ),
}

__all__ = [
    "DEFAULT_MODULES",
    "EXPIRED_NAME",
    "GUARD_GLOBALS",
    "INTERNAL_NAMES",
    "SAFE_DUNDERS",
    "TICK_NAME",
    "Policy",
    "ScriptInterrupt",
    "apply_checks",
    "attribute_problem",
    "instrument",
    "is_dunder",
    "name_denied",
    "register_recording_hooks",
    "register_stand_in",
    "tick",
    "warm_guarded_builtins",
    "with_file_access",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
