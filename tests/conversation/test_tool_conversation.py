"""`CodeTool` with a `Conversation`: the Python state follows truncate and fork, usage, cancelled and lost turns."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import CodeTool, Conflict, Conversation, Limits, Policy, Pool, WorkerLost
from snapcell.conversation import FileConversationStore, MemoryConversationStore
from snapcell.errors import RunCancelled, TurnOnOtherBranch
from snapcell.heads import MemoryHeads


def call(call_id: str, code: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "run_code", "arguments": code}}],
    }


def defined(name: str) -> str:
    """Code that binds ``seen`` to whether ``name`` is defined (globals() is not allowed)."""
    return f"try:\n    {name}\n    seen = True\nexcept NameError:\n    seen = False\n"


def result(call_id: str, answer: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": answer}


async def turn(tool: CodeTool, store: Any, conversation: Conversation, call_id: str, code: str) -> str:
    """One code turn of an agent loop: the call, the run, the result, as the example does it."""
    await store.add_messages(conversation, [call(call_id, code)])
    answer = await tool.run_code(conversation, code, turn_id=call_id)
    await store.add_messages(conversation, [result(call_id, answer)])
    return answer


@pytest.fixture(scope="module")
def inline_pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="inline") as pool:
        yield pool


@pytest.fixture(scope="module")
def process_pool() -> Iterator[Pool]:
    limits = Limits(wall_time_s=1.0, grace_s=0.5)
    with Pool("memory://", isolation="process", policy=Policy.unrestricted(), limits=limits) as pool:
        yield pool


def in_pool(pool: Pool, scenario: Callable[[CodeTool], Coroutine[Any, Any, None]], **options: Any) -> None:
    async def main() -> None:
        tool = CodeTool(pool.aio, heads=MemoryHeads(), **options)
        try:
            await scenario(tool)
        finally:
            await tool.aclose()

    pool.call(main())


def test_truncate_moves_the_python_state_back_and_the_head_follows(inline_pool: Pool, tmp_path: Path) -> None:
    store = FileConversationStore(tmp_path)

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="trunc")
        await store.add_messages(conversation, [{"role": "user", "content": "count"}])
        await turn(tool, store, conversation, "c1", "x = 1")
        after_first = len(conversation.messages)
        await turn(tool, store, conversation, "c2", "x = 2\ny = 'second'")
        assert "2" in await tool.run_code(conversation, "x")
        with pytest.raises(Exception, match="without its result"):
            conversation.truncate(-1)  # would keep c2's call without its result
        conversation.truncate(after_first)
        await store.save(conversation)
        loaded = await store.load("trunc")
        assert loaded is not None and len(loaded.messages) == after_first
        answer = await turn(tool, store, loaded, "c3", defined("y") + "x, seen")
        assert "(1, False)" in answer
        head = await tool.head("trunc")
        assert head is not None and head.checkpoint_id == loaded.checkpoint_id  # the head followed
        loaded.truncate(1)  # before any code turn: an empty session
        assert "NameError" in await turn(tool, store, loaded, "c4", "x")

    in_pool(inline_pool, scenario)


def test_fork_forks_messages_and_state_both_continue(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        original = Conversation(id="orig")
        await turn(tool, store, original, "c1", "items = [1]")
        fork = original.fork("fork")
        await store.save(fork)
        await turn(tool, store, original, "c2", "items.append('original')")
        await turn(tool, store, fork, "c3", "items.append('fork')")
        assert "[1, 'original']" in await turn(tool, store, original, "c4", "items")
        assert "[1, 'fork']" in await turn(tool, store, fork, "c5", "items")
        a, b = await store.load("orig"), await store.load("fork")
        assert a is not None and b is not None
        assert [m["tool_call_id"] for m in a.messages if m["role"] == "tool"] == ["c1", "c2", "c4"]
        assert [m["tool_call_id"] for m in b.messages if m["role"] == "tool"] == ["c1", "c3", "c5"]
        assert a.checkpoint_id != b.checkpoint_id

    in_pool(inline_pool, scenario)


LOG = "try:\n    log\nexcept NameError:\n    log = []\nlog.append({tag!r})\nlog"


def test_a_turn_replayed_after_a_truncate_raced_it_adopts_no_state_of_another_branch(inline_pool: Pool) -> None:
    """Turn r3 commits on r0 r1 r2 while the conversation is truncated to r0 r1; the call is then answered again
    with its turn ID. Adopting the committed state would put r2's variables under a transcript without r2."""
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="raced")
        for tag in ("r0", "r1"):
            await turn(tool, store, conversation, tag, LOG.format(tag=tag))
        after_r1 = len(conversation.messages)
        await turn(tool, store, conversation, "r2", LOG.format(tag="r2"))
        await store.add_messages(conversation, [call("r3", LOG.format(tag="r3"))])
        editor = await store.load("raced")
        assert editor is not None
        # r3 runs and moves the head; its writer dies before saving the conversation. Meanwhile r2 is cut off.
        assert "'r2', 'r3'" in await tool.run_code(conversation, LOG.format(tag="r3"), turn_id="r3")
        editor.truncate(after_r1)
        await store.save(editor)
        loaded = await store.load("raced")
        assert loaded is not None
        at_r1 = loaded.checkpoint_id
        await store.add_messages(loaded, [call("r3", LOG.format(tag="r3"))])  # the call, answered again
        with pytest.raises(TurnOnOtherBranch, match="turn 'r3' .* another branch") as info:
            await tool.run_code(loaded, LOG.format(tag="r3"), turn_id="r3")
        assert isinstance(info.value, Conflict) and info.value.expected == at_r1
        assert info.value.started_from is not None and info.value.started_from != at_r1
        assert loaded.checkpoint_id == at_r1 and loaded.last_turn_id != "r3"  # nothing adopted
        # What the error says to do: a new turn ID runs the code on this branch's state.
        answer = await tool.run_code(loaded, LOG.format(tag="r3"), turn_id="r3-again")
        await store.add_messages(loaded, [result("r3", answer)])
        assert answer == "['r0', 'r1', 'r3']"
        assert await tool.run_code(loaded, "log") == "['r0', 'r1', 'r3']"

    in_pool(inline_pool, scenario)


