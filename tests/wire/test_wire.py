"""The host<->worker wire: plain data round trips as JSON, and hostile bytes fail cleanly and quickly."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import zoneinfo

import pytest

from snapcell import Limits, ScriptSyntaxError
from snapcell.errors import OutputLimitExceeded
from snapcell.wire import _budget, _wire
from snapcell.wire._budget import reply_budget
from snapcell.wire._wire import MalformedMessage, NotPlainData, check_script, decode, encode, split_parts, to_plain

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
    for _ in range(_budget.MAX_MESSAGE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(NotPlainData):
        encode({"value": deep})


def test_deeply_nested_message_fails_cleanly() -> None:
    for depth in (_budget.MAX_MESSAGE_DEPTH + 1, 500, 100_000):
        data = b'{"v":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(MalformedMessage, match="deeper|malformed"):
            decode(data)
    tuples = b'{"v":' + b'{"$t":[' * 40 + b"]}" * 40 + b"}"
    with pytest.raises(MalformedMessage):
        decode(tuples)
    # The limit is exact: the message dict plus MAX_MESSAGE_DEPTH - 1 lists decodes to that very nesting,
    # one list more does not.
    limit = _budget.MAX_MESSAGE_DEPTH
    expected: list[object] = []
    for _ in range(limit - 2):
        expected = [expected]
    ok = b'{"v":' + b"[" * (limit - 1) + b"]" * (limit - 1) + b"}"
    assert decode(ok) == {"v": expected}
    with pytest.raises(MalformedMessage, match="deeper"):
        decode(b'{"v":' + b"[" * limit + b"]" * limit + b"}")


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


def _hostile_megabytes() -> dict[str, bytes]:
    size = 1024 * 1024
    return {
        "keys": json.dumps({f"k{i}": i for i in range(size // 12)}).encode(),  # str keys: hashes cannot collide
        "many": b'{"v":[' + b",".join([b"[]"] * (size // 3)) + b"]}",
        "tags": b'{"v":[' + b",".join([b'{"$t":[{"$b":""}]}'] * (size // 18)) + b"]}",
        "strings": b'{"v":[' + b",".join([b'"[{,:"'] * (size // 7)) + b"]}",
        "wide_deep": b'{"v":[' + b",".join([b"[" * 30 + b"]" * 30] * (size // 61)) + b"]}",
    }


def test_a_hostile_megabyte_is_refused_by_the_run_budget_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A megabyte of dense items is over a run reply's item budget: it is refused without building anything."""
    budget = reply_budget("run", Limits())
    parses: list[int] = []
    real_parse = _wire._parse
    monkeypatch.setattr(_wire, "_parse", lambda raw: parses.append(1) or real_parse(raw))
    for name, data in _hostile_megabytes().items():
        assert len(data) >= 1024 * 1024 * 0.9, name
        with pytest.raises(MalformedMessage, match="items"):
            decode(data, max_items=budget.items)
    assert parses == []
    assert decode(encode({"v": list(range(1000))}), max_items=budget.items) == {"v": list(range(1000))}
    assert parses == [1]


