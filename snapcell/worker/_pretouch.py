"""Pre-touch a forked worker: walk a throwaway turn while it waits for its session's first request.

A child forked from the zygote shares the zygote's pages copy-on-write. The first time it touches an object there
(a reference count, a cache entry), the kernel copies that object's page: hundreds of page faults, spread over the
first load, run and dump of its session, on the turn's latency. A worker set up ahead of its checkout is idle
meanwhile, so it makes most of those copies then: it runs a throwaway turn of its own (a run, a dump, a load of that
dump) with a runner of its own, the session's policy and limits and no workspace, one step at a time, and stops as
soon as a request starts to arrive. A worker whose first request comes at once (set up by its
checkout) skips it all, and so does one forked before the zygote's warm-up imported asyncio: its runs may not make
an event loop (see `_loopfree`), which the throwaway turn's would. Otherwise the loop it makes is the one the
session's runs use. The session's own runner and workspace are never touched; the code run is fixed, not a script's.

Measured on a fresh worker of a small cold turn: the walk costs about 7 ms of CPU and takes the turn's load, run
and dump from about 6 ms of CPU and ~880 page faults to about 3 ms and ~60: the turn is about 3 ms faster, but each
worker spends about 4 ms more CPU in all. So a worker walks only when its pool asks for it
(``pretouch_workers=True``), for servers that would rather pay that CPU than a cold turn's latency.
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from snapcell.errors import SnapcellError
from snapcell.wire import encode, to_plain

if TYPE_CHECKING:
    from snapcell.interpreter import Runner
    from snapcell.worker._workerchannel import Channel
    from snapcell.workspace import Workspace


class Worker(Protocol):
    """What a pre-touch walk needs of the worker it walks (`snapcell.worker._worker.Worker` is one)."""

    channel: Channel
    runner: Runner
    workspace: Workspace | None

    def new_runner(self) -> Runner: ...

    def run(self, message: dict[str, Any]) -> tuple[bytes, list[bytes | bytearray]]: ...

    def dump(self, message: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | bytearray]]: ...

    def load(self, message: dict[str, Any], blob: bytearray) -> tuple[dict[str, Any], list[bytes | bytearray]]: ...


__all__ = ["IDLE_WAIT_S", "pretouch", "steps_run"]

# A request sent by the checkout that set the worker up arrives within this long after "ready"; a worker that has
# seen none by then was set up ahead and is idle.
IDLE_WAIT_S = 0.005
# Close to a small turn's namespace: plain data, and a string large enough to be a frame blob (its own section of the
# checkpoint). Functions and classes by value would touch more (cloudpickle's paths) and cost every worker more.
_CELL = (
    'rows = [{"id": i, "name": f"row-{i}", "v": i * 0.5} for i in range(50)]\n'
    "text = 'y' * 20_000\n"
    "turns = 0\n"
    'sum(r["v"] for r in rows)\n'
)
_DUMP_LEVEL = 1  # the pool's default compression level
# Steps this process's pretouch ran (a worker pretouches once, before its first request).
_STEPS_RUN = [0]


def steps_run() -> int:
    """How many steps of the throwaway turn this worker ran before its first request (0 to 3)."""
    return _STEPS_RUN[0]


def pretouch(worker: Worker) -> int:
    """Run the throwaway turn's steps while no request arrives; return how many ran.

    Waits `IDLE_WAIT_S` for a first request before the first step, and checks again (without waiting) before each
    one. The worker's runner and workspace are put back as they were, and the cells' source lines are dropped from
    ``linecache`` (a session's tracebacks must not show them).
    """
    if "asyncio" not in sys.modules or worker.channel.readable(IDLE_WAIT_S):
        return 0
    runner, workspace = worker.runner, worker.workspace
    cached = {name: entry for name, entry in linecache.cache.items() if name.startswith("<cell-")}
    worker.runner, worker.workspace = worker.new_runner(), None
    done = 0
    try:
        for step in _steps(worker):
            if worker.channel.readable(0):
                break
            step()
            done += 1
            _STEPS_RUN[0] = done
    except SnapcellError:  # a step that fails teaches nothing more; the session starts as it would have
        pass
    finally:
        worker.runner, worker.workspace = runner, workspace
        for name in [name for name in linecache.cache if name.startswith("<cell-")]:
            del linecache.cache[name]
        linecache.cache.update(cached)
    return done


def _steps(worker: Worker) -> Iterator[Callable[[], Any]]:
    """The throwaway turn, step by step, as the worker serves them (replies encoded, never sent)."""
    import dataclasses  # not before a zygote's "ready" (tests/worker/test_zygote_imports.py)

    limits = to_plain(dataclasses.asdict(worker.runner.limits))
    run = {"op": "run", "code": _CELL, "host": {}, "setup": False, "limits": limits}
    dump = {"op": "dump", "created_at": 0.0, "level": _DUMP_LEVEL, "on_unpicklable": "skip", "known_blobs": []}
    saved: dict[str, Any] = {}

    def dump_step() -> None:
        reply, parts = worker.dump(dump)
        encode(reply)
        saved.update(names=reply["new_blobs"], parts=parts)

    def load_step() -> None:
        # As a fresh worker's first request: the body, then each new blob, in one buffer.
        parts = saved["parts"]
        message = {"op": "load", "parts": [len(p) for p in parts], "blobs": saved["names"]}
        reply, _ = worker.load(message, bytearray().join(parts))
        encode(reply)

    yield lambda: worker.run(run)
    yield dump_step
    yield load_step
