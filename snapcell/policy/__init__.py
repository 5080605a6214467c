"""The guardrail: which imports, builtins and attributes a script may use, source rewrites, the runtime guard.

A guardrail that gives the model a clear `PolicyError`, never a boundary on its own: the boundary is the worker
process (`snapcell.sandbox`, `snapcell.worker`). Its names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.policy._policy import DEFAULT_MODULES, Policy

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.policy._policy": (
        "DEFAULT_MODULES",
        "Policy",
    ),
}

__all__ = [
    "DEFAULT_MODULES",
    "Policy",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
