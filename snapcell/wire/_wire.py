"""What crosses between host and worker: frames, plain data, and errors rebuilt from a fixed table.

Only plain data crosses: None, bool, int, float, str, bytes, list, tuple, dict with str keys,
datetime values (date, datetime, time, timedelta, timezone) and Decimal, nested to a bounded depth
and size. Messages are JSON: the reading side can build nothing but plain data, dict keys are str
(whose hashes are randomized per process, so a worker cannot make them collide), and a message
cannot share or cycle, so its size on the host is bounded by its bytes. Values JSON lacks travel as
one-key tagged objects (``{"$t": [...]}`` for a tuple, ``{"$b": "<base64>"}`` for bytes, ...); a
one-key dict whose key starts with ``$`` is escaped as ``{"$dict": [key, value]}``. What each frame may
hold (the protocol's size limits and each reply's budget) is in `_budget`.
"""

from __future__ import annotations

import binascii
import functools
import gc
import itertools
import json
import json.encoder
import re
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import snapcell.errors as errors
from snapcell.limits import Limits
from snapcell.wire._budget import (
    MAX_ERROR_NAMES,
    MAX_ERROR_TEXT_CHARS,
    MAX_MESSAGE_DEPTH,
    MAX_MESSAGE_ITEMS,
    MAX_NAME_CHARS,
)
from snapcell.wire._plain import JSON_SCALARS as _JSON_SCALARS
from snapcell.wire._plain import SCALARS as _SCALARS
from snapcell.wire._plain import NotPlainData, to_plain, type_name, value_kinds
from snapcell.wire._values import VALUE_TAGS, Tagged

if TYPE_CHECKING:
    import datetime

__all__ = [
    "FRAME",
    "MalformedMessage",
    "NotPlainData",
    "check_script",
    "count_items",
    "cut_text",
    "decode",
    "encode",
    "error_from_plain",
    "error_to_plain",
    "split_parts",
    "to_plain",
]

FRAME = struct.Struct(">QQ")  # message length, blob length

_CONTAINERS = frozenset((list, tuple, dict, Tagged))
# Messages up to this size are parsed with the cyclic GC left on (see `decode`).
_GC_PAUSE_BYTES = 4096


class MalformedMessage(ValueError):
    """Bytes from the other side that are not a well-formed message of plain data (a broken or hostile peer)."""


# ------------------------------------------------------------------ encoding


def _tag_value(value: Any) -> Any:
    """JSON for one non-JSON plain value; the encoder calls it for every type it does not know."""
    kind = type(value)
    if kind is bytes:
        return {"$b": binascii.b2a_base64(value, newline=False).decode("ascii")}  # base64.b64encode's own call
    # The module of a date or Decimal is imported already (see `value_kinds`); a worker imports neither for messages
    # without such values.
    module = kind.__module__
    if module == "datetime":
        import datetime

        if kind is datetime.datetime:
            return {"$dt": value.isoformat()}
        if kind is datetime.date:
            return {"$d": value.isoformat()}
        if kind is datetime.time:
            return {"$tm": value.isoformat()}
        if kind is datetime.timedelta:
            return {"$td": [value.days, value.seconds, value.microseconds]}
        if kind is datetime.timezone:
            offset, *name = value.__getinitargs__()
            return {"$tz": [offset.days, offset.seconds, offset.microseconds, name[0] if name else None]}
    elif module == "decimal":
        import decimal

        if kind is decimal.Decimal:
            return {"$dec": str(value)}
    raise NotPlainData(f"a value of type {type_name(kind)} is not plain data", kind)


def _tag_tree(value: Any) -> Any:
    """Copy a tree, turning tuples into ``$t`` tags and escaping one-key dicts whose key starts with ``$``.

    A container of JSON scalars only is checked at C speed and not copied item by item.
    """
    kind = type(value)
    if kind is Tagged:  # a run's value, tagged by snapcell.wire._values: written as is, never escaped
        return {value[0]: _tag_tree(value[1])}
    if kind is list:
        kinds = set(map(type, value))
        if kinds <= _JSON_SCALARS:
            return value
        if kinds == {tuple} and _JSON_SCALARS.issuperset(map(type, itertools.chain.from_iterable(value))):
            return [{"$t": row} for row in value]  # rows of scalars: the encoder writes each tuple as an array
        return [x if type(x) in _JSON_SCALARS else _tag_tree(x) for x in value]
    if kind is tuple:
        if _JSON_SCALARS.issuperset(map(type, value)):
            return {"$t": value}
        return {"$t": [x if type(x) in _JSON_SCALARS else _tag_tree(x) for x in value]}
    if kind is dict:
        if len(value) == 1:
            ((key, x),) = value.items()
            if _is_tag_like(key):
                return {"$dict": [key, _tag_tree(x)]}
        if _JSON_SCALARS.issuperset(map(type, value.values())):
            return value
        return {k: x if type(x) in _JSON_SCALARS else _tag_tree(x) for k, x in value.items()}
    return value


