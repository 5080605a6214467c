"""One cheap line on the size of a session's namespace and its largest variables (`RunResult.namespace_summary`)."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

from snapcell.interpreter._host import HostFunction

__all__ = ["summarize_namespace"]


_SUMMARY_MAX_NAMES = 1000  # a huge namespace is summarized from its first names only
_SUMMARY_MAX_LIBRARY_SIZES = 16  # pandas' memory_usage costs ~100 µs; only this many per run
_SUMMARY_SAMPLE = 8
_SUMMARY_TOP = 3
_SUMMARY_NAME_LARGEST_BYTES = 1024 * 1024
# Types whose __sizeof__ is the interpreter's own: measured exactly, and no script code runs.
_EXACT_SIZE_TYPES = frozenset({int, float, complex, bool, str, bytes, bytearray, type(None), range})
_CONTAINER_TYPES = frozenset({list, tuple, set, frozenset, dict})
_SIZED_TYPES = _EXACT_SIZE_TYPES | _CONTAINER_TYPES
_LIBRARY_TYPES = frozenset(
    {
        ("numpy", "ndarray"),
        ("pandas", "DataFrame"),
        ("pandas", "Series"),
        ("pandas.core.frame", "DataFrame"),
        ("pandas.core.series", "Series"),
    }
)
_SKIPPED_TYPES = (types.ModuleType, HostFunction)


def summarize_namespace(namespace: dict[str, Any]) -> str:
    """One cheap line on the namespace's size and largest variables, for `RunResult.namespace_summary`.

    Only sizes the interpreter and known libraries compute are trusted (no script-defined ``__sizeof__`` runs):
    builtin scalars exactly, builtin containers from a sample of their first items, numpy arrays and pandas objects
    by their buffers; other objects count as variables of unknown size. The largest variables are named only when
    the namespace holds at least 1 MiB. Ten small variables take a few microseconds.
    """
    getsizeof = sys.getsizeof
    sized: list[tuple[int, str, str, bool]] = []  # size, name, type name, estimated
    count = total = 0
    estimated = False
    library_budget = _SUMMARY_MAX_LIBRARY_SIZES
    for name, value in itertools.islice(namespace.items(), _SUMMARY_MAX_NAMES):
        if name[:2] == "__":  # builtins, __name__, the result slot
            continue
        kind = type(value)
        sampled = False
        if kind in _EXACT_SIZE_TYPES:
            size = getsizeof(value)
        elif kind in _CONTAINER_TYPES:
            size = _container_size(value, kind)
            sampled = len(value) > _SUMMARY_SAMPLE
            estimated = estimated or sampled
        elif isinstance(value, _SKIPPED_TYPES):
            continue
        elif library_budget and (kind.__module__, kind.__qualname__) in _LIBRARY_TYPES:
            library_budget -= 1
            size = _library_size(value)
        else:
            count += 1
            estimated = True
            continue
        count += 1
        total += size
        sized.append((size, name, kind.__name__, sampled))
    if not count:
        return ""
    more = "+" if len(namespace) > _SUMMARY_MAX_NAMES else ""
    head = f"{count}{more} variable{'s' if count != 1 else ''}, {'~' if estimated else ''}{_format_size(total)}"
    if total < _SUMMARY_NAME_LARGEST_BYTES:
        return head
    sized.sort(reverse=True)
    largest = ", ".join(f"{n[:40]} ({t}, {'~' if e else ''}{_format_size(s)})" for s, n, t, e in sized[:_SUMMARY_TOP])
    return f"{head}; largest: {largest}"


def _container_size(value: Any, kind: type) -> int:
    size = sys.getsizeof(value)
    length = len(value)
    if not length:
        return size
    if kind is dict:
        if length <= _SUMMARY_SAMPLE:
            sample = [*value.keys(), *value.values()]
        else:
            sample = [
                *itertools.islice(value.keys(), _SUMMARY_SAMPLE),
                *itertools.islice(value.values(), _SUMMARY_SAMPLE),
            ]
        measured = sum([sys.getsizeof(part) for part in sample if type(part) in _SIZED_TYPES])
        return size + measured * length // min(length, _SUMMARY_SAMPLE)
    if length <= _SUMMARY_SAMPLE:
        return size + sum([sys.getsizeof(part) for part in value if type(part) in _SIZED_TYPES])
    sample = list(itertools.islice(value, _SUMMARY_SAMPLE))
    measured = sum([sys.getsizeof(part) for part in sample if type(part) in _SIZED_TYPES])
    return size + measured * length // _SUMMARY_SAMPLE


def _library_size(value: Any) -> int:
    if type(value).__name__ == "DataFrame":
        return _frame_size(value)
    if type(value).__name__ == "Series":
        return int(value.memory_usage(index=True, deep=False))
    return int(value.nbytes)


def _frame_size(frame: Any) -> int:
    """``frame.memory_usage(index=True, deep=False).sum()``, without building that Series.

    The Series costs ~2.5 ms of a fresh worker's turn (its first use of pandas' Series construction: ~700 pages
    copied from the zygote); the same sum is the index's size plus the bytes of each column array of the frame's
    manager (a block holding several columns holds exactly their bytes). Any other frame is measured as pandas does.
    """
    manager = getattr(frame, "_mgr", None)
    arrays = getattr(manager, "arrays", None)
    if type(arrays) is not list:
        return int(frame.memory_usage(index=True, deep=False).sum())
    return int(frame.index.memory_usage(deep=False)) + sum([int(array.nbytes) for array in arrays])


def _format_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
