"""The `CodeTool`'s file operations on a conversation's workspace, each a turn-safe operation on its head."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from snapcell.heads import TurnRecord, validate_conversation_id, validate_turn_id
from snapcell.session import AsyncSession
from snapcell.tool._turn import load_head

if TYPE_CHECKING:
    from snapcell.tool._context import TurnContext

__all__ = ["files_at_head", "put_file"]


async def put_file(
    context: TurnContext, conversation_id: str, path: str, data: bytes, *, turn_id: str | None
) -> bytes | None:
    """Write a file at the head as a turn: lease, load, write, dump, move the head; see `CodeTool.put_file`."""
    validate_conversation_id(conversation_id)
    turn_id = secrets.token_hex(16) if turn_id is None else validate_turn_id(turn_id)
    async with context.leases.hold(conversation_id) as lease:
        head = await context.read_head(conversation_id)
        if head is not None and head.turn(turn_id) is not None:
            return head.checkpoint_id
        async with context.new_session() as session:
            history = await load_head(context, session, head, [])
            await session.write_file(path, data)
            new_id = await session.dump()
        write = context.heads.compare_and_set(
            conversation_id,
            head.version if head is not None else None,
            new_id,
            history=history,
            owner=lease.owner,
            release_lease=True,
            turn=TurnRecord(turn_id, f"put_file {str(path)[:200]} ({len(data):,} bytes)"),
        )
        await context.write_head(f"saving a file into conversation {conversation_id!r}", write)
        lease.released_with_head()
        return new_id


@asynccontextmanager
async def files_at_head(context: TurnContext, conversation_id: str) -> AsyncIterator[AsyncSession]:
    """A session loaded from the conversation's head, under its lease; the head does not move."""
    validate_conversation_id(conversation_id)
    async with context.leases.hold(conversation_id):
        head = await context.read_head(conversation_id)
        async with context.new_session() as session:
            await load_head(context, session, head, [])
            yield session
