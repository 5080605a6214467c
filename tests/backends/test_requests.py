"""The worker's request path: read by the thread that needs the frame, no reader thread in between."""

from __future__ import annotations

import asyncio
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Policy, Pool


def double(x: int) -> int:
    return 2 * x


async def later(x: int) -> int:
    await asyncio.sleep(0.01)
    return x + 100


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="process", policy=Policy.unrestricted()) as opened:
        yield opened


def test_no_thread_hands_requests_over(pool: Pool) -> None:
    with pool.checkout() as session:
        names = session.feed_run("import threading\nsorted(t.name for t in threading.enumerate())")
    assert "snapcell-reader" not in names and len(names) <= 2, names  # the main thread and the watchdog


def test_a_sync_call_delivers_the_results_of_async_calls_in_flight(pool: Pool) -> None:
    # While a sync call waits for its own result, the frames it reads may be results of async calls the
    # event loop has in flight: they must reach their awaiting coroutines.
    code = textwrap.dedent(
        """
        import asyncio
        async def mixed(i):
            pending = asyncio.ensure_future(later(i))
            await asyncio.sleep(0)
            return double(i), await pending
        await asyncio.gather(*(mixed(i) for i in range(20)))
        """
    )
    with pool.checkout() as session:
        for _ in range(3):
            got = session.feed_run(code, external_lookup={"double": double, "later": later})
            assert got == [(2 * i, i + 100) for i in range(20)]
        assert session.feed_run("1 + 1") == 2


def test_the_host_serves_a_sync_host_function_in_a_host_thread_and_an_async_one_in_a_task(pool: Pool) -> None:
    """A sync function runs off the event loop (one that blocks stalls only its own run); async ones overlap."""
    threads: list[str] = []
    seen: list[asyncio.Task[object] | None] = []

    def record(x: int) -> int:
        threads.append(threading.current_thread().name)
        return x

    async def record_async(x: int) -> int:
        seen.append(asyncio.current_task())
        return x

    with pool.checkout() as session:
        assert session.feed_run("sum(record(i) for i in range(20))", external_lookup={"record": record}) == 190
        assert len(threads) == 20 and all(name.startswith("snapcell-host-function") for name in threads)
        code = "import asyncio\nsum(await asyncio.gather(*(record_async(i) for i in range(5))))"
        assert session.feed_run(code, external_lookup={"record_async": record_async}) == 10
        assert len({id(task) for task in seen}) == 5  # gathered async calls each run in a task of their own


def test_the_host_registers_the_channel_with_its_event_loop_once_for_many_frames_and_runs() -> None:
    """Waiting for each frame does not register and remove the channel again (two epoll_ctl each)."""
    from snapcell import AsyncPool

    async def scenario() -> list[int]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("1")
            loop = asyncio.get_running_loop()
            added: list[int] = []
            real = loop._add_reader  # type: ignore[attr-defined]
            loop._add_reader = lambda fd, *args: added.append(fd) or real(fd, *args)  # type: ignore[attr-defined]
            try:
                total = await session.feed_run("sum(double(i) for i in range(20))", external_lookup={"double": double})
                for _ in range(10):  # nor for each run
                    assert await session.feed_run("1 + 1") == 2
            finally:
                del loop._add_reader  # type: ignore[attr-defined]
            assert total == 380
            return added

    added = asyncio.run(scenario())
    assert len(added) <= 1, added  # 31 frames from the worker (20 calls and 11 replies)


def test_a_request_waiting_for_its_reply_ends_when_its_worker_is_killed() -> None:
    import dataclasses

    from snapcell import Limits
    from snapcell.backends._procbackend import ProcessBackend
    from snapcell.backends._process import _Died
    from snapcell.backends._workerpool import WorkerOptions, WorkerPool

    async def scenario() -> BaseException | None:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=60))
        backend = ProcessBackend(workers, policy=Policy(), limits=Limits())
        try:
            await backend.start()
            worker = backend.worker
            assert worker is not None
            message = {"op": "run", "code": "while True:\n    pass", "limits": dataclasses.asdict(Limits())}
            request = asyncio.ensure_future(worker.request(message))
            while worker._waiter is None:  # the request is sent and waits for its reply
                await asyncio.sleep(0.01)
            await worker.kill()
            # A guard against a hang only: the request ends as soon as the kill closes the channel.
            done, _ = await asyncio.wait({request}, timeout=60)
            return request.exception() if done else None
        finally:
            await workers.close()

    assert isinstance(asyncio.run(scenario()), _Died)


