"""What a host function returns is checked in the host: plain data crosses, anything else is refused by name."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import pydantic

from snapcell.backends._hostcalls import PendingCall, call_host, finish_call
from snapcell.interpreter import HostCall


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Receipt:
    """A plain object: no plain form of its own."""


class Order(pydantic.BaseModel):
    id: int
    placed: datetime.date


def _reply(result: Any) -> tuple[dict[str, Any], list[HostCall]]:
    """The reply the worker gets when a host function ``lookup`` returns ``result``, and the call's record."""

    async def lookup() -> Any:
        return result

    async def call() -> dict[str, Any]:
        calls: list[HostCall] = []
        reply = call_host(
            {"op": "call", "id": 1, "name": "lookup", "args": [], "kwargs": {}}, {"lookup": lookup}, calls
        )
        if isinstance(reply, PendingCall):
            reply = await finish_call(reply, calls)
        return reply, calls

    return asyncio.run(call())


def test_a_dataclass_is_refused_with_a_message_that_says_what_to_return() -> None:
    reply, calls = _reply(Point(1, 2))
    assert "value" not in reply
    assert reply["error"]["type"] == "TypeError"
    message = reply["error"]["message"]
    assert message.startswith(f"lookup() returned a {__name__}.Point (a dataclass),"), message
    assert "dataclasses.asdict" in message
    assert calls[0].error is not None and "Point" in calls[0].error


def test_a_dataclass_inside_the_result_is_refused_the_same_way() -> None:
    message = _reply({"points": [Point(1, 2)]})[0]["error"]["message"]
    assert message.startswith(f"lookup() returned data holding a {__name__}.Point (a dataclass),"), message


def test_a_plain_object_is_named_by_its_type_without_internal_names() -> None:
    message = _reply(Receipt())[0]["error"]["message"]
    assert message.startswith(f"lookup() returned a {__name__}.Receipt, which cannot be sent to the script"), message
    assert "plain data (None, bools, numbers, strings, bytes, lists, tuples, dicts with str keys" in message
    set_message = _reply({1, 2})[0]["error"]["message"]
    assert set_message.startswith("lookup() returned a set, which cannot be sent"), set_message
    assert "builtins" not in set_message and "NotPlainData" not in set_message


def test_a_pydantic_model_crosses_as_its_model_dump() -> None:
    reply, calls = _reply([Order(id=7, placed=datetime.date(2024, 2, 29))])
    assert reply["value"] == [{"id": 7, "placed": datetime.date(2024, 2, 29)}]
    assert calls[0].error is None


def test_plain_data_crosses_as_itself() -> None:
    value = {"a": [1, 2.5, "x", b"y", None, (True,)], "when": datetime.date(2024, 1, 1)}
    assert _reply(value)[0]["value"] == value
