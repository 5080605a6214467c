"""Per-run capture of stdout and stderr that never reaches the host's real streams."""

from __future__ import annotations

import io
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

__all__ = ["TailBuffer", "capture_output"]

_SLACK = 64 * 1024


class TailBuffer(io.TextIOBase):
    """A text sink that keeps the last ``limit`` characters and counts what it dropped.

    Memory stays under ``2 * limit`` plus 64 KiB however much is written.
    """

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self._limit = limit
        self._chunks: deque[str] = deque()
        self._size = 0
        self.dropped_bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        self._chunks.append(text)
        self._size += len(text)
        # Trimming is amortized: a flood of small writes trims once per `limit` characters, not per write.
        if self._limit is not None and self._size > 2 * self._limit + _SLACK:
            self._trim()
        return len(text)

    def _trim(self) -> None:
        if self._limit is None:
            return
        while self._size > self._limit and self._chunks:
            excess = self._size - self._limit
            head = self._chunks[0]
            if len(head) <= excess:
                self._chunks.popleft()
                self._size -= len(head)
                self.dropped_bytes += len(head)
            else:
                self._chunks[0] = head[excess:]
                self._size -= excess
                self.dropped_bytes += excess

    def getvalue(self) -> str:
        """The kept text, preceded by a line saying how much was dropped."""
        self._trim()
        text = "".join(self._chunks)
        if self.dropped_bytes:
            return f"[... {self.dropped_bytes} earlier characters of output were dropped ...]\n{text}"
        return text


_targets: ContextVar[tuple[TailBuffer, TailBuffer] | None] = ContextVar("snapcell_capture", default=None)


class _Dispatch(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: writes go to the current run's buffer, or to the original stream."""

    def __init__(self, original: TextIO, index: int) -> None:
        super().__init__()
        self.original = original
        self._index = index

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        targets = _targets.get()
        if targets is None:
            return self.original.write(text)
        return targets[self._index].write(text)

    def flush(self) -> None:
        if _targets.get() is None:
            self.original.flush()

    def isatty(self) -> bool:
        return False if _targets.get() is not None else self.original.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


_lock = threading.Lock()
_active = 0


@contextmanager
def capture_output(limit: int | None) -> Iterator[tuple[TailBuffer, TailBuffer]]:
    """Capture what the current context writes to stdout and stderr for the length of a run.

    Tasks the run starts inherit the capture; other threads and tasks of the host do not.
    """
    global _active
    out, err = TailBuffer(limit), TailBuffer(limit)
    with _lock:
        if _active == 0 or not isinstance(sys.stdout, _Dispatch):
            sys.stdout = _Dispatch(sys.stdout, 0)
            sys.stderr = _Dispatch(sys.stderr, 1)
        _active += 1
    token = _targets.set((out, err))
    try:
        yield out, err
    finally:
        _targets.reset(token)
        with _lock:
            _active -= 1
            if _active == 0:
                if isinstance(sys.stdout, _Dispatch):
                    sys.stdout = sys.stdout.original
                if isinstance(sys.stderr, _Dispatch):
                    sys.stderr = sys.stderr.original
