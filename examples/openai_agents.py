"""The OpenAI Agents SDK with snapcell's run_code as a function tool.

Run it offline (a scripted stand-in model, no API key):  python examples/openai_agents.py
With OpenAI (OPENAI_API_KEY set), pass a model name:      python examples/openai_agents.py gpt-5

Needs: pip install 'snapcell[examples]'
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, FunctionTool, Model, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import snapcell

ORDERS = {"A-1": 120.0, "A-2": 75.5, "A-3": 310.25}


async def order_total(order_id: str) -> float:
    """The total of an order in euros."""
    await asyncio.sleep(0)  # stands in for a network call
    return ORDERS[order_id]


def make_run_code(tool: snapcell.CodeTool) -> FunctionTool:
    """run_code as a function tool; the conversation ID comes from the run's context.

    The tool's schema is snapcell's (the SDK makes it strict), and so is the check of what the model sends: a call
    that does not fit is answered in plain words, for the model to fix.
    """

    async def run_code(ctx: ToolContext[str], arguments: str) -> str:
        try:
            code, setup = snapcell.tool.tool_call_arguments(arguments)
        except snapcell.errors.ConfigError as exc:
            return str(exc)
        return await tool.run_code(ctx.context, code, setup)

    return FunctionTool(
        name=tool.name, description=tool.description, params_json_schema=tool.json_schema, on_invoke_tool=run_code
    )


class ScriptedModel(Model):
    """A stand-in for an LLM: one script per turn as a tool call, then the tool's answer as text."""

    def __init__(self, scripts: list[str]) -> None:
        self._scripts = iter(scripts)
        self._calls = 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        self._calls += 1
        last = input[-1] if isinstance(input, list) and input else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            text = ResponseOutputText(type="output_text", text=f"The tool says: {last['output']}", annotations=[])
            item: Any = ResponseOutputMessage(
                id=f"msg-{self._calls}", type="message", role="assistant", status="completed", content=[text]
            )
        else:
            item = ResponseFunctionToolCall(
                type="function_call",
                name="run_code",
                call_id=f"call-{self._calls}",
                arguments=json.dumps({"code": next(self._scripts), "setup": False}),
            )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this stand-in model does not stream")


async def main(model: Model | str | None = None) -> list[str]:
    """Two questions in one conversation; returns the agent's two answers."""
    if model is None:
        set_tracing_disabled(True)  # offline: nowhere to send traces
    async with snapcell.AsyncPool("memory://") as pool:  # "file://.snapcell" or "s3://bucket/prefix" to keep it
        tool = snapcell.CodeTool(pool, tools={"order_total": order_total})
        stand_in = ScriptedModel(
            [
                "import asyncio\n"
                "totals = dict(zip(['A-1', 'A-2', 'A-3'], await asyncio.gather(*[order_total(o) for o in "
                "['A-1', 'A-2', 'A-3']])))\nsum(totals.values())",
                "max(totals, key=totals.get)",  # uses the variable the first turn left behind
            ]
        )
        agent = Agent[str](name="analyst", tools=[make_run_code(tool)], model=model or stand_in)
        answers = []
        for question in ("What do orders A-1 to A-3 add up to?", "Which is the largest?"):
            result = await Runner.run(agent, question, context="user-42:chat-9")
            answers.append(str(result.final_output))
            print(f"> {question}\n{result.final_output}")
        await tool.aclose()
        return answers


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
