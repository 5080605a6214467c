"""A run's value as it crosses from a worker to the host: as faithful as plain data allows.

The worker turns the value into plain data plus a few tags (`to_value`); the host rebuilds it from
those tags only (`VALUE_TAGS`, used by the wire decoder), never unpickling or calling anything the
script made:

- tuples, sets, frozensets, complex numbers, ranges, bytes, Decimals, dates and times, and dicts with
  keys of any of these kinds come back as themselves; subclasses of the built-in containers
  (``Counter``, ``OrderedDict``, a namedtuple) as the built-in container;
- numpy scalars as Python numbers; numpy arrays of numbers, booleans, dates or fixed-size strings, and
  pandas DataFrames and Series, rebuilt on the host from their dtype, shape and buffer bytes (numpy / pandas
  imported on the first such value) when the host can import numpy / pandas, else a `ScriptValue` (object
  arrays are not plain data);
- anything else as a `ScriptValue`: its type's name and its ``repr``, computed in the worker.

The host checks every tag before building anything: dtypes against a fixed grammar (never ``object``),
shapes against the bytes received, and the hashes of set members and dict keys (which a worker could
choose to collide) against a bound on repeats.
"""

from __future__ import annotations

import collections
import functools
import math
import re
import sys
from typing import TYPE_CHECKING, Any

from snapcell.wire._plain import type_name, value_kinds

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = ["MAX_FRAME_COLUMNS", "VALUE_TAGS", "ScriptValue", "Tagged", "imports_library", "to_value"]

MAX_DEPTH = 32
_MAX_INT_BITS = 13_000
_REPR_CHARS = 2000
_MAX_NDIM = 32
# A frame of more columns crosses as its repr (`ScriptValue`): the host builds each column as a block of its own,
# so a forged value of 40,000 one-row columns, a megabyte, cost it seconds to rebuild. The host refuses more.
MAX_FRAME_COLUMNS = 1000
# Set members or dict keys sharing one hash: each insertion compares with every earlier one, so a worker that
# sends many colliding ints (multiples of 2**61 - 1 all hash to 0) would make the host do quadratic work.
_MAX_SAME_HASH = 64


@dataclass(frozen=True, slots=True)
class ScriptValue:
    """A value from a worker that is not plain data: its type's name and its ``repr``, as text.

    Process mode only; inline mode returns the object itself. Nothing of the object reaches the host:
    the ``repr`` was computed in the worker and is capped.

    Attributes:
        type_name: The type's qualified name, with its module unless that is ``builtins`` or ``__main__``
            (``"Point"``, ``"fractions.Fraction"``).
        repr: The value's ``repr()`` in the worker, cut to a few thousand characters.
    """

    type_name: str
    repr: str

    def __repr__(self) -> str:
        return self.repr


class Tagged(tuple[str, Any]):
    """``(tag, payload)``: a value the wire encoder writes as the one-key JSON object ``{tag: payload}``."""

    __slots__ = ()


class _TooManyItems(Exception):
    """The value holds more items than the run's budget allows."""


def _cut(text: str, limit: int = _REPR_CHARS) -> str:
    return text if len(text) <= limit else f"{text[: limit - 40]} ...[{len(text)} characters, cut]"


def _script_value(item: Any, text: str | None = None) -> Tagged:
    if text is None:
        try:
            text = repr(item)
        except Exception as exc:  # a script's __repr__ may raise anything; the value is still reported
            text = f"<{type_name(type(item))} object; repr() failed: {type(exc).__name__}>"
        if type(text) is not str:
            text = f"<{type_name(type(item))} object>"
    return Tagged(("$sv", [_cut(type_name(type(item)), 256), _cut(text)]))


_SCALARS = (type(None), bool, int, float, str, bytes)


