"""`CodeTool(conversations=store, durability=...)`: each turn's result, checkpoint and usage stored by the tool."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import CodeTool, ConfigError, Conflict, Conversation, Pool, StorageError, SyncCodeTool
from snapcell.conversation import (
    ConversationStore,
    FileConversationStore,
    MemoryConversationStore,
    tool_call_ids,
    tool_result_ids,
)
from snapcell.heads import MemoryHeads


def call(call_id: str, code: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "run_code", "arguments": code}}],
    }


def unanswered(conversation: Conversation) -> list[str]:
    answered = {i for m in conversation.messages for i in tool_result_ids(m)}
    return [i for m in conversation.messages for i in tool_call_ids(m) if i not in answered]


@pytest.fixture(scope="module")
def inline_pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="inline") as pool:
        yield pool


def in_pool(
    pool: Pool, scenario: Callable[[CodeTool], Coroutine[Any, Any, None]], *, close: bool = True, **options: Any
) -> None:
    async def main() -> None:
        tool = CodeTool(pool.aio, heads=MemoryHeads(), **options)
        try:
            await scenario(tool)
        finally:
            if close:
                await tool.aclose()

    pool.call(main())


async def code_turn(
    tool: CodeTool, store: ConversationStore, conversation: Conversation, call_id: str, code: str
) -> str:
    """The application's part of a code turn: store the model's call, then run it. No result message, no save."""
    await store.add_messages(conversation, [call(call_id, code)])
    return await tool.run_code(conversation, code, turn_id=call_id)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_each_turn_is_stored_with_its_result_without_glue(inline_pool: Pool, tmp_path: Path, durability: str) -> None:
    store = FileConversationStore(tmp_path)

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="loop")
        await store.add_messages(conversation, [{"role": "user", "content": "count"}])
        assert await code_turn(tool, store, conversation, "c1", "n = 1") == "(no output)"
        assert "2" in await code_turn(tool, store, conversation, "c2", "n += 1\nn")
        assert "ZeroDivisionError" in await code_turn(tool, store, conversation, "c3", "1 / 0")
        assert unanswered(conversation) == []
        assert conversation.messages[-1] == {
            "role": "tool",
            "tool_call_id": "c3",
            "content": conversation.messages[-1]["content"],
        }
        if durability == "exit":
            return  # stored once, when the tool closes
        stored = await store.load("loop")  # waits for a write still running in the background
        assert stored is not None and stored.messages == conversation.messages
        assert stored.checkpoint_id == conversation.checkpoint_id is not None
        assert stored.last_turn_id == "c3" and stored.usage.runs == 3
        assert [r.turn_id for r in stored.usage.records] == ["c1", "c2", "c3"]

    in_pool(inline_pool, scenario, conversations=store, durability=durability)
    stored = store.load_sync("loop")
    assert stored is not None and unanswered(stored) == []
    assert [m.get("tool_call_id") for m in stored.messages if m["role"] == "tool"] == ["c1", "c2", "c3"]
    assert stored.usage.by_status == {"ok": 2, "error": 1}


def test_exit_durability_stores_nothing_until_the_tool_closes(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="later")
        await code_turn(tool, store, conversation, "c1", "x = 1")
        stored = await store.load("later")
        assert stored is not None and unanswered(stored) == ["c1"]  # the call the application stored, only
        with pytest.raises(ConfigError, match="pass the Conversation"):
            await tool.run_code("later", "x")
        await tool.aclose()
        stored = await store.load("later")
        assert stored is not None and unanswered(stored) == [] and stored.checkpoint_id == conversation.checkpoint_id

    in_pool(inline_pool, scenario, close=False, conversations=store, durability="exit")


def test_a_conversation_id_is_loaded_from_the_store_and_stored_again(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        app = Conversation(id="user:7")
        await store.add_messages(app, [{"role": "user", "content": "hi"}, call("c1", "x = 41")])
        await tool.run_code("user:7", "x = 41", turn_id="c1")
        app = await store.load("user:7")  # the store is the truth: the application loads it again
        assert app is not None and unanswered(app) == [] and app.checkpoint_id is not None
        await store.add_messages(app, [call("c2", "x + 1")])
        assert "42" in await tool.run_code("user:7", "x + 1", turn_id="c2")
        stored = await store.load("user:7")
        assert stored is not None and stored.messages[-1]["content"] == "42" and stored.usage.runs == 2
        # A turn of a conversation the store does not have starts it.
        await tool.run_code("fresh", "y = 1")
        fresh = await store.load("fresh")
        assert fresh is not None and fresh.checkpoint_id is not None and fresh.messages == []

    in_pool(inline_pool, scenario, conversations=store, durability="async")


def test_results_take_the_format_of_their_call(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="formats")
        # Anthropic: two calls in one message get their results in the one user message that follows.
        uses = [{"type": "tool_use", "id": f"toolu_{i}", "name": "run_code", "input": {}} for i in (1, 2)]
        await store.add_messages(conversation, [{"role": "assistant", "content": uses}])
        await tool.run_code(conversation, "a = 1", turn_id="toolu_1")
        await tool.run_code(conversation, "a + 1", turn_id="toolu_2")
        last = conversation.messages[-1]
        assert last["role"] == "user" and [b["tool_use_id"] for b in last["content"]] == ["toolu_1", "toolu_2"]
        assert last["content"][1]["content"] == "2"
        # OpenAI responses.
        item = {"type": "function_call", "call_id": "fc_1", "name": "run_code", "arguments": "{}"}
        await store.add_messages(conversation, [item])
        await tool.run_code(conversation, "a * 10", turn_id="fc_1")
        assert conversation.messages[-1] == {"type": "function_call_output", "call_id": "fc_1", "output": "10"}
        # Code run outside a model's call answers nothing, and the state still follows.
        count = len(conversation.messages)
        assert "10" in await tool.run_code(conversation, "a * 10", turn_id="app-check")
        assert len(conversation.messages) == count
        stored = await store.load("formats")
        assert stored is not None and stored.messages == conversation.messages and unanswered(stored) == []
        stored.truncate(len(stored.messages) - 2)  # before the responses call: its result and state go with it
        assert "1" in await tool.run_code(stored, "a")

    in_pool(inline_pool, scenario, conversations=store)


def test_a_cancelled_turn_records_a_result_saying_so_and_the_transcript_stays_valid(inline_pool: Pool) -> None:
    store = MemoryConversationStore()
    started = asyncio.Event()
    code = "import asyncio\nkept = 41\nstarted()\nawait asyncio.sleep(120)\nnever = 1"

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="cancel")
        await store.add_messages(conversation, [call("c1", code)])
        task = asyncio.ensure_future(tool.run_code(conversation, code, turn_id="c1"))
        await asyncio.wait_for(started.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)
        stored = await store.load("cancel")
        assert stored is not None and unanswered(stored) == []
        result = stored.messages[-1]["content"]
        assert "this turn was cancelled" in result and "kept" in result and "never" not in result
        assert stored.checkpoint_id is not None and stored.usage.by_status == {"cancelled": 1}
        stored.truncate(len(stored.messages))  # no unanswered call: truncate accepts the transcript
        assert "41" in await tool.run_code(stored, "kept")

    in_pool(inline_pool, scenario, conversations=store, tools={"started": started.set})


def test_on_host_error_hold_leaves_the_head_and_the_answer_says_so(inline_pool: Pool) -> None:
    def fetch() -> int:
        raise ConnectionError("the CRM is down")

    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="held")
        await code_turn(tool, store, conversation, "c1", "x = 1")
        before = await tool.head("held")
        answer = await code_turn(tool, store, conversation, "c2", "x = 2\ny = fetch()")
        assert "the host function fetch failed" in answer and "this call was not saved" in answer
        after = await tool.head("held")
        assert before is not None and after is not None and after.checkpoint_id == before.checkpoint_id
        assert after.turn("c2") is None and conversation.checkpoint_id == before.checkpoint_id
        assert "1" in await code_turn(tool, store, conversation, "c3", "x")  # the state before the held turn
        # An error the script caught is its own business: the turn is saved as usual.
        await code_turn(tool, store, conversation, "c4", "try:\n    fetch()\nexcept ConnectionError:\n    x = 3")
        assert "3" in await code_turn(tool, store, conversation, "c5", "x")
        stored = await store.load("held")
        assert stored is not None and unanswered(stored) == [] and stored.usage.by_status == {"error": 1, "ok": 4}

    in_pool(inline_pool, scenario, conversations=store, on_host_error="hold", tools={"fetch": fetch})

    async def advance(tool: CodeTool) -> None:
        conversation = Conversation(id="advanced")
        await tool.run_code(conversation, "x = 1")
        await tool.run_code(conversation, "x = 2\ny = fetch()")
        assert "2" in await tool.run_code(conversation, "x")  # the default: the failed turn is saved

    in_pool(inline_pool, advance, tools={"fetch": fetch})


class GatedStore(MemoryConversationStore):
    """Writes wait at a gate (to show where the answer returns), and the first ``fail`` writes fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = 0
        self.writes = 0

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        self.gate.wait(60)
        if self.fail:
            self.fail -= 1
            raise StorageError("the conversation store is briefly down")
        super()._append(conversation_id, expected, record, full=full)
        self.writes += 1


