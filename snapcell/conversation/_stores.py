"""Where conversations live: the `ConversationStore` protocol, and the memory and file stores.

Every store keeps a conversation as a log of records: a *full* record (the whole conversation, written by `save`)
followed by *add* records (the messages of one write, with the conversation's turn state: its checkpoints, usage,
last turn ID and application ``state``). Each write names the revision it expects to follow; a write that does not
follow the store's latest revision is refused with `Conflict`, so two writers never interleave a transcript.

Records are written whole or not at all: the file store appends one line with one ``write`` and ignores a torn
last line; the object store (S3) writes one create-only object per record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic_core import PydanticSerializationError

from snapcell._support import fsync_dir, make_dirs
from snapcell.conversation._model import Conversation, storage_name, validate_conversation_key
from snapcell.errors import ConfigError, Conflict, ConversationFormatError, StorageError, map_exceptions

__all__ = [
    "ConversationStore",
    "FileConversationStore",
    "LogConversationStore",
    "MemoryConversationStore",
]

# A stored record (one line, one object) is at most this large; a conversation's log at most this many records.
MAX_RECORD_BYTES = 64 * 1024 * 1024


@runtime_checkable
class ConversationStore(Protocol):
    """Keeps conversations: four async methods, the same for every backend.

    Only one writer per conversation: each write names the revision of the conversation it was loaded from or last
    written as, and a write by a stale copy is refused with `Conflict`.
    """

    async def load(self, session_id: str) -> Conversation | None:
        """Return the stored conversation, or None when there is none.

        Raises:
            InvalidKey: The ID is malformed.
            ConversationFormatError: The stored data is malformed or from an unknown version.
            StorageError: The store failed; the call may be retried.
        """
        ...

    async def save(self, session: Conversation) -> None:
        """Store the whole conversation (after a `Conversation.truncate`, say, or the first time).

        Raises:
            Conflict: The stored conversation changed since ``session`` was loaded or last written (another
                writer), or a new conversation's ID is taken; nothing was written: load it again.
            StorageError: The store failed; nothing was written, the call may be retried.
        """
        ...

    async def add_messages(self, session: Conversation, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append messages to the conversation, in memory and in the store, with its code turns' state.

        Raises:
            ConfigError: A message is not plain JSON data; nothing changed.
            Conflict: As for `save`; nothing changed, in memory or in the store.
            StorageError: The store failed; nothing changed, the call may be retried.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the conversation; an absent one is not an error (its checkpoints expire on their own).

        Raises:
            InvalidKey: The ID is malformed.
            StorageError: The store failed; the call may be retried.
        """
        ...


def _dump(conversation: Conversation, include: set[str] | None = None) -> dict[str, Any]:
    try:
        return conversation.model_dump(mode="json", include=include)
    except PydanticSerializationError as exc:  # an object in ``state`` (messages are checked as they are added)
        raise ConfigError(f"the conversation is not plain JSON data: {exc}") from None


def _meta(conversation: Conversation) -> dict[str, Any]:
    return _dump(conversation, {"usage", "checkpoints", "last_turn_id", "state"})


def _full_record(revision: int, conversation: Conversation, messages: list[dict[str, Any]]) -> bytes:
    data = _dump(conversation)
    data["messages"] = messages
    return _encode({"rev": revision, "conversation": data})


def _encode(record: dict[str, Any]) -> bytes:
    try:
        text = json.dumps(record, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"the conversation is not plain JSON data: {exc}") from None
    data = text.encode()
    if len(data) > MAX_RECORD_BYTES:
        raise ConfigError(f"one write of a conversation is limited to {MAX_RECORD_BYTES:,} bytes of JSON")
    return data


