"""Warm conversations: the next turn reuses the live session while the head names its checkpoint, loads otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from snapcell import AsyncPool, CodeTool, ConfigError, Policy
from snapcell.heads import MemoryHeads
from snapcell.session import AsyncSession
from snapcell.storage import MemoryStore
from tests import procs

KEY = "warm-test-signing-key-0123456789"
HANG_GUARD_S = 30.0


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every checkpoint ID a session loads during the test."""
    seen: list[bytes] = []
    original = AsyncSession.load_session

    async def counted(self: AsyncSession, checkpoint_id: bytes) -> None:
        seen.append(checkpoint_id)
        await original(self, checkpoint_id)

    monkeypatch.setattr(AsyncSession, "load_session", counted)
    yield seen


def _pool(store: MemoryStore, **options: object) -> AsyncPool:
    return AsyncPool(store=store, signing_keys=[KEY], isolation="inline", **options)  # type: ignore[arg-type]


def _process_pool(max_workers: int, **options: object) -> AsyncPool:
    """A process-mode pool whose scripts may reach their worker (to kill or inspect it), on its own store."""
    return AsyncPool(  # type: ignore[arg-type]
        store=MemoryStore(),
        signing_keys=[KEY],
        isolation="process",
        policy=Policy.unrestricted(),
        max_workers=max_workers,
        checkout_timeout_s=HANG_GUARD_S,
        **options,
    )


def test_a_warm_conversation_skips_the_load(loads: list[bytes]) -> None:
    async def main() -> tuple[list[str], list[str]]:
        store, heads = MemoryStore(), MemoryHeads()
        async with _pool(store) as pool:
            warm = CodeTool(pool, heads=heads, keep_warm_s=60)
            hot = [await warm.run_code("a", "x = 1"), *[await warm.run_code("a", "x += 1\nx") for _ in range(3)]]
            await warm.aclose()
            cold = CodeTool(pool, heads=heads)
            again = [await cold.run_code("a", "x += 1\nx"), await cold.run_code("a", "x")]
            await cold.aclose()
        return hot, again

    hot, again = asyncio.run(main())
    assert [answer.split()[-1] for answer in hot[1:]] == ["2", "3", "4"]
    assert [answer.split()[-1] for answer in again] == ["5", "5"]
    assert len(loads) == 2  # none while warm; one per turn of the tool without warm sessions


def test_a_moved_head_forces_a_load(loads: list[bytes]) -> None:
    async def main() -> list[str]:
        store, heads = MemoryStore(), MemoryHeads()
        async with _pool(store) as pool:
            one = CodeTool(pool, heads=heads, keep_warm_s=60)
            other = CodeTool(pool, heads=heads, keep_warm_s=60)
            answers = [await one.run_code("a", "x = 'one'")]
            answers.append(await other.run_code("a", "x = x + ', other'\nx"))  # the head moves under `one`
            assert len(loads) == 1
            answers.append(await one.run_code("a", "x = x + ', one again'\nx"))
            assert len(loads) == 2  # the warm session no longer matched the head: it was checked in, and loaded
            await one.rewind("a")  # back to other's checkpoint, which `one` does not hold
            answers.append(await one.run_code("a", "x"))
            assert len(loads) == 3
            await one.aclose()
            await other.aclose()
        return answers

    answers = asyncio.run(main())
    assert "one, other" in answers[1]
    assert "one, other, one again" in answers[2]
    assert "'one, other'" in answers[3] and "again" not in answers[3]


