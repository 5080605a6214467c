"""How `CodeTool` keeps the conversations it is given in their store: `ConversationKeeper`.

A turn records its tool-call result, its checkpoint and its usage in the `Conversation` in memory; the keeper then
stores them in one write, when the durability mode says: ``"sync"`` before the turn's answer returns, ``"async"`` in
a thread of the store while the application's next step runs (the store's own methods on that conversation wait
for it, and `aclose` does), ``"exit"`` once, when the tool closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Literal

from snapcell.conversation import Conversation, ConversationStore, LogConversationStore
from snapcell.errors import ConfigError, Conflict, StorageError

__all__ = ["DURABILITY_MODES", "ConversationKeeper", "Durability"]

log = logging.getLogger("snapcell")

Durability = Literal["sync", "async", "exit"]
DURABILITY_MODES: tuple[str, ...] = ("sync", "async", "exit")


class ConversationKeeper:
    """Stores the conversations a tool's turns changed, in the durability mode's time.

    Args:
        store: The conversation store.
        durability: ``"sync"``, ``"async"`` or ``"exit"`` (see the module docstring).

    Raises:
        ConfigError: The store is not a `ConversationStore`, the mode is unknown, or ``"async"`` is asked of a
            store that cannot order its writes behind the application's (one not built on `LogConversationStore`).
    """

    def __init__(self, store: ConversationStore, durability: str) -> None:
        if not isinstance(store, ConversationStore):
            raise ConfigError(
                "conversations must be a conversation store (MemoryConversationStore, FileConversationStore, "
                f"S3ConversationStore, PostgresConversationStore), not {store!r}"
            )
        if durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be 'sync', 'async' or 'exit', not {durability!r}")
        if durability == "async" and not isinstance(store, LogConversationStore):
            raise ConfigError(
                "durability='async' needs one of snapcell's conversation stores (their methods wait for the "
                f"writes queued before them); use 'sync' with {type(store).__name__}"
            )
        self.store = store
        self.durability = durability
        # Conversations whose turns are not stored yet: kept for "exit", and those whose write failed.
        self._unsaved: dict[int, Conversation] = {}
        self._writes: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()  # a background write ends in the store's thread

    def check_id_turn(self) -> None:
        """Check that a turn may be given a conversation ID rather than a `Conversation`.

        Raises:
            ConfigError: ``durability="exit"``: a conversation known only by its ID would be loaded again by each
                turn, without the turns kept in memory.
        """
        if self.durability == "exit":
            raise ConfigError(
                "durability='exit' keeps a conversation's turns in memory until the tool closes: pass the "
                "Conversation to run_code, not its ID"
            )

    async def load(self, conversation_id: str) -> Conversation:
        """The stored conversation, or a new one under that ID (a turn given an ID rather than a `Conversation`)."""
        return await self.store.load(conversation_id) or Conversation(id=conversation_id)

    async def before_turn(self, conversation: Conversation) -> None:
        """Wait for the write of the conversation's previous turn, if it is still running: a turn changes the
        conversation in memory, and that write must see it whole."""
        if isinstance(self.store, LogConversationStore):
            await self.store.settled(conversation.id)

    async def keep(self, conversation: Conversation) -> None:
        """Store what the turn recorded in ``conversation``, as the durability mode says.

        Raises:
            Conflict: ``"sync"``: another writer changed the stored conversation; this turn's head move stands,
                and the turn is in the conversation in memory (load the stored one and answer the call again with
                the same turn ID: its answer and checkpoint are recorded, it does not run again).
            StorageError: ``"sync"``: the store failed; the same holds.
        """
        if self.durability == "exit":
            with self._lock:
                self._unsaved[id(conversation)] = conversation
            return
        if self.durability == "sync":
            await self._write(conversation)
            with self._lock:
                self._unsaved.pop(id(conversation), None)
            return
        store = self.store
        if not isinstance(store, LogConversationStore):  # checked when made; this tells the type checker
            raise ConfigError("durability='async' needs one of snapcell's conversation stores")
        future = store.flush_later(conversation)
        with self._lock:
            self._writes.add(future)
        future.add_done_callback(lambda done: self._written(conversation, done))

    async def _write(self, conversation: Conversation) -> None:
        if isinstance(self.store, LogConversationStore):
            await self.store.flush(conversation)
        else:
            await self.store.save(conversation)

    def _written(self, conversation: Conversation, done: concurrent.futures.Future[None]) -> None:
        """A background write ended (in the store's thread): remember a conversation whose write failed."""
        error = done.exception() if not done.cancelled() else None
        with self._lock:
            self._writes.discard(done)
            if error is None:
                self._unsaved.pop(id(conversation), None)
                return
            self._unsaved[id(conversation)] = conversation
        # The conversation in memory still holds the turn: the next write of it (the application's, the next
        # turn's, or aclose's) stores it.
        log.warning("snapcell: storing conversation %r in the background failed: %s", conversation.id, error)

    async def aclose(self) -> None:
        """Wait for the background writes, then store every conversation whose turns are not stored yet.

        Raises:
            StorageError: A conversation could not be stored (the first error; the others are logged).
            Conflict: Another writer changed a stored conversation.
        """
        with self._lock:
            writes = list(self._writes)
        if writes:
            await asyncio.wait([asyncio.wrap_future(f) for f in writes])
        with self._lock:
            unsaved = list(self._unsaved.items())
        first: BaseException | None = None
        for key, conversation in unsaved:
            try:
                await self._write(conversation)
            except (StorageError, Conflict, ConfigError) as exc:
                log.warning("snapcell: storing conversation %r failed: %s", conversation.id, exc)
                first = first or exc
            else:
                with self._lock:
                    self._unsaved.pop(key, None)
        if first is not None:
            raise first
