"""A worker's first cells without an event loop: so that neither the zygote nor a fresh child imports asyncio.

A worker runs each cell in its event loop, so that a script may ask for the running loop, start tasks and await.
Importing asyncio and making the loop cost tens of milliseconds of CPU, which a session's first ``1 + 1`` would
wait for. A cell that nothing could tell apart runs without them (`runs_without_loop`, `finish_without_loop`);
once a cell needed the loop, every later one of the worker uses it.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from typing import Any

from snapcell.interpreter import Runner, RunResult

__all__ = ["finish_without_loop", "runs_without_loop"]

# Source text that could reach asyncio or wait for something: an import (statement, ``__import__``, ``importlib``),
# ``await`` and ``async``. Matched anywhere (names, strings, comments): a false match only costs the event loop.
_MAY_NEED_LOOP = ("import", "await", "async")


def runs_without_loop(runner: Runner, code: object) -> bool:
    """Whether ``runner.run(code)`` may be driven without an event loop (`finish_without_loop`): nothing could tell.

    So when the cell cannot import (and so reach asyncio to ask for the running loop) nor wait, and nothing run
    before it could import for it: asyncio is not imported yet (a cell that imports anything runs in the loop, which
    imports it), no setup cell or definition runs first, and the namespace was not loaded (its functions come from
    cells never run here). The caller also needs no loop of its own: no async host function in the run.
    """
    return (
        "asyncio" not in sys.modules
        and not runner.loaded
        and not runner.pending_setup
        and not runner.pending_definitions
        and isinstance(code, str)
        and not any(word in code for word in _MAY_NEED_LOOP)
    )


def finish_without_loop(run: Coroutine[Any, Any, RunResult]) -> RunResult:
    """Drive `Runner.run`'s coroutine for a cell `runs_without_loop` cleared: it ends in its first step.

    Raises:
        RuntimeError: It waited for something after all (a bug): the run is closed where it waited.
    """
    try:
        waiting = run.send(None)
    except StopIteration as done:
        result: RunResult = done.value
        return result
    run.close()
    raise RuntimeError(f"a run started without an event loop waited for {type(waiting).__name__}")
