"""The `CodeTool`'s file operations on a conversation's workspace, each a turn-safe operation on its head."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from snapcell.heads import TurnRecord, validate_conversation_id, validate_turn_id
from snapcell.session import AsyncSession
from snapcell.tool._context import HeadMove
from snapcell.tool._turn import load_head, shows_write

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
        done = head.turn(turn_id) if head is not None else None
        if head is not None and done is not None:
            return done.checkpoint_id if done.states_known else head.checkpoint_id
        async with context.new_session() as session:
            history = await load_head(context, session, head, [])
            await session.write_file(path, data)
            new_id = await session.dump()
        record = TurnRecord(
            turn_id,
            f"put_file {str(path)[:200]} ({len(data):,} bytes)",
            checkpoint_id=new_id,
            started_from=head.checkpoint_id if head is not None else None,
        )
        write = context.heads.compare_and_set(
            conversation_id,
            head.version if head is not None else None,
            new_id,
            history=history,
            owner=lease.owner,
            release_lease=True,
            turn=record,
        )
        current = await context.move_head(
            HeadMove(
                conversation_id=conversation_id,
                write=write,
                turn_id=turn_id,
                landed=lambda moved: shows_write(moved, turn_id, new_id) or moved.checkpoint_id == new_id,
                what=f"saving a file into conversation {conversation_id!r}",
                again=f"call put_file again with turn_id={turn_id!r}: if it landed, the file is not written again",
            )
        )
        lease.released_with_head(current)
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