@functools.cache
def _dtype() -> re.Pattern[str]:
    """The dtypes an array may cross with; compiled on first use: a zygote says ready without it."""
    return re.compile(
        r"[<>|](?:b1|[iu][1248]|f(?:2|4|8|16)|c(?:8|16|32)|[SU]\d{1,6}|[mM]8\[(?:Y|M|W|D|h|m|s|ms|us|ns)\])"
    )


def to_value(value: Any, *, max_items: int, max_bytes: int | None = None, top_repr: str | None = None) -> Any:
    """Turn a run's value into what the wire encoder writes: plain data and `Tagged` pieces.

    Never fails for a value's type: what has no plain form becomes a `ScriptValue`. Runs in the worker
    (it may call the value's ``__repr__`` and numpy / pandas methods), never in the host.

    Args:
        value: The run's value.
        max_items: Most items (values, keys, array buffers count one each) the result may hold.
        max_bytes: Most bytes of array buffers the result may hold (None: no limit of its own).
        top_repr: The value's repr if already computed, used when the value itself is a `ScriptValue`.

    Raises:
        OverflowError: The value holds more than ``max_items`` items or ``max_bytes`` bytes of buffers.
    """
    converter = _Converter(max_items, sys.maxsize if max_bytes is None else max_bytes, top_repr)
    try:
        return converter.convert(value, 0)
    except _TooManyItems:
        raise OverflowError(f"more than {max_items} items or {max_bytes} bytes") from None


def _leaf(item: Any, kind: type, values: tuple[type, ...]) -> Any:
    """A scalar, date or number as plain data or a tag; `_NOT_LEAF` for anything else.

    ``values`` is `value_kinds()` (taken once per value: every date or Decimal in it was made before).
    """
    if kind in _SCALARS:
        if kind is int and item.bit_length() > _MAX_INT_BITS:
            return Tagged(("$sv", ["int", f"<int of {item.bit_length()} bits>"]))
        return item
    if kind in values:
        if kind.__name__ in ("datetime", "time") and item.tzinfo is not None:
            import datetime  # imported already: the value is one of its kinds

            if type(item.tzinfo) is not datetime.timezone:
                offset = item.utcoffset()
                if kind is not datetime.datetime or offset is None:
                    return _script_value(item)
                return item.replace(tzinfo=datetime.timezone(offset))  # the same instant and offset
        return item
    if kind is bytearray:
        return bytes(item)
    if kind is complex:
        return Tagged(("$c", [item.real, item.imag]))
    if kind is range:
        if max(abs(item.start), abs(item.stop), abs(item.step)).bit_length() > _MAX_INT_BITS:
            return _script_value(item)
        return Tagged(("$r", [item.start, item.stop, item.step]))
    return _NOT_LEAF


_NOT_LEAF = object()


class _Converter:
    """One value's conversion, with its item and buffer budgets."""

    def __init__(self, items: int, nbytes: int, top_repr: str | None) -> None:
        self.items = items
        self.nbytes = nbytes
        self.top_repr = top_repr
        self.values = value_kinds()

    def spend(self, items: int = 1, nbytes: int = 0) -> None:
        self.items -= items
        self.nbytes -= nbytes
        if self.items < 0 or self.nbytes < 0:
            raise _TooManyItems

    def convert(self, item: Any, depth: int) -> Any:
        self.spend()
        kind = type(item)
        leaf = _leaf(item, kind, self.values)
        if leaf is not _NOT_LEAF:
            return leaf
        if depth >= MAX_DEPTH:
            return _script_value(item)
        # The built-in methods, called unbound: a subclass's own __iter__ or items() is not run.
        if isinstance(item, list):
            return [self.convert(x, depth + 1) for x in list.__iter__(item)]
        if isinstance(item, tuple):
            return tuple([self.convert(x, depth + 1) for x in tuple.__iter__(item)])
        if isinstance(item, dict):
            pairs = list(dict.items(item))
            self.spend(len(pairs))
            if all(type(k) is str for k, _ in pairs):
                return {k: self.convert(x, depth + 1) for k, x in pairs}
            return Tagged(("$kv", [[self.convert(k, depth + 1), self.convert(x, depth + 1)] for k, x in pairs]))
        if isinstance(item, set):
            return Tagged(("$set", [self.convert(x, depth + 1) for x in set.__iter__(item)]))
        if isinstance(item, frozenset):
            return Tagged(("$fset", [self.convert(x, depth + 1) for x in frozenset.__iter__(item)]))
        library = _library_value(item, kind, depth, self)
        if library is not None:
            return library
        return _script_value(item, self.top_repr if depth == 0 else None)


