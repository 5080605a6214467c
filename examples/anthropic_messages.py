"""The Anthropic SDK (async client) with snapcell's run_code tool: the whole tool-use loop.

Run it offline (a fake HTTP transport plays the model):  python examples/anthropic_messages.py
Against the API (ANTHROPIC_API_KEY set):                 python examples/anthropic_messages.py --live

Needs: pip install 'snapcell[examples]'
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import anthropic
import httpx2  # the HTTP client the Anthropic SDK is built on

import snapcell

CUSTOMERS = [
    {"id": "c-1", "name": "Acme", "churned_at": "2026-08-14"},
    {"id": "c-2", "name": "Globex", "churned_at": None},
    {"id": "c-3", "name": "Initech", "churned_at": "2026-09-02"},
]


def list_customers() -> list[dict[str, str | None]]:
    """Every customer with id, name, churned_at."""
    return [dict(c) for c in CUSTOMERS]  # your application's code: a database query, an API call


async def answer(
    client: anthropic.AsyncAnthropic, tool: snapcell.CodeTool, conversation_id: str, messages: list[dict[str, Any]]
) -> str:
    """Call the model until it stops asking for the tool; return its text."""
    spec: Any = {"name": tool.name, "description": tool.description, "input_schema": tool.json_schema}
    while True:
        reply = await client.messages.create(model="claude-sonnet-5", max_tokens=2000, tools=[spec], messages=messages)
        messages.append({"role": "assistant", "content": reply.content})
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            return "".join(block.text for block in reply.content if block.type == "text")
        results = []
        for call in calls:
            code, setup = snapcell.tool.tool_call_arguments(call.input)  # checks what the model sent
            text = await tool.run_code(conversation_id, code, setup)
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": text})
        messages.append({"role": "user", "content": results})


def fake_client() -> anthropic.AsyncAnthropic:
    """An AsyncAnthropic whose HTTP transport plays the model: a script per question, then the tool's answer."""
    scripts = iter(
        [
            'churned = [c for c in list_customers() if c["churned_at"] and c["churned_at"] >= "2026-07-01"]\n'
            '[c["name"] for c in churned]',
            "len(churned)",  # the second question's script uses the first one's variable
        ]
    )

    def model(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and last and last[-1].get("type") == "tool_result":
            content: list[dict[str, Any]] = [{"type": "text", "text": f"The tool says: {last[-1]['content']}"}]
            stop = "end_turn"
        else:
            content = [{"type": "tool_use", "id": "toolu_1", "name": "run_code", "input": {"code": next(scripts)}}]
            stop = "tool_use"
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        return httpx2.Response(200, json=message)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(model))
    return anthropic.AsyncAnthropic(api_key="offline", http_client=http, max_retries=0)


async def main(client: anthropic.AsyncAnthropic) -> list[str]:
    """Two questions in one conversation; returns the model's two answers."""
    async with snapcell.AsyncPool("memory://") as pool:  # "file://.snapcell" or "s3://bucket/prefix" to keep it
        tool = snapcell.CodeTool(pool, tools={"list_customers": list_customers})
        answers = []
        messages: list[dict[str, Any]] = []
        for question in ("Which customers churned since July?", "How many is that?"):
            messages.append({"role": "user", "content": question})
            text = await answer(client, tool, "user-42:chat-7", messages)
            answers.append(text)
            print(f"> {question}\n{text}")
        await tool.aclose()
        return answers


if __name__ == "__main__":
    asyncio.run(main(anthropic.AsyncAnthropic() if "--live" in sys.argv else fake_client()))