def test_decoding_a_hostile_megabyte_visits_each_object_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the largest budget, decoding is one pass: each JSON object is seen once, nothing is walked again."""
    visits: list[int] = []
    real_untag = _wire._untag
    monkeypatch.setattr(_wire, "_untag", lambda obj: visits.append(1) or real_untag(obj))
    walked: list[int] = []
    real_split = _wire._split
    monkeypatch.setattr(_wire, "_split", lambda level: walked.append(len(level)) or real_split(level))
    for name, data in _hostile_megabytes().items():
        visits.clear()
        walked.clear()
        try:
            decode(data)
        except MalformedMessage:
            pass
        assert len(visits) <= data.count(b"{"), name
        # The depth check (only for text with many brackets) walks each container at most once.
        assert sum(walked) <= data.count(b"[") + data.count(b"{") + 1, name


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


@pytest.mark.parametrize("name", ["dump_time_s", "load_time_s", "max_value_bytes"])
def test_new_limits_are_validated(name: str) -> None:
    from snapcell import ConfigError

    for bad in (0, -1, True, "1", math.inf if name != "max_value_bytes" else 1.5):
        with pytest.raises(ConfigError, match=name):
            Limits(**{name: bad})
    Limits(**{name: None})  # no limit


def test_an_honest_reply_at_every_cap_fits_its_budget() -> None:
    """The largest ``ran`` reply a real worker can send (astral text at every cap) is within the run budget."""
    from snapcell.errors import ScriptError

    limits = Limits(max_output_bytes=4096, max_value_repr_bytes=2048, max_value_bytes=64 * 1024)
    wide = "\U0001f600"  # 12 bytes of JSON for one character
    error = ScriptError(wide * 10**5, exc_type=wide * 10**3, exc_message=wide * 10**5, traceback_text=wide * 10**5)
    value = "x" * (64 * 1024 - 20)
    reply = {
        "op": "ran",
        "value": value,
        "value_repr": wide * (2048 + 150),
        "stdout": wide * (4096 + 150),
        "stderr": wide * (4096 + 150),
        "duration_s": 1e300,
        "notes": [_wire.cut_text(wide * 10**4, _budget.MAX_NOTE_CHARS)] * _budget.MAX_NOTES,
        "error": _wire.error_to_plain(error),
        "memory_bytes": 2**63,
        "namespace_summary": wide * _budget.MAX_SUMMARY_CHARS,
    }
    assert len(encode({"v": value})) <= 64 * 1024
    data = encode(reply)
    budget = reply_budget("run", limits)
    assert len(data) <= budget.message_bytes
    assert _wire.count_items(data, budget.items) <= budget.items
    # ... and a frame only a little larger than the budget allows is not one a worker can send by accident.
    assert budget.message_bytes < 2 * len(data)


def test_error_texts_are_cut_on_both_sides() -> None:
    from snapcell.errors import ScriptError, UnpicklableValue

    plain = _wire.error_to_plain(ScriptError("m" * 10**6, hint="h" * 10**6, traceback_text="t" * 10**6))
    assert all(len(plain[key]) == _budget.MAX_ERROR_TEXT_CHARS for key in ("message", "hint", "traceback_text"))
    names = _wire.error_to_plain(UnpicklableValue("x", variable_names=["v" * 1000] * 10_000))["variable_names"]
    assert len(names) == _budget.MAX_ERROR_NAMES and all(len(n) == _budget.MAX_NAME_CHARS for n in names)
    rebuilt = _wire.error_from_plain({"class": "ScriptError", "message": "m" * 10**6, "hint": "h" * 10**6})
    assert len(str(rebuilt)) == len(rebuilt.hint) == _budget.MAX_ERROR_TEXT_CHARS
    assert "1000000 characters, cut" in str(rebuilt) and str(rebuilt).startswith("m") and str(rebuilt).endswith("m")


@pytest.mark.parametrize(
    "message",
    [
        {"$t": [1, 2]},
        {"op": "x", "v": {"$b": "not base64"}},
        {"op": "x", "v": {"$dict": ["a", 1]}},
        {"op": "x", "v": {"a": 1, "$t": 2}, "w": [None, True, 1.5, "s"]},
    ],
)
def test_flat_messages_written_on_the_quick_path_still_escape_dollar_keys(message: dict[str, object]) -> None:
    assert decode(encode(message)) == message


@pytest.mark.parametrize(
    "message",
    [
        {"op": "x", "v": [object()]},
        {"op": "x", "v": {1: "int key"}},
        {"op": "x", "v": {"a": {1, 2}}},
        {"op": "x", "v": 10**5000},
        {"op": "x", "v": [1, bytearray(b"not exact")]},
        {2: "int key at the top"},
    ],
)
def test_flat_messages_written_on_the_quick_path_are_still_checked(message: dict[str, object]) -> None:
    with pytest.raises(NotPlainData):
        encode(message)


def test_a_message_is_parsed_as_utf8_only() -> None:
    text = '{"op": "ran", "value": "\u00e9"}'
    assert decode(text.encode("utf-8")) == {"op": "ran", "value": "\u00e9"}
    with pytest.raises(MalformedMessage):
        decode(text.encode("utf-16"))


@pytest.mark.parametrize(
    "text", [b"{}", b'{"a":1}', b"[1,2,3,[4,5],{}]", b'{"a":[1,{"b":[2,3]}],"c":"x,y:z"}', b"[" * 40]
)
def test_the_short_text_shortcut_of_count_items_decides_as_the_full_count(text: bytes) -> None:
    def full_count(data: bytes, limit: int) -> int:  # count_items without its shortcut for short texts
        count = _wire._items_bound(data)
        return _wire._items_bound(_wire._string().sub(b"", data)) if count > limit else count

    for limit in range(1, 2 * len(text) + 2):
        assert (_wire.count_items(text, limit) > limit) == (full_count(text, limit) > limit), limit
