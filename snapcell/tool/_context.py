"""What a turn and a workspace operation use of the tool that runs them: `TurnContext`.

`CodeTool` builds one when it is made and hands it to each `Turn` and file operation (`_turn`, `_files`): they read
the tool's settings and services from it, so they never import the tool, and the tool imports them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from snapcell.errors import StorageUnavailable

if TYPE_CHECKING:
    from snapcell.heads import AsyncHeads, Head
    from snapcell.pool import AsyncPool
    from snapcell.session import AsyncSession
    from snapcell.tool._lease import TurnLeases
    from snapcell.tool._warm import WarmSessions

__all__ = ["TurnContext"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """The tool's settings and services a turn uses.

    Attributes:
        pool: The pool that runs the sessions (its keyring reads a checkpoint ID's time).
        tools: Host functions by name; the tool's own mapping, looked up at each run.
        max_answer_chars: Longest answer.
        heads: The head store, async.
        leases: Takes and gives back the conversations' leases; bounds head-store calls by the deadline.
        warm: The sessions kept warm after their turns.
        new_session: Checks out a new session with the tool's settings (limits, mounts, type checking).
    """

    pool: AsyncPool
    tools: Mapping[str, Callable[..., Any]]
    max_answer_chars: int
    heads: AsyncHeads
    leases: TurnLeases
    warm: WarmSessions
    new_session: Callable[[], AbstractAsyncContextManager[AsyncSession]]

    @property
    def storage_timeout_s(self) -> float | None:
        """Deadline of every head-store call of a turn, or None (the leases' own)."""
        return self.leases.storage_timeout_s

    def pool_full(self) -> bool:
        """Whether every worker slot of the pool is checked out (warm sessions give theirs up then).

        Sessions already being checked in do not count: their slots come free without evicting a warm session.
        """
        taken = len(self.pool._sessions) - self.warm.leaving
        return self.pool.isolation == "process" and taken >= self.pool.max_workers

    async def bounded(self, call: Awaitable[_T], timeout_s: float | None = None) -> _T:
        """Await a head-store call for at most ``timeout_s`` (default ``storage_timeout_s``); TimeoutError after."""
        return await self.leases.bounded(call, timeout_s)

    async def read_head(self, conversation_id: str) -> Head | None:
        """Read the conversation's head under the storage deadline.

        Raises:
            StorageUnavailable: No answer within ``storage_timeout_s``.
        """
        try:
            return await self.bounded(self.heads.get(conversation_id))
        except TimeoutError as exc:
            raise self.leases.timed_out(f"reading the head of conversation {conversation_id!r}") from exc

    async def write_head(self, what: str, call: Awaitable[str]) -> str:
        """Await a head write under the storage deadline; ``what`` names it.

        Raises:
            StorageUnavailable: No answer within ``storage_timeout_s``; the write may still land.
        """
        try:
            return await self.bounded(call)
        except TimeoutError as exc:
            raise StorageUnavailable(
                f"{what} timed out after {self.storage_timeout_s:g} s (storage_timeout_s): the head store did not "
                "answer and the write may still land; read the head to see"
            ) from exc
