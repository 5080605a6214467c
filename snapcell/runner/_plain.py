"""What plain data is: the only values that cross between host and worker, and `to_plain`, which copies one.

None, bool, int, float, str, bytes, list, tuple, dict with str keys, datetime values (date, datetime, time,
timedelta, timezone) and Decimal, nested to a bounded depth and size. `_wire` writes and reads them as messages.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from snapcell.runner._budget import MAX_DEPTH, MAX_ITEMS

__all__ = ["DATETIMES", "JSON_SCALARS", "SCALARS", "VALUES", "NotPlainData", "to_plain"]

# Larger ints are not plain data: CPython refuses to print or parse them as decimal text (and that is quadratic).
_MAX_INT_BITS = 13_000


JSON_SCALARS = frozenset((type(None), bool, int, float, str))
SCALARS = (type(None), bool, int, float, str, bytes)
VALUES = (datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone, decimal.Decimal)
DATETIMES = (datetime.datetime, datetime.time)


class NotPlainData(TypeError):
    """A value that cannot cross the boundary as plain data."""


def to_plain(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> Any:
    """Copy ``value`` as plain data, or raise `NotPlainData` saying what is in the way.

    Only exact built-in types are accepted (a subclass of ``dict`` is not plain data); dict keys must
    be str; sets, complex numbers, ints over about 3,900 digits and datetimes whose tzinfo is not a
    ``datetime.timezone`` are not plain data.
    """
    budget = [max_items]

    def convert(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise NotPlainData(f"more than {max_items} items")
        kind = type(item)
        if kind in SCALARS:
            if kind is int and item.bit_length() > _MAX_INT_BITS:
                raise NotPlainData(f"an int of {item.bit_length()} bits is too large to be plain data")
            return item
        if kind in VALUES:
            if kind in DATETIMES and item.tzinfo is not None and type(item.tzinfo) is not datetime.timezone:
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
        raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")

    return convert(value, 0)
