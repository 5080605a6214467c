"""What a script learns of its session's memory: the ``memory()`` builtin, and ``/proc/self/status`` in a worker.

A worker's sandbox hides ``/proc``. The worker makes the memory lines of its ``/proc/self/status`` from what it
reads anyway (`Runner` ``read_status``), and scripts get them through ``memory()``, and as the file
``/proc/self/status`` when they ``open`` it for reading. Nothing of the real ``/proc`` becomes readable.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

__all__ = ["STATUS_PATH", "make_memory", "serving_status"]

STATUS_PATH = "/proc/self/status"


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
    """``open`` that serves ``/proc/self/status`` (memory lines, read-only) and passes every other call on."""

    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if type(file) is str and file == STATUS_PATH and mode in ("r", "rt", "rb"):
            text = read_status()
            if text is not None:
                return io.BytesIO(text.encode()) if mode == "rb" else io.StringIO(text)
        return real_open(file, mode, *args, **kwargs)

    return open