def _is_tag_like(key: Any) -> bool:
    return type(key) is str and key.startswith("$")


def _split(level: list[Any]) -> tuple[list[dict[Any, Any]], list[Any]]:
    """The dicts of a level of containers, and the values of all of them, gathered at C speed."""
    kinds = set(map(type, level))
    if dict not in kinds:
        return [], list(itertools.chain.from_iterable(level))
    dicts = level if len(kinds) == 1 else [node for node in level if type(node) is dict]
    seqs = [] if len(kinds) == 1 else [node for node in level if type(node) is not dict]
    return dicts, list(itertools.chain(itertools.chain.from_iterable(map(dict.values, dicts)), *seqs))


def _containers(values: list[Any]) -> list[Any]:
    return list(itertools.compress(values, map(_CONTAINERS.__contains__, map(type, values))))


def _depth(root: Any, max_depth: int) -> int:
    """How deep containers nest in ``root``, counted up to ``max_depth + 1``.

    The tree is walked a level at a time with C-level iteration only, so even many small containers
    (the rows of a table) cost no Python-level loop.
    """
    level = [root] if type(root) in _CONTAINERS else []
    depth = 0
    while level and depth <= max_depth:
        depth += 1
        level = _containers(_split(level)[1])
    return depth


# And `value_kinds`, whose modules may not be imported yet.
_PLAIN_KINDS = frozenset((*_SCALARS, list, tuple, dict, Tagged))


def _scan(root: Any, max_depth: int) -> tuple[int, set[type], set[type], bool]:
    """Like `_depth`; also gather the types of values and of dict keys, and whether a one-key ``$`` dict is there."""
    kinds: set[type] = {type(root)}
    key_kinds: set[type] = set()
    dollar = False
    level = [root] if type(root) in _CONTAINERS else []
    depth = 0
    while level and depth <= max_depth:
        depth += 1
        dicts, values = _split(level)
        if dicts:
            key_kinds.update(map(type, itertools.chain.from_iterable(dicts)))
            if not dollar and 1 in map(len, dicts):
                dollar = any(len(d) == 1 and _is_tag_like(next(iter(d))) for d in dicts)
        kinds.update(map(type, values))
        level = _containers(values)
    return depth, kinds, key_kinds, dollar


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_tag_value, check_circular=False)
# The C encoder `_ENCODER.encode` builds on every call, built once (the same settings); None without the C module.
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODER: Callable[[Any, int], Sequence[str]] | None = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(None, _tag_value, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
)


def _shallow(message: dict[str, Any]) -> bool:
    """Whether a message holds only JSON scalars, and flat lists and dicts of them (most frames are such).

    Such a message has nothing to tag or escape and is two levels deep at most, so `_scan` has nothing to find.
    """
    if len(message) == 1 and _is_tag_like(next(iter(message))):
        return False
    for key, value in message.items():
        kind = type(value)
        if type(key) is not str:
            return False
        if kind in _JSON_SCALARS:
            continue
        if kind is list:
            if not _JSON_SCALARS.issuperset(map(type, value)):
                return False
        elif kind is dict:
            if len(value) == 1 and _is_tag_like(next(iter(value))):
                return False
            if not _JSON_SCALARS.issuperset(map(type, value.values())) or not {str}.issuperset(map(type, value)):
                return False
        else:
            return False
    return True


def _write(tree: Any) -> str:
    if _C_ENCODER is not None:
        return "".join(_C_ENCODER(tree, 0))
    return _ENCODER.encode(tree)