def replay(conversation_id: str, records: Sequence[bytes]) -> Conversation | None:
    """Rebuild a conversation from its records (each one JSON record); None when there is no full record.

    Raises:
        ConversationFormatError: A record is malformed, out of order or from an unknown version.
    """
    data: dict[str, Any] | None = None
    revision = 0
    for raw in records:
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ConversationFormatError(
                f"conversation {conversation_id!r} has a malformed record: {exc}", conversation_id=conversation_id
            ) from None
        if not isinstance(record, dict) or type(record.get("rev")) is not int:
            raise ConversationFormatError(
                f"conversation {conversation_id!r} has a record without a revision", conversation_id=conversation_id
            )
        if isinstance(record.get("conversation"), dict):
            data = record["conversation"]
        elif data is not None and isinstance(record.get("add"), list) and isinstance(record.get("meta"), dict):
            data = {**data, **record["meta"], "messages": [*data.get("messages", []), *record["add"]]}
        else:
            raise ConversationFormatError(
                f"conversation {conversation_id!r} has a record that is neither a conversation nor an append",
                conversation_id=conversation_id,
            )
        if record["rev"] <= revision:
            raise ConversationFormatError(
                f"conversation {conversation_id!r} has records out of order", conversation_id=conversation_id
            )
        revision = record["rev"]
    if data is None:
        return None
    conversation = Conversation.from_data(data)
    if conversation.id != conversation_id:
        raise ConversationFormatError(
            f"the record stored as conversation {conversation_id!r} is conversation {conversation.id!r}",
            conversation_id=conversation_id,
        )
    conversation._revision = revision
    conversation._stored_messages = len(conversation.messages)
    conversation._stored_meta = _meta(conversation)
    return conversation


class LogConversationStore:
    """The logic every store shares: records, revisions, Conflict; a backend supplies three sync primitives.

    A backend implements ``_records(id)`` (the conversation's records in order, from the last full one on is
    enough), ``_append(id, expected, record, full)`` (write one record if the stored revision is ``expected``, else
    raise `Conflict`; a full record may replace the log) and ``_remove(id)``. They run in a thread.
    """

    def _records(self, conversation_id: str) -> list[bytes]:
        raise NotImplementedError

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        raise NotImplementedError

    def _remove(self, conversation_id: str) -> None:
        raise NotImplementedError

    def load_sync(self, session_id: str) -> Conversation | None:
        """See `ConversationStore.load`."""
        self._settle(validate_conversation_key(session_id))
        return replay(session_id, self._records(session_id))

    def save_sync(self, session: Conversation) -> None:
        """See `ConversationStore.save`."""
        conversation = _checked(session)
        self._settle(conversation.id)
        revision = conversation._revision + 1
        count = len(conversation.messages)
        record = _full_record(revision, conversation, conversation.messages[:count])
        self._append(conversation.id, conversation._revision, record, full=True)
        conversation._revision = revision
        conversation._stored_messages = count
        conversation._stored_meta = _meta(conversation)

    def add_messages_sync(self, session: Conversation, messages: Sequence[Mapping[str, Any]]) -> None:
        """See `ConversationStore.add_messages`."""
        conversation = _checked(session)
        if isinstance(messages, Mapping | str | bytes):
            raise ConfigError("messages must be a list of message dicts")
        probe = conversation.model_copy(update={"messages": []})
        added = probe.add_local_messages(messages)  # validated and copied; the conversation is not touched yet
        self._settle(conversation.id)
        self._write(conversation, added)

    def flush_sync(self, session: Conversation) -> None:
        """Store what ``session`` holds that the store does not have yet (messages added in memory, its turns'
        state, usage and ``state``), in one write; nothing when the store has it all already.

        Raises:
            Conflict: As for `save`; nothing was written.
            StorageError: The store failed; nothing was written, the call may be retried.
        """
        conversation = _checked(session)
        self._settle(conversation.id)
        self._write(conversation, [], skip_unchanged=True)

    def _write(self, conversation: Conversation, added: list[dict[str, Any]], *, skip_unchanged: bool = False) -> None:
        """Write ``added`` and what the conversation holds unstored as one record (an append when the stored
        messages are a prefix of the conversation's, else the whole conversation)."""
        count = len(conversation.messages)  # read once: messages appended meanwhile go in the next write
        stored = conversation._stored_messages
        revision = conversation._revision + 1
        meta = _meta(conversation)
        if 0 <= stored <= count:
            unstored = conversation.messages[stored:count]
            if skip_unchanged and not unstored and not added and meta == conversation._stored_meta:
                return
            record = _encode({"rev": revision, "add": [*unstored, *added], "meta": meta})
            full = False
        else:
            record = _full_record(revision, conversation, [*conversation.messages[:count], *added])
            full = True
        self._append(conversation.id, conversation._revision, record, full=full)
        conversation.messages[count:count] = added
        conversation._revision = revision
        conversation._stored_meta = meta
        # A truncate made meanwhile (on another thread) keeps its -1: the next write stores the whole conversation.
        if conversation._stored_messages == stored:
            conversation._stored_messages = count + len(added)

    def delete_sync(self, session_id: str) -> None:
        """See `ConversationStore.delete`."""
        self._settle(validate_conversation_key(session_id))
        self._remove(session_id)

    # --------------------------------------------------- writes in the background

    def flush_later(self, session: Conversation) -> concurrent.futures.Future[None]:
        """Start `flush_sync` of ``session`` in a thread of the store and return its future; the write is queued
        now, before this returns.

        Every method of the store on the same conversation ID (this one too) first waits for the writes queued
        before it, so the application's next `add_messages` or `load` sees this one. Queued writes finish
        before the interpreter exits (the threads are joined at exit), unless the process is killed.
        """
        conversation = _checked(session)
        return _queue(self).submit(conversation.id, lambda: self._write(conversation, [], skip_unchanged=True))

    async def settled(self, session_id: str) -> None:
        """Wait for the writes `flush_later` queued for the conversation; their errors are not raised here."""
        pending = _queue(self).pending(session_id)
        if pending is not None:
            await asyncio.wait([asyncio.wrap_future(pending)])

    def _settle(self, conversation_id: str) -> None:
        pending = _queue(self).pending(conversation_id)
        if pending is not None:
            concurrent.futures.wait([pending])

    async def load(self, session_id: str) -> Conversation | None:
        """See `ConversationStore.load`."""
        return await asyncio.to_thread(self.load_sync, session_id)

    async def save(self, session: Conversation) -> None:
        """See `ConversationStore.save`."""
        await asyncio.to_thread(self.save_sync, session)

    async def add_messages(self, session: Conversation, messages: Sequence[Mapping[str, Any]]) -> None:
        """See `ConversationStore.add_messages`."""
        await asyncio.to_thread(self.add_messages_sync, session, messages)

    async def flush(self, session: Conversation) -> None:
        """See `flush_sync`."""
        await asyncio.to_thread(self.flush_sync, session)

    async def delete(self, session_id: str) -> None:
        """See `ConversationStore.delete`."""
        await asyncio.to_thread(self.delete_sync, session_id)


