"""What a turn and a workspace operation need of the tool that runs them: `TurnContext`.

`CodeTool` is one. The turn's steps (`_turn`) and the file operations (`_files`) are written against this protocol
rather than against `CodeTool`, so the tool imports them and they never import the tool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from snapcell.heads import AsyncHeads, Head
    from snapcell.pool import AsyncPool
    from snapcell.session import AsyncSession
    from snapcell.tool._lease import TurnLeases
    from snapcell.tool._warm import WarmSessions

__all__ = ["TurnContext"]

_T = TypeVar("_T")


class TurnContext(Protocol):
    """The tool's settings and services a turn uses: its pool, host functions, heads, leases and warm sessions."""

    @property
    def pool(self) -> AsyncPool: ...

    @property
    def tools(self) -> Mapping[str, Callable[..., Any]]: ...

    @property
    def max_answer_chars(self) -> int: ...

    @property
    def storage_timeout_s(self) -> float | None: ...

    @property
    def _aheads(self) -> AsyncHeads: ...

    @property
    def _leases(self) -> TurnLeases: ...

    @property
    def _warm(self) -> WarmSessions: ...

    @property
    def _checkout(self) -> dict[str, Any]: ...

    def _new_session(self) -> AbstractAsyncContextManager[AsyncSession]: ...

    def _pool_full(self) -> bool: ...

    async def _storage(self, what: str, conversation_id: str) -> Head | None: ...

    async def _bounded(self, call: Awaitable[_T], timeout_s: float | None = None) -> _T: ...

    async def _load(self, session: AsyncSession, head: Head | None, notes: list[str]) -> tuple[bytes, ...]: ...

    async def _write(self, what: str, call: Awaitable[str]) -> str: ...
