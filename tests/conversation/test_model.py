"""`Conversation`: stable JSON, the version check, truncate and fork of the transcript."""

from __future__ import annotations

import json

import pytest

from snapcell import ConfigError, Conversation
from snapcell.errors import ConversationFormatError

CKPT = "ab" * 40


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": text}


def openai_call(call_id: str) -> dict[str, object]:
    return {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "run_code"}}]}


def openai_result(call_id: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def anthropic_call(call_id: str) -> dict[str, object]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "run_code", "input": {}}]}


def anthropic_result(call_id: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]}


def sample() -> Conversation:
    conversation = Conversation(id="conv-1", messages=[user("hi"), openai_call("c1")])
    conversation.record_turn(bytes.fromhex(CKPT), "c1")
    conversation.messages.append(openai_result("c1"))
    conversation.usage.add_run(status="ok", wall_time_s=0.5, cpu_time_s=0.25, host_calls=2, bytes_stored=100)
    return conversation


def test_json_round_trip_is_stable() -> None:
    conversation = sample()
    text = conversation.model_dump_json()
    again = Conversation.model_validate_json(text)
    assert again == conversation
    assert again.model_dump_json() == text
    assert again.checkpoint_id == bytes.fromhex(CKPT)
    assert json.loads(text)["version"] == 1
    assert json.loads(text)["checkpoints"] == {"2": CKPT}


def test_unknown_future_version_is_a_clear_error() -> None:
    data = json.loads(sample().model_dump_json())
    data["version"] = 2
    with pytest.raises(ConversationFormatError, match="version 2.*upgrade snapcell") as info:
        Conversation.model_validate_json(json.dumps(data))
    assert info.value.version == 2
    assert info.value.conversation_id == "conv-1"


@pytest.mark.parametrize(
    "change",
    [
        {"id": "../etc/passwd"},
        {"id": ""},
        {"messages": "not a list"},
        {"checkpoints": {"1": "not hex"}},
        {"checkpoints": {"-1": CKPT}},
        {"unknown_field": 1},
        {"usage": {"runs": -1}},
    ],
)
def test_malformed_data_is_refused_on_load(change: dict[str, object]) -> None:
    data = {**json.loads(sample().model_dump_json()), **change}
    with pytest.raises(ConversationFormatError):
        Conversation.model_validate_json(json.dumps(data))
    with pytest.raises(ConversationFormatError):
        Conversation.model_validate(data)


def test_truncate_keeps_messages_and_the_state_before_the_index() -> None:
    conversation = sample()
    conversation.messages.append(user("more"))
    conversation.truncate(-1)  # drops "more": the turn's result stays, so does its state
    assert len(conversation.messages) == 3
    assert conversation.checkpoint_id == bytes.fromhex(CKPT)
    conversation.truncate(1)  # keeps only "hi": before the turn, an empty session
    assert conversation.messages == [user("hi")]
    assert conversation.checkpoint_id is None
    assert conversation.checkpoints == {}


@pytest.mark.parametrize(("call", "result"), [(openai_call, openai_result), (anthropic_call, anthropic_result)])
def test_truncate_refuses_to_keep_a_tool_call_without_its_result(call, result) -> None:  # type: ignore[no-untyped-def]
    conversation = Conversation(id="c", messages=[user("hi"), call("x1"), result("x1"), user("again")])
    with pytest.raises(ConfigError, match="'x1' without its result"):
        conversation.truncate(2)
    with pytest.raises(ConfigError, match="without its result"):
        conversation.truncate(-2)
    assert len(conversation.messages) == 4  # nothing changed
    conversation.truncate(-1)
    assert len(conversation.messages) == 3


def test_truncate_refuses_out_of_range_indices() -> None:
    conversation = sample()
    for index in (4, -4, 1.5, True):
        with pytest.raises(ConfigError):
            conversation.truncate(index)  # type: ignore[arg-type]
    conversation.truncate(-3)
    assert conversation.messages == []


def test_fork_is_independent() -> None:
    conversation = sample()
    fork = conversation.fork("conv-2")
    assert fork.id == "conv-2" and fork.checkpoint_id == conversation.checkpoint_id
    fork.messages.append(user("only in the fork"))
    fork.messages[0]["content"] = "changed in the fork"
    fork.record_turn(b"\x01" * 40, "f1")
    fork.usage.add_run(status="error", wall_time_s=1.0)
    assert len(conversation.messages) == 3 and conversation.messages[0]["content"] == "hi"
    assert conversation.checkpoint_id == bytes.fromhex(CKPT)
    assert conversation.usage.runs == 1
    with pytest.raises(ConfigError):
        conversation.fork("conv-1")
    with pytest.raises(ConfigError):
        conversation.fork("bad/id")
    assert conversation.fork().id != conversation.id