class _WriteQueue:
    """The writes `LogConversationStore.flush_later` queued, one chain per conversation ID, run in threads."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a done callback may run at once, in the thread that holds it
        self._last: dict[str, concurrent.futures.Future[None]] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, conversation_id: str, write: Callable[[], None]) -> concurrent.futures.Future[None]:
        with self._lock:
            before = self._last.get(conversation_id)
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="snapcell-conversation-writes"
                )

            def run() -> None:
                if before is not None:  # submitted earlier, so started earlier: this wait never starves the pool
                    concurrent.futures.wait([before])
                write()

            future = self._executor.submit(run)
            self._last[conversation_id] = future
            future.add_done_callback(lambda done: self._forget(conversation_id, done))
            return future

    def _forget(self, conversation_id: str, done: concurrent.futures.Future[None]) -> None:
        with self._lock:
            if self._last.get(conversation_id) is done:
                del self._last[conversation_id]

    def pending(self, conversation_id: str) -> concurrent.futures.Future[None] | None:
        with self._lock:
            return self._last.get(conversation_id)


_QUEUES_LOCK = threading.Lock()


def _queue(store: LogConversationStore) -> _WriteQueue:
    # Made on first use: the backends' own __init__ need not call a base one.
    queue: _WriteQueue | None = store.__dict__.get("_write_queue")
    if queue is None:
        with _QUEUES_LOCK:
            queue = store.__dict__.setdefault("_write_queue", _WriteQueue())
    return queue


def _checked(session: Conversation) -> Conversation:
    if not isinstance(session, Conversation):
        raise ConfigError(f"session must be a snapcell Conversation, not {type(session).__name__}")
    return session


def _revision_of(record: bytes, conversation_id: str) -> int:
    try:
        revision = json.loads(record).get("rev")
    except (ValueError, AttributeError, RecursionError):
        revision = None
    if type(revision) is not int:
        raise ConversationFormatError(
            f"conversation {conversation_id!r} has a malformed last record", conversation_id=conversation_id
        )
    return revision


def _conflict(conversation_id: str, expected: int, found: int) -> Conflict:
    if expected == 0:
        return Conflict(f"conversation {conversation_id!r} already exists: load it instead of creating it again")
    return Conflict(
        f"conversation {conversation_id!r} was changed by another writer (stored revision {found}, this copy is "
        f"revision {expected}); nothing was written: load it again and redo the change"
    )


class MemoryConversationStore(LogConversationStore):
    """Conversations in this process's memory: tests, examples, one-process applications."""

    def __init__(self) -> None:
        self._logs: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    def _records(self, conversation_id: str) -> list[bytes]:
        with self._lock:
            return list(self._logs.get(conversation_id, ()))

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        with self._lock:
            log = self._logs.get(conversation_id, [])
            found = _revision_of(log[-1], conversation_id) if log else 0
            if found != expected:
                raise _conflict(conversation_id, expected, found)
            self._logs[conversation_id] = [record] if full else [*log, record]

    def _remove(self, conversation_id: str) -> None:
        with self._lock:
            self._logs.pop(conversation_id, None)

    def __repr__(self) -> str:
        return f"MemoryConversationStore({len(self._logs)} conversations)"


