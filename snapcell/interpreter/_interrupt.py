"""Wall-time limits for pure-Python code: one watchdog thread interrupts scripts where they run.

When a run's time is up the watchdog (a single long-lived thread per process, watching a heap of
deadlines) does three things:

- raises `ScriptInterrupt` in the thread that runs the script, again every 50 ms, but only while one
  of the session's frames is on that thread's stack (never in host code);
- cancels the script's task when it is awaiting;
- sets the flag ``__snapcell_expired__`` in the session's builtins. Every loop body, ``except``
  handler and ``finally`` block of a script, and the code after every ``with`` block, is instrumented
  to check the flag and raise `ScriptInterrupt` again, so a script cannot swallow the interrupt
  with a bare ``except``, ``except BaseException``, ``contextlib.suppress(BaseException)`` or a
  ``finally: continue`` loop. The check is a builtins lookup, a few nanoseconds per iteration.

C-level work (``10**10**8``, ``sorted`` of a huge list) cannot be interrupted in-process; the worker
process's host kills it.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import sys
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from snapcell.policy import EXPIRED_NAME, ScriptInterrupt

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "start_watchdog",
    "Watchdog",
    "cancelled_error",
    "reap_tasks",
    "running_tasks",
]

_REINJECT_S = 0.05
# Seconds left-over tasks get to finish after being cancelled, with the expired flag set.
_REAP_S = 0.5


_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc


def _set_async_exc(thread_id: int, exc: type[BaseException]) -> None:
    _SET_ASYNC_EXC(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


class _Drain(BaseException):
    """Replaces an interrupt still in flight when a run ends, and is caught at once by `_drain_interrupt`."""


def _drain_interrupt() -> None:
    """Take back an interrupt that was sent to this thread but has not landed yet, and clear its signal.

    ``PyThreadState_SetAsyncExc(id, NULL)`` would drop the exception but leave the interpreter's "async
    exception pending" signal raised (CPython clears it only when it delivers one). With a trace or profile
    function installed (coverage, a debugger, a profiler), Python 3.11 then re-checks that signal at the
    start of every function call without ever getting past it: the host hangs at its next call. So the
    pending interrupt is replaced by `_Drain` and delivered here, in this thread, which clears the signal.
    """
    try:
        _set_async_exc(threading.get_ident(), _Drain)
        for _ in range(1_000_000):  # delivered at the first backward jump, in practice the first iteration
            pass
    except _Drain:
        return


class _Monitor:
    """The process's one watchdog thread: sleeps until the earliest deadline, then fires that watch."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._stale = 0
        self._firing: set[Watchdog] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, watch: Watchdog, deadline: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), watch))
            if not self._ensure_thread() and self._heap[0][2] is watch:
                self._cond.notify()

    def _ensure_thread(self) -> bool:
        """Start the thread if it is not running (call with the lock held); True when it was started now."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._thread = threading.Thread(target=self._run, name="snapcell-watchdog", daemon=True)
        self._thread.start()
        return True

    def start(self) -> None:
        """Start the thread ahead of the first run (a worker does this once its sandbox is in place)."""
        with self._cond:
            self._ensure_thread()

    def discard(self) -> None:
        """Note that a watch ended early; its heap entry is dropped lazily."""
        with self._cond:
            self._stale += 1
            if self._stale > 64 and self._stale > len(self._heap) // 2:
                self._heap = [entry for entry in self._heap if not entry[2].finished]
                heapq.heapify(self._heap)
                self._stale = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, _, watch = heapq.heappop(self._heap)
                    if watch.finished:
                        self._stale = max(self._stale - 1, 0)
                    else:
                        self._firing.add(watch)
                        watch.fire()
                self._firing = {w for w in self._firing if not w.finished}
                firing = list(self._firing)
            for watch in firing:
                watch.inject()
            with self._cond:
                timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                if self._firing:
                    timeout = _REINJECT_S if timeout is None else min(timeout, _REINJECT_S)
                if timeout is None or timeout > 0:
                    self._cond.wait(timeout)


_monitor = _Monitor()

# snapcell's own stand-ins that scripts call (guarded builtins, time.sleep in slices, format checks).
_SCRIPT_FACING = frozenset({"snapcell.policy._guard", "snapcell.interpreter._host", "snapcell.policy._standins"})
# Standard-library modules scripts call into; an interrupt may land in their frames (it unwinds into the script).
# `traceback` is deliberately missing: hooks that format exceptions run it on the host's behalf.
_LIBRARY_MODULES = frozenset(
    {
        "abc", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
        "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq", "io", "itertools",
        "json", "math", "numbers", "operator", "pprint", "random", "re", "statistics", "string", "struct",
        "textwrap", "time", "typing", "unicodedata", "uuid", "zoneinfo", "_pydecimal", "_strptime", "sre_compile",
        "sre_parse", "numpy", "pandas",
    }
)  # fmt: skip


def start_watchdog() -> None:
    """Start the process's watchdog thread now rather than at the first run with a time limit."""
    _monitor.start()


