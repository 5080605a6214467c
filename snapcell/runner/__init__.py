"""Restricted execution of scripts: compile, policy, namespace, limits, workers.

Knows nothing of storage; checkpoints leave it as unsigned bytes.
"""

from snapcell.runner._backend import Backend, InlineBackend
from snapcell.runner._host import HostCall, HostFunction
from snapcell.runner._limits import Limits
from snapcell.runner._policy import DEFAULT_MODULES, Policy
from snapcell.runner._result import Artifact, RunResult
from snapcell.runner._runner import Runner
from snapcell.runner._values import ScriptValue

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
