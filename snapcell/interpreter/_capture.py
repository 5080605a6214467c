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
# Small writes are joined into strings of about this many characters, so a flood of tiny writes (a print per
# character) is kept in a few large strings instead of a million small objects of ~50 bytes each.
_BLOCK = 8 * 1024


class TailBuffer(io.TextIOBase):
    """A text sink that keeps the last ``limit`` characters and counts what it dropped.

    However much is written, and in however small pieces, it holds at most ``2 * limit`` plus 64 KiB of text in
    strings of about 8 KiB or more: small writes are joined, and a write longer than ``limit`` keeps its tail only.
    """

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        self._limit = limit
        self._chunks: deque[str] = deque()
        self._pending: list[str] = []  # small writes not yet joined into a chunk
        self._pending_size = 0
        self._size = 0  # characters held, in chunks and pending
        self.dropped_bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        size = len(text)
        if not size:
            return 0
        limit = self._limit
        if limit is not None and size >= limit:
            # Only this write's tail can be kept: what came before goes now, and so does its head.
            self.dropped_bytes += self._size + size - limit
            self._pending.clear()
            self._pending_size = 0
            self._chunks.clear()
            self._chunks.append(text[size - limit :] if size > limit else text)
            self._size = limit
            return size
        if size >= _BLOCK:
            self._join_pending()
            self._chunks.append(text)
        else:
            self._pending.append(text)
            self._pending_size += size
            if self._pending_size >= _BLOCK:
                self._join_pending()
        self._size += size
        # Trimming is amortized: a flood of small writes trims once per `limit` characters, not per write.
        if limit is not None and self._size > 2 * limit + _SLACK:
            self._trim()
        return size

    def _join_pending(self) -> None:
        if self._pending:
            self._chunks.append("".join(self._pending))
            self._pending.clear()
            self._pending_size = 0

    def _trim(self) -> None:
        self._join_pending()
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
        """The kept text, preceded by a line saying how much was dropped: ``limit`` characters at most, in all.

        The line takes its room from the oldest kept text, so the cap holds for what the caller receives.
        """
        self._trim()
        text = "".join(self._chunks)
        if not self.dropped_bytes or self._limit is None:
            return text
        limit = self._limit
        dropped, cut = self.dropped_bytes, 0
        for _ in range(3):  # the note's length depends on the count it states: settle both (twice is enough)
            cut = max(len(text) - (limit - len(_dropped_note(dropped, limit))), 0)
            if self.dropped_bytes + cut == dropped:
                break
            dropped = self.dropped_bytes + cut
        return _dropped_note(dropped, limit) + text[cut:]


def _dropped_note(count: int, limit: int) -> str:
    """The line saying ``count`` characters were dropped, short or none when it would take over half the cap."""
    for note in (f"[... {count} earlier characters of output were dropped ...]\n", f"[... {count} dropped ...]\n"):
        if len(note) <= limit // 2:
            return note
    return ""


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
# The stand-ins last installed: put back again while the streams they wrap are still sys.stdout and sys.stderr, rather
# than made anew for every run.
_stand_ins: tuple[_Dispatch, _Dispatch] | None = None


@contextmanager
def capture_output(limit: int | None) -> Iterator[tuple[TailBuffer, TailBuffer]]:
    """Capture what the current context writes to stdout and stderr for the length of a run.

    Tasks the run starts inherit the capture; other threads and tasks of the host do not.
    """
    global _active, _stand_ins
    out, err = TailBuffer(limit), TailBuffer(limit)
    with _lock:
        if _active == 0 or not isinstance(sys.stdout, _Dispatch):
            pair = _stand_ins
            if pair is None or pair[0].original is not sys.stdout or pair[1].original is not sys.stderr:
                pair = _stand_ins = (_Dispatch(sys.stdout, 0), _Dispatch(sys.stderr, 1))
            sys.stdout, sys.stderr = pair
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
