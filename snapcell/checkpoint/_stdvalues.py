"""Standard-library values that their own pickles cannot bring back through the checkpoint rule, kept as plain data.

asyncio's primitives and queues, ``io.StringIO``/``io.BytesIO`` and ``zoneinfo.ZoneInfo`` pickle through private
names (``_io.StringIO``, ``ZoneInfo._unpickle``) or carry loop state, so the rule refuses them. The worker's pickler
turns each into a call of one of the helpers below with plain data instead: a short ``spec`` string (kind, sizes,
positions, flags) and at most one content value (the text, the bytes, the queue's items, a condition's lock). The
rule checks those arguments (`call_refusal`, for both the host's scan and the loader), so a hand-written stream can
only build these values, with bounded numbers, and nothing else.

Between turns no task survives, so waiters are not kept; a primitive comes back unbound to any event loop (they
bind to the running loop on first use), so the next turn's loop can use it. Exact types only: a script's subclass
pickles as before (and is dropped and named if the rule refuses it).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any, Final

from snapcell._support import HELPERS_MODULE, pickled_helper

__all__ = ["MODULE", "VALUE_HELPERS", "keeps_identity", "std_reducers", "value_call_refusal"]

# Checkpoints name the helpers by their stable path (`snapcell.checkpoint.helpers`), not by this module.
MODULE: Final = HELPERS_MODULE
_MAX_COUNT = 2**31 - 1  # semaphore values, queue sizes, unfinished tasks, stream positions
_MAX_SPEC = 64
_MAX_ZONE_KEY = 128
_NUMBER = r"(0|[1-9][0-9]{0,9})"  # no sign, no leading zeros, at most ten digits (then bounded by _MAX_COUNT)

# Helper kinds (how `call_refusal` checks the arguments), one per helper.
_LOCK: Final = "asyncio lock spec"
_EVENT: Final = "asyncio event spec"
_SEMAPHORE: Final = "asyncio semaphore spec"
_CONDITION: Final = "asyncio condition"
_QUEUE: Final = "asyncio queue spec and items"
_STRINGIO: Final = "StringIO spec and text"
_BYTESIO: Final = "BytesIO spec and bytes"
_ZONEINFO: Final = "zoneinfo key"

VALUE_HELPERS: dict[tuple[str, str], str] = {
    (MODULE, "rebuild_lock"): _LOCK,
    (MODULE, "rebuild_event"): _EVENT,
    (MODULE, "rebuild_semaphore"): _SEMAPHORE,
    (MODULE, "rebuild_condition"): _CONDITION,
    (MODULE, "rebuild_queue"): _QUEUE,
    (MODULE, "rebuild_stringio"): _STRINGIO,
    (MODULE, "rebuild_bytesio"): _BYTESIO,
    (MODULE, "rebuild_zoneinfo"): _ZONEINFO,
}

_LOCK_SPEC = re.compile(r"(locked|unlocked)")
_EVENT_SPEC = re.compile(r"(set|clear)")
_SEMAPHORE_SPEC = re.compile(rf"Semaphore:{_NUMBER}|BoundedSemaphore:{_NUMBER}/{_NUMBER}")
_QUEUE_SPEC = re.compile(rf"(Queue|LifoQueue|PriorityQueue):{_NUMBER}:{_NUMBER}")
_STRINGIO_SPEC = re.compile(rf"(universal|untranslated|lf|cr|crlf):{_NUMBER}")
_BYTESIO_SPEC = re.compile(_NUMBER)
# tz database keys: path segments of letters, digits, '_', '+' and '-' (no dots: no '..', no hidden files).
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*")
_MODULES = {
    _LOCK: "asyncio",
    _EVENT: "asyncio",
    _SEMAPHORE: "asyncio",
    _CONDITION: "asyncio",
    _QUEUE: "asyncio",
    _STRINGIO: "io",
    _BYTESIO: "io",
    _ZONEINFO: "zoneinfo",
}
_SPECS = {
    _LOCK: _LOCK_SPEC,
    _EVENT: _EVENT_SPEC,
    _SEMAPHORE: _SEMAPHORE_SPEC,
    _QUEUE: _QUEUE_SPEC,
    _STRINGIO: _STRINGIO_SPEC,
    _BYTESIO: _BYTESIO_SPEC,
}
_NEWLINES: dict[str, str | None] = {"universal": None, "untranslated": "", "lf": "\n", "cr": "\r", "crlf": "\r\n"}
_NEWLINE_NAMES = {value: name for name, value in _NEWLINES.items()}


# ------------------------------------------------------------------ the rule for their arguments


def _unknown(value: object) -> bool:
    """True for the scanner's stand-in for a value it does not track (a loaded object is never one)."""
    scan = sys.modules.get("snapcell.checkpoint.scan._scanvalues")
    return scan is not None and (value is scan.OPAQUE or value is scan.FOREIGN)