def encode(message: dict[str, Any]) -> bytes:
    """Write a message of plain data (as `to_plain` makes it) as JSON bytes.

    Raises:
        NotPlainData: The message holds something else, or is nested deeper than `decode` accepts.
    """
    if type(message) is dict and _shallow(message):
        tree: Any = message
    else:
        depth, kinds, key_kinds, dollar = _scan(message, MAX_MESSAGE_DEPTH)
        if depth > MAX_MESSAGE_DEPTH:
            raise NotPlainData(f"the message is nested deeper than {MAX_MESSAGE_DEPTH} levels")
        odd = kinds - _PLAIN_KINDS
        if odd:
            odd = odd.difference(value_kinds())
        if odd or not key_kinds <= {str}:
            names = sorted(k.__qualname__ for k in odd | (key_kinds - {str}))
            raise NotPlainData(f"the message holds what is not plain data: {', '.join(names)}")
        # The JSON encoder writes a tuple as a list; a copy with tags is made only when a tuple is there.
        tree = _tag_tree(message) if dollar or tuple in kinds or Tagged in kinds else message
    try:
        return _write(tree).encode("ascii")
    except (ValueError, RecursionError) as exc:  # an int too large for text, a cycle
        raise NotPlainData(f"the message cannot be written: {exc}") from exc


# ------------------------------------------------------------------ decoding


def _expect(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise MalformedMessage(f"a tag holds a {type(value).__name__}, not a {kind.__name__}")
    return value


def _ints(value: Any, count: int) -> list[int]:
    if type(value) is not list or len(value) < count or any(type(n) is not int for n in value[:count]):
        raise MalformedMessage(f"a tag needs {count} ints")
    return value[:count]


def _timezone(value: Any) -> datetime.timezone:
    import datetime  # a worker imports it for the first message that holds a date or time, not before

    days, seconds, micros = _ints(value, 3)
    name = value[3] if len(value) == 4 else None
    offset = datetime.timedelta(days, seconds, micros)
    if name is None:
        return datetime.timezone(offset)
    return datetime.timezone(offset, _expect(name, str))


def _bytes(value: Any) -> bytes:
    import base64  # a worker imports it for the first message that holds bytes, not before

    return base64.b64decode(_expect(value, str), validate=True)


def _from_iso(name: str) -> Callable[[Any], Any]:
    """The decoder of a date, datetime or time tag (written with ``isoformat``)."""

    def untag(value: Any) -> Any:
        import datetime  # a worker imports it for the first message that holds a date or time, not before

        return getattr(datetime, name).fromisoformat(_expect(value, str))

    return untag


def _timedelta(value: Any) -> datetime.timedelta:
    import datetime  # as in `_from_iso`

    return datetime.timedelta(*_ints(value, 3))


def _decimal(value: Any) -> Any:
    import decimal  # a worker imports it for the first message that holds a Decimal, not before

    return decimal.Decimal(_expect(value, str))


def _one_key(value: Any) -> dict[str, Any]:
    if type(value) is not list or len(value) != 2 or type(value[0]) is not str:
        raise MalformedMessage("an escaped dict must be [key, value]")
    return {value[0]: value[1]}


_UNTAG: dict[str, Any] = {
    "$t": lambda v: tuple(_expect(v, list)),
    "$b": _bytes,
    "$dt": _from_iso("datetime"),
    "$d": _from_iso("date"),
    "$tm": _from_iso("time"),
    "$td": _timedelta,
    "$tz": _timezone,
    "$dec": _decimal,
    "$dict": _one_key,
    **VALUE_TAGS,  # only in a run's value, from snapcell.wire._values.to_value
}


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) != 1:
        return obj
    for key in obj:
        if key[:1] != "$":
            return obj
        untag = _UNTAG.get(key)
        if untag is None:
            raise MalformedMessage(f"unknown tag {key[:40]!r}")
        return untag(obj[key])
    return obj  # unreachable: the dict has one key


@functools.cache
def _string() -> re.Pattern[bytes]:
    """A JSON string, escapes included; removed before counting a message's items when the quick count is too high.

    Compiled on first use: a zygote says ready without it.
    """
    return re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _items_bound(data: bytes | bytearray) -> int:
    """An upper bound on the values in a JSON text: every value but the first follows one of ``[{,:``."""
    return data.count(b",") + data.count(b":") + data.count(b"[") + data.count(b"{") + 1


@functools.lru_cache(maxsize=4)
def _decoder(object_hook: Callable[[dict[str, Any]], Any]) -> json.JSONDecoder:
    return json.JSONDecoder(object_hook=object_hook)


def _parse(raw: bytes | bytearray) -> Any:
    """Parse JSON text (UTF-8; `encode` writes ASCII), every object through `_untag`, with a decoder built once."""
    return _decoder(_untag).decode(raw.decode("utf-8", "surrogatepass"))


