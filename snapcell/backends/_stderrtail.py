"""A child's stderr as the host keeps it: a pipe drained as it fills, of which only the last bytes are kept.

A worker is hostile, so its stderr must cost the host nothing it could grow: not a file on the host's disk (a
``posix_fallocate`` of fd 2 would take the host's temp space at once), and not memory. The host reads the pipe
whenever it has data, a bounded read per turn of the event loop, and keeps the last `KEEP_BYTES` of what it read;
a writer that floods it only makes the host read and drop. The worker itself sees a plain pipe on fd 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

__all__ = ["KEEP_BYTES", "StderrTail"]

# The most of a child's stderr kept (its end): a Python traceback and the lines before it.
KEEP_BYTES = 64 * 1024
# One read per turn of the event loop: other sessions' I/O goes between two.
_READ_BYTES = 64 * 1024
# What `tail` reads on the spot, at most, of what is waiting in the pipe (a live writer could keep it full).
_CATCH_UP_BYTES = 1024 * 1024


class StderrTail:
    """A pipe for a child's stderr, and the last `KEEP_BYTES` the host has read of it.

    Give `write_fd` to the child (as its fd 2) and call `close_write_end` once it has it; `watch` reads the pipe in
    the running event loop from then on; `tail` says how it ends; `close` stops reading.
    """

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self._keep = keep_bytes
        read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(read_fd, False)
        self._read_fd = read_fd
        self._kept = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def kept_bytes(self) -> int:
        """How many bytes of the child's stderr the host holds now (at most twice `KEEP_BYTES` and one read)."""
        return len(self._kept)

    def close_write_end(self) -> None:
        """Close the host's copy of the write end (the child has its own): the pipe ends when the child's does."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def watch(self) -> None:
        """Read the pipe in the running event loop whenever it has data, until it ends or `close`."""
        if self._read_fd >= 0 and self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._read_fd, self._read)

    def _read(self) -> bool:
        """Read once; False when there was nothing to read (the pipe is empty, or it ended)."""
        if self._read_fd < 0:
            return False
        try:
            data = os.read(self._read_fd, _READ_BYTES)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:  # every write end is closed: nothing more will come (and an ended pipe is always readable)
            self._unwatch()
            os.close(self._read_fd)
            self._read_fd = -1
            return False
        kept = self._kept
        kept += data
        if len(kept) > 2 * self._keep:  # trimmed now and then, not on every read
            del kept[: len(kept) - self._keep]
        return True

    def tail(self, limit: int = KEEP_BYTES) -> str:
        """The last ``limit`` bytes (at most `KEEP_BYTES`) the child wrote, after reading what waits in the pipe."""
        read = 0
        while read < _CATCH_UP_BYTES and self._read():
            read += _READ_BYTES
        size = min(limit, self._keep, len(self._kept))
        return bytes(self._kept[len(self._kept) - size :]).decode(errors="replace")

    def _unwatch(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile has no readers left
                self._loop.remove_reader(self._read_fd)
            self._loop = None

    def close(self) -> None:
        """Stop reading and close both ends; what was kept stays readable through `tail`."""
        self._unwatch()
        self.close_write_end()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
