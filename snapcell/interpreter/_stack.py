"""A script's recursion limit, with room left for the garbage collector's finalizers.

A script that recurses to its limit (`Limits.max_recursion_depth`) leaves no stack for anything else that
runs on its thread at that depth, and the garbage collector runs there: any allocation may start a
collection, whose finalizers (``__del__`` of host objects, weak-reference callbacks, generators closed in a
cycle) and ``sys.unraisablehook`` then run on top of the script's deepest frame. Without room they fail
with ``RecursionError``; and when the collection starts while CPython is creating the script's own
``RecursionError``, a finalizer needing more than 50 frames aborts the whole process ("Cannot recover from
stack overflow"). In inline mode that process is the host.

So while a script runs, a ``gc.callbacks`` entry raises the limit by `FINALIZER_ROOM` frames for the
length of each collection and lowers it again when the collection ends. A collection that starts within
two frames of the limit still finds no room (the callback itself needs those frames): its finalizers fail
with ``RecursionError``, reported to ``sys.unraisablehook``, but the process is not aborted.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["FINALIZER_ROOM", "script_recursion_limit", "stack_depth"]

# Frames a collection's finalizers (and the unraisable hook reporting their errors) get above the script's limit.
FINALIZER_ROOM = 400

_lock = threading.Lock()
# The script limits in force (innermost last: nested inline runs), each with its thread's identifier.
_limits: list[tuple[int, int]] = []
_raised: set[int] = set()  # threads whose current collection raised the limit


def stack_depth() -> int:
    """The number of frames on the calling thread's stack."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    # Only a collection on a script's own thread: raising the limit for one on another thread would let the script
    # recurse past its limit meanwhile, and lowering it then would leave the script's thread deeper than the limit,
    # which CPython cannot recover from.
    thread = threading.get_ident()
    for limit, owner in reversed(_limits):  # noqa: B007 (the loop finds it)
        if owner == thread:
            break
    else:
        return
    try:
        if phase == "start":
            sys.setrecursionlimit(limit + FINALIZER_ROOM)
            _raised.add(thread)
        elif thread in _raised:
            sys.setrecursionlimit(limit)
            _raised.discard(thread)
    except BaseException:
        # RecursionError: within two frames of the limit even this call has no room, so that collection's
        # finalizers get none either (and a raised limit stays until the next collection's end, or the run's).
        # ScriptInterrupt: the watchdog raises it again 50 ms later, and the script's next check raises it anyway.
        pass


@contextmanager
def script_recursion_limit(max_depth: int | None) -> Iterator[None]:
    """Limit recursion to ``max_depth`` frames above the caller while the block runs (no limit for None).

    The previous limit is restored at the end. Garbage collections during the block get `FINALIZER_ROOM`
    frames more (see the module docstring).
    """
    old = sys.getrecursionlimit()
    if max_depth is None:
        yield
        return
    limit = max(max_depth + stack_depth(), old // 4)
    with _lock:
        if not _limits:
            gc.callbacks.append(_on_collection)
        _limits.append((limit, threading.get_ident()))
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        with _lock:
            _limits.remove((limit, threading.get_ident()))
            _raised.discard(threading.get_ident())
            if not _limits:
                gc.callbacks.remove(_on_collection)
        sys.setrecursionlimit(old)