def _spec(pattern: re.Pattern[str], spec: object) -> re.Match[str] | str:
    if not isinstance(spec, str):
        return "its spec is not a constant string"
    if len(spec) > _MAX_SPEC:
        return "its spec is too long"
    match = pattern.fullmatch(spec)
    if match is None:
        return f"{spec[:40]!r} is not a valid spec"
    if any(int(number) > _MAX_COUNT for number in match.groups() if number is not None and number.isdigit()):
        return "a number in its spec is too large"
    return match


def _number(match: re.Match[str], group: int) -> int:
    return int(match.group(group))


def value_call_refusal(
    kind: str, args: tuple[Any, ...], allow_module: Callable[[str], bool] | None = None
) -> str | None:
    """Why one of this module's helpers may not be called with ``args`` (None: it may).

    The host's scanner passes the constants it tracked (content it does not track is accepted there and checked
    at load); the loader passes the real arguments. With ``allow_module``, the module of the value's type must be
    one the policy lets scripts import.
    """
    module = _MODULES.get(kind)
    if module is None:
        return "an unknown helper"
    if allow_module is not None and not allow_module(module):
        return f"a value of the module {module}, which the policy does not allow"
    arity = 1 if kind in (_LOCK, _EVENT, _SEMAPHORE, _CONDITION, _ZONEINFO) else 2
    if len(args) != arity:
        return f"it takes {arity} argument{'s' if arity > 1 else ''}"
    if kind == _CONDITION:
        lock_type = getattr(sys.modules.get("asyncio"), "Lock", None)
        ok = _unknown(args[0]) or (lock_type is not None and type(args[0]) is lock_type)
        return None if ok else "its lock is not an asyncio.Lock"
    if kind == _ZONEINFO:
        key = args[0]
        if not isinstance(key, str) or len(key) > _MAX_ZONE_KEY or _ZONE_KEY.fullmatch(key) is None:
            return "not a time zone key"
        return None
    match = _spec(_SPECS[kind], args[0])
    if isinstance(match, str):
        return match
    if kind == _SEMAPHORE and match.group(2) is not None and _number(match, 2) > _number(match, 3):
        return "a bounded semaphore above its bound"
    if kind == _QUEUE:
        return _sized_content(args[1], list, _number(match, 2), "more items than its maxsize")
    if kind in (_STRINGIO, _BYTESIO):
        position = _number(match, 2 if kind == _STRINGIO else 1)
        return _sized_content(args[1], str if kind == _STRINGIO else bytes, position, "a position past its end")
    return None


def _sized_content(value: object, expected: type, bound: int, beyond: str) -> str | None:
    """``value`` must be exactly of type ``expected`` (or unknown to the scanner) and fit ``bound``.

    For a queue, ``bound`` is its maxsize (0: unbounded), which its items must not exceed; for a buffer, it is the
    position, which must not be past the end.
    """
    if not (type(value) is expected or _unknown(value)):
        return f"its content is a {type(value).__name__}, not a {expected.__name__}"
    if not isinstance(value, list | str | bytes):
        return None  # unknown to the scanner: checked at load
    if expected is list:
        return beyond if bound and len(value) > bound else None
    return beyond if bound > len(value) else None


def _checked(kind: str, *args: Any) -> None:
    """The rule again, inside the helper: it holds however the helper was reached."""
    problem = value_call_refusal(kind, args)
    if problem is not None:
        raise TypeError(f"refused: {problem}")


# ------------------------------------------------------------------ the helpers (called at load)


@pickled_helper
def rebuild_lock(spec: str) -> Any:
    """An ``asyncio.Lock``, locked or not, bound to no loop."""
    import asyncio

    _checked(_LOCK, spec)
    lock: Any = asyncio.Lock()
    lock._locked = spec == "locked"
    return lock


@pickled_helper
def rebuild_event(spec: str) -> Any:
    """An ``asyncio.Event``, set or not, bound to no loop."""
    import asyncio

    _checked(_EVENT, spec)
    event = asyncio.Event()
    if spec == "set":
        event.set()
    return event


@pickled_helper
def rebuild_semaphore(spec: str) -> Any:
    """An ``asyncio.Semaphore`` (``Semaphore:value``) or ``BoundedSemaphore`` (``BoundedSemaphore:value/bound``)."""
    import asyncio

    _checked(_SEMAPHORE, spec)
    kind, _, numbers = spec.partition(":")
    if kind == "Semaphore":
        return asyncio.Semaphore(int(numbers))
    value, _, bound = numbers.partition("/")
    semaphore = asyncio.BoundedSemaphore(int(bound))
    semaphore._value = int(value)
    return semaphore


@pickled_helper
def rebuild_condition(lock: Any) -> Any:
    """An ``asyncio.Condition`` around ``lock`` (restored on its own, so a lock shared with a variable stays so)."""
    import asyncio

    _checked(_CONDITION, lock)
    return asyncio.Condition(lock)


