"""Wall-time limits for pure-Python code: a watchdog thread interrupts the script where it runs.

The watchdog raises `ScriptInterrupt` in the thread that runs the script, but only while one of the
session's frames is on that thread's stack, and it cancels the script's task when it is awaiting.
Every ``except`` handler and every ``with`` block of a script is instrumented to raise it again, so a
script cannot swallow the interrupt with a bare ``except`` or ``contextlib.suppress``.
C-level work (``10**10**8``) cannot be interrupted in-process; the worker's host kills it.
"""

from __future__ import annotations

import ast
import asyncio
import ctypes
import sys
import threading
from contextvars import ContextVar
from typing import Any

__all__ = ["TICK_NAME", "ScriptInterrupt", "Watchdog", "instrument", "tick"]

TICK_NAME = "__snapcell_tick__"
_REINJECT_S = 0.05


class ScriptInterrupt(BaseException):
    """Raised inside a script whose wall time is up; a BaseException so ``except Exception`` misses it."""


_expired: ContextVar[threading.Event | None] = ContextVar("snapcell_expired", default=None)


def tick() -> None:
    """Raise `ScriptInterrupt` again if the current run's time is up (called from instrumented handlers)."""
    event = _expired.get()
    if event is not None and event.is_set():
        raise ScriptInterrupt


class _Instrument(ast.NodeTransformer):
    @staticmethod
    def _call() -> ast.stmt:
        return ast.Expr(ast.Call(func=ast.Name(id=TICK_NAME, ctx=ast.Load()), args=[], keywords=[]))

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        self.generic_visit(node)
        node.body.insert(0, ast.copy_location(self._call(), node))
        return node

    def _after(self, node: ast.With | ast.AsyncWith) -> list[ast.stmt]:
        self.generic_visit(node)
        return [node, ast.copy_location(self._call(), node)]

    visit_With = _after
    visit_AsyncWith = _after


def instrument(tree: ast.Module) -> ast.Module:
    """Insert interrupt checks into every except handler and after every with block."""
    result = _Instrument().visit(tree)
    ast.fix_missing_locations(result)
    return tree


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class Watchdog:
    """Interrupts one run when its wall time is up.

    Args:
        timeout_s: Seconds the run may take; None disables the watchdog.
        namespace: The session's globals; a frame using them is script code.

    Create it before the script's task, so the task inherits the run's interrupt flag.
    """

    def __init__(self, timeout_s: float | None, namespace: dict[str, Any]) -> None:
        self.timeout_s = timeout_s
        self.fired = False
        self._namespace = namespace
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = threading.get_ident()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._finished = False
        self.expired = threading.Event()
        self._token = _expired.set(self.expired)
        self._thread: threading.Thread | None = None
        if timeout_s is not None:
            self._thread = threading.Thread(target=self._watch, name="snapcell-watchdog", daemon=True)
            self._thread.start()

    def attach(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` (an async cell) at the deadline, as well as interrupting its frames."""
        self._loop = asyncio.get_running_loop()
        self._task = task

    def _script_on_stack(self) -> bool:
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if frame.f_globals is self._namespace:
                return True
            frame = frame.f_back
        return False

    def _watch(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        self.fired = True
        self.expired.set()
        if self._task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        while not self._done.is_set():
            with self._lock:
                if self._finished:
                    return
                if self._script_on_stack():
                    _set_async_exc(self._thread_id, ScriptInterrupt)
            self._done.wait(_REINJECT_S)

    def stop(self) -> None:
        """End the watch; called in the run's thread before it leaves the script boundary."""
        while True:
            try:
                with self._lock:
                    self._finished = True
                self._done.set()
                _set_async_exc(self._thread_id, None)
                _expired.reset(self._token)
                return
            except ScriptInterrupt:
                continue  # an interrupt that was in flight; the watch is over now
            except ValueError:
                return  # token already reset by an earlier pass of this loop
