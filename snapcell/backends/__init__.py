"""The host's side of a session: the `Backend` seam, inline and process backends, the worker pool, the zygote host.

Nothing here runs inside a worker, and nothing here imports `snapcell.worker` (they share `snapcell.wire`,
`snapcell.interpreter`, `snapcell.policy` and `snapcell.limits`). Its names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.backends._backend import Backend, DumpRequest, InlineBackend, LoadRequest, RunRequest
    from snapcell.backends._procbackend import ProcessBackend
    from snapcell.backends._workerpool import WorkerOptions, WorkerPool

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.backends._backend": (
        "Backend",
        "DumpRequest",
        "InlineBackend",
        "LoadRequest",
        "RunRequest",
    ),
    "snapcell.backends._procbackend": ("ProcessBackend",),
    "snapcell.backends._workerpool": (
        "WorkerOptions",
        "WorkerPool",
    ),
}

__all__ = [
    "Backend",
    "DumpRequest",
    "InlineBackend",
    "LoadRequest",
    "ProcessBackend",
    "RunRequest",
    "WorkerOptions",
    "WorkerPool",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
