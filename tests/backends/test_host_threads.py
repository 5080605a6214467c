"""Sync host functions run in threads: one that blocks stalls its own run, not every conversation on the loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from pathlib import Path

import pytest

import snapcell
from snapcell.storage import MemoryStore

KEY = "host-threads-tests-signing-key-0123456789"
REQUEST = contextvars.ContextVar("REQUEST", default="none")


def test_two_conversations_blocked_in_sync_host_functions_overlap() -> None:
    """Each call waits (in its host function) until the other has started: on the event loop they never would."""
    both_in = threading.Barrier(2, timeout=60)
    threads: set[str] = set()

    def wait_for_the_other(tag: str) -> str:
        threads.add(threading.current_thread().name)
        both_in.wait()  # BrokenBarrierError (after 60 s) if the calls ran one after the other
        return tag

    async def main() -> list[object]:
        async with snapcell.AsyncPool(MemoryStore("threads"), isolation="process", signing_keys=[KEY]) as pool:

            async def turn(tag: str) -> object:
                async with pool.checkout() as session:
                    return await session.feed_run(f"wait({tag!r})", external_lookup={"wait": wait_for_the_other})

            return list(await asyncio.gather(turn("a"), turn("b")))

    assert asyncio.run(main()) == ["a", "b"]
    assert threading.main_thread().name not in threads


def test_a_sync_host_function_sees_the_callers_context_and_its_failures_reach_the_script() -> None:
    def read_context() -> str:
        return REQUEST.get()

    def fail() -> None:
        raise LookupError("no such customer")

    async def main() -> tuple[object, object]:
        REQUEST.set("request-7")
        async with snapcell.AsyncPool(MemoryStore("context"), isolation="process", signing_keys=[KEY]) as pool:
            async with pool.checkout() as session:
                tools = {"read_context": read_context, "fail": fail}
                seen = await session.feed_run("read_context()", external_lookup=tools)
                caught = await session.feed_run(
                    "try:\n    fail()\nexcept LookupError as exc:\n    r = str(exc)\nr", external_lookup=tools
                )
                return seen, caught

    assert asyncio.run(main()) == ("request-7", "no such customer")


def test_sync_host_functions_run_in_at_most_max_host_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of blocking calls gets the documented number of threads, not one each: the rest wait for a thread,
    then all finish."""
    from snapcell.backends import _hostcalls
    from snapcell.backends._hostcalls import MAX_HOST_THREADS, PendingCall, call_host, finish_call

    # A pool of threads of this test's own: a host function an earlier test left running holds none of them.
    monkeypatch.setattr(_hostcalls, "_threads", None)

    count = MAX_HOST_THREADS + 8
    lock = threading.Lock()
    release = threading.Event()
    running = peak = entered = 0

    def block(index: int) -> int:
        nonlocal running, peak, entered
        with lock:
            running, entered = running + 1, entered + 1
            peak = max(peak, running)
        try:
            assert release.wait(60), "hang guard"
            return index
        finally:
            with lock:
                running -= 1

    async def main() -> list[object]:
        pending = [call_host({"id": i, "name": "block", "args": [i]}, {"block": block}, None) for i in range(count)]
        assert all(isinstance(call, PendingCall) for call in pending)
        deadline = asyncio.get_running_loop().time() + 60  # a hang guard: fewer threads than documented never fill
        while entered < MAX_HOST_THREADS and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # room for a call past the bound to start, were there no bound
        release.set()
        replies = await asyncio.gather(*(finish_call(call, None) for call in pending if isinstance(call, PendingCall)))
        return [reply.get("value") for reply in replies]

    try:
        assert asyncio.run(main()) == list(range(count))
    finally:
        release.set()
        if _hostcalls._threads is not None:
            _hostcalls._threads.shutdown(wait=True)
    assert peak == MAX_HOST_THREADS
    quickstart = (Path(__file__).parents[2] / "docs" / "quickstart.md").read_text()
    assert f"at most {MAX_HOST_THREADS} at once per process" in " ".join(quickstart.split())
