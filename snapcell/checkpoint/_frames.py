"""Frames: the variables of a namespace cut into independent pickles, grouped only where they share objects.

Each variable is pickled alone first, by a fresh pickler. The pickler's memo lists every object the pickle holds
(by id); two variables whose memos hold the same mutable object (a list both refer to, a function and the dict it
reads) must come back sharing it, so they are merged (union-find over those ids) and pickled again together as one
frame. Everything else is its own frame: a value that fails to pickle, or to restore, costs only its own frame.

Only objects whose identity can matter are counted (`shared_ids`): containers, script functions and instances,
arrays. Atoms (str, numbers, tuples, classes, modules, code) and library objects pickled by reference are left
out: sharing them carries no meaning, and interned strings would otherwise merge everything. So are the objects
inside a class's own dict (methods, dataclass fields): snapcell restores a class once per load (its
tracker) however many frames hold it, and counting them would merge every pair of variables holding instances
of one class.

A large exact ``dict`` or ``list`` is cut into parts of a fixed number of items (key-value pairs or a slice; the
count is sized from its first items to make parts of about `PART_BYTES`), each its own pickle, when no object is
shared between parts. A part's bytes depend only on its items, so a turn that appends
to the list or adds keys to the dict changes the last part only; the others hash the same and are stored once as
blobs (`_pickle`). Fixed-count chunks keep appends (the common growth of an agent's state) cheap; an insertion in
the middle of a list re-stores the parts after it, which is no worse than storing the whole value.

A dict or list of fewer items is cut too when its pickle is large (`LARGE_VALUE_BYTES`): by bytes, into parts of
about `PART_BYTES` each and at least one item (`items_for_bytes`), so thirty 200 KB items appended one a turn are
stored once each rather than the whole list again every turn.
"""

from __future__ import annotations

import pickle
import types
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import compress, islice
from operator import itemgetter
from typing import Any

from cloudpickle.cloudpickle import _should_pickle_by_reference

from snapcell.checkpoint._stdvalues import keeps_identity

__all__ = [
    "CHUNK_ITEMS",
    "LARGE_VALUE_BYTES",
    "PART_BYTES",
    "Frame",
    "Part",
    "chunkable",
    "cut",
    "group_names",
    "items_for_bytes",
    "items_per_part",
    "shared_ids",
]

# The first this many items of a large dict or list are pickled to size its parts.
CHUNK_ITEMS = 512
# Parts are about this large (pickled): big enough that a value is a few store objects, small enough that an
# appending turn stores little.
PART_BYTES = 32 * 1024
_MIN_PART_ITEMS = 64
_MAX_PART_ITEMS = 1 << 16
# Values with fewer items than this are cut only when their pickle is over `LARGE_VALUE_BYTES`.
_CHUNK_MIN_ITEMS = 2 * CHUNK_ITEMS
# A dict or list of fewer items whose pickle (with its out-of-band buffers) is larger than this is cut by bytes.
LARGE_VALUE_BYTES = 4 * PART_BYTES


@dataclass(slots=True)
class Part:
    """One independent pickle: its bytes, out-of-band buffers, and the shareable objects it holds (by id)."""

    data: bytes
    buffers: list[pickle.PickleBuffer]
    ids: set[int]
    # The memo's objects, kept alive until grouping is done so that no id is reused by a later temporary.
    keep: list[Any] = field(default_factory=list)
    # The pickle is plain data (no global, no call, no buffer), as its pickler or the dump's scan found: the rule
    # refuses none of it, and restoring it cannot fail.
    plain: bool = False


@dataclass(slots=True)
class Frame:
    """Variables pickled together; ``layout`` says how the parts make their values (see `FrameInfo`)."""

    names: list[str]
    layout: str
    parts: list[Part]


def shared_ids(
    memo: dict[int, tuple[int, Any]], namespace: dict[str, Any], leave_out: object
) -> tuple[set[int], list[Any]]:
    """The ids of a pickler memo's objects whose identity can matter across variables, and the objects themselves.

    Counted: containers (list, dict, set, bytearray, deque), closure cells, script functions (their globals are
    the session namespace) other than methods, instances of script classes, numpy arrays and pandas frames.
    Not counted: atoms, anything of a library pickled by reference, what lives inside a class pickled by value
    (its dict's values and their own dicts, annotations and defaults), and ``leave_out``. A class pickled by
    reference brings none of its dict into the memo, so its dict is not looked at.

    Whether an object counts depends only on its type, except for functions and classes: the verdict is taken once
    per type (a memo of a DataFrame holds a thousand strings of one type), and the objects of counted types are
    picked out at C speed (a list of 100k dicts has 100k of them); only functions and classes are looked at one by
    one.
    """
    objects = list(map(itemgetter(1), memo.values()))
    types_of = list(map(type, objects))
    kinds = set(types_of)
    counted = {cls for cls in kinds if cls not in _ATOMS and cls is not types.FunctionType and _type_matters(cls)}
    # The memo's keys are its objects' ids.
    ids = set(compress(memo, map(counted.__contains__, types_of))) if counted else set()
    inside: set[int] = set()
    metaclasses = {cls for cls in kinds if issubclass(cls, type)}
    if metaclasses:
        for cls in compress(objects, map(metaclasses.__contains__, types_of)):
            if not _by_reference(cls):
                for value in vars(cls).values():
                    _add_internals(value, inside)
    if types.FunctionType in kinds:
        functions = compress(objects, map({types.FunctionType}.__contains__, types_of))
        ids.update(id(f) for f in functions if f.__globals__ is namespace and not _is_method(f))
    ids -= inside
    ids.discard(id(leave_out))
    return ids, objects