class FileConversationStore(LogConversationStore):
    """Conversations as JSON Lines files in a directory: ``<dir>/<id>.jsonl``.

    The first line is the conversation as last saved; each `add_messages` appends one line (the messages and the
    turn state) with a single ``write`` and an fsync, under an exclusive lock on ``<dir>/.lock`` (so processes on
    one machine take turns). A torn last line (the writer died mid-write) is ignored on load and cut off by the next
    write. `save` writes a new file and renames it over the old one.

    Args:
        directory: Where the files go; created if missing.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        with map_exceptions([(OSError, StorageError)], f"creating the conversation directory {self.directory}"):
            make_dirs(self.directory)

    def path(self, conversation_id: str) -> Path:
        """The file of a conversation."""
        return self.directory / f"{storage_name(validate_conversation_key(conversation_id))}.jsonl"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with map_exceptions([(OSError, StorageError)], f"locking {self.directory / '.lock'}"):
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_lines(self, path: Path) -> tuple[list[bytes], int]:
        """The complete lines of a file and the length of the complete part (a torn last line is left out)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return [], 0
        end = data.rfind(b"\n") + 1
        return [line for line in data[:end].split(b"\n") if line], end

    def _records(self, conversation_id: str) -> list[bytes]:
        with map_exceptions([(OSError, StorageError)], f"reading conversation {conversation_id!r}"):
            return self._read_lines(self.path(conversation_id))[0]

    def _append(self, conversation_id: str, expected: int, record: bytes, *, full: bool) -> None:
        path = self.path(conversation_id)
        with self._locked(), map_exceptions([(OSError, StorageError)], f"writing conversation {conversation_id!r}"):
            lines, end = self._read_lines(path)
            found = _revision_of(lines[-1], conversation_id) if lines else 0
            if found != expected:
                raise _conflict(conversation_id, expected, found)
            if full:
                fd, temp = tempfile.mkstemp(
                    dir=self.directory, prefix=f".{storage_name(conversation_id)}.", suffix=".tmp"
                )
                try:
                    with os.fdopen(fd, "wb") as file:
                        file.write(record + b"\n")
                        file.flush()
                        os.fsync(file.fileno())
                    os.replace(temp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temp)
                    raise
                fsync_dir(self.directory)
                return
            fd = os.open(path, os.O_WRONLY)
            try:
                if os.fstat(fd).st_size != end:
                    os.ftruncate(fd, end)  # a torn line left by a writer that died
                os.lseek(fd, end, os.SEEK_SET)
                line = record + b"\n"
                written = os.write(fd, line)
                if written != len(line):
                    os.ftruncate(fd, end)
                    raise StorageError(f"writing conversation {conversation_id!r}: short write (disk full?)")
                os.fsync(fd)
            finally:
                os.close(fd)

    def _remove(self, conversation_id: str) -> None:
        with self._locked(), map_exceptions([(OSError, StorageError)], f"deleting conversation {conversation_id!r}"):
            with contextlib.suppress(FileNotFoundError):
                self.path(conversation_id).unlink()

    def __repr__(self) -> str:
        return f"FileConversationStore({str(self.directory)!r})"
