"""A pydantic-ai agent with snapcell's run_code tool.

Run it offline (a scripted stand-in model, no API key):  python examples/pydantic_ai_agent.py
With a real model, pass its name:  python examples/pydantic_ai_agent.py anthropic:claude-sonnet-5

Needs: pip install 'snapcell[examples]'
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

import snapcell

CUSTOMERS = [
    {"id": "c-1", "name": "Acme", "churned_at": "2026-08-14"},
    {"id": "c-2", "name": "Globex", "churned_at": None},
    {"id": "c-3", "name": "Initech", "churned_at": "2026-09-02"},
]


def list_customers() -> list[dict[str, str | None]]:
    """Every customer with id, name and churned_at (ISO date or None)."""
    return [dict(c) for c in CUSTOMERS]  # your application's code: a database query, an API call


def build_agent(tool: snapcell.CodeTool, model: Model | str) -> Agent[str, str]:
    """An agent whose one tool is run_code; the conversation ID travels as the run's dependency.

    The tool's schema is snapcell's (`RunCodeArguments`), and so is the check of what the model sends: a call that
    does not fit goes back to the model in plain words, for it to retry.
    """

    async def run_code(ctx: RunContext[str], **arguments: Any) -> str:
        try:
            call = snapcell.tool.RunCodeArguments.from_call(arguments)
        except snapcell.errors.ConfigError as exc:
            raise ModelRetry(str(exc)) from exc
        return await tool.run_code(ctx.deps, call.code, call.setup)

    return Agent(
        model,
        deps_type=str,
        output_type=str,
        tools=[Tool.from_schema(run_code, tool.name, tool.description, tool.json_schema, takes_ctx=True)],
    )


def scripted_model() -> FunctionModel:
    """A stand-in for an LLM: it writes one script per turn, then repeats the tool's answer."""
    scripts = iter(
        [
            'churned = [c for c in list_customers() if c["churned_at"] and c["churned_at"] >= "2026-07-01"]\n'
            "len(churned)",
            '[c["name"] for c in churned]',  # the next turn uses the variable the first one left behind
        ]
    )

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"The tool says: {last.content}")])
        return ModelResponse(parts=[ToolCallPart("run_code", {"code": next(scripts)})])

    return FunctionModel(respond)


async def main(model: Model | str | None = None) -> list[str]:
    """Two questions in one conversation; returns the agent's two answers."""
    async with snapcell.AsyncPool("memory://") as pool:  # "file://.snapcell" or "s3://bucket/prefix" to keep it
        tool = snapcell.CodeTool(pool, tools={"list_customers": list_customers})
        agent = build_agent(tool, model or scripted_model())
        answers = []
        for question in ("How many customers churned since July?", "Which ones?"):
            result = await agent.run(question, deps="user-42:chat-7")
            answers.append(result.output)
            print(f"> {question}\n{result.output}")
        await tool.aclose()
        return answers


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