def test_a_turn_replayed_on_the_state_it_started_from_adopts_it_and_an_older_one_replays(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="crashed")
        await turn(tool, store, conversation, "r0", LOG.format(tag="r0"))
        await store.add_messages(conversation, [call("r1", LOG.format(tag="r1"))])
        stored = await store.load("crashed")  # as stored: r1's writer dies before saving the conversation
        assert stored is not None
        await tool.run_code(conversation, LOG.format(tag="r1"), turn_id="r1")
        assert await tool.run_code(stored, LOG.format(tag="r1"), turn_id="r1") == "['r0', 'r1']"
        assert stored.last_turn_id == "r1" and stored.checkpoint_id == conversation.checkpoint_id  # adopted
        await store.add_messages(stored, [result("r1", "['r0', 'r1']")])
        await turn(tool, store, stored, "r2", LOG.format(tag="r2"))
        # A late duplicate of r0 (long since in this conversation's past) is answered, and changes nothing.
        before = stored.checkpoint_id
        assert await tool.run_code(stored, LOG.format(tag="r0"), turn_id="r0") == "['r0']"
        assert stored.checkpoint_id == before

    in_pool(inline_pool, scenario)


async def cancel_when_started(tool: CodeTool, conversation: Conversation, code: str, started: asyncio.Event) -> None:
    task = asyncio.ensure_future(tool.run_code(conversation, code, turn_id="cancelled-turn"))
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)


CANCEL_CODE = {
    # Inline, only async code can be interrupted (a synchronous cell holds the event loop until it ends).
    "inline": "import asyncio\nkept = 41\nstarted()\nawait asyncio.sleep(120)\nnever = 1",
    "process": "kept = 41\nstarted()\nwhile True:\n    pass\nnever = 1",
}


