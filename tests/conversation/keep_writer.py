"""A writer whose tool keeps the conversation, SIGKILLed at one point of a turn's save, for test_keep_crash.py.

``python keep_writer.py ROOT DURABILITY HOOK`` runs turn ``c1`` fully, stores the model's call ``c2``, runs it, and
dies: ``in_run`` while ``c2``'s code runs (before the head moves); ``before_write`` in the store's write of ``c2``'s
result (the head moved, nothing stored); ``after_write`` once that write is on disk (before the answer returns, or
in the background with ``async``); ``answered`` once ``run_code`` returned (with ``async``, its write held back).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

from snapcell import AsyncPool, CodeTool, Conversation
from snapcell.conversation import FileConversationStore

CODE_1 = "n = 1"
CODE_2 = "n = n + 1\ntick()"


def call(call_id: str, code: str) -> dict[str, object]:
    return {"role": "assistant", "tool_calls": [{"id": call_id, "function": {"name": "run_code", "arguments": code}}]}


class HookedStore(FileConversationStore):
    def __init__(self, directory: str, hook: str) -> None:
        super().__init__(directory)
        self.hook = hook
        self.hold = threading.Event()  # set: the write of c2's result waits for ever (killed meanwhile)

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        result_of_c2 = b'"tool_call_id":"c2"' in record
        if result_of_c2 and self.hook == "before_write":
            os.kill(os.getpid(), signal.SIGKILL)
        if result_of_c2 and self.hold.is_set():
            threading.Event().wait()
        super()._append(conversation_id, expected, record, full=full)
        if result_of_c2 and self.hook == "after_write":
            os.kill(os.getpid(), signal.SIGKILL)


async def main(root: str, durability: str, hook: str) -> None:
    def tick() -> None:
        if hook == "in_run":
            os.kill(os.getpid(), signal.SIGKILL)

    store = HookedStore(os.path.join(root, "conversations"), hook)
    async with AsyncPool(f"file://{root}/store", isolation="inline", create_store=True) as pool:
        tool = CodeTool(pool, tools={"tick": tick}, holder_id="writer", conversations=store, durability=durability)
        conversation = Conversation(id="crash")
        await store.add_messages(conversation, [{"role": "user", "content": "count"}, call("c1", CODE_1)])
        await tool.run_code(conversation, CODE_1, turn_id="c1")
        await store.add_messages(conversation, [call("c2", CODE_2)])
        if hook == "answered":
            store.hold.set()
        await tool.run_code(conversation, CODE_2, turn_id="c2")
        if hook == "after_write":
            threading.Event().wait()  # the background write kills the process
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