def _by_reference(cls: type) -> bool:
    """True when cloudpickle pickles ``cls`` by reference (module and name): then its dict is not in the memo."""
    if cls.__module__ == "builtins":
        return True
    return bool(_should_pickle_by_reference(cls))


def _add_internals(value: object, inside: set[int]) -> None:
    inside.add(id(value))
    if isinstance(value, dict):
        inside.update(id(v) for v in value.values())
    function = getattr(value, "__func__", value)  # classmethod / staticmethod
    if isinstance(function, types.FunctionType):
        inside.add(id(function))
        for part in (function.__dict__, function.__annotations__, function.__defaults__, function.__kwdefaults__):
            if part is not None:
                inside.add(id(part))


_CONTAINERS = (list, dict, set, bytearray, deque, types.CellType)
_DATA_TYPES = frozenset({("numpy", "ndarray"), ("pandas", "DataFrame"), ("pandas", "Series")})
# Immutable types that hold no reference a script could share: never counted, and passed over first.
_ATOMS = frozenset({str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range})


def _type_matters(cls: type) -> bool:
    """Whether objects of ``cls`` (other than functions) are counted: the type-only part of `shared_ids`' rule."""
    if issubclass(cls, _CONTAINERS) or keeps_identity(cls):
        return True
    module = cls.__module__
    return module == "__main__" or (module.split(".")[0], cls.__name__) in _DATA_TYPES


def _is_method(obj: types.FunctionType) -> bool:
    qualname = obj.__qualname__
    return "." in qualname and "<locals>" not in qualname.rsplit(".", 1)[0].rsplit(".", 1)[-1]


def chunkable(value: object) -> bool:
    """True for an exact dict or list large enough to be cut into parts."""
    return type(value) in (dict, list) and len(value) >= _CHUNK_MIN_ITEMS  # type: ignore[arg-type]


def items_per_part(sample_bytes: int) -> int:
    """Items per part, from the pickled size of the first `CHUNK_ITEMS` items: parts of about `PART_BYTES`.

    A power of two, so that small changes to the first items do not move every later part boundary.
    """
    wanted = CHUNK_ITEMS * PART_BYTES // max(sample_bytes, 1)
    return max(_MIN_PART_ITEMS, min(_MAX_PART_ITEMS, 1 << max(wanted, 1).bit_length() - 1))


def items_for_bytes(count: int, pickled_bytes: int) -> int:
    """Items per part for a value of ``count`` items that pickles to ``pickled_bytes``: parts of about `PART_BYTES`.

    At least one item a part; a power of two, like `items_per_part`, so that a part's boundaries do not move
    when the value grows by items of about the same size.
    """
    wanted = PART_BYTES * max(count, 1) // max(pickled_bytes, 1)
    return 1 << max(wanted, 1).bit_length() - 1


def cut(value: dict[Any, Any] | list[Any], per_part: int) -> tuple[str, list[list[Any]]]:
    """A dict or list as its layout and its parts of ``per_part`` items (key-value pairs, or slices)."""
    if isinstance(value, list):
        return "list", [value[start : start + per_part] for start in range(0, len(value), per_part)]  # C-speed copies
    items: Iterable[Any] = iter(value.items())
    parts = []
    while part := list(islice(items, per_part)):
        parts.append(part)
    return "dict", parts


def group_names(names: list[str], ids: dict[str, list[set[int]]]) -> list[list[str]]:
    """Union-find: names whose id sets (one or more each) meet end up in one group; groups keep ``names``' order.

    Most namespaces share nothing between variables: that is checked first with set operations, at C speed.
    """
    if len(names) > 1:
        seen: set[int] = set()
        for name in names:
            for part_ids in ids.get(name, ()):
                if not seen.isdisjoint(part_ids):
                    return _union_find(names, ids)
                seen |= part_ids
    return [[name] for name in names]


def _union_find(names: list[str], ids: dict[str, list[set[int]]]) -> list[list[str]]:
    parent = {name: name for name in names}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    owner: dict[int, str] = {}
    for name in names:
        for part_ids in ids.get(name, ()):
            for obj_id in part_ids:
                other = owner.setdefault(obj_id, name)
                if other != name:
                    a, b = find(other), find(name)
                    if a != b:
                        parent[b] = a
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(find(name), []).append(name)
    return list(groups.values())


def overlapping(parts: list[Part]) -> bool:
    """True when two parts hold one shareable object (the value cannot be cut there without losing identity)."""
    seen: set[int] = set()
    for part in parts:
        if not seen.isdisjoint(part.ids):
            return True
        seen |= part.ids
    return False