@pytest.mark.parametrize("mode", ["inline", "process"])
def test_a_cancelled_turn_keeps_its_variables_and_the_next_answer_says_so(
    mode: str, request: pytest.FixtureRequest
) -> None:
    pool: Pool = request.getfixturevalue(f"{mode}_pool")
    started = asyncio.Event()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id=f"cancel-{mode}")
        await tool.run_code(conversation, "before = 1")
        await cancel_when_started(tool, conversation, CANCEL_CODE[mode], started)
        assert conversation.last_turn_id == "cancelled-turn"
        answer = await tool.run_code(conversation, defined("never") + "kept + before, seen")
        assert "(42, False)" in answer
        assert re.search(r"previous turn was cancelled.*variables it had set: [^)]*\bkept\b", answer)
        assert "never" not in answer
        assert conversation.usage.by_status == {"ok": 2, "cancelled": 1}
        # A retry of the cancelled turn does not run it again: its saved answer says it was cancelled.
        assert "this turn was cancelled" in await tool.run_code(conversation, "x", turn_id="cancelled-turn")

    in_pool(pool, scenario, tools={"started": started.set})


def test_session_run_cancelled_raises_run_cancelled_with_the_result(process_pool: Pool) -> None:
    started = asyncio.Event()

    async def scenario() -> None:
        async with process_pool.aio.checkout() as session:
            task = asyncio.ensure_future(
                session.run("a = 1\nstarted()\nb = 2\nwhile True:\n    pass", external_lookup={"started": started.set})
            )
            await asyncio.wait_for(started.wait(), 60)
            task.cancel()
            with pytest.raises(RunCancelled) as info:
                await task
            assert info.value.result.status == "cancelled"
            assert info.value.result.assigned == ("a", "b")
            assert (await session.run("a + b")).value == 3  # the same worker, the namespace as it stood

    process_pool.call(scenario())


def test_usage_sums_ok_failed_timed_out_and_cancelled_runs(process_pool: Pool) -> None:
    started = asyncio.Event()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="usage")
        await tool.run_code(conversation, "data = list(range(100_000))\nping()")
        await tool.run_code(conversation, "1 / 0")
        answer = await tool.run_code(conversation, "while True:\n    pass")
        assert "stopped after 1 s" in answer
        await cancel_when_started(tool, conversation, CANCEL_CODE["process"], started)
        usage = conversation.usage
        assert usage.runs == 4
        assert usage.by_status == {"ok": 1, "error": 1, "timeout": 1, "cancelled": 1}
        assert usage.host_calls == 2  # ping() and started()
        assert usage.wall_time_s >= 1.0  # the timed-out run alone ran for its limit
        assert usage.cpu_time_s > 0  # the busy loops, measured by the host from the worker's /proc entry
        assert usage.peak_memory_bytes > 1_000_000
        assert usage.bytes_stored > 10_000  # four checkpoints, one holding 100,000 ints

    in_pool(process_pool, scenario, tools={"ping": lambda: None, "started": started.set})


def test_status_and_restarted_after_a_worker_loss(process_pool: Pool) -> None:
    async def scenario(tool: CodeTool) -> None:
        async with process_pool.aio.checkout() as session:
            assert (await session.run("kept = 1")).status == "ok"
            await session.dump()
            with pytest.raises(WorkerLost) as lost:
                await session.run("import os\nos.kill(os.getpid(), 9)", raise_on_lost=True)
            assert lost.value.result.status == "lost" and not lost.value.result.restarted
            after = await session.run("kept")
            assert after.status == "ok" and after.restarted and after.value == 1
            assert not (await session.run("kept")).restarted  # only the first run after the restart
        conversation = Conversation(id="lost")
        await tool.run_code(conversation, "kept = 1")
        answer = await tool.run_code(conversation, "import os\nos.kill(os.getpid(), 9)")
        assert "the Python session restarted because" in answer
        assert conversation.usage.by_status == {"ok": 1, "lost": 1}
        assert "1" in await tool.run_code(conversation, "kept")

    in_pool(process_pool, scenario)