def test_warm_sessions_are_bounded_and_evicted_ones_checked_in(loads: list[bytes]) -> None:
    async def main() -> tuple[int, int, int]:
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60, max_warm_sessions=2)
            for conversation in ("a", "b", "c"):
                await tool.run_code(conversation, "x = 1")
            kept, open_sessions = len(tool._warm), len(pool._sessions)
            await tool.run_code("a", "x")  # evicted: loads
            await tool.run_code("c", "x")  # still warm
            await tool.aclose()
            return kept, open_sessions, len(pool._sessions)

    kept, open_sessions, after_close = asyncio.run(main())
    assert (kept, open_sessions, after_close) == (2, 2, 0)
    assert len(loads) == 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _until(done: Callable[[], bool]) -> bool:
    """Wait (a hang guard, not a bound) until ``done()``: work under way in the background has finished."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return done()


def test_warm_sessions_past_their_keep_time_are_checked_in_while_the_tool_runs() -> None:
    """Checked before the tool closes (`aclose` checks every session in anyway), on an injected clock."""

    async def main() -> None:
        clock = Clock()
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=0.05)
            tool._warm.clock = clock
            try:
                await tool.run_code("a", "x = 1")
                # The timer has fired (and looked again) a few times: the clock says the keep time has not passed.
                await asyncio.sleep(0.2)
                assert "a" in tool._warm._kept and len(pool._sessions) == 1
                clock.now += 0.05  # now it has: the next timer checks the session in, with no turn to prompt it
                assert await _until(lambda: not pool._sessions), "a warm session outlived its keep time"
                assert "a" not in tool._warm._kept
                # A turn checks in whatever is due too (a timer may be late): "b" is due when "c" starts.
                tool._warm.keep_warm_s = 60
                await tool.run_code("b", "x = 1")
                clock.now += 61
                await tool.run_code("c", "x = 1")
                assert await _until(lambda: len(pool._sessions) == 1) and list(tool._warm._kept) == ["c"]
            finally:
                await tool.aclose()

    asyncio.run(main())


def test_a_warm_conversation_whose_idle_worker_died_runs_its_next_turn(loads: list[bytes]) -> None:
    """The worker of a kept session is SIGKILLed between turns: the next turn used to say "this code's changes are
    lost ... do not rerun it unchanged" though the code never ran. Now it loads the checkpoint and runs."""
    marks: list[int] = []

    def mark(value: int) -> int:
        marks.append(value)
        return value

    async def main() -> tuple[str, int, int, int]:
        pool = _process_pool(2)
        async with pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60, tools={"mark": mark})
            await tool.run_code("a", "x = 1")
            worker = tool._warm._kept["a"].session._backend.worker  # type: ignore[attr-defined]
            os.kill(worker.pid, signal.SIGKILL)
            answer = await tool.run_code("a", "mark(x)\nx += 1\nimport os\nx, os.getpid()")
            assert await tool.run_code("a", "x") == "2"  # kept again, and reused
            dead, reused = tool._warm.dead, tool._warm.reused
            await tool.aclose()
        value, pid = answer.rsplit("\n", 1)[-1].strip("()").split(", ")
        assert pid != str(worker.pid)
        return answer, int(value), dead, reused

    answer, value, dead, reused = asyncio.run(main())
    assert "[note]" not in answer and "lost" not in answer and "restarted" not in answer, answer
    assert value == 2 and marks == [1]  # the code ran, once
    assert len(loads) == 1 and (dead, reused) == (1, 1)  # loaded as a cold turn; then warm again


def test_a_session_that_dropped_a_variable_is_not_kept_warm(loads: list[bytes]) -> None:
    async def main() -> str:
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60)
            await tool.run_code("a", "g = (i for i in range(3))")  # a generator is not saved
            answer = await tool.run_code("a", "try:\n    g\n    seen = True\nexcept NameError:\n    seen = False\nseen")
            await tool.aclose()
            return answer

    # Warm, the live generator would still be there: the next turn must see what a load restores.
    answer = asyncio.run(main())
    assert "False" in answer and "True" not in answer, answer
    assert len(loads) == 1


def test_warm_sessions_give_their_worker_to_a_new_conversation() -> None:
    async def main() -> tuple[list[int], str]:
        pool = _process_pool(1)
        async with pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60)
            pids = []
            for _ in range(2):
                answer = await tool.run_code("a", "import os\nos.getpid()")
                pids.append(int(answer.split()[-1]))
            other = await tool.run_code("b", "'b ran'")  # the only worker is warm for "a": it is checked in
            await tool.aclose()
        return pids, other

    pids, other = asyncio.run(main())
    assert pids[0] == pids[1]  # the same worker served both turns of "a"
    assert "b ran" in other


