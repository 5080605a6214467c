"""The host<->worker wire: plain data round trips as JSON, and hostile bytes fail cleanly and quickly."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import time
import zoneinfo

import pytest

from snapcell import Limits, OutputLimitExceeded, ScriptSyntaxError
from snapcell.runner import _wire
from snapcell.runner._wire import MalformedMessage, NotPlainData, check_script, decode, encode, split_parts, to_plain

CET = datetime.timezone(datetime.timedelta(hours=1), "CET")
ODD = datetime.timezone(-datetime.timedelta(hours=3, minutes=30, seconds=15, microseconds=7))
PLAIN = {
    "none": None,
    "bools": [True, False],
    "int": -(2**200),
    "float": 1.5,
    "inf": math.inf,
    "str": 'tëxt \ud800 with [brackets], {braces}: and "quotes"',
    "bytes": b"\x00\xffraw",
    "empty": ["", b"", [], (), {}],
    "tuple": (1, (2, [3, (4,)]), "x"),
    "list_of_tuples": [(1, "a"), (2, "b")],
    "date": datetime.date(2024, 2, 29),
    "datetime": datetime.datetime(2024, 2, 29, 12, 30, 1, 5),
    "aware": datetime.datetime(2024, 2, 29, 12, 30, tzinfo=CET),
    "odd_offset": datetime.datetime(2024, 1, 1, tzinfo=ODD),
    "time": datetime.time(23, 59, 59, 999_999, tzinfo=datetime.UTC),
    "timedelta": datetime.timedelta(days=-3, seconds=5, microseconds=1),
    "timezones": [datetime.UTC, CET, ODD],
    "decimal": [
        decimal.Decimal("3.14159265358979323846264338327950288"),
        decimal.Decimal("-0"),
        decimal.Decimal("1E+999999"),
    ],
    "tag_like": {"$t": [1, 2]},
    "tag_like_nested": [{"$b": {"$dict": "x"}}, {"$": 1, "$b": 2}],
    "nested": {"a": [{"b": ({"c": [b"d"]},)}]},
}


def test_every_plain_type_round_trips() -> None:
    message = {"op": "ran", "value": to_plain(PLAIN)}
    back = decode(encode(message))
    assert back == message
    value = back["value"]
    assert (
        type(value["tuple"]) is tuple and type(value["tuple"][1][1]) is list and type(value["tuple"][1][1][1]) is tuple
    )
    assert [type(row) for row in value["list_of_tuples"]] == [tuple, tuple]
    assert type(value["empty"][3]) is tuple and type(value["empty"][2]) is list
    assert type(value["bytes"]) is bytes
    assert value["aware"].utcoffset() == datetime.timedelta(hours=1)
    assert value["timezones"][1].tzname(None) == "CET"  # a timezone keeps its name
    assert str(value["decimal"][1]) == "-0" and str(value["decimal"][2]) == "1E+999999"
    nan = decode(encode({"v": [decimal.Decimal("NaN"), math.nan]}))["v"]
    assert nan[0].is_nan() and math.isnan(nan[1])
    assert type(value["nested"]["a"][0]["b"][0]["c"][0]) is bytes
    assert value["tag_like"] == {"$t": [1, 2]}  # a user dict that looks like a tag stays a dict


def test_bytearray_becomes_bytes() -> None:
    assert to_plain(bytearray(b"ab")) == b"ab"


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({1}),
        1 + 2j,
        {1: "a"},
        {("a", "b"): 1},
        {"ok": {None: 1}},
        datetime.datetime(2024, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        10**5000,
        type("D", (dict,), {})(),
        [object()],
    ],
    ids=[
        "set",
        "frozenset",
        "complex",
        "int-key",
        "tuple-key",
        "nested-none-key",
        "zoneinfo",
        "huge-int",
        "dict-sub",
        "obj",
    ],
)
def test_what_is_not_plain_data(value: object) -> None:
    with pytest.raises(NotPlainData):
        to_plain(value)


def test_encode_refuses_what_is_not_plain() -> None:
    with pytest.raises(NotPlainData):
        encode({"value": {1: "int keys would silently become text"}})
    with pytest.raises(NotPlainData):
        encode({"value": {1, 2}})
    deep: list[object] = []
    for _ in range(_wire.MAX_MESSAGE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(NotPlainData):
        encode({"value": deep})


def test_deeply_nested_message_fails_cleanly() -> None:
    for depth in (_wire.MAX_MESSAGE_DEPTH + 1, 500, 100_000):
        data = b'{"v":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(MalformedMessage, match="deeper|malformed"):
            decode(data)
    tuples = b'{"v":' + b'{"$t":[' * 40 + b"]}" * 40 + b"}"
    with pytest.raises(MalformedMessage):
        decode(tuples)
    ok = b'{"v":' + b"[" * (_wire.MAX_MESSAGE_DEPTH - 1) + b"]" * (_wire.MAX_MESSAGE_DEPTH - 1) + b"}"
    assert decode(ok)["v"] is not None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b'{"op": "ran"',
        b"[1, 2]",
        b'"text"',
        b'{"v": 1e999999999}x',
        b'{"v": ' + b"9" * 5000 + b"}",
        b"\xff\xfe",
        b'{"v": {"$t": 1}}',
        b'{"v": {"$b": "not base64!"}}',
        b'{"v": {"$dt": "yesterday"}}',
        b'{"v": {"$dec": "one"}}',
        b'{"v": {"$td": [1, 2]}}',
        b'{"v": {"$td": [999999999999, 0, 0]}}',
        b'{"v": {"$tz": [0, 99999, 0, null]}}',
        b'{"v": {"$tz": [0, 0, 0, 7]}}',
        b'{"v": {"$dict": [1, 2]}}',
        b'{"v": {"$unknown": 1}}',
    ],
)
def test_malformed_bytes_raise_malformed_message(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode(data)


def _time(data: bytes) -> float:
    start = time.perf_counter()
    try:
        decode(data)
    except MalformedMessage:
        pass
    return time.perf_counter() - start


def test_decoding_a_hostile_megabyte_is_fast() -> None:
    size = 1024 * 1024
    keys = json.dumps({f"k{i}": i for i in range(size // 12)}).encode()  # str keys: hashes cannot be made to collide
    many = b'{"v":[' + b",".join([b"[]"] * (size // 3)) + b"]}"
    tags = b'{"v":[' + b",".join([b'{"$t":[{"$b":""}]}'] * (size // 18)) + b"]}"
    strings = b'{"v":[' + b",".join([b'"[{,:"'] * (size // 7)) + b"]}"
    wide_deep = b'{"v":[' + b",".join([b"[" * 30 + b"]" * 30] * (size // 61)) + b"]}"
    for data in (keys, many, tags, strings, wide_deep):
        assert len(data) >= size * 0.9
        assert _time(data) < 0.5


def test_item_budget_is_checked_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wire, "MAX_MESSAGE_ITEMS", 1000)
    with pytest.raises(MalformedMessage, match="items"):
        decode(encode({"v": [0] * 2000}))
    # Separators inside strings are not items: one long CSV text is fine.
    assert decode(encode({"v": ",:[{" * 5000}))["v"] == ",:[{" * 5000


def test_split_parts() -> None:
    data = bytearray(b"bodyab")
    assert [bytes(p) for p in split_parts(data, [4, 1, 1])] == [b"body", b"a", b"b"]
    assert [bytes(p) for p in split_parts(b"", [0])] == [b""]
    for sizes in ([4, 1], [4, 1, 2], [7, -1], [4, 1, 1.0], "6", None, [True, 5]):
        with pytest.raises(MalformedMessage):
            split_parts(data, sizes)


def test_check_script() -> None:
    limits = Limits(max_script_bytes=10)
    assert check_script("x = 1", limits) is None
    assert check_script("é" * 5, limits) is None  # 10 bytes in UTF-8
    assert isinstance(check_script("é" * 6, limits), OutputLimitExceeded)
    error = check_script("x" * 11, limits)
    assert isinstance(error, OutputLimitExceeded) and error.limit == "max_script_bytes" and error.value == 10
    assert check_script("x" * 10**6, Limits(max_script_bytes=None)) is None
    for code in (None, 123, b"1+1"):
        assert isinstance(check_script(code, limits), ScriptSyntaxError)


def test_max_script_bytes_is_validated() -> None:
    from snapcell import ConfigError

    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError):
            Limits(max_script_bytes=bad)  # type: ignore[arg-type]
    assert Limits().max_script_bytes == 1024 * 1024
