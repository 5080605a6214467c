"""What the host reads of a worker from ``/proc``: its CPU time and peak memory, never anything the worker says.

The two files are opened once, when the worker has started, and read with ``pread`` on every run: that costs a
third of opening them each time, and the descriptors stay bound to that process (once it is gone a read fails,
whatever process later gets its pid).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["ProcStat", "parent_of"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_STAT_BYTES = 4096
_STATUS_BYTES = 16 * 1024


class ProcStat:
    """A worker's ``/proc/PID/stat`` and ``status``, kept open; every reading is None when it is unknown."""

    def __init__(self, pid: int) -> None:
        self._stat = _open(f"/proc/{pid}/stat")
        self._status = _open(f"/proc/{pid}/status")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the worker (all its threads)."""
        if self._stat is None:
            return None
        try:
            fields = os.pread(self._stat, _STAT_BYTES, 0).rpartition(b")")[2].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, ValueError, IndexError):
            return None

    def peak_rss(self) -> int | None:
        """The worker's peak resident set size in bytes (``VmHWM``)."""
        if self._status is None:
            return None
        try:
            text = os.pread(self._status, _STATUS_BYTES, 0)
            start = text.index(b"\nVmHWM:") + 7
            return int(text[start : text.index(b"kB", start)]) * 1024
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Close both descriptors; safe to call twice."""
        for fd in (self._stat, self._status):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stat = self._status = None


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` from /proc (0 if unknown).

    Read from ``stat`` (one short line) rather than ``status`` (some fifty the kernel formats): once per worker start,
    to check that a process the host did not start itself (a forked or launched worker) is the one it was told of.
    """
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
        # The command name (field 2) may hold spaces and parentheses: the state and the parent follow its last ")".
        return int(text.rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