def test_usage_sums_runs_and_keeps_the_peak() -> None:
    conversation = Conversation(id="u")
    conversation.usage.add_run(status="ok", wall_time_s=1.0, cpu_time_s=0.5, peak_memory_bytes=100, host_calls=1)
    conversation.usage.add_run(status="timeout", wall_time_s=2.0, peak_memory_bytes=50, bytes_stored=7)
    assert conversation.usage.runs == 2
    assert conversation.usage.by_status == {"ok": 1, "timeout": 1}
    assert conversation.usage.wall_time_s == 3.0
    assert conversation.usage.peak_memory_bytes == 100
    assert conversation.usage.bytes_stored == 7


def test_usage_keeps_unknown_figures_unknown_and_adds_model_calls() -> None:
    usage = Conversation(id="u").usage
    usage.add_run(status="ok", wall_time_s=1.0, turn_id="t1")
    assert usage.cpu_time_s is None and usage.peak_memory_bytes is None and usage.cost is None
    usage.add_run(status="ok", wall_time_s=1.0, cpu_time_s=0.5, peak_memory_bytes=0)
    assert usage.cpu_time_s == 0.5 and usage.peak_memory_bytes == 0  # measured as 0 is 0
    assert [(r.turn_id, r.cpu_time_s) for r in usage.records] == [("t1", None), (None, 0.5)]
    usage.add_model(input_tokens=100, output_tokens=20)
    assert usage.cost is None
    usage.add_model(input_tokens=50, output_tokens=5, cost=0.25)
    assert (usage.model_calls, usage.input_tokens, usage.output_tokens, usage.cost) == (2, 150, 25, 0.25)
    for bad in ({"input_tokens": -1}, {"output_tokens": 1.5}, {"cost": -0.1}, {"cost": float("nan")}):
        with pytest.raises(ConfigError):
            usage.add_model(**bad)  # type: ignore[arg-type]
    assert usage.model_calls == 2


def test_usage_of_an_earlier_snapcell_loads_and_state_round_trips() -> None:
    data = json.loads(sample().model_dump_json())
    data["usage"] = {"runs": 1, "by_status": {"ok": 1}, "wall_time_s": 0.5, "cpu_time_s": 0.0, "peak_memory_bytes": 0}
    data.pop("state")
    old = Conversation.model_validate(data)
    assert old.usage.runs == 1 and old.usage.records == [] and old.state == {}
    old.state["approval"] = {"pending": True}
    again = Conversation.model_validate_json(old.model_dump_json())
    assert again.state == {"approval": {"pending": True}}
    assert old.fork("f").state == old.state and old.fork("g").state is not old.state


def test_add_tool_result_answers_only_an_open_call() -> None:
    conversation = Conversation(id="r", messages=[user("hi"), openai_call("c1")])
    assert conversation.add_tool_result("nope", "x") is None
    assert conversation.add_tool_result("c1", "done") == 2
    assert conversation.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "done"}
    assert conversation.add_tool_result("c1", "again") is None and len(conversation.messages) == 3
    conversation.add_local_messages([anthropic_call("a1"), user("interrupting")])
    conversation.add_tool_result("a1", "late")  # not right after its call's message: a message of its own
    assert conversation.messages[-1] == anthropic_result("a1") | {
        "content": [{"type": "tool_result", "tool_use_id": "a1", "content": "late"}]
    }


def test_fork_with_a_count_returns_that_many_independent_forks() -> None:
    conversation = sample()
    forks = conversation.fork(count=3)
    assert isinstance(forks, list) and len(forks) == 3
    assert len({fork.id for fork in forks} | {conversation.id}) == 4
    assert all(fork.checkpoint_id == conversation.checkpoint_id for fork in forks)
    forks[0].messages.append(user("only in the first fork"))
    assert len(forks[1].messages) == len(conversation.messages) == 3
    for bad in ({"count": 0}, {"count": True}, {"new_id": "conv-9", "count": 2}):
        with pytest.raises(ConfigError):
            conversation.fork(**bad)  # type: ignore[call-overload]
