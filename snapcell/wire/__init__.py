"""Everything that crosses a process boundary: one codec for frames, plain data, a run's value, every size.

A worker keeps within these sizes and the host checks every frame against them: the host's side of the boundary
reads nothing a worker sends except through here. Its names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.wire._values import ScriptValue

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.wire._values": ("ScriptValue",),
}

__all__ = [
    "ScriptValue",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
