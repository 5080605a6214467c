"""What crosses between host and worker: frames, plain data, and errors rebuilt from a fixed table.

Only plain data crosses: None, bool, int, float, complex, str, bytes, list, tuple, dict, set,
datetime values and Decimal, nested to a bounded depth and size. Messages are pickled, but the
reading side uses an unpickler that can build nothing else, so the host never runs worker-made code.
"""

from __future__ import annotations

import datetime
import decimal
import io
import pickle
import struct
from typing import Any

from snapcell import errors

__all__ = [
    "MAX_MESSAGE_BYTES",
    "NotPlainData",
    "decode",
    "encode",
    "error_from_plain",
    "error_to_plain",
    "to_plain",
]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_DEPTH = 32
MAX_ITEMS = 2_000_000

FRAME = struct.Struct(">QQ")  # message length, blob length

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_VALUES = (datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone, decimal.Decimal)
_ALLOWED_GLOBALS = {
    ("datetime", "date"): datetime.date,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
}


class NotPlainData(TypeError):
    """A value that cannot cross the boundary as plain data."""


def to_plain(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    """Copy ``value`` as plain data, or raise `NotPlainData` saying what is in the way.

    Only exact built-in types are accepted (a subclass of ``dict`` is not plain data).
    """
    budget = [max_items]

    def convert(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise NotPlainData(f"more than {max_items} items")
        kind = type(item)
        if kind in _SCALARS or kind in _VALUES:
            return item
        if kind is bytearray:
            return bytes(item)
        if depth >= max_depth:
            raise NotPlainData(f"nested deeper than {max_depth} levels")
        if kind is list or kind is tuple:
            converted = [convert(x, depth + 1) for x in item]
            return converted if kind is list else tuple(converted)
        if kind is dict:
            return {convert(k, depth + 1): convert(v, depth + 1) for k, v in item.items()}
        if kind is set or kind is frozenset:
            return kind(convert(x, depth + 1) for x in item)
        raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")

    return convert(value, 0)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data") from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent references are not plain data")


def encode(message: dict[str, Any]) -> bytes:
    """Pickle a message of plain data."""
    return pickle.dumps(message, protocol=5)


def decode(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Read a message written by `encode`; only plain data can come out.

    Raises:
        pickle.UnpicklingError: The bytes hold anything but plain data, or are malformed.
    """
    try:
        message = _PlainUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError:
        raise
    except (EOFError, ValueError, TypeError, KeyError, IndexError, struct.error, RecursionError) as exc:
        raise pickle.UnpicklingError(f"malformed message: {exc}") from exc
    if type(message) is not dict:
        raise pickle.UnpicklingError("a message must be a dict")
    return message


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
    )
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


def error_to_plain(error: BaseException) -> dict[str, Any]:
    """Describe a snapcell error as plain data."""
    data: dict[str, Any] = {"class": type(error).__name__, "message": str(error)}
    for name in (*_FIELDS, "limit", "value", "variable_names"):
        if hasattr(error, name):
            try:
                data[name] = to_plain(getattr(error, name))
            except NotPlainData:
                continue
    return data


def error_from_plain(data: dict[str, Any]) -> errors.SnapcellError:
    """Rebuild an error described by `error_to_plain`; unknown classes become `ScriptError`."""
    name = str(data.get("class", ""))
    message = str(data.get("message", ""))
    fields = {k: data[k] for k in _FIELDS if k in data}
    for key in ("exc_type", "exc_message", "traceback_text", "hint"):
        fields[key] = str(fields.get(key) or "")
    for key in ("lineno",):
        fields[key] = fields.get(key) if isinstance(fields.get(key), int) else None
    fields["cell"] = str(fields["cell"]) if isinstance(fields.get("cell"), str) else None
    if name in _CHECKPOINT_ERRORS:
        cls = _CHECKPOINT_ERRORS[name]
        if cls is errors.UnpicklableValue:
            names = data.get("variable_names")
            return errors.UnpicklableValue(message, variable_names=[str(n) for n in names or ()])
        return cls(message)
    cls_script = _ERRORS.get(name, errors.ScriptError)
    if issubclass(cls_script, errors.LimitExceeded):
        value = data.get("value")
        return cls_script(
            message,
            limit=str(data.get("limit", "")),
            value=value if isinstance(value, int | float) else None,
            **fields,
        )
    return cls_script(message, **fields)
