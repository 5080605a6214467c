"""Restricted execution of scripts: compile, policy, namespace, limits, workers.

Knows nothing of storage; checkpoints leave it as unsigned bytes. Its names are imported on first use
(`snapcell._lazy`): a worker imports its own modules without the inline backend (asyncio) or the checkpoint code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.runner._backend import Backend, InlineBackend
    from snapcell.runner._host import HostCall, HostFunction
    from snapcell.runner._limits import Limits
    from snapcell.runner._policy import DEFAULT_MODULES, Policy
    from snapcell.runner._result import Artifact, RunResult
    from snapcell.runner._runner import Runner
    from snapcell.runner._values import ScriptValue

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.runner._backend": ("Backend", "InlineBackend"),
    "snapcell.runner._host": ("HostCall", "HostFunction"),
    "snapcell.runner._limits": ("Limits",),
    "snapcell.runner._policy": ("DEFAULT_MODULES", "Policy"),
    "snapcell.runner._result": ("Artifact", "RunResult"),
    "snapcell.runner._runner": ("Runner",),
    "snapcell.runner._values": ("ScriptValue",),
}

__all__ = [
    "DEFAULT_MODULES",
    "Backend",
    "HostCall",
    "HostFunction",
    "InlineBackend",
    "Limits",
    "Policy",
    "Artifact",
    "RunResult",
    "Runner",
    "ScriptValue",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