@pytest.mark.parametrize("recycle_after", [1, 3], ids=["started-ahead", "recycled"])
def test_a_spare_worker_that_died_while_it_waited_is_not_handed_to_a_turn(recycle_after: int) -> None:
    """The pool's spare workers (started ahead of a checkout, or kept after one) may die while they wait; one handed
    out anyway made a fresh conversation's first turn answer "this code's changes are lost" for code never sent."""
    marks: list[int] = []

    def mark(value: int) -> int:
        marks.append(value)
        return value

    async def main() -> str:
        pool = _process_pool(2, recycle_after=recycle_after)
        async with pool:
            tool = CodeTool(pool, heads=MemoryHeads(), tools={"mark": mark})
            try:
                await tool.run_code("a", "x = 1")
                workers = pool._workers

                def spares() -> list[Any]:
                    return [*workers._warm, *(w for idle in workers._idle.values() for w in idle)]

                def ready() -> bool:  # "a"'s worker is kept (checked in after the answer), or one started ahead
                    kept = any(workers._idle.values()) if recycle_after > 1 else bool(workers._warm)
                    return kept and all(w.pid for w in spares())

                assert await _until(ready)
                killed = [w.pid for w in spares()]
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
                assert await _until(lambda: all(procs.exited(pid) for pid in killed))
                return await tool.run_code("b", "mark(1)\n'b ran'")
            finally:
                await tool.aclose()

    answer = asyncio.run(main())
    assert answer == "'b ran'" and marks == [1], answer


@pytest.mark.parametrize(
    "options",
    [{"keep_warm_s": -1}, {"keep_warm_s": "5"}, {"max_warm_sessions": -1}, {"max_warm_bytes": 1.5}],
)
def test_warm_settings_are_checked(options: dict[str, object]) -> None:
    async def main() -> None:
        async with _pool(MemoryStore()) as pool:
            CodeTool(pool, heads=MemoryHeads(), **options)  # type: ignore[arg-type]

    with pytest.raises(ConfigError):
        asyncio.run(main())


def _watch_checkins(tool: CodeTool, events: list[str], release: asyncio.Event | None = None) -> None:
    """Make the tool's checkouts say in ``events`` when their check-in starts and ends (held until ``release``)."""

    @contextlib.asynccontextmanager
    async def watched(**options: Any) -> AsyncIterator[AsyncSession]:
        async with tool.pool.checkout(**options) as session:
            yield session
            events.append("checkin started")
            if release is not None:
                await release.wait()
        events.append("checked in")

    tool._context = dataclasses.replace(tool._context, new_session=watched)


def test_a_turn_answers_before_its_session_is_checked_in_and_aclose_waits_for_it() -> None:
    """Checking a session in (a worker to kill) is off the turn's latency, but never left behind by `aclose`."""
    events: list[str] = []

    async def main() -> bool:
        release = asyncio.Event()
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads())
            _watch_checkins(tool, events, release)
            turn = asyncio.ensure_future(tool.run_code("a", "x = 1\nx"))
            done, _ = await asyncio.wait({turn}, timeout=HANG_GUARD_S)
            answered = turn in done and "1" in turn.result()
            events.append("answered")
            closing = asyncio.ensure_future(tool.aclose())
            await asyncio.sleep(0)
            release.set()
            await closing
            events.append("tool closed")
            return answered

    assert asyncio.run(main())
    assert events == ["checkin started", "answered", "checked in", "tool closed"]


def test_a_turn_s_check_in_starts_only_once_its_answer_is_returned() -> None:
    """Nothing of the check-in (a worker's kill, a thread for its scratch mount) runs before `run_code` returns:
    it used to start while the turn gave its lease back, and the turn waited for it."""
    events: list[str] = []

    async def main() -> tuple[list[str], str]:
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads())
            _watch_checkins(tool, events)
            await tool.run_code("a", "x = 1")
            for _ in range(10_000):  # the first turn's check-in, under way in the background
                if "checked in" in events:
                    break
                await asyncio.sleep(0)
            events.clear()
            answer = await tool.run_code("a", "x + 1")
            at_return = list(events)
            await tool.aclose()
            return at_return, answer

    at_return, answer = asyncio.run(main())
    assert "2" in answer
    assert at_return == [] and events == ["checkin started", "checked in"]


