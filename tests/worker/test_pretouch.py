"""A forked worker walks a throwaway turn while it waits for its first request, and leaves no trace of it."""

from __future__ import annotations

import asyncio
import linecache
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from snapcell import Limits, Policy, Pool
from snapcell.interpreter._runner import Runner
from snapcell.wire._wire import FRAME
from snapcell.worker._pretouch import pretouch
from snapcell.worker._worker import Worker
from snapcell.worker._workerchannel import Channel

UNRESTRICTED = Policy.unrestricted()


@pytest.fixture
def worker() -> Iterator[tuple[Worker, socket.socket]]:
    """A worker served in this process (no sandbox, no workspace) and the host's end of its channel."""
    host, child = socket.socketpair()
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        served = Worker(Channel(child), Runner(policy=Policy(), limits=Limits()))
        yield served, host
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if "loop" in vars(served):  # made by a run, as in a worker
            served.loop.close()
            asyncio.set_event_loop(None)
        host.close()
        child.close()


def test_an_idle_worker_runs_every_step_and_puts_its_session_back(worker: tuple[Worker, socket.socket]) -> None:
    served, _ = worker
    runner = served.runner
    linecache.cache["<cell-1>"] = (3, None, ["abc\n"], "<cell-1>")
    linecache.cache.pop("<cell-2>", None)  # left by earlier tests' runs in this process
    before = {name: entry for name, entry in linecache.cache.items() if name.startswith("<cell-")}
    try:
        assert pretouch(served) == 3
        assert served.runner is runner and served.workspace is None
        assert runner.variables() == {} and runner.cell_count == 0
        # The throwaway cells' source is gone: a session's traceback never shows it.
        assert {name: entry for name, entry in linecache.cache.items() if name.startswith("<cell-")} == before
        assert "<cell-2>" not in linecache.cache
    finally:
        linecache.cache.pop("<cell-1>", None)


def test_a_request_already_arriving_is_served_without_pretouching(worker: tuple[Worker, socket.socket]) -> None:
    served, host = worker
    host.sendall(FRAME.pack(2, 0) + b"{}")
    assert pretouch(served) == 0
    assert served.channel.readable(0)  # the request is left for the worker to read


def test_a_worker_set_up_ahead_starts_its_session_clean_after_pretouching() -> None:
    with Pool("memory://", isolation="process", policy=UNRESTRICTED, min_warm_workers=1, pretouch_workers=True) as pool:
        for _ in range(10):
            time.sleep(0.2)  # the worker set up ahead is idle meanwhile: it pretouches
            with pool.checkout() as session:
                steps = session.feed_run("import sys\nsys.modules['snapcell.worker._pretouch'].steps_run()")
                if steps == 0:
                    continue
                assert session.feed_run("sorted(k for k in globals() if not k.startswith('__'))") == ["sys"]
                failed = session.run("x = 1\n1 / 0")
                assert failed.error is not None and "1 / 0" in failed.error.traceback_text
                assert session.feed_run("x") == 1
                break
        else:
            pytest.fail("no worker set up ahead pretouched in 10 checkouts")


def test_a_default_pools_worker_set_up_ahead_does_not_pretouch() -> None:
    """The walk costs a worker more CPU than it saves its first turn (docs/performance.md): off unless asked for."""
    with Pool("memory://", isolation="process", policy=UNRESTRICTED, min_warm_workers=1) as pool:
        steps = []
        for _ in range(3):
            time.sleep(0.2)  # the worker set up ahead is idle meanwhile: it would pretouch now
            with pool.checkout() as session:
                steps.append(session.feed_run("import sys\nsys.modules['snapcell.worker._pretouch'].steps_run()"))
    assert steps == [0, 0, 0]