def count_items(data: bytes | bytearray, limit: int) -> int:
    """An upper bound on the values in a JSON text, exact enough to compare with ``limit``.

    Separators are counted at C speed; only when that count is over ``limit`` are the strings (whose
    separators are not items) taken out and the count made again.
    """
    if len(data) < limit:  # every value but the first follows a separator byte: no text this short holds more
        return len(data) + 1
    count = _items_bound(data)
    if count > limit:
        count = _items_bound(_string().sub(b"", data))
    return count


def decode(data: bytes | bytearray | memoryview, *, max_items: int | None = None) -> dict[str, Any]:
    """Read a message written by `encode`; only plain data, within the depth and item budgets, comes out.

    The item budget is checked on the bytes, before anything is built.

    Args:
        data: The message's bytes.
        max_items: Most values the message may hold; `MAX_MESSAGE_ITEMS` by default.

    Raises:
        MalformedMessage: The bytes are not such a message.
    """
    raw = bytes(data) if isinstance(data, memoryview) else data
    limit = MAX_MESSAGE_ITEMS if max_items is None else max_items
    try:
        if count_items(raw, limit) > limit:
            raise MalformedMessage(f"the message holds more than {limit} items")
        # Parsing makes no cycles, so the cyclic GC has nothing to find; left on, it rescans the growing
        # tree again and again and makes decoding many small containers several times slower. A small message
        # (most frames) makes too few containers for that to matter.
        paused = len(raw) > _GC_PAUSE_BYTES and gc.isenabled()
        if paused:
            gc.disable()
        try:
            message = _parse(raw)
        finally:
            if paused:
                gc.enable()
        if len(raw) > MAX_MESSAGE_DEPTH and raw.count(b"[") + raw.count(b"{") > MAX_MESSAGE_DEPTH:  # else not too deep
            if _depth(message, MAX_MESSAGE_DEPTH) > MAX_MESSAGE_DEPTH:
                raise MalformedMessage(f"the message is nested deeper than {MAX_MESSAGE_DEPTH} levels")
    except MalformedMessage:
        raise
    except (ValueError, TypeError, KeyError, IndexError, ArithmeticError, RecursionError, binascii.Error) as exc:
        raise MalformedMessage(f"malformed message: {str(exc)[:200]}") from exc
    if type(message) is not dict:
        raise MalformedMessage("a message must be a dict")
    return message


def split_parts(data: bytes | bytearray | memoryview, sizes: Any) -> list[memoryview]:
    """Cut a frame's blob into consecutive parts of the given sizes, which must cover it exactly.

    Raises:
        MalformedMessage: ``sizes`` is not a list of non-negative ints adding up to the blob's length.
    """
    if type(sizes) is not list or not all(type(n) is int and n >= 0 for n in sizes):
        raise MalformedMessage("part sizes must be a list of non-negative ints")
    view = memoryview(data)
    if sum(sizes) != view.nbytes:
        raise MalformedMessage(f"part sizes add up to {sum(sizes)} bytes, not {view.nbytes}")
    offsets = list(itertools.accumulate(sizes, initial=0))
    return [view[start:end] for start, end in itertools.pairwise(offsets)]


def check_script(code: object, limits: Limits) -> errors.ScriptError | None:
    """The error for a script that must not be run (not text, or over ``max_script_bytes``), else None."""
    if not isinstance(code, str):
        return errors.ScriptSyntaxError(
            f"a script must be text (str), not {type(code).__name__}",
            hint="Pass the script's source code as a str.",
        )
    limit = limits.max_script_bytes
    # UTF-8 takes 1 to 4 bytes a character: count bytes only when the length alone cannot tell.
    if limit is None or len(code) * 4 <= limit:
        return None
    if len(code) <= limit and len(code.encode("utf-8", "surrogatepass")) <= limit:
        return None
    return errors.OutputLimitExceeded(
        f"the script is larger than Limits.max_script_bytes ({limit:,} bytes); nothing ran",
        limit="max_script_bytes",
        value=limit,
        hint="Send shorter scripts: read large data from a file or a host function instead of pasting it in.",
    )