class Watchdog:
    """Interrupts one run when its wall time is up.

    Args:
        timeout_s: Seconds the run may take; None disables the watchdog.
        namespace: The session's globals; a frame using them is script code, and their
            ``__builtins__`` hold the expired flag the instrumented code checks.
    """

    def __init__(self, timeout_s: float | None, namespace: dict[str, Any]) -> None:
        self.timeout_s = timeout_s
        self.fired = False
        self.cancelled = False
        self.finished = False
        self._namespace = namespace
        table = namespace.get("__builtins__")
        self._flags: dict[str, Any] | None = table if isinstance(table, dict) and EXPIRED_NAME in table else None
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = threading.get_ident()
        self._lock = threading.Lock()
        if timeout_s is not None:
            _monitor.add(self, time.monotonic() + timeout_s)

    def cancel(self) -> None:
        """Fire now, as the run's caller cancelled it (any thread); ``cancelled`` tells it from a timeout."""
        with self._lock:
            if self.finished or self.fired:
                return
            self.cancelled = True
        _monitor.add(self, time.monotonic())

    def attach(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` (an async cell) at the deadline, as well as interrupting its frames."""
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._task = task

    def fire(self) -> None:
        """Mark the run as out of time (watchdog thread)."""
        with self._lock:
            if self.finished:
                return
            self.fired = True
            if self._flags is not None:
                self._flags[EXPIRED_NAME] = True
            if self._task is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)

    def inject(self) -> None:
        """Raise `ScriptInterrupt` in the run's thread if script code is on its stack (watchdog thread)."""
        with self._lock:
            if not self.finished and self._script_on_stack():
                _set_async_exc(self._thread_id, ScriptInterrupt)

    def _script_on_stack(self) -> bool:
        """True when the thread is running script code, or library code the script called.

        Walking out from the innermost frame: script frames mean yes; frames of the standard-library and
        allowed modules a script uses are looked through; any other frame (a host function, snapcell itself,
        an exception or unraisable hook of the host) means no — an interrupt must never land in host code,
        so the next try comes once control is back in the script.
        """
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if frame.f_globals is self._namespace:
                return True
            module = frame.f_globals.get("__name__")
            if not isinstance(module, str) or (
                module.partition(".")[0] not in _LIBRARY_MODULES and module not in _SCRIPT_FACING
            ):
                return False
            frame = frame.f_back
        return False

    def stop(self) -> None:
        """End the watch; called in the run's thread before it leaves the script boundary."""
        while True:
            try:
                with self._lock:
                    if self.finished:
                        return
                    self.finished = True
                    # The monitor's heap may hold this watch a while yet: not the run's task (asyncio.all_tasks,
                    # which every run asks, walks every task still alive).
                    self._task = self._loop = None
                    if self._flags is not None:
                        self._flags[EXPIRED_NAME] = False
                if self.fired:
                    _drain_interrupt()
                elif self.timeout_s is not None:
                    _monitor.discard()
                return
            except ScriptInterrupt:
                continue  # an interrupt that was in flight; the watch is over now


def _is_script_task(task: asyncio.Task[Any], namespace: dict[str, Any], owners: Collection[object]) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    if frame is None:
        return False
    return frame.f_globals is namespace or frame.f_locals.get("self") in owners


def running_tasks() -> set[asyncio.Task[Any]]:
    """The tasks of the running event loop; none when no loop runs (a worker's cell run without one, see
    `_loopfree.runs_without_loop`), and without importing asyncio when nothing has."""
    aio = sys.modules.get("asyncio")
    if aio is None:
        return set()
    try:
        tasks: set[asyncio.Task[Any]] = aio.all_tasks()
    except RuntimeError:  # no running event loop
        return set()
    return tasks


def cancelled_error() -> type[BaseException]:
    """`asyncio.CancelledError`, for an ``except`` clause (evaluated as an exception passes), without importing asyncio:
    before anything has imported it, nothing can raise it."""
    aio = sys.modules.get("asyncio")
    return _NeverRaised if aio is None else aio.CancelledError


class _NeverRaised(BaseException):
    pass


async def reap_tasks(before: set[asyncio.Task[Any]], namespace: dict[str, Any], owners: Collection[object] = ()) -> int:
    """Cancel the tasks a run started and left running, and wait for them to end.

    While they wind down the expired flag is set, so a task that catches the cancellation is
    interrupted at its next loop iteration, handler or ``finally``.

    Args:
        before: The tasks that existed before the run.
        namespace: The session's globals; a task whose coroutine uses them is the script's.
        owners: Objects whose coroutine methods belong to the run (its host bridge).

    Returns:
        How many tasks were cancelled.
    """
    leftovers = [t for t in running_tasks() - before if not t.done() and _is_script_task(t, namespace, owners)]
    if not leftovers:
        return 0
    table = namespace.get("__builtins__")
    flags = table if isinstance(table, dict) and EXPIRED_NAME in table else None
    import asyncio  # imported already: tasks exist

    if flags is not None:
        flags[EXPIRED_NAME] = True
    try:
        for task in leftovers:
            task.cancel()
        await asyncio.wait(leftovers, timeout=_REAP_S)
    finally:
        if flags is not None:
            flags[EXPIRED_NAME] = False
    for task in leftovers:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log "exception was never retrieved"
    return len(leftovers)