def test_async_durability_answers_before_the_write_and_the_store_waits_for_it(inline_pool: Pool) -> None:
    store = GatedStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="async")
        await store.add_messages(conversation, [call("c1", "x = 1")])
        store.gate.clear()
        await tool.run_code(conversation, "x = 1", turn_id="c1")  # answered while its write waits at the gate
        assert store.writes == 1 and unanswered(conversation) == []
        loading = asyncio.ensure_future(store.load("async"))
        await asyncio.sleep(0)
        store.gate.set()
        stored = await loading  # waited for the tool's write: never the conversation without its result
        assert stored is not None and unanswered(stored) == [] and store.writes == 2
        # A write that fails in the background is stored by the next write of the conversation.
        await store.add_messages(conversation, [call("c2", "x + 1")])
        store.fail = 1
        await tool.run_code(conversation, "x + 1", turn_id="c2")
        await store.settled("async")
        stored = await store.load("async")
        assert stored is not None and unanswered(stored) == ["c2"]
        await store.add_messages(conversation, [{"role": "user", "content": "thanks"}])
        stored = await store.load("async")
        assert stored is not None and unanswered(stored) == [] and stored.messages == conversation.messages

    in_pool(inline_pool, scenario, conversations=store, durability="async")


def test_aclose_stores_what_a_failed_background_write_left(inline_pool: Pool) -> None:
    store = GatedStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="closing")
        await store.add_messages(conversation, [call("c1", "x = 1")])
        store.fail = 1
        await tool.run_code(conversation, "x = 1", turn_id="c1")
        await tool.aclose()  # waits for the write, which failed, and stores the conversation again
        stored = await store.load("closing")
        assert stored is not None and unanswered(stored) == [] and stored.checkpoint_id is not None

    in_pool(inline_pool, scenario, close=False, conversations=store, durability="async")