# Script-facing errors that may come back from a worker, by class name.
_ERRORS: dict[str, type[errors.ScriptError]] = {
    cls.__name__: cls
    for cls in (
        errors.ScriptError,
        errors.ScriptSyntaxError,
        errors.PolicyError,
        errors.TypingError,
        errors.TimeLimitExceeded,
        errors.MemoryLimitExceeded,
        errors.OutputLimitExceeded,
        errors.RunCancelledError,
        errors.WorkspaceQuotaExceeded,
    )
}
# Workspace errors a worker reports for a file request (a bad path, a missing file).
_WORKSPACE_ERRORS: dict[str, type[errors.WorkspaceError]] = {
    cls.__name__: cls for cls in (errors.WorkspaceError, errors.WorkspacePathError)
}
_CHECKPOINT_ERRORS: dict[str, type[errors.SnapcellError]] = {
    cls.__name__: cls
    for cls in (
        errors.CheckpointCorrupt,
        errors.CheckpointVersionError,
        errors.UnpicklableValue,
        errors.CheckpointError,
    )
}
_FIELDS = ("exc_type", "exc_message", "traceback_text", "lineno", "cell", "hint")


_LONG_FIELDS = frozenset(("message", "exc_message", "traceback_text", "hint"))


def cut_text(text: str, limit: int) -> str:
    """``text``, or its start and end around a marker, in at most ``limit`` characters (``limit`` >= 64)."""
    if len(text) <= limit:
        return text
    marker = f" ...[{len(text)} characters, cut]... "
    keep = limit - len(marker)
    return f"{text[: keep // 4]}{marker}{text[len(text) - (keep - keep // 4) :]}"


def _cut_field(name: str, value: Any) -> Any:
    if type(value) is str:
        return cut_text(value, MAX_ERROR_TEXT_CHARS if name in _LONG_FIELDS else MAX_NAME_CHARS)
    if name == "variable_names" and type(value) is list:
        return [cut_text(str(n), MAX_NAME_CHARS) for n in value[:MAX_ERROR_NAMES]]
    return value


def error_to_plain(error: BaseException) -> dict[str, Any]:
    """Describe a snapcell error as plain data, its texts cut to the sizes the host accepts."""
    data: dict[str, Any] = {
        "class": cut_text(type(error).__name__, MAX_NAME_CHARS),
        "message": cut_text(str(error), MAX_ERROR_TEXT_CHARS),
    }
    for name in (*_FIELDS, "limit", "value", "variable_names", "path", "used_bytes"):
        if hasattr(error, name):
            try:
                data[name] = _cut_field(name, to_plain(getattr(error, name)))
            except NotPlainData:
                continue
    return data


def error_from_plain(data: Any) -> errors.SnapcellError:
    """Rebuild an error described by `error_to_plain`; unknown classes become `ScriptError`.

    Raises:
        MalformedMessage: ``data`` is not such a description.
    """
    if type(data) is not dict:
        raise MalformedMessage(f"an error must be described by a dict, not a {type(data).__name__}")
    name = str(data.get("class", ""))
    message = cut_text(str(data.get("message", "")), MAX_ERROR_TEXT_CHARS)
    fields = {k: data[k] for k in _FIELDS if k in data}
    for key in ("exc_type", "exc_message", "traceback_text", "hint"):
        fields[key] = cut_text(str(fields.get(key) or ""), MAX_ERROR_TEXT_CHARS)
    for key in ("lineno",):
        fields[key] = fields.get(key) if isinstance(fields.get(key), int) else None
    fields["cell"] = str(fields["cell"]) if isinstance(fields.get("cell"), str) else None
    if name in _CHECKPOINT_ERRORS:
        cls = _CHECKPOINT_ERRORS[name]
        if cls is errors.UnpicklableValue:
            names = data.get("variable_names")
            if names is not None and type(names) is not list:
                raise MalformedMessage("variable_names must be a list")
            return errors.UnpicklableValue(message, variable_names=[str(n) for n in (names or ())[:MAX_ERROR_NAMES]])
        return cls(message)
    if name in _WORKSPACE_ERRORS:
        path = data.get("path")
        return _WORKSPACE_ERRORS[name](message, path=cut_text(path, MAX_NAME_CHARS) if type(path) is str else None)
    cls_script = _ERRORS.get(name, errors.ScriptError)
    if cls_script is errors.WorkspaceQuotaExceeded:
        used, value = data.get("used_bytes"), data.get("value")
        return errors.WorkspaceQuotaExceeded(
            message,
            limit="workspace_bytes",
            value=value if type(value) is int else None,
            used_bytes=used if type(used) is int else 0,
            **fields,
        )
    if issubclass(cls_script, errors.LimitExceeded):
        value = data.get("value")
        return cls_script(
            message,
            limit=str(data.get("limit", ""))[:MAX_NAME_CHARS],
            value=value if isinstance(value, int | float) else None,
            **fields,
        )
    return cls_script(message, **fields)
