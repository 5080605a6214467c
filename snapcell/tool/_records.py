"""What `CodeTool` records in a `Conversation` for a turn: where the turn starts, usage, cancelled-turn notes."""

from __future__ import annotations

import re

from snapcell.conversation import Conversation
from snapcell.heads import Head
from snapcell.interpreter import RunResult

__all__ = ["CANCELLED_LOST_NOTE", "CANCELLED_NOTE", "HELD_NOTE", "cancelled_notes", "conversation_head", "count_run"]

# The note of a turn that was cancelled while its code ran; the next turn's answer repeats it.
CANCELLED_NOTE = "this turn was cancelled while its code ran; its state up to then was saved (variables it had set: "
# The note of a cancelled turn whose script did not stop in time: its worker was killed, nothing was saved.
CANCELLED_LOST_NOTE = (
    "this turn was cancelled while its code ran and the code did not stop in time, so the Python session restarted; "
    "this code's changes are lost and the variables are as they were before it ran"
)
# The note of a turn held for a failed host function (``on_host_error="hold"``).
HELD_NOTE = (
    "this call was not saved because a host function failed: the next call starts from the state before it "
    "(variables this code set are gone)"
)
_CANCELLED = re.compile(r"\[note\] " + re.escape(CANCELLED_NOTE) + r"([^)\n]*)\)")


def conversation_head(conversation: Conversation) -> Head | None:
    """The conversation's own Python state, newest first, in the shape `CodeTool._load` reads."""
    checkpoints = [bytes.fromhex(conversation.checkpoints[i]) for i in sorted(conversation.checkpoints, reverse=True)]
    if not checkpoints:
        return None
    return Head(checkpoint_id=checkpoints[0], history=tuple(checkpoints[1:]))


def cancelled_notes(head: Head | None) -> list[str]:
    """A note when the conversation's previous turn was cancelled, naming the variables it had set."""
    if head is None or not head.turns or head.turns[0].answer is None:
        return []
    match = _CANCELLED.search(head.turns[0].answer)
    if match is None:
        return []
    return [
        f"the previous turn was cancelled while its code ran; its state up to then was kept (variables it had set: "
        f"{match.group(1)})"
    ]


def count_run(
    conversation: Conversation, result: RunResult, *, bytes_stored: int = 0, turn_id: str | None = None
) -> None:
    conversation.usage.add_run(
        turn_id=turn_id,
        status=result.status or "ok",
        wall_time_s=result.duration_s,
        cpu_time_s=result.cpu_time_s,
        peak_memory_bytes=result.peak_memory_bytes,
        host_calls=len(result.external_calls),
        bytes_stored=bytes_stored,
    )
