"""An agent loop that keeps the transcript and the Python state in one `FileConversationStore`, which the tool writes.

The "model" here is scripted (no API key needed): it answers each user message with one `run_code` call and then
a text reply, in the OpenAI chat format. Replace `ScriptedModel.reply` with your model API; the loop stays the same.

Run it twice: ``python examples/conversation_loop.py DIR``. The second run loads the conversation, and its code sees
the variables of the first; then it truncates the last exchange, and the Python state goes back with it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import snapcell

USER_TURNS = [
    ("Load the numbers.", "numbers = [3, 1, 4, 1, 5, 9, 2, 6]\nlen(numbers)"),
    ("What is their sum?", "total = sum(numbers)\ntotal"),
    ("And their mean?", "total / len(numbers)"),
]


class ScriptedModel:
    """Stands in for a model API: a tool call for each user message, then a text reply to the tool's result."""

    def __init__(self) -> None:
        self.calls = 0

    def reply(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1]
        if last["role"] == "tool":
            return {"role": "assistant", "content": f"The answer is {last['content'].splitlines()[-1]}."}
        code = next(code for question, code in USER_TURNS if question == last["content"])
        self.calls += 1
        call_id = f"call_{uuid.uuid4().hex[:12]}"  # unique, as a model's are: a turn ID names one turn
        arguments = json.dumps({"code": code})
        return {
            "role": "assistant",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "run_code", "arguments": arguments}}
            ],
        }


async def answer(
    tool: snapcell.CodeTool,
    store: snapcell.conversation.ConversationStore,
    conversation: snapcell.Conversation,
    question: str,
) -> str:
    """Run one user message to the model's final text; the tool stores each call's result with its state."""
    model = ScriptedModel()
    await store.add_messages(conversation, [{"role": "user", "content": question}])
    while True:
        reply = model.reply(conversation.messages)
        await store.add_messages(conversation, [reply])
        calls = reply.get("tool_calls") or []
        if not calls:
            return str(reply["content"])
        for call in calls:
            code, setup = snapcell.tool.tool_call_arguments(call["function"]["arguments"])
            # The tool stores the call's result, its checkpoint and its usage in one write. turn_id: a retry after
            # a crash never runs the code twice.
            await tool.run_code(conversation, code, setup, turn_id=call["id"])


async def main(directory: str) -> None:
    store = snapcell.conversation.FileConversationStore(f"{directory}/conversations")
    # The default isolation: the model's code runs in sandboxed worker processes, as it should in an application.
    async with snapcell.AsyncPool(f"file://{directory}/checkpoints", create_store=True) as pool:
        tool = snapcell.CodeTool(pool, conversations=store)
        conversation = await store.load("demo") or snapcell.Conversation(id="demo")
        done = sum(1 for m in conversation.messages if m["role"] == "user")
        if done >= len(USER_TURNS):
            # Take the last question back: its messages and the state its code made go together.
            last_user = max(i for i, m in enumerate(conversation.messages) if m["role"] == "user")
            conversation.truncate(last_user)
            await store.save(conversation)
            done -= 1
            print("truncated the last exchange")
        for question, _ in USER_TURNS[done : done + 2]:
            print(question, "->", await answer(tool, store, conversation, question))
        print(f"{len(conversation.messages)} messages, {conversation.usage.runs} runs")
        await tool.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else ".snapcell-example"))