def _library_value(item: Any, kind: type, depth: int, converter: _Converter) -> Any:
    """numpy and pandas values as plain data or tags; None for anything else."""
    convert = converter.convert
    module = type.__dict__["__module__"].__get__(kind)
    if not isinstance(module, str):
        return None
    top = module.partition(".")[0]
    numpy = sys.modules.get("numpy")
    if numpy is not None and top == "numpy":
        if isinstance(item, numpy.generic):
            if item.dtype.kind in "mM":
                return convert(item.astype(f"{item.dtype.kind}8[us]").item(), depth)
            if item.dtype.kind in "biufcSU":
                return convert(item.item(), depth)
            return None
        if type(item) is numpy.ndarray:
            converter.spend(nbytes=item.nbytes)
            return _array(numpy, item)
        return None
    pandas = sys.modules.get("pandas")
    if pandas is not None and top == "pandas":
        if type(item) is pandas.DataFrame:
            converter.spend(nbytes=int(item.memory_usage(index=True, deep=False).sum()))
            return _frame(numpy, pandas, item, convert, depth)
        if type(item) is pandas.Series:
            converter.spend(nbytes=int(item.memory_usage(index=True, deep=False)))
            return _series(numpy, pandas, item, convert, depth)
        if isinstance(item, pandas.Timestamp) and item is not pandas.NaT:
            return convert(item.to_pydatetime(warn=False), depth)
        if isinstance(item, pandas.Timedelta) and item is not pandas.NaT:
            return convert(item.to_pytimedelta(), depth)
    return None


def _array(numpy: Any, array: Any, text: str | None = None) -> Tagged | None:
    dtype = array.dtype.str
    if not _dtype().fullmatch(dtype) or array.dtype.itemsize == 0:
        return _script_value(array) if text is None else None
    data = numpy.ascontiguousarray(array).tobytes()
    if text is None:
        text = _cut(repr(array))
    return Tagged(("$nd", [dtype, list(array.shape), data, text]))


def _column(numpy: Any, values: Any, convert: Any, depth: int) -> Any:
    """One column (or index) of a frame: an array of its buffer, or a list of plain values."""
    if isinstance(values, numpy.ndarray) and values.dtype != object:
        tagged = _array(numpy, values, "")
        if tagged is not None:
            return tagged
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [convert(x, depth + 1) for x in items]


def _index(numpy: Any, pandas: Any, index: Any, convert: Any, depth: int) -> Any:
    if type(index) is pandas.RangeIndex:
        return convert(range(index.start, index.stop, index.step), depth)
    if isinstance(index, pandas.MultiIndex):
        return None
    return _column(numpy, index.to_numpy(), convert, depth)


def _plain_label(label: Any, convert: Any, depth: int) -> Any:
    return convert(label, depth + 1)


def _frame(numpy: Any, pandas: Any, frame: Any, convert: Any, depth: int) -> Any:
    if isinstance(frame.columns, pandas.MultiIndex) or frame.shape[1] > MAX_FRAME_COLUMNS:
        return None
    index = _index(numpy, pandas, frame.index, convert, depth)
    if index is None:
        return None
    columns = [_column(numpy, frame.iloc[:, i].to_numpy(), convert, depth) for i in range(frame.shape[1])]
    names = [_plain_label(name, convert, depth) for name in frame.columns.tolist()]
    label = _plain_label(frame.index.name, convert, depth)
    return Tagged(("$df", [names, index, label, columns, _cut(repr(frame))]))


