"""A writer whose tool keeps the conversation, SIGKILLed at each point of a turn's save: the stored conversation
never holds a result without its state (or the reverse), and answering its open call again lands the turn once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from snapcell import AsyncPool, CodeTool, Conversation
from snapcell.conversation import FileConversationStore, tool_call_ids, tool_result_ids

from .keep_writer import CODE_1, CODE_2  # type: ignore[import-not-found]

WRITER = Path(__file__).with_name("keep_writer.py")
CODES = {"c1": CODE_1, "c2": CODE_2}


def unanswered(conversation: Conversation) -> list[str]:
    answered = {i for m in conversation.messages for i in tool_result_ids(m)}
    return [i for m in conversation.messages for i in tool_call_ids(m) if i not in answered]


async def value_of_n(pool: AsyncPool, checkpoint_id: bytes | None) -> object:
    async with pool.checkout() as session:
        if checkpoint_id is not None:
            await session.load_session(checkpoint_id)
        return await session.feed_run("n")


@pytest.mark.parametrize(
    ("durability", "hook"),
    [
        ("sync", "in_run"),
        ("sync", "before_write"),
        ("sync", "after_write"),
        ("async", "answered"),
        ("async", "after_write"),
        ("exit", "answered"),
    ],
)
def test_sigkill_at_each_point_of_the_save_leaves_the_conversation_whole(
    tmp_path: Path, durability: str, hook: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(WRITER), str(tmp_path), durability, hook], timeout=120, capture_output=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    ticks: list[int] = []

    async def recover() -> None:
        store = FileConversationStore(tmp_path / "conversations")
        async with AsyncPool(f"file://{tmp_path}/store", isolation="inline") as pool:
            tool = CodeTool(pool, tools={"tick": lambda: ticks.append(1)}, holder_id="writer", conversations=store)
            conversation = await store.load("crash")
            assert conversation is not None
            open_calls = unanswered(conversation)
            # Whole: a result is stored with the state it made, or neither is.
            stored_n = await value_of_n(pool, conversation.checkpoint_id)
            # ("exit": the application's own write of c2's call stored c1's result and state with it.)
            if hook == "after_write":
                assert open_calls == [] and stored_n == 2 and conversation.last_turn_id == "c2"
            else:
                assert open_calls == ["c2"] and stored_n == 1 and conversation.last_turn_id == "c1"
            head = await tool.head("crash")
            assert head is not None and (head.turn("c2") is not None) == (hook != "in_run")  # the window was real
            # The restarted application answers the open calls again with their IDs; nothing else.
            for call_id in open_calls:
                await tool.run_code(conversation, CODES[call_id], turn_id=call_id)
            assert len(ticks) == (1 if hook == "in_run" else 0)  # a committed turn does not run again
            stored = await store.load("crash")
            assert stored is not None and unanswered(stored) == [] and stored.last_turn_id == "c2"
            assert [m["tool_call_id"] for m in stored.messages if m.get("role") == "tool"] == ["c1", "c2"]
            assert await value_of_n(pool, stored.checkpoint_id) == 2
            await tool.aclose()

    asyncio.run(recover())
