"""A conversation writer that is SIGKILLed at a hook point, for test_crash.py.

``python crash_writer.py ROOT HOOK`` runs turn ``c1`` fully, saves the model's call ``c2``, then dies:
``HOOK=in_run`` while ``c2``'s code runs (before the head moves), ``HOOK=after_commit`` after the head moved and
before the result message is saved.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from snapcell import AsyncPool, CodeTool, Conversation
from snapcell.conversation import FileConversationStore

CODE_2 = "n = n + 1\ntick()"


def call(call_id: str, code: str) -> dict[str, object]:
    return {"role": "assistant", "tool_calls": [{"id": call_id, "function": {"name": "run_code", "arguments": code}}]}


def result(call_id: str, answer: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": answer}


async def main(root: str, hook: str) -> None:
    def tick() -> None:
        if hook == "in_run":
            os.kill(os.getpid(), signal.SIGKILL)

    store = FileConversationStore(os.path.join(root, "conversations"))
    async with AsyncPool(f"file://{root}/store", create_store=True, isolation="inline") as pool:
        tool = CodeTool(pool, tools={"tick": tick}, holder_id="writer")
        conversation = Conversation(id="crash")
        await store.add_messages(conversation, [{"role": "user", "content": "count"}, call("c1", "n = 1")])
        answer = await tool.run_code(conversation, "n = 1", turn_id="c1")
        await store.add_messages(conversation, [result("c1", answer)])
        await store.add_messages(conversation, [call("c2", CODE_2)])
        await tool.run_code(conversation, CODE_2, turn_id="c2")
        # The hook point: the head has moved, the result message is not saved yet.
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
