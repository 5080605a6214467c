"""A writer SIGKILLed between the head's move and the message save: messages and state stay consistent."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from snapcell import AsyncPool, CodeTool
from snapcell.conversation import FileConversationStore, tool_call_ids, tool_result_ids

from .crash_writer import CODE_2, result  # type: ignore[import-not-found]

WRITER = Path(__file__).with_name("crash_writer.py")


async def state_of(tool: CodeTool, conversation_checkpoint: bytes | None, pool: AsyncPool) -> object:
    async with pool.checkout() as session:
        if conversation_checkpoint is not None:
            await session.load_session(conversation_checkpoint)
        return await session.feed_run("n")


@pytest.mark.parametrize("hook", ["in_run", "after_commit"])
def test_sigkill_between_message_save_and_head_move_leaves_both_consistent(tmp_path: Path, hook: str) -> None:
    done = subprocess.run([sys.executable, str(WRITER), str(tmp_path), hook], timeout=120, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    ticks: list[int] = []

    async def recover() -> None:
        store = FileConversationStore(tmp_path / "conversations")
        async with AsyncPool(f"file://{tmp_path}/store", create_store=True, isolation="inline") as pool:
            tool = CodeTool(pool, tools={"tick": lambda: ticks.append(1)}, holder_id="writer")
            conversation = await store.load("crash")
            assert conversation is not None
            # The stored conversation shows neither half of turn c2: its call is there, its result and state not.
            assert tool_call_ids(conversation.messages[-1]) == ["c2"]
            assert not any("c2" in tool_result_ids(m) for m in conversation.messages)
            assert conversation.last_turn_id == "c1"
            assert await state_of(tool, conversation.checkpoint_id, pool) == 1
            head = await tool.head("crash")
            assert head is not None
            assert (head.turn("c2") is not None) == (hook == "after_commit")  # the crash window was real
            # The restarted writer answers the dangling call with the same turn ID: the turn lands exactly once.
            answer = await tool.run_code(conversation, CODE_2, turn_id="c2")
            await store.add_messages(conversation, [result("c2", answer)])
            assert len(ticks) == (1 if hook == "in_run" else 0)  # committed before the crash: not run again
            stored = await store.load("crash")
            assert stored is not None and stored.last_turn_id == "c2"
            assert await state_of(tool, stored.checkpoint_id, pool) == 2
            assert "2" in await tool.run_code(stored, "n")
            await tool.aclose()

    asyncio.run(recover())