@pickled_helper
def rebuild_queue(spec: str, items: list[Any]) -> Any:
    """An ``asyncio.Queue``/``LifoQueue``/``PriorityQueue`` (``Kind:maxsize:unfinished``) holding ``items``."""
    import asyncio
    import collections

    _checked(_QUEUE, spec, items)
    kind, maxsize, unfinished = spec.split(":")
    queue = getattr(asyncio, kind)(int(maxsize))
    # The stored order as is: a priority queue's list is its heap (no comparisons of script objects at load).
    queue._queue = collections.deque(items) if kind == "Queue" else list(items)
    queue._unfinished_tasks = int(unfinished)
    if queue._unfinished_tasks:
        queue._finished.clear()
    return queue


@pickled_helper
def rebuild_stringio(spec: str, text: str) -> Any:
    """An ``io.StringIO`` (``newline-mode:position``) holding ``text`` as stored, without newline translation."""
    import io

    _checked(_STRINGIO, spec, text)
    mode, _, position = spec.partition(":")
    newline = _NEWLINES[mode]
    buffer: Any = io.StringIO(newline=newline)
    buffer.__setstate__((text, newline, int(position), None))
    return buffer


@pickled_helper
def rebuild_bytesio(spec: str, data: bytes) -> Any:
    """An ``io.BytesIO`` (``position``) holding ``data``."""
    import io

    _checked(_BYTESIO, spec, data)
    buffer = io.BytesIO(data)
    buffer.seek(int(spec))
    return buffer


@pickled_helper
def rebuild_zoneinfo(key: str) -> Any:
    """``zoneinfo.ZoneInfo(key)``."""
    import zoneinfo

    _checked(_ZONEINFO, key)
    return zoneinfo.ZoneInfo(key)


# ------------------------------------------------------------------ the reducers (called at dump)

Reducer = Callable[[Any], tuple[Callable[..., Any], tuple[Any, ...]]]


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise ValueError(f"its {what} ({value!r:.40}) is out of range")
    return value


def _reduce_lock(lock: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return rebuild_lock, ("locked" if lock.locked() else "unlocked",)


def _reduce_event(event: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return rebuild_event, ("set" if event.is_set() else "clear",)


def _reduce_semaphore(semaphore: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    value = _count(semaphore._value, "value")
    if type(semaphore).__name__ == "BoundedSemaphore":
        return rebuild_semaphore, (f"BoundedSemaphore:{value}/{_count(semaphore._bound_value, 'bound')}",)
    return rebuild_semaphore, (f"Semaphore:{value}",)


def _reduce_condition(condition: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return rebuild_condition, (condition._lock,)


def _reduce_queue(queue: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    if getattr(queue, "_is_shutdown", False):
        raise ValueError("a queue that was shut down is not kept")
    maxsize = _count(max(queue.maxsize, 0), "maxsize")  # any maxsize <= 0 means unbounded
    unfinished = _count(queue._unfinished_tasks, "count of unfinished tasks")
    return rebuild_queue, (f"{type(queue).__name__}:{maxsize}:{unfinished}", list(queue._queue))


def _reduce_stringio(buffer: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    text, newline, position, attributes = buffer.__getstate__()  # raises ValueError when closed
    if attributes:
        raise ValueError("attributes set on a StringIO are not kept")
    return rebuild_stringio, (f"{_NEWLINE_NAMES[newline]}:{_count(position, 'position')}", text)


def _reduce_bytesio(buffer: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    data, position, attributes = buffer.__getstate__()  # raises ValueError when closed
    if attributes:
        raise ValueError("attributes set on a BytesIO are not kept")
    return rebuild_bytesio, (str(_count(position, "position")), data)


def _reduce_zoneinfo(zone: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    if zone.key is None:
        raise ValueError("a ZoneInfo made from a file has no key to restore it by")
    return rebuild_zoneinfo, (zone.key,)


_loaded: tuple[bool, bool] | None = None
_table: dict[type, Reducer] = {}


def std_reducers() -> dict[type, Reducer]:
    """The reducers by exact type, for the modules loaded so far (a type whose module is not loaded has no values)."""
    global _loaded, _table
    loaded = ("asyncio" in sys.modules, "zoneinfo" in sys.modules)
    if loaded == _loaded:
        return _table
    import io

    table: dict[type, Reducer] = {io.StringIO: _reduce_stringio, io.BytesIO: _reduce_bytesio}
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        table.update(
            {
                asyncio.Lock: _reduce_lock,
                asyncio.Event: _reduce_event,
                asyncio.Semaphore: _reduce_semaphore,
                asyncio.BoundedSemaphore: _reduce_semaphore,
                asyncio.Condition: _reduce_condition,
                asyncio.Queue: _reduce_queue,
                asyncio.LifoQueue: _reduce_queue,
                asyncio.PriorityQueue: _reduce_queue,
            }
        )
    zoneinfo = sys.modules.get("zoneinfo")
    if zoneinfo is not None:
        table[zoneinfo.ZoneInfo] = _reduce_zoneinfo
    _loaded, _table = loaded, table
    return table


def keeps_identity(cls: type) -> bool:
    """True for the mutable types above: variables that hold one such object must be framed together."""
    return cls in std_reducers() and cls.__name__ != "ZoneInfo"  # zones are cached by key: identity comes back
