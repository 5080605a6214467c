"""`Conversation`: an agent conversation's transcript and its Python state, as one versioned record.

The messages are the application's own (plain JSON-able dicts in whatever format its model API uses); snapcell adds
the checkpoint ID each code turn produced, keyed by the index its result message takes in the transcript, so that
`Conversation.truncate` and `Conversation.fork` move the transcript and the Python state together.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from snapcell.errors import ConfigError, ConversationFormatError, InvalidKey
from snapcell.heads import validate_conversation_id

__all__ = [
    "CONVERSATION_VERSION",
    "MAX_RUN_RECORDS",
    "Conversation",
    "RunRecord",
    "Usage",
    "tool_call_ids",
    "tool_result_ids",
    "storage_name",
    "validate_conversation_key",
]

CONVERSATION_VERSION = 1
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
# A message is at most this large as JSON, and a conversation holds at most this many (a bound on what a load
# reads and validates, not a quota: 100,000 messages of a few KiB is a long conversation indeed).
MAX_MESSAGES = 100_000


def validate_conversation_key(conversation_id: str) -> str:
    """Check a stored conversation's ID and return it: the one rule of conversation IDs (`validate_conversation_id`).

    A conversation's ID is its head's ID, so a conversation store takes every ID a `CodeTool` takes
    (``"user:42"``); where it names a file or a storage key it goes through `storage_name`.

    Raises:
        InvalidKey: The ID is malformed; nothing was read or written.
    """
    return validate_conversation_id(conversation_id)


def storage_name(conversation_id: str) -> str:
    """The name a (valid) conversation ID has as a file name or storage-key segment: letters, digits, ``_ . -``.

    An ID of letters, digits, ``_`` and ``-`` (every ID conversation stores took before) is its own name; any other
    (with ``.`` or ``:``) is ``h.`` and its UTF-8 bytes in hex, a name no such ID can have (it holds a ``.``).
    """
    if _PLAIN_ID.match(conversation_id):
        return conversation_id
    return "h." + conversation_id.encode().hex()


# Per-run records a conversation keeps, newest last; older ones leave the list, the totals keep counting them.
MAX_RUN_RECORDS = 1000


class RunRecord(BaseModel):
    """What one code run of a conversation used; a figure that was not measured is None, not 0.

    Attributes:
        turn_id: The turn the run belonged to, if known.
        status: `RunResult.status` (``ok``, ``error``, ``timeout``, ``cancelled``, ``lost``).
        wall_time_s: Wall-clock seconds of the run.
        cpu_time_s: CPU seconds of the run, or None where not measured (see `RunResult.cpu_time_s`).
        peak_memory_bytes: The worker's peak resident set size, or None where not measured (inline, a lost worker).
        host_calls: Host-function calls made.
        bytes_stored: Bytes the turn's checkpoint put into the store (0: nothing was saved).
    """

    model_config = ConfigDict(extra="forbid")

    turn_id: str | None = None
    status: str
    wall_time_s: float = Field(default=0.0, ge=0)
    cpu_time_s: float | None = Field(default=None, ge=0)
    peak_memory_bytes: int | None = Field(default=None, ge=0)
    host_calls: int = Field(default=0, ge=0)
    bytes_stored: int = Field(default=0, ge=0)


class Usage(BaseModel):
    """What a conversation used: its code runs (failed, timed-out, cancelled and lost ones too) and, as the
    application adds them with `add_model`, its model calls.

    A figure no run measured is None, not 0: ``peak_memory_bytes`` stays None for a conversation whose runs were all
    inline, ``cost`` until the application adds one.

    Attributes:
        runs: Runs counted.
        by_status: Runs by `RunResult.status` (``ok``, ``error``, ``timeout``, ``cancelled``, ``lost``).
        wall_time_s: Wall-clock seconds of the runs.
        cpu_time_s: CPU seconds of the runs that measured it (see `RunResult.cpu_time_s`); None if none did.
        peak_memory_bytes: The highest peak memory of any run that measured it (process mode); None if none did.
        host_calls: Host-function calls made.
        bytes_stored: Bytes the turns' checkpoints put into the store.
        records: One `RunRecord` per run, oldest first (the last 1,000; the totals count every run).
        model_calls: Model calls the application added (`add_model`).
        input_tokens: Model input tokens the application added.
        output_tokens: Model output tokens the application added.
        cost: Cost the application added, in its own currency; None until it adds one.
    """

    model_config = ConfigDict(extra="forbid")

    runs: int = Field(default=0, ge=0)
    by_status: dict[str, int] = Field(default_factory=dict)
    wall_time_s: float = Field(default=0.0, ge=0)
    cpu_time_s: float | None = Field(default=None, ge=0)
    peak_memory_bytes: int | None = Field(default=None, ge=0)
    host_calls: int = Field(default=0, ge=0)
    bytes_stored: int = Field(default=0, ge=0)
    records: list[RunRecord] = Field(default_factory=list)
    model_calls: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost: float | None = Field(default=None, ge=0)

    def add_run(
        self,
        *,
        status: str,
        wall_time_s: float,
        cpu_time_s: float | None = None,
        peak_memory_bytes: int | None = None,
        host_calls: int = 0,
        bytes_stored: int = 0,
        turn_id: str | None = None,
    ) -> None:
        """Count one run, and keep its `RunRecord`; None marks a figure that was not measured."""
        record = RunRecord(
            turn_id=turn_id,
            status=status,
            wall_time_s=max(wall_time_s, 0.0),
            cpu_time_s=None if cpu_time_s is None else max(cpu_time_s, 0.0),
            peak_memory_bytes=None if peak_memory_bytes is None else max(peak_memory_bytes, 0),
            host_calls=max(host_calls, 0),
            bytes_stored=max(bytes_stored, 0),
        )
        self.runs += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.wall_time_s += record.wall_time_s
        if record.cpu_time_s is not None:
            self.cpu_time_s = (self.cpu_time_s or 0.0) + record.cpu_time_s
        if record.peak_memory_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, record.peak_memory_bytes)
        self.host_calls += record.host_calls
        self.bytes_stored += record.bytes_stored
        self.records.append(record)
        del self.records[:-MAX_RUN_RECORDS]

    def add_model(self, *, input_tokens: int = 0, output_tokens: int = 0, cost: float | None = None) -> None:
        """Count one model call of the application: its tokens and, if known, its cost (in the application's
        currency).

        The conversation's next write stores it (the tool's save after a turn, or the application's
        `ConversationStore.add_messages` / `save`), in the same write as the messages.

        Raises:
            ConfigError: A count is negative or not a number.
        """
        for label, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{label} must be a whole number >= 0, not {value!r}")
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < 1e18):
            raise ConfigError(f"cost must be a number >= 0 or None, not {cost!r}")
        self.model_calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        if cost is not None:
            self.cost = (self.cost or 0.0) + float(cost)


def _block_ids(message: Mapping[str, Any], block_type: str, key: str) -> Iterator[str]:
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == block_type and isinstance(block.get(key), str):
                yield block[key]


def tool_call_ids(message: Mapping[str, Any]) -> list[str]:
    """The tool-call IDs a message makes, in the formats of the common model APIs.

    OpenAI chat (``tool_calls: [{"id": ...}]``), OpenAI responses (``{"type": "function_call", "call_id": ...}``)
    and Anthropic (content blocks ``{"type": "tool_use", "id": ...}``).
    """
    ids = [call["id"] for call in message.get("tool_calls") or () if isinstance(call, Mapping) and "id" in call]
    if message.get("type") == "function_call" and isinstance(message.get("call_id"), str):
        ids.append(message["call_id"])
    ids.extend(_block_ids(message, "tool_use", "id"))
    return [str(i) for i in ids]


def tool_result_ids(message: Mapping[str, Any]) -> list[str]:
    """The tool-call IDs a message answers (``role: tool`` + ``tool_call_id``, ``function_call_output``,
    Anthropic ``tool_result`` blocks)."""
    ids: list[str] = []
    if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
        ids.append(message["tool_call_id"])
    if message.get("type") == "function_call_output" and isinstance(message.get("call_id"), str):
        ids.append(message["call_id"])
    ids.extend(_block_ids(message, "tool_result", "tool_use_id"))
    return ids


class Conversation(BaseModel):
    """An agent conversation: its messages, the Python state of its code turns, and what its runs used.

    Create one with an ``id`` (default: a random one), keep it in a `ConversationStore`, and pass it to
    `CodeTool.run_code` instead of a bare conversation ID: each code turn then records the checkpoint it produced
    in the conversation, keyed by the index the turn's result message takes (``len(messages)`` when the turn ended).
    The Python state the next turn starts from is `checkpoint_id`, the latest of those; `truncate` and `fork`
    change it along with the messages.

    The JSON form (`model_dump_json` / `model_validate_json`) is stable and versioned; a version this snapcell does
    not know is refused with `ConversationFormatError`.

    Attributes:
        id: The conversation's ID: 1 to 128 letters, digits, ``_`` or ``-`` (it names a file, a key and a head).
        version: Format version of the JSON form (1).
        messages: The transcript, in the application's own format: plain JSON-able dicts.
        usage: What the conversation's code runs used.
        checkpoints: Checkpoint ID (hex) of each code turn, by the message index of its result.
        last_turn_id: The turn ID of the last code turn recorded.
        state: The application's own data for its loop (a pending approval, a step counter): plain JSON, kept with
            the transcript and stored by the same write as the messages; `fork` copies it, `truncate` leaves it.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    id: str = Field(default_factory=lambda: secrets.token_hex(16))
    version: int = CONVERSATION_VERSION
    messages: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    checkpoints: dict[int, str] = Field(default_factory=dict)
    last_turn_id: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)

    # The store's revision this object was loaded from or last written as (a store's compare-and-set token), and
    # how many of the messages the store already has (-1: the next write must store the whole conversation).
    _revision: int = PrivateAttr(default=0)
    _stored_messages: int = PrivateAttr(default=-1)
    # The turn state (usage, checkpoints, state) as the store last got it: a flush with nothing new writes nothing.
    _stored_meta: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _check_version(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "version" in data:
            version = data["version"]
            if type(version) is not int or version != CONVERSATION_VERSION:
                raise ConversationFormatError(
                    f"this conversation was saved in format version {version!r}, and this snapcell reads version "
                    f"{CONVERSATION_VERSION} only: upgrade snapcell to load it",
                    conversation_id=str(data.get("id"))[:128] if data.get("id") is not None else None,
                    version=version,
                )
        return data

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        try:
            return validate_conversation_key(value)
        except InvalidKey as exc:
            raise ValueError(str(exc)) from None

    @field_validator("checkpoints")
    @classmethod
    def _check_checkpoints(cls, value: dict[int, str]) -> dict[int, str]:
        for index, checkpoint in value.items():
            if index < 0 or not re.fullmatch(r"(?:[0-9a-f]{2}){8,256}", checkpoint):
                raise ValueError(f"checkpoint {index}: not a hex checkpoint ID at a message index")
        return value

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(value) > MAX_MESSAGES:
            raise ValueError(f"more than {MAX_MESSAGES} messages")
        return value

    # ------------------------------------------------------------- loading

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Conversation:
        """Pydantic's `model_validate_json`, with snapcell's error: `ConversationFormatError`, never a traceback.

        Raises:
            ConversationFormatError: The JSON is malformed, not a conversation, or from another format version.
        """
        try:
            return super().model_validate_json(*args, **kwargs)
        except ValidationError as exc:
            raise _format_error(exc) from None

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Conversation:
        """Pydantic's `model_validate`, with snapcell's error (see `model_validate_json`)."""
        try:
            return super().model_validate(*args, **kwargs)
        except ValidationError as exc:
            raise _format_error(exc) from None

    @classmethod
    def from_json(cls, data: str | bytes | bytearray) -> Conversation:
        """Load a conversation from its JSON form; see `model_validate_json`."""
        return cls.model_validate_json(data)

    @classmethod
    def from_data(cls, data: Any) -> Conversation:
        """Load a conversation from parsed JSON data; see `model_validate_json`."""
        return cls.model_validate(data)

    # --------------------------------------------------------------- state

    @property
    def checkpoint_id(self) -> bytes | None:
        """The checkpoint the next code turn starts from: the latest turn's, or None (an empty session)."""
        if not self.checkpoints:
            return None
        return bytes.fromhex(self.checkpoints[max(self.checkpoints)])

    def record_turn(self, checkpoint_id: bytes, turn_id: str, *, index: int | None = None) -> None:
        """Record a code turn's checkpoint at message ``index`` (default: the next message's, ``len(messages)``).

        `CodeTool.run_code` calls this; an application that runs code its own way can too.
        """
        at = len(self.messages) if index is None else index
        # A later turn at a lower index (after a truncate the application did not save) replaces what follows.
        self.checkpoints = {i: c for i, c in self.checkpoints.items() if i < at}
        self.checkpoints[at] = bytes(checkpoint_id).hex()
        self.last_turn_id = turn_id

    def add_local_messages(self, messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Append messages in memory only (a store's `add_messages` does this and saves them); return them.

        Raises:
            ConfigError: A message is not a JSON-able dict.
        """
        added = [_plain_message(message) for message in messages]
        if len(self.messages) + len(added) > MAX_MESSAGES:
            raise ConfigError(f"a conversation holds at most {MAX_MESSAGES} messages")
        self.messages.extend(added)
        return added

    def add_tool_result(self, call_id: str, text: str) -> int | None:
        """Answer the transcript's unanswered tool call ``call_id`` with ``text``, in the call's own format (in memory).

        OpenAI chat gets a ``role: tool`` message, OpenAI responses a ``function_call_output`` item, Anthropic a
        ``tool_result`` block: in a new user message, or added to the user message right after the call's message
        when that one holds only results of its calls (the API wants every result of a message's calls in the next
        message). `CodeTool` calls this for each turn when it keeps the conversation in a store.

        Returns:
            The index of the message that holds the result, or None when no unanswered call has that ID.
        """
        answered = {i for message in self.messages for i in tool_result_ids(message)}
        if call_id in answered:
            return None
        for at in range(len(self.messages) - 1, -1, -1):
            call = self.messages[at]
            if call_id not in tool_call_ids(call):
                continue
            if call.get("type") == "function_call":
                result: dict[str, Any] = {"type": "function_call_output", "call_id": call_id, "output": text}
            elif call.get("tool_calls"):
                result = {"role": "tool", "tool_call_id": call_id, "content": text}
            else:
                block = {"type": "tool_result", "tool_use_id": call_id, "content": text}
                following = self.messages[at + 1] if at + 1 < len(self.messages) else None
                if at + 2 == len(self.messages) and following is not None and _only_results_of(following, call):
                    self.messages[at + 1] = {**following, "content": [*following["content"], block]}
                    # A stored message changed: the next write stores the whole conversation.
                    self._stored_messages = -1
                    return at + 1
                result = {"role": "user", "content": [block]}
            self.add_local_messages([result])
            return len(self.messages) - 1
        return None

    def truncate(self, index: int) -> None:
        """Keep the messages before ``index`` and the Python state of the last code turn among them.

        A negative index counts from the end (``truncate(-2)`` drops the last two messages). Only this object
        changes; the next save stores it, and the next code turn starts from the state recorded before ``index``
        (an empty session when there is none), so the conversation's head follows.

        Raises:
            ConfigError: ``index`` is out of range, or the kept messages would end with a tool call whose result
                is cut off; nothing changed.
        """
        if not isinstance(index, int) or isinstance(index, bool):
            raise ConfigError(f"index must be an integer, not {type(index).__name__}")
        count = len(self.messages)
        keep = index + count if index < 0 else index
        if not 0 <= keep <= count:
            raise ConfigError(f"index {index} is out of range for a conversation of {count} messages")
        kept = self.messages[:keep]
        pending = _unanswered_calls(kept)
        if pending:
            raise ConfigError(
                f"truncating at {index} would keep tool call {pending[0]!r} without its result; truncate before "
                "the message that makes the call, or after its result"
            )
        self.messages = kept
        self.checkpoints = {i: c for i, c in self.checkpoints.items() if i < keep}
        self._stored_messages = -1

    @overload
    def fork(self, new_id: str | None = None) -> Conversation: ...

    @overload
    def fork(self, *, count: int) -> list[Conversation]: ...

    def fork(self, new_id: str | None = None, *, count: int | None = None) -> Conversation | list[Conversation]:
        """Return an independent copy under a new ID, standing on the same Python state (or ``count`` of them).

        Checkpoints are immutable, so nothing is copied in storage: each conversation's next code turn starts
        from the same checkpoint and they go their own ways. The copy is not stored until it is saved.

        Args:
            new_id: The copy's ID; default: a new random one.
            count: Return a list of this many copies, each with a new random ID (for trying several continuations
                of one state at once).

        Raises:
            ConfigError: ``new_id`` is malformed or the ID of this conversation; ``count`` is not a positive integer,
                or given with ``new_id``.
        """
        if count is not None:
            if type(count) is not int or count < 1:
                raise ConfigError(f"count must be a positive integer, not {count!r}")
            if new_id is not None:
                raise ConfigError("fork(count=...) gives each copy a new random ID: pass no new_id with it")
            return [self._fork(None) for _ in range(count)]
        return self._fork(new_id)

    def _fork(self, new_id: str | None) -> Conversation:
        new_id = secrets.token_hex(16) if new_id is None else new_id
        try:
            validate_conversation_key(new_id)
        except InvalidKey as exc:
            raise ConfigError(str(exc)) from None
        if new_id == self.id:
            raise ConfigError("a fork needs a new conversation ID")
        return Conversation(
            id=new_id,
            messages=copy.deepcopy(self.messages),
            usage=self.usage.model_copy(deep=True),
            checkpoints=dict(self.checkpoints),
            last_turn_id=self.last_turn_id,
            state=copy.deepcopy(self.state),
        )

    def __repr__(self) -> str:
        state = self.checkpoints[max(self.checkpoints)][:16] + "..." if self.checkpoints else None
        return f"Conversation(id={self.id!r}, messages={len(self.messages)}, checkpoint={state!r})"


def _unanswered_calls(messages: list[dict[str, Any]]) -> list[str]:
    answered: set[str] = set()
    for message in messages:
        answered.update(tool_result_ids(message))
    return [call for message in messages for call in tool_call_ids(message) if call not in answered]


def _only_results_of(message: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
    """Whether ``message`` is a user message of Anthropic ``tool_result`` blocks answering calls of ``call``."""
    content = message.get("content")
    calls = set(tool_call_ids(call))
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and bool(content)
        and all(
            isinstance(b, Mapping) and b.get("type") == "tool_result" and b.get("tool_use_id") in calls for b in content
        )
    )


def _plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ConfigError(f"a message must be a dict, not {type(message).__name__}")
    try:
        # A round trip through JSON both checks and copies it: the stored form is what the caller reads back.
        loaded: dict[str, Any] = json.loads(json.dumps(dict(message), allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"a message must be plain JSON data: {exc}") from None
    return loaded


def _format_error(exc: ValidationError) -> ConversationFormatError:
    for error in exc.errors():
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, ConversationFormatError):
            return cause
    return ConversationFormatError(f"not a valid conversation: {exc.errors()[0].get('msg', exc)}")
