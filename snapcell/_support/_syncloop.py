"""The event loop behind the synchronous API (`Pool`, `Session`, `SyncCodeTool`).

`asyncio.Runner.run` installs and removes a SIGINT handler on every call made from the main thread, through
`signal.signal`, which tries to turn the handler (a partial holding the task) into an enum member and formats the
task's repr for the error it catches: 13 of the 21 µs that each call costs. A synchronous `feed_run` makes one
such call, so `SyncLoop.run` does what `Runner.run` does with the C-level `_signal` functions: the first Ctrl-C
cancels the call's task (it ends as `KeyboardInterrupt`, after the task's clean-up ran), a second one raises
`KeyboardInterrupt` at once.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module under `signal` (no stub)
import asyncio
import contextvars
import functools
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

__all__ = ["SyncLoop"]

T = TypeVar("T")


class SyncLoop:
    """An `asyncio.Runner` whose `run` is cheaper from the main thread (see the module docstring)."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()
        self._interrupts = 0

    def run(self, coro: Coroutine[Any, Any, T], *, context: contextvars.Context) -> T:
        """Run ``coro`` to completion in ``context`` on the loop, as `asyncio.Runner.run` does."""
        loop = self._runner.get_loop()
        task = loop.create_task(coro, context=context)
        handler = None
        if (
            threading.current_thread() is threading.main_thread()
            and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
        ):
            handler = functools.partial(self._on_sigint, task, loop)
            try:
                _signal.signal(_signal.SIGINT, handler)
            except ValueError:  # signals are not available here
                handler = None
        self._interrupts = 0
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if self._interrupts and task.uncancel() == 0:
                raise KeyboardInterrupt() from None
            raise
        finally:
            if handler is not None and _signal.getsignal(_signal.SIGINT) is handler:
                _signal.signal(_signal.SIGINT, _signal.default_int_handler)

    def _on_sigint(
        self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop, signum: int, frame: FrameType | None
    ) -> None:
        self._interrupts += 1
        if self._interrupts == 1 and not task.done():
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wake the loop if it waits in select()
            return
        raise KeyboardInterrupt()

    def close(self) -> None:
        """Close the loop (`asyncio.Runner.close`)."""
        self._runner.close()
