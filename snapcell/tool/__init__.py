"""The ready-made agent tool: ``run_code(conversation_id, code)`` with one head per conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.tool._arguments import RunCodeArguments, ToolArguments, ToolBool, ToolText
    from snapcell.tool._tool import (
        CANCELLED_NOTE,
        KEPT_ANSWER_CHARS,
        MIN_ANSWER_CHARS,
        STATE_GONE_NOTE,
        CodeTool,
        SyncCodeTool,
        TurnAnswer,
        cut_answer,
        render_answer,
        tool_call_arguments,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.tool._arguments": ("RunCodeArguments", "ToolArguments", "ToolBool", "ToolText"),
    "snapcell.tool._tool": (
        "CANCELLED_NOTE",
        "KEPT_ANSWER_CHARS",
        "MIN_ANSWER_CHARS",
        "STATE_GONE_NOTE",
        "CodeTool",
        "SyncCodeTool",
        "TurnAnswer",
        "cut_answer",
        "render_answer",
        "tool_call_arguments",
    ),
}

__all__ = [
    "CANCELLED_NOTE",
    "KEPT_ANSWER_CHARS",
    "MIN_ANSWER_CHARS",
    "STATE_GONE_NOTE",
    "CodeTool",
    "RunCodeArguments",
    "SyncCodeTool",
    "ToolArguments",
    "ToolBool",
    "ToolText",
    "TurnAnswer",
    "cut_answer",
    "render_answer",
    "tool_call_arguments",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