def test_a_cancelled_run_that_does_not_stop_is_killed_and_the_session_restored(process_pool: Pool) -> None:
    started = asyncio.Event()

    async def scenario() -> None:
        async with process_pool.aio.checkout() as session:
            await session.run("kept = 1")
            await session.dump()
            # C-level work cannot be interrupted: the worker does not answer within grace_s and is killed.
            task = asyncio.ensure_future(
                session.run("lost = 1\nstarted()\nbig = 10**10**8", external_lookup={"started": started.set})
            )
            await asyncio.wait_for(started.wait(), 60)
            task.cancel()
            with pytest.raises(RunCancelled) as info:
                await asyncio.wait_for(task, 60)
            assert info.value.result.status == "lost"
            after = await session.run(defined("lost") + "kept, seen")
            assert after.value == (1, False) and after.restarted

    process_pool.call(scenario())


def test_a_run_cancelled_while_its_script_is_being_sent_leaves_the_channel_whole(process_pool: Pool) -> None:
    async def scenario() -> None:
        async with process_pool.aio.checkout() as session:
            await session.run("kept = 1")
            # Larger than the socket's buffer: the request is still being written when its caller is cancelled.
            task = asyncio.ensure_future(session.run("sent = 1\n" + "#" * 900_000 + "\nsent"))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(RunCancelled) as info:
                await asyncio.wait_for(task, 60)
            assert info.value.result.status != "lost"
            # The whole frame went, the reply was read: the same worker answers the next run in step.
            after = await session.run("kept")
            assert after.value == 1 and not after.restarted

    process_pool.call(scenario())


def test_a_run_cancelled_while_an_async_host_function_is_pending_keeps_its_worker(process_pool: Pool) -> None:
    started = asyncio.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(120)
        return 1

    async def scenario() -> None:
        async with process_pool.aio.checkout() as session:
            task = asyncio.ensure_future(session.run("a = 1\nb = await slow()", external_lookup={"slow": slow}))
            await asyncio.wait_for(started.wait(), 60)
            task.cancel()
            with pytest.raises(RunCancelled) as info:
                await asyncio.wait_for(task, 60)
            assert info.value.result.status == "cancelled"
            assert info.value.result.assigned == ("a",)
            after = await session.run("a")
            assert after.value == 1 and not after.restarted  # the same worker, in step with the host

    process_pool.call(scenario())


def test_a_kept_conversation_records_timed_out_and_lost_turns_with_what_was_measured(process_pool: Pool) -> None:
    store = MemoryConversationStore()
    kill = "import os\nos.kill(os.getpid(), 9)"
    spin = "while True:\n    pass"

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="kept-lost")
        for call_id, code in (("c1", "kept = 1"), ("c2", spin), ("c3", kill)):
            await store.add_messages(conversation, [call(call_id, code)])
            await tool.run_code(conversation, code, turn_id=call_id)
        stored = await store.load("kept-lost")
        assert stored is not None and stored.messages == conversation.messages
        results = {m["tool_call_id"]: m["content"] for m in stored.messages if m["role"] == "tool"}
        assert list(results) == ["c1", "c2", "c3"]
        assert "stopped after 1 s" in results["c2"] and "the Python session restarted" in results["c3"]
        assert stored.usage.by_status == {"ok": 1, "timeout": 1, "lost": 1}
        assert stored.usage.peak_memory_bytes is not None  # measured in process mode
        assert [r.status for r in stored.usage.records] == ["ok", "timeout", "lost"]
        assert stored.usage.records[-1].peak_memory_bytes is None  # the lost worker's was not measured
        assert "1" in await tool.run_code(stored, "kept")  # the lost turn did not move the state

    in_pool(process_pool, scenario, conversations=store)
