"""One conformance suite for every `ConversationStore`: memory, file, and S3 on the moto server."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from snapcell import ConfigError, Conflict, Conversation
from snapcell.conversation import ConversationStore, FileConversationStore, LogConversationStore
from snapcell.errors import ConversationFormatError, InvalidKey

CKPT = bytes.fromhex("cd" * 40)


def synced(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body on its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def msg(i: int) -> dict[str, object]:
    return {"role": "user", "content": f"message {i}", "meta": {"n": i, "tags": ["a", None, 1.5]}}


def test_every_backend_is_a_conversation_store(conversation_store: LogConversationStore) -> None:
    assert isinstance(conversation_store, ConversationStore)


@synced
async def test_load_absent_is_none(conversation_store: LogConversationStore) -> None:
    assert await conversation_store.load("nobody") is None


@synced
async def test_save_then_add_messages_round_trip(conversation_store: LogConversationStore) -> None:
    conversation = Conversation(id="c-1", messages=[msg(0)])
    await conversation_store.save(conversation)
    await conversation_store.add_messages(conversation, [msg(1), msg(2)])
    conversation.record_turn(CKPT, "turn-a")
    conversation.usage.add_run(status="ok", wall_time_s=0.1, bytes_stored=10)
    await conversation_store.add_messages(conversation, [msg(3)])
    assert [m["content"] for m in conversation.messages] == [f"message {i}" for i in range(4)]
    loaded = await conversation_store.load("c-1")
    assert loaded == conversation
    assert loaded is not None and loaded.checkpoint_id == CKPT and loaded.last_turn_id == "turn-a"
    assert loaded.usage.bytes_stored == 10
    # The loaded copy can go on writing.
    await conversation_store.add_messages(loaded, [msg(4)])
    again = await conversation_store.load("c-1")
    assert again is not None and len(again.messages) == 5


@synced
async def test_add_messages_creates_a_new_conversation(conversation_store: LogConversationStore) -> None:
    conversation = Conversation(id="fresh")
    await conversation_store.add_messages(conversation, [msg(0)])
    loaded = await conversation_store.load("fresh")
    assert loaded is not None and loaded.messages == [msg(0)]


@synced
async def test_two_writers_get_conflict_never_an_interleaved_transcript(
    conversation_store: LogConversationStore,
) -> None:
    await conversation_store.save(Conversation(id="shared", messages=[msg(0)]))
    first = await conversation_store.load("shared")
    second = await conversation_store.load("shared")
    assert first is not None and second is not None
    await conversation_store.add_messages(first, [msg(1)])
    with pytest.raises(Conflict, match="another writer"):
        await conversation_store.add_messages(second, [msg(99)])
    with pytest.raises(Conflict):
        await conversation_store.save(second)
    assert second.messages == [msg(0)]  # nothing changed in memory either
    stored = await conversation_store.load("shared")
    assert stored is not None and stored.messages == [msg(0), msg(1)]
    # Creating a conversation whose ID is taken is a conflict too.
    with pytest.raises(Conflict, match="already exists"):
        await conversation_store.save(Conversation(id="shared"))


@synced
async def test_racing_writers_one_wins_each_revision(conversation_store: LogConversationStore) -> None:
    await conversation_store.save(Conversation(id="race"))
    copies = [await conversation_store.load("race") for _ in range(4)]
    outcomes = await asyncio.gather(
        *(conversation_store.add_messages(c, [msg(i)]) for i, c in enumerate(copies) if c is not None),
        return_exceptions=True,
    )
    assert sum(o is None for o in outcomes) == 1
    assert all(isinstance(o, Conflict) for o in outcomes if o is not None)
    stored = await conversation_store.load("race")
    assert stored is not None and len(stored.messages) == 1


@synced
async def test_save_after_truncate_stores_the_shorter_transcript(conversation_store: LogConversationStore) -> None:
    conversation = Conversation(id="t")
    await conversation_store.add_messages(conversation, [msg(0), msg(1)])
    conversation.record_turn(CKPT, "t1")
    await conversation_store.add_messages(conversation, [msg(2), msg(3)])
    conversation.truncate(2)
    # add_messages after a truncate stores the whole conversation, not an append to the old one.
    await conversation_store.add_messages(conversation, [msg(7)])
    loaded = await conversation_store.load("t")
    assert loaded is not None and loaded.messages == [msg(0), msg(1), msg(7)]
    assert loaded.checkpoint_id is None
    loaded.truncate(1)
    await conversation_store.save(loaded)
    reloaded = await conversation_store.load("t")
    assert reloaded is not None and reloaded.messages == [msg(0)]


@synced
async def test_fork_is_stored_independently(conversation_store: LogConversationStore) -> None:
    conversation = Conversation(id="orig", messages=[msg(0)])
    conversation.record_turn(CKPT, "t1")
    await conversation_store.save(conversation)
    fork = conversation.fork("forked")
    await conversation_store.add_messages(fork, [msg(1)])
    await conversation_store.add_messages(conversation, [msg(2)])
    a, b = await conversation_store.load("orig"), await conversation_store.load("forked")
    assert a is not None and b is not None
    assert a.messages == [msg(0), msg(2)] and b.messages == [msg(0), msg(1)]
    assert a.checkpoint_id == b.checkpoint_id == CKPT


@synced
async def test_delete(conversation_store: LogConversationStore) -> None:
    await conversation_store.save(Conversation(id="gone", messages=[msg(0)]))
    await conversation_store.delete("gone")
    await conversation_store.delete("gone")  # absent: not an error
    assert await conversation_store.load("gone") is None
    await conversation_store.save(Conversation(id="gone"))  # the ID is free again


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 129, ".a", "a b", "é"])
@synced
async def test_malformed_ids_are_refused(conversation_store: LogConversationStore, bad: str) -> None:
    with pytest.raises(InvalidKey):
        await conversation_store.load(bad)
    with pytest.raises(InvalidKey):
        await conversation_store.delete(bad)


@synced
async def test_non_json_messages_change_nothing(conversation_store: LogConversationStore) -> None:
    conversation = Conversation(id="j")
    await conversation_store.save(conversation)
    for bad in ([{"x": object()}], [{"x": float("nan")}], ["not a dict"], {"role": "user"}):
        with pytest.raises(ConfigError):
            await conversation_store.add_messages(conversation, bad)  # type: ignore[arg-type]
    assert conversation.messages == []
    loaded = await conversation_store.load("j")
    assert loaded is not None and loaded.messages == []


@synced
async def test_state_and_usage_are_stored_with_the_messages_in_one_write(
    conversation_store: LogConversationStore,
) -> None:
    conversation = Conversation(id="st", state={"pending_approval": {"tool": "refund", "amount": 12.5}, "step": 1})
    await conversation_store.save(conversation)
    conversation.state["step"] = 2
    await conversation_store.add_messages(conversation, [msg(0)])
    conversation.state["step"] = 3
    conversation.usage.add_model(input_tokens=10, output_tokens=2, cost=0.01)
    conversation.add_local_messages([msg(1)])
    await conversation_store.flush(conversation)
    revision = conversation._revision
    await conversation_store.flush(conversation)  # nothing new: nothing written
    assert conversation._revision == revision
    loaded = await conversation_store.load("st")
    assert loaded == conversation and loaded is not None and loaded.state["step"] == 3
    assert loaded.messages == [msg(0), msg(1)] and loaded.usage.input_tokens == 10
    conversation.state["bad"] = object()
    with pytest.raises(ConfigError, match="plain JSON"):
        await conversation_store.add_messages(conversation, [msg(2)])
    assert len(conversation.messages) == 2
    again = await conversation_store.load("st")
    assert again is not None and "bad" not in again.state and len(again.messages) == 2


@synced
async def test_a_write_queued_in_the_background_comes_before_the_next_call(
    conversation_store: LogConversationStore,
) -> None:
    conversation = Conversation(id="queued")
    await conversation_store.add_messages(conversation, [msg(0)])
    for i in range(1, 4):
        conversation.add_local_messages([msg(i)])
        conversation.state["i"] = i
        conversation_store.flush_later(conversation)
    loaded = await conversation_store.load("queued")  # waits for the queued writes, in order
    assert loaded is not None and loaded.messages == [msg(i) for i in range(4)] and loaded.state == {"i": 3}
    await conversation_store.add_messages(conversation, [msg(4)])  # the writer's copy goes on in step


# ------------------------------------------------------------- file store


def test_file_layout_is_the_saved_session_then_one_line_per_add(tmp_path: Path) -> None:
    store = FileConversationStore(tmp_path)
    conversation = Conversation(id="layout", messages=[msg(0)])
    store.save_sync(conversation)
    store.add_messages_sync(conversation, [msg(1)])
    store.add_messages_sync(conversation, [msg(2), msg(3)])
    lines = (tmp_path / "layout.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0])["conversation"]["messages"] == [msg(0)]
    assert json.loads(lines[2])["add"] == [msg(2), msg(3)]


def test_file_store_ignores_and_repairs_a_torn_last_line(tmp_path: Path) -> None:
    store = FileConversationStore(tmp_path)
    conversation = Conversation(id="torn", messages=[msg(0)])
    store.save_sync(conversation)
    path = tmp_path / "torn.jsonl"
    with open(path, "ab") as file:  # a writer that died halfway through its line
        file.write(b'{"rev":2,"add":[{"role":"user","content":"half')
    loaded = store.load_sync("torn")
    assert loaded is not None and loaded.messages == [msg(0)]
    store.add_messages_sync(loaded, [msg(1)])
    assert store.load_sync("torn") == loaded
    assert b"half" not in path.read_bytes()


@pytest.mark.parametrize(
    "content",
    [
        b"not json\n",
        b'{"rev": 1, "conversation": {"id": "other"}}\n',
        b'{"rev": 1, "conversation": {"id": "bad", "version": 9}}\n',
        b"[1, 2]\n",
    ],
)
def test_file_store_refuses_malformed_files(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(ConversationFormatError):
        FileConversationStore(tmp_path).load_sync("bad")


def test_file_store_failed_save_leaves_nothing_half_written(tmp_path: Path) -> None:
    store = FileConversationStore(tmp_path)
    conversation = Conversation(id="keep", messages=[msg(0)])
    store.save_sync(conversation)
    before = (tmp_path / "keep.jsonl").read_bytes()
    stale = Conversation(id="keep", messages=[msg(5)])
    with pytest.raises(Conflict):
        store.save_sync(stale)
    assert (tmp_path / "keep.jsonl").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [".lock", "keep.jsonl"]


@pytest.mark.parametrize("conversation_id", ["user:42", "user:42:chat-7", "A.b_c-d", "h.757365723a3432"])
@synced
async def test_a_store_takes_every_conversation_id_a_tool_takes(
    conversation_store: LogConversationStore, conversation_id: str
) -> None:
    """One rule for conversation IDs: the head's (a CodeTool takes ``"user:42"``), kept apart from one another."""
    await conversation_store.save(Conversation(id=conversation_id, messages=[msg(0)]))
    await conversation_store.save(Conversation(id="user_42", messages=[msg(1)]))
    loaded = await conversation_store.load(conversation_id)
    assert loaded is not None and loaded.id == conversation_id and loaded.messages == [msg(0)]
    other = await conversation_store.load("user_42")
    assert other is not None and other.messages == [msg(1)]