def _series(numpy: Any, pandas: Any, series: Any, convert: Any, depth: int) -> Any:
    index = _index(numpy, pandas, series.index, convert, depth)
    if index is None:
        return None
    values = _column(numpy, series.to_numpy(), convert, depth)
    name, label = _plain_label(series.name, convert, depth), _plain_label(series.index.name, convert, depth)
    return Tagged(("$ser", [name, index, label, values, _cut(repr(series))]))


# ------------------------------------------------------------------ on the host


def _list(value: Any, what: str) -> list[Any]:
    if type(value) is not list:
        raise ValueError(f"{what} must be a list")
    return value


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{what} must be text")
    return value


def _few_collisions(items: list[Any]) -> list[Any]:
    """``items``, once no hash repeats more than `_MAX_SAME_HASH` times (else the set would cost quadratic time)."""
    if len(items) > _MAX_SAME_HASH:
        counts = collections.Counter(map(hash, items))
        if counts and max(counts.values()) > _MAX_SAME_HASH:
            raise ValueError(f"more than {_MAX_SAME_HASH} set members or dict keys share a hash")
    return items


def _pairs(value: Any) -> dict[Any, Any]:
    pairs = _list(value, "a $kv tag")
    if not all(type(p) is list and len(p) == 2 for p in pairs):
        raise ValueError("a $kv tag holds [key, value] pairs")
    _few_collisions([k for k, _ in pairs])
    return {k: v for k, v in pairs}


def _complex(value: Any) -> complex:
    parts = _list(value, "a $c tag")
    if len(parts) != 2 or not all(type(p) in (int, float) for p in parts):
        raise ValueError("a $c tag holds two numbers")
    return complex(parts[0], parts[1])


def _range(value: Any) -> range:
    parts = _list(value, "a $r tag")
    if len(parts) != 3 or not all(type(p) is int for p in parts):
        raise ValueError("a $r tag holds three ints")
    return range(*parts)


def _script(value: Any) -> ScriptValue:
    parts = _list(value, "a $sv tag")
    if len(parts) != 2:
        raise ValueError("a $sv tag holds a type name and a repr")
    return ScriptValue(_cut(_text(parts[0], "a type name"), 256), _cut(_text(parts[1], "a repr")))


# Modules this host failed to import: not tried again (each try searches the whole path).
_unavailable: set[str] = set()
# The tags whose values need a library, as they appear in a message, and the module each needs.
_LIBRARY_TAGS = ((b'"$nd"', "numpy"), (b'"$df"', "pandas"), (b'"$ser"', "pandas"))


def _has(module: str) -> Any:
    """The module ``module`` (numpy or pandas), imported on first use; None when the host cannot import it.

    Imported only when a value that needs it arrives, so a host whose runs return no arrays never loads numpy or
    pandas (tens of MiB). Importing runs only the host's own installation: what the worker sent is data still.
    """
    if module in _unavailable:
        return None
    import importlib  # here, not at the top: a worker (which never rebuilds values) does not load it

    try:
        # Even when the module is in sys.modules: another thread may be importing it still, and this waits for that.
        return importlib.import_module(module)
    except Exception:  # not installed, or broken (pandas built for another numpy fails with ValueError): no library
        _unavailable.add(module)
        return None


def imports_library(raw: bytes | bytearray) -> bool:
    """Whether decoding the message ``raw`` would first import numpy or pandas (an import best made off a loop)."""
    return any(module not in sys.modules and module not in _unavailable and tag in raw for tag, module in _LIBRARY_TAGS)