def test_a_failed_sync_write_raises_and_a_retry_stores_the_turn_without_running_it(inline_pool: Pool) -> None:
    store = GatedStore()
    ran: list[int] = []

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="retry")
        await store.add_messages(conversation, [call("c1", "x = tick()")])
        store.fail = 1
        with pytest.raises(StorageError, match="briefly down"):
            await tool.run_code(conversation, "x = tick()", turn_id="c1")
        stored = await store.load("retry")
        assert stored is not None and unanswered(stored) == ["c1"] and stored.checkpoint_id is None
        await tool.run_code(stored, "x = tick()", turn_id="c1")  # as after a restart: the stored copy
        assert unanswered(stored) == [] and stored.checkpoint_id is not None and ran == [1]
        again = await store.load("retry")
        assert again is not None and again.messages == stored.messages
        with pytest.raises(Conflict):  # the first copy is stale now: its writes are refused
            await tool.run_code(conversation, "x = tick()", turn_id="c1")
        assert ran == [1]
        # The same process retries with its own copy: the turn is in it already, and the retry stores it.
        own = Conversation(id="own")
        await store.add_messages(own, [call("c1", "x = tick()")])
        store.fail = 1
        with pytest.raises(StorageError):
            await tool.run_code(own, "x = tick()", turn_id="c1")
        assert unanswered(own) == []
        await tool.run_code(own, "x = tick()", turn_id="c1")
        stored_own = await store.load("own")
        assert stored_own is not None and stored_own.messages == own.messages and ran == [1, 1]

    in_pool(inline_pool, scenario, conversations=store, tools={"tick": lambda: ran.append(1) or 1})


