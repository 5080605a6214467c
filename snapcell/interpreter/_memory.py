"""What a script learns of its session's memory: the ``memory()`` builtin, and ``/proc/self/status`` in a worker.

A worker's sandbox hides ``/proc``; the worker keeps a descriptor of its own ``/proc/self/status`` opened before the
sandbox (`Runner` ``read_status``), and scripts get its memory lines from it: through ``memory()``, and as the file
``/proc/self/status`` when they ``open`` it for reading. Nothing else of ``/proc`` becomes readable.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

__all__ = ["STATUS_PATH", "make_memory", "serving_status", "status_memory_lines"]

STATUS_PATH = "/proc/self/status"
# The lines of the status file a script is shown: its memory, and its name and threads for context.
_SHOWN = ("Name:", "Vm", "Rss", "Hugetlb", "Threads:")


def status_memory_lines(text: str) -> str:
    """The memory lines (and name and thread count) of a ``/proc/<pid>/status`` text."""
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith(_SHOWN))


def _kib_field(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def make_memory(
    read_status: Callable[[], str | None] | None, limit_bytes: Callable[[], int | None]
) -> Callable[[], dict[str, int | None]]:
    """The ``memory()`` builtin: reads the status text when called (None: the session has no process of its own)."""

    def memory() -> dict[str, int | None]:
        """This session's memory in bytes: resident now, its peak, address space and its limit (None: unknown)."""
        text = read_status() if read_status is not None else None
        if text is None:
            return {
                "resident_bytes": None,
                "peak_resident_bytes": None,
                "address_space_bytes": None,
                "limit_bytes": None,
            }
        return {
            "resident_bytes": _kib_field(text, "VmRSS"),
            "peak_resident_bytes": _kib_field(text, "VmHWM"),
            "address_space_bytes": _kib_field(text, "VmSize"),
            "limit_bytes": limit_bytes(),
        }

    return memory


def serving_status(real_open: Callable[..., Any], read_status: Callable[[], str | None]) -> Callable[..., Any]:
    """``open`` that serves ``/proc/self/status`` (its memory lines, read-only) and passes every other call on."""

    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if type(file) is str and file == STATUS_PATH and mode in ("r", "rt", "rb"):
            text = read_status()
            if text is not None:
                shown = status_memory_lines(text)
                return io.BytesIO(shown.encode()) if mode == "rb" else io.StringIO(shown)
        return real_open(file, mode, *args, **kwargs)

    return open
