"""What plain data is: the only values that cross between host and worker, and `to_plain`, which copies one.

None, bool, int, float, str, bytes, list, tuple, dict with str keys, datetime values (date, datetime, time,
timedelta, timezone) and Decimal, nested to a bounded depth and size. `_wire` writes and reads them as messages.
"""

from __future__ import annotations

import sys
from typing import Any

from snapcell.wire._budget import MAX_DEPTH, MAX_ITEMS

__all__ = ["JSON_SCALARS", "SCALARS", "NotPlainData", "to_plain", "type_name", "value_kinds"]

# Larger ints are not plain data: CPython refuses to print or parse them as decimal text (and that is quadratic).
_MAX_INT_BITS = 13_000


JSON_SCALARS = frozenset((type(None), bool, int, float, str))
SCALARS = (type(None), bool, int, float, str, bytes)
# Once both modules are imported: see `value_kinds`.
_value_kinds: tuple[type, ...] | None = None


def value_kinds() -> tuple[type, ...]:
    """The plain kinds that are neither scalars nor containers: date, datetime, time, timedelta, timezone, Decimal.

    Only those whose module is imported: a value of one of these kinds comes from its module, so a worker imports
    neither module for runs that hold no such value (its first run, say).
    """
    global _value_kinds
    if _value_kinds is not None:
        return _value_kinds
    dates, numbers = sys.modules.get("datetime"), sys.modules.get("decimal")
    kinds: tuple[type, ...] = ()
    if dates is not None:
        kinds += (dates.date, dates.datetime, dates.time, dates.timedelta, dates.timezone)
    if numbers is not None:
        kinds += (numbers.Decimal,)
    if dates is not None and numbers is not None:
        _value_kinds = kinds
    return kinds


class NotPlainData(TypeError):
    """A value that cannot cross the boundary as plain data.

    Attributes:
        kind: The type of the value in the way when it is its type that is not plain data (else None: too many
            items, nested too deep, an int too large).
    """

    def __init__(self, message: str, kind: type | None = None) -> None:
        super().__init__(message)
        self.kind = kind


def type_name(kind: type) -> str:
    """A type's name as a person reads it: qualified with its module unless that is ``builtins`` or ``__main__``.

    Read through ``type``'s own descriptors, so a script class's metaclass runs nothing.
    """
    module = type.__dict__["__module__"].__get__(kind)
    name = type.__dict__["__qualname__"].__get__(kind)
    if not isinstance(module, str) or module in ("builtins", "__main__"):
        return str(name)
    return f"{module}.{name}"


def _fixed_offset(tzinfo: object) -> bool:
    """Whether ``tzinfo`` is a fixed offset (a ``datetime.timezone``), which the wire can carry."""
    import datetime  # imported already: a date or time holds it

    return type(tzinfo) is datetime.timezone


def _needs_no_walk(value: Any) -> bool:
    """Whether ``value`` is plain data as it is (a host function's usual result) or an empty dict or list (a host
    call's usual keyword arguments): nothing for `to_plain` to set up a walk for."""
    kind = type(value)
    if kind in JSON_SCALARS:
        return kind is not int or value.bit_length() <= _MAX_INT_BITS
    return (kind is dict or kind is list) and not value


def to_plain(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    """Copy ``value`` as plain data, or raise `NotPlainData` saying what is in the way.

    Only exact built-in types are accepted (a subclass of ``dict`` is not plain data); dict keys must
    be str; sets, complex numbers, ints over about 3,900 digits and datetimes whose tzinfo is not a
    ``datetime.timezone`` are not plain data.
    """
    if max_items > 0 and _needs_no_walk(value):
        return type(value)() if type(value) in (dict, list) else value
    budget = [max_items]
    values = value_kinds()

    def convert(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise NotPlainData(f"more than {max_items} items")
        kind = type(item)
        if kind in SCALARS:
            if kind is int and item.bit_length() > _MAX_INT_BITS:
                raise NotPlainData(f"an int of {item.bit_length()} bits is too large to be plain data")
            return item
        if kind in values:
            if kind.__name__ in ("datetime", "time") and item.tzinfo is not None and not _fixed_offset(item.tzinfo):
                raise NotPlainData(
                    f"a {kind.__name__} with a {type(item.tzinfo).__qualname__} tzinfo is not plain data"
                )
            return item
        if kind is bytearray:
            return bytes(item)
        if depth >= max_depth:
            raise NotPlainData(f"nested deeper than {max_depth} levels")
        if kind is list or kind is tuple:
            converted = [convert(x, depth + 1) for x in item]
            return converted if kind is list else tuple(converted)
        if kind is dict:
            out = {}
            for key, x in item.items():
                if type(key) is not str:
                    raise NotPlainData(
                        f"a dict with a {type(key).__qualname__} key is not plain data (keys must be str)"
                    )
                budget[0] -= 1
                out[key] = convert(x, depth + 1)
            return out
        raise NotPlainData(f"a value of type {type_name(kind)} is not plain data", kind)

    return convert(value, 0)