def test_usage_keeps_per_run_records_unknown_figures_as_none_and_model_tokens(inline_pool: Pool) -> None:
    store = MemoryConversationStore()

    async def scenario(tool: CodeTool) -> None:
        conversation = Conversation(id="usage")
        conversation.usage.add_model(input_tokens=1200, output_tokens=80, cost=0.0042)
        conversation.state["step"] = 1
        await code_turn(tool, store, conversation, "c1", "x = 1")
        usage = conversation.usage
        assert usage.peak_memory_bytes is None  # inline: not measured, not 0
        assert [(r.turn_id, r.status, r.peak_memory_bytes) for r in usage.records] == [("c1", "ok", None)]
        stored = await store.load("usage")
        assert stored is not None and stored.usage == usage and stored.state == {"step": 1}
        assert (stored.usage.model_calls, stored.usage.input_tokens, stored.usage.cost) == (1, 1200, 0.0042)

    in_pool(inline_pool, scenario, conversations=store)


def test_bad_settings_are_config_errors(inline_pool: Pool) -> None:
    class OwnStore:
        async def load(self, session_id: str) -> Conversation | None:
            return None

        async def save(self, session: Conversation) -> None:
            return None

        async def add_messages(self, session: Conversation, messages: Any) -> None:
            return None

        async def delete(self, session_id: str) -> None:
            return None

    with pytest.raises(ConfigError, match="durability"):
        CodeTool(inline_pool.aio, conversations=MemoryConversationStore(), durability="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="conversations="):
        CodeTool(inline_pool.aio, durability="async")
    with pytest.raises(ConfigError, match="use 'sync'"):
        CodeTool(inline_pool.aio, conversations=OwnStore(), durability="async")
    with pytest.raises(ConfigError, match="conversation store"):
        CodeTool(inline_pool.aio, conversations="memory://")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_host_error"):
        CodeTool(inline_pool.aio, on_host_error="ignore")


def test_the_sync_tool_keeps_conversations_too(tmp_path: Path) -> None:
    store = FileConversationStore(tmp_path)
    with Pool("memory://", isolation="inline") as pool:
        tool = SyncCodeTool(pool, heads=MemoryHeads(), conversations=store, durability="async")
        conversation = Conversation(id="sync")
        for call_id, code in (("c1", "x = 20"), ("c2", "x * 2 + 2")):
            store.add_messages_sync(conversation, [call(call_id, code)])
            tool.run_code(conversation, code, turn_id=call_id)
        stored = store.load_sync("sync")  # waits for the background write, which needs no event loop
        assert stored is not None and stored.messages[-1]["content"] == "42" and unanswered(stored) == []
        tool.close()