def _build_array(value: Any) -> Any:
    """An ndarray from ``[dtype, shape, data, repr]``, or a `ScriptValue` when the host cannot import numpy."""
    parts = _list(value, "a $nd tag")
    if len(parts) != 4:
        raise ValueError("a $nd tag holds dtype, shape, data and repr")
    dtype, shape, data, text = parts
    dtype, text = _text(dtype, "a dtype"), _text(text, "a repr")
    shape = _list(shape, "a shape")
    if not _dtype().fullmatch(dtype) or len(shape) > _MAX_NDIM or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError("a $nd tag holds a dtype or shape that is not allowed")
    if type(data) is not bytes:
        raise ValueError("a $nd tag's data must be bytes")
    numpy = _has("numpy")
    if numpy is None:
        return ScriptValue("numpy.ndarray", _cut(text))
    kind = numpy.dtype(dtype)
    if kind.hasobject or kind.itemsize == 0 or math.prod(shape) * kind.itemsize != len(data):
        raise ValueError("a $nd tag's data does not match its dtype and shape")
    return numpy.frombuffer(bytearray(data), dtype=kind).reshape(shape)


def _column_values(numpy: Any, column: Any, length: int) -> Any:
    if type(column) is list:
        values = column  # pandas infers the dtype, as it did in the worker (str columns, objects)
    elif numpy is not None and isinstance(column, numpy.ndarray) and column.ndim == 1:
        values = column
    else:
        raise ValueError("a column must be a list or a one-dimensional array")
    if len(values) != length:
        raise ValueError("a column's length differs from its index's")
    return values


def _build_index(pandas: Any, numpy: Any, index: Any, name: Any) -> Any:
    if type(index) is range:
        return pandas.RangeIndex(index.start, index.stop, index.step, name=name)
    values = _column_values(numpy, index, len(index) if isinstance(index, list | numpy.ndarray) else -1)
    return pandas.Index(values, name=name)


def _build_frame(value: Any) -> Any:
    parts = _list(value, "a $df tag")
    if len(parts) != 5:
        raise ValueError("a $df tag holds names, index, index name, columns and repr")
    names, index, label, columns, text = parts
    names, columns, text = _list(names, "column names"), _list(columns, "columns"), _text(text, "a repr")
    if len(names) != len(columns):
        raise ValueError("a $df tag has as many names as columns")
    if len(columns) > MAX_FRAME_COLUMNS:
        raise ValueError(f"a $df tag holds more than {MAX_FRAME_COLUMNS} columns")
    pandas, numpy = _has("pandas"), _has("numpy")
    if pandas is None or numpy is None:
        return ScriptValue("pandas.DataFrame", _cut(text))
    rows = _build_index(pandas, numpy, index, label)
    data = {i: _column_values(numpy, column, len(rows)) for i, column in enumerate(columns)}
    frame = pandas.DataFrame(data, index=rows, copy=False)
    if names:
        frame.columns = pandas.Index(names)
    return frame


def _build_series(value: Any) -> Any:
    parts = _list(value, "a $ser tag")
    if len(parts) != 5:
        raise ValueError("a $ser tag holds name, index, index name, values and repr")
    name, index, label, values, text = parts
    text = _text(text, "a repr")
    pandas, numpy = _has("pandas"), _has("numpy")
    if pandas is None or numpy is None:
        return ScriptValue("pandas.Series", _cut(text))
    rows = _build_index(pandas, numpy, index, label)
    return pandas.Series(_column_values(numpy, values, len(rows)), index=rows, name=name, copy=False)


# Tags a run's value may hold, and how the host rebuilds each (from plain data the decoder has already built).
VALUE_TAGS: dict[str, Any] = {
    "$set": lambda v: set(_few_collisions(_list(v, "a $set tag"))),
    "$fset": lambda v: frozenset(_few_collisions(_list(v, "a $fset tag"))),
    "$kv": _pairs,
    "$c": _complex,
    "$r": _range,
    "$sv": _script,
    "$nd": _build_array,
    "$df": _build_frame,
    "$ser": _build_series,
}