def test_a_slot_being_checked_in_is_waited_for_rather_than_evicting_a_warm_session(loads: list[bytes]) -> None:
    """A finished turn's session frees its worker in a moment: a new turn waits for it and the warm one stays."""

    async def main() -> tuple[int, str, str]:
        release = asyncio.Event()
        pool = _process_pool(2)
        async with pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60)

            @contextlib.asynccontextmanager
            async def held_checkin(**options: Any) -> AsyncIterator[AsyncSession]:
                async with pool.checkout(**options) as session:
                    yield session
                    await release.wait()

            tool._context = dataclasses.replace(tool._context, new_session=held_checkin)
            await tool.run_code("a", "x = 1")  # kept warm: one worker
            # A generator cannot be saved, so this session is not kept: it is checked in, held there: the other worker.
            await tool.run_code("b", "g = (i for i in range(3))")
            third = asyncio.ensure_future(tool.run_code("c", "'c ran'"))
            deadline = time.monotonic() + HANG_GUARD_S
            while tool._warm._waiting == 0 and not third.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            still_warm = len(tool._warm)
            release.set()
            answer = await third
            again = await tool.run_code("a", "x")
            await tool.aclose()
        return still_warm, answer, again

    still_warm, answer, again = asyncio.run(main())
    assert still_warm == 1
    assert "c ran" in answer
    assert "1" in again
    assert loads == []  # "a" ran warm again: nothing was loaded


def test_a_session_whose_setup_cells_rebuild_what_it_dropped_is_kept_warm(loads: list[bytes]) -> None:
    """A setup cell making an unsavable value runs once, not every turn: the warm session keeps the live value."""

    async def main() -> list[str]:
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads(), keep_warm_s=60)
            setup = "runs = [0]\nstream = (i for i in range(100))\nruns[0] += 1"
            answers = [await tool.run_code("a", setup, setup=True)]
            answers += [await tool.run_code("a", "next(stream), runs[0]") for _ in range(3)]
            await tool.aclose()
            return answers

    answers = asyncio.run(main())
    assert "gone next turn" not in answers[0] and "stream" in answers[0], answers[0]
    assert [answer.splitlines()[-1] for answer in answers[1:]] == ["(0, 1)", "(1, 1)", "(2, 1)"], answers
    assert not any("[note]" in answer for answer in answers[1:]), answers
    assert loads == []


def test_a_cold_load_reruns_the_setup_cells_that_rebuild_a_dropped_value_with_one_note() -> None:
    async def main() -> list[str]:
        async with _pool(MemoryStore()) as pool:
            tool = CodeTool(pool, heads=MemoryHeads())
            answers = [await tool.run_code("a", "stream = (i for i in range(100))", setup=True)]
            answers.append(await tool.run_code("a", "next(stream)"))
            await tool.aclose()
            return answers

    first, second = asyncio.run(main())
    notes = [line for line in second.splitlines() if line.startswith("[note]")]
    assert len(notes) == 1 and "setup cell" in notes[0] and "stream" in notes[0], second
    assert second.splitlines()[0] == "0", second


def test_a_warm_turn_sees_process_state_a_load_does_not_restore_so_warm_is_off_by_default() -> None:
    """Why `keep_warm_s` defaults to 0: a warm turn differs from a cold one in what lives in the worker beside the
    namespace. Here a random seed set in one turn: a warm next turn draws from the seeded stream, a cold one (a
    fresh worker, reseeded from the OS, with the namespace loaded) does not."""
    code = ("import random\nrandom.seed(7)\nx = 1", "import random\nrandom.random()")

    async def main() -> tuple[str, str, float]:
        pool = _process_pool(2)
        async with pool:
            heads = MemoryHeads()
            warm, cold = CodeTool(pool, heads=heads, keep_warm_s=60), CodeTool(pool, heads=heads)
            answers = []
            for tool, conversation in ((warm, "warm"), (cold, "cold")):
                for cell in code:
                    answer = await tool.run_code(conversation, cell)
                answers.append(answer.strip())
            default = cold._warm.keep_warm_s
            await warm.aclose()
            await cold.aclose()
        return answers[0], answers[1], default

    warm, cold, default = asyncio.run(main())
    seeded = repr(__import__("random").Random(7).random())
    assert warm == seeded and cold != seeded, (warm, cold)
    assert default == 0  # off until a warm turn cannot be told apart from a cold one