def test_bytes_nobody_asked_for_do_not_keep_the_hosts_loop_busy(tmp_path: Path) -> None:
    """A worker writing between requests gets its channel unwatched at once, not polled on every loop turn."""
    import socket

    from snapcell.backends._process import WorkerProcess

    async def scenario() -> tuple[bytes, int, object]:
        worker = WorkerProcess(str(tmp_path))
        host, other = socket.socketpair()
        host.setblocking(False)
        worker._sock = host
        fired = 0
        real = worker._on_readable

        def counted() -> None:
            nonlocal fired
            fired += 1
            real()

        worker._on_readable = counted  # type: ignore[method-assign]
        read = asyncio.ensure_future(worker._read_exactly(4))
        await asyncio.sleep(0)  # it waits, watching the channel
        other.sendall(b"ping")
        data = bytes(await read)
        other.sendall(b"unasked for" * 100)
        for _ in range(100):
            await asyncio.sleep(0)
        watching = worker._watching
        worker._unwatch()
        host.close()
        other.close()
        return data, fired, watching

    data, fired, watching = asyncio.run(scenario())
    assert data == b"ping" and watching is None
    assert fired <= 3, fired  # the read's wake-up, maybe a stale report, then the unasked bytes: unwatched


def test_a_sync_host_call_costs_the_event_loop_few_turns() -> None:
    """The function's thread sends its result itself: no executor future, no task and no wake-up of the loop."""
    from snapcell import AsyncPool

    calls = 50

    async def scenario() -> tuple[int, int]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("double(1)", external_lookup={"double": double})
            loop = asyncio.get_running_loop()
            turns = [0]
            real = loop._run_once  # type: ignore[attr-defined]

            def counted() -> None:
                turns[0] += 1
                real()

            loop._run_once = counted  # type: ignore[attr-defined]
            try:
                total = await session.feed_run(
                    f"sum(double(i) for i in range({calls}))", external_lookup={"double": double}
                )
            finally:
                del loop._run_once  # type: ignore[attr-defined]
            return total, turns[0]

    total, turns = asyncio.run(scenario())
    assert total == calls * (calls - 1)
    assert turns <= 3 * calls, turns  # five or six per call when a task awaited the executor's future


def test_host_results_larger_than_the_sockets_buffer_arrive_whole_from_threads_and_tasks_at_once(pool: Pool) -> None:
    """Results of sync calls (sent from their threads) and async ones (from tasks), each more than the socket
    takes at a time, sent while others are under way: no frame is cut into by another."""
    texts = {i: chr(ord("a") + i) * (1_000_000 + i) for i in range(8)}

    def big(i: int) -> str:
        return texts[i]

    async def big_later(i: int) -> str:
        await asyncio.sleep(0)
        return texts[i]

    code = textwrap.dedent(
        """
        import asyncio
        async def both(i):
            pending = asyncio.ensure_future(big_later(i + 4))
            await asyncio.sleep(0)
            return len(big(i)), len(await pending), set(big(i))
        await asyncio.gather(*(both(i) for i in range(4)))
        """
    )
    with pool.checkout() as session:
        for _ in range(2):
            got = session.feed_run(code, external_lookup={"big": big, "big_later": big_later})
            assert got == [(1_000_000 + i, 1_000_004 + i, {chr(ord("a") + i)}) for i in range(4)]
        assert session.feed_run("double(21)", external_lookup={"double": double}) == 42


def test_a_sync_host_functions_late_result_never_reaches_a_later_run() -> None:
    """A run cancelled while its sync host function blocks: the function's result, when it comes, is dropped."""
    from snapcell import AsyncPool

    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        entered.set()
        release.wait(60)
        returned.set()
        return "late"

    def quick() -> str:
        return "mine"

    async def scenario() -> list[object]:
        tools = {"slow": slow, "quick": quick}
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            run = asyncio.ensure_future(session.run("slow()", external_lookup=tools))
            assert await asyncio.to_thread(entered.wait, 60)
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            release.set()
            assert await asyncio.to_thread(returned.wait, 60)
            await asyncio.sleep(0.05)  # room for the late result to be (wrongly) sent; never a bound on time
            return [await session.feed_run("quick(), quick()", external_lookup=tools) for _ in range(2)]

    assert asyncio.run(scenario()) == [("mine", "mine")] * 2
