"""Backpressure under overload: a bounded, first-come-first-served checkout queue, and `Overloaded` beyond it."""

from __future__ import annotations

import asyncio

import pytest

from snapcell import AsyncPool, ConfigError, Overloaded, SessionError
from snapcell.backends._workerpool import CheckoutQueue

LONG_S = 3600.0  # a wait this long never ends inside a test: anything that returns did not wait it out


async def _admitted_in_order(queue: CheckoutQueue, count: int) -> tuple[list[int], list[asyncio.Task[None]]]:
    order: list[int] = []

    async def one(index: int) -> None:
        await queue.admit(LONG_S)
        order.append(index)

    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    await asyncio.sleep(0)  # every task has run up to its wait
    return order, tasks


def test_waiting_checkouts_are_served_first_come_first_served() -> None:
    async def scenario() -> tuple[list[int], int]:
        queue = CheckoutQueue(slots=2, max_queued=10)
        order, tasks = await _admitted_in_order(queue, 8)
        assert order == [0, 1] and queue.queued == 6
        for _ in range(6):
            queue.leave()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        # A newcomer does not jump the queue while others wait: it waits behind them.
        late = asyncio.create_task(queue.admit(LONG_S))
        await asyncio.sleep(0)
        assert not late.done()
        queue.leave()
        await late
        return order, queue.active

    order, active = asyncio.run(scenario())
    assert order == list(range(8))
    assert active == 2


def test_a_full_queue_refuses_at_once_with_overloaded() -> None:
    async def scenario() -> list[Overloaded]:
        queue = CheckoutQueue(slots=1, max_queued=2)
        _, tasks = await _admitted_in_order(queue, 3)  # one served, two waiting: the queue is full
        refused = []
        for _ in range(5):
            with pytest.raises(Overloaded) as caught:
                await queue.admit(LONG_S)
            refused.append(caught.value)
        assert queue.queued == 2 and queue.active == 1  # the refused ones hold nothing and left no waiter
        queue.leave()
        queue.leave()
        await asyncio.gather(*tasks)
        return refused

    refused = asyncio.run(scenario())
    assert len(refused) == 5
    error = refused[0]
    assert isinstance(error, SessionError)  # callers that catch SessionError still do
    assert (error.max_workers, error.max_queued, error.timed_out) == (1, 2, False)
    assert "retry" in str(error) and "max_workers" in str(error)


def test_a_queue_of_zero_refuses_whenever_every_slot_is_taken() -> None:
    async def scenario() -> None:
        queue = CheckoutQueue(slots=1, max_queued=0)
        await queue.admit(LONG_S)
        with pytest.raises(Overloaded):
            await queue.admit(LONG_S)
        queue.leave()
        await queue.admit(LONG_S)  # free again

    asyncio.run(scenario())


def test_a_wait_that_runs_out_is_overloaded_and_holds_no_slot() -> None:
    async def scenario() -> None:
        queue = CheckoutQueue(slots=1, max_queued=4)
        await queue.admit(LONG_S)
        with pytest.raises(Overloaded) as caught:
            await queue.admit(0.05)
        assert caught.value.timed_out
        assert queue.queued == 0 and queue.active == 1
        queue.leave()
        assert queue.active == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    async def scenario() -> list[int]:
        queue = CheckoutQueue(slots=1, max_queued=4)
        order, tasks = await _admitted_in_order(queue, 4)  # 0 served; 1, 2, 3 wait
        tasks[1].cancel()  # gives up while waiting
        await asyncio.sleep(0)
        queue.leave()  # 0 done: the slot goes to 2, which is cancelled just as it gets it
        tasks[2].cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert queue.active == 1 and order == [0, 3]  # 2's slot was passed on to 3, not lost
        queue.leave()
        assert queue.active == 0
        await asyncio.gather(*tasks, return_exceptions=True)
        return order

    assert asyncio.run(scenario()) == [0, 3]


def test_closing_the_pool_releases_queued_checkouts() -> None:
    async def scenario() -> None:
        pool = AsyncPool("memory://", isolation="process", max_workers=1, min_warm_workers=0)
        workers = pool._worker_pool()
        await workers.admit()
        waiting = asyncio.create_task(workers.admit())
        await asyncio.sleep(0)
        await pool.aclose()
        with pytest.raises(SessionError, match="closed"):
            await waiting

    asyncio.run(scenario())


@pytest.mark.parametrize("value", [-1, 1.5, True, "4"])
def test_max_queued_checkouts_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match="max_queued_checkouts"):
        AsyncPool("memory://", max_queued_checkouts=value)  # type: ignore[arg-type]


CONVERSATIONS = 60
TURNS = 3


def test_overload_completes_or_refuses_every_turn_and_loses_none() -> None:
    """60 conversations x 3 turns at once on two workers and a queue of four: each turn completes, or is refused."""

    async def conversation(pool: AsyncPool, outcomes: list[str]) -> int:
        checkpoint: bytes | None = None
        for _ in range(TURNS):
            try:
                async with pool.checkout() as session:
                    if checkpoint is not None:
                        await session.load_session(checkpoint)
                    await session.feed_run("n = n + 1 if 'n' in dir() else 1")
                    checkpoint = await session.dump()
            except Overloaded as exc:
                assert not exc.timed_out  # refused at once: nothing waited out checkout_timeout_s
                outcomes.append("overloaded")
                continue
            outcomes.append("completed")
        if checkpoint is None:
            return 0
        async with pool.checkout() as session:
            await session.load_session(checkpoint)
            value: int = await session.feed_run("n")
            return value

    async def scenario() -> tuple[list[list[str]], list[int]]:
        outcomes: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
        # A generous checkout timeout: a turn that was queued must be served, never timed out.
        async with AsyncPool("memory://", max_workers=2, max_queued_checkouts=4, checkout_timeout_s=300) as pool:
            counters = await asyncio.gather(*(conversation(pool, outcomes[i]) for i in range(CONVERSATIONS)))
        return outcomes, list(counters)

    outcomes, counters = asyncio.run(scenario())
    flat = [outcome for turns in outcomes for outcome in turns]
    assert len(flat) == CONVERSATIONS * TURNS
    assert flat.count("completed") + flat.count("overloaded") == CONVERSATIONS * TURNS  # nothing else happened
    # First come, first served: the first two conversations got the workers and the next four the queue; each
    # came back to the queue's end for its next turn and was served. Every later one was refused at once.
    assert outcomes[:6] == [["completed"] * TURNS] * 6
    assert outcomes[6:] == [["overloaded"] * TURNS] * (CONVERSATIONS - 6)
    # No admitted turn was lost: each conversation's counter is the number of turns it completed.
    assert counters == [TURNS] * 6 + [0] * (CONVERSATIONS - 6)


def test_by_default_a_burst_of_conversations_waits_its_turn_instead_of_being_refused() -> None:
    """Twenty conversations at once on two workers: a server wants them queued (bounded by the checkout wait)."""

    async def scenario() -> list[object]:
        async with AsyncPool("memory://", max_workers=2) as pool:

            async def turn(index: int) -> object:
                try:
                    async with pool.checkout() as session:
                        return await session.feed_run(f"{index} * 2")
                except Overloaded as exc:
                    return exc

            return list(await asyncio.gather(*(turn(i) for i in range(20))))

    assert asyncio.run(scenario()) == [i * 2 for i in range(20)]
