"""What a test may read of another process from ``/proc``, with the race of its exit handled in one place.

A process can be reaped between opening its ``/proc/PID/stat`` and reading it: the open succeeds and the read
fails with ``ESRCH`` (``ProcessLookupError``), which is neither ``FileNotFoundError`` nor a state. Every test that
asks whether a process is alive or gone reads it through here.
"""

from __future__ import annotations

import os
import time

__all__ = ["alive", "exited", "state", "wait_gone"]


def state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``Z``, ...), or None once it is reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:  # FileNotFoundError before the open, ProcessLookupError between the open and the read
        return None
    # The command name may hold spaces and parentheses: the state follows its last ")".
    fields = text.rpartition(b")")[2].split()
    return fields[0].decode() if fields else None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not count)."""
    return state(pid) not in (None, "Z", "X")


def exited(pid: int) -> bool:
    """Whether the process has exited with all its threads (reaped, or a zombie alone in its thread group): its
    descriptors are closed then. A zombie leader whose other threads are still exiting may hold them a moment."""
    if alive(pid):
        return False
    try:
        return os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except OSError:
        return True


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids of ``pids`` still running once all have stopped or after ``timeout_s`` (a hang guard: a killed
    process exits when the kernel gets to it, not when ``kill()`` returns)."""
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if alive(pid)]
