"""Rules that let ordinary code through where a name alone cannot decide (no false positives).

- Attributes whose rule depends on the object (`TYPED_NAMES`): ``x.replace`` is ``str.replace`` or
  ``date.replace`` unless ``x`` is a code object; namedtuple's documented API (``_replace``, ``_asdict``,
  ``_fields``, ``_make``, ``_field_defaults``) on namedtuples and the script's own objects; ``x.__dict__`` of
  the script's own objects (and of what ``vars(x)`` may read); ``other._x`` read in a method of the script's
  class or outside it, when ``other`` is one of the script's own objects (``self._c < other._c``, ``t._c``): a
  method of the script's class could read it anyway. Loads of these names are rewritten to `typed_attr`, and
  ``getattr``/``hasattr`` apply the same rule (``attrgetter``/``methodcaller`` to the names of `TYPED_NAMES`).
  ``now`` / ``today`` / ``utcnow`` are typed too: ``datetime``'s own class clocks are recorded in a pausable run.
- ``globals()`` returns the session's variables (`SessionGlobals`): a live mapping over the namespace that
  hides and refuses dunder names (``__builtins__`` holds the guard's own functions).
- ``asyncio.run(coro)`` at the top level of a script awaits ``coro`` in the run's task, as top-level
  ``await`` would; inside a function it says why it cannot start a second event loop.

A guardrail, not a boundary: see DESIGN.md ("The runner and its boundary").
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Iterator, MutableMapping
from typing import Any

from snapcell.policy._guard import (
    INTERNAL_NAMES,
    attribute_hint,
    attribute_problem,
    check_attr,
    class_clock,
    exact_str,
    guarded_getattr,
    guarded_hasattr,
    guarded_vars,
    is_dunder,
    register_stand_in,
    runtime_policy_error,
    script_function,
    shared_problem,
)
from snapcell.policy._rewrite import (
    ASYNC_RUN_NAME,
    CLASS_CLOCK_NAMES,
    FORMAT_ATTR_NAME,
    TYPED_ATTR_NAME,
    TYPED_NAMES,
)

__all__ = ["SessionGlobals", "fidelity_builtins", "typed_attr"]

_NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def _refuse(name: str) -> Exception:
    return runtime_policy_error(attribute_problem(name) or f"the attribute .{name}", attribute_hint(name))


def _own(obj: Any) -> bool:
    """True for the script's own objects: its classes, its functions and instances of its classes."""
    if isinstance(obj, type):
        return _script_class(obj)
    if type(obj) is types.FunctionType:
        return script_function(obj)
    return _script_class(type(obj))


def _script_class(cls: type) -> bool:
    """True for a class a script made: its module is the session's ``__main__`` and no real module holds it.

    Types of the interpreter that no module names (``builtin_function_or_method``) are not importable either;
    their module tells them apart.
    """
    return type.__dict__["__module__"].__get__(cls) == "__main__" and shared_problem(cls) is None


def _namedtuple(obj: Any) -> bool:
    cls = obj if isinstance(obj, type) else type(obj)
    return issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)


def typed_attr(obj: Any, name: str, /) -> Any:
    """``obj.name`` for a name in `TYPED_NAMES`, when the object's type allows it; else `PolicyError`."""
    name = exact_str(name)
    if name in CLASS_CLOCK_NAMES:
        return class_clock(obj, name)
    if name == "replace":
        if isinstance(obj, types.CodeType):
            raise _refuse(name)
        return obj.replace
    if name == "__dict__":
        if isinstance(obj, type):
            if shared_problem(obj) is not None:
                raise _refuse(name)
            return type.__dict__["__dict__"].__get__(obj)  # a read-only mappingproxy
        return guarded_vars(obj)
    if name in _NAMEDTUPLE_API and (_namedtuple(obj) or _own(obj)):
        value = getattr(obj, name)
        return dict(value) if name == "_field_defaults" and type(value) is dict else value
    if name.startswith("_") and not is_dunder(name) and name not in INTERNAL_NAMES and _own(obj):
        return getattr(obj, name)  # ``other._x`` / ``t._x`` on one of the script's own objects
    raise _refuse(name)


_MISSING = object()


def _getattr(obj: Any, name: str, default: Any = _MISSING, /) -> Any:
    """`getattr` with the attribute rules, deciding the names of `TYPED_NAMES` by the object."""
    plain = exact_str(name)
    if type(plain) is str and _typed(plain):
        try:
            return typed_attr(obj, plain)
        except AttributeError:
            if default is _MISSING:
                raise
            return default
    return guarded_getattr(obj, name) if default is _MISSING else guarded_getattr(obj, name, default)


def _hasattr(obj: Any, name: str, /) -> bool:
    """`hasattr` with the attribute rules, deciding the names of `TYPED_NAMES` by the object."""
    plain = exact_str(name)
    if type(plain) is str and _typed(plain):
        try:
            typed_attr(obj, plain)
        except AttributeError:
            return False
        return True
    return guarded_hasattr(obj, name)


def _typed(name: str) -> bool:
    """True for a name `typed_attr` decides by the object: `TYPED_NAMES` and private (non-dunder) names."""
    return name in TYPED_NAMES or name.startswith("_") and not is_dunder(name)


def checked_name(name: Any) -> Any:
    """`check_attr` for a name used with an object later (``attrgetter``): names of `TYPED_NAMES` wait for it."""
    plain = exact_str(name)
    return plain if type(plain) is str and plain in TYPED_NAMES else check_attr(plain)


# ------------------------------------------------------------------ globals()

# The namespace behind each live `SessionGlobals`, by id (the view itself holds nothing a script could read).
_namespaces: dict[int, dict[str, Any]] = {}


def _hidden(key: Any) -> bool:
    return type(key) is not str or is_dunder(key) and key != "__name__"


class SessionGlobals(MutableMapping[str, Any]):
    """What ``globals()`` returns to a script: the session's variables, live, without the interpreter's entries.

    Reading, setting and deleting variables by name works as on the real dict; dunder names (``__builtins__``,
    the policy's helpers) are absent: reading or setting one is a `PolicyError`. The namespace itself is never
    handed out.
    """

    __slots__ = ("__weakref__",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("globals() cannot be subclassed")

    def __getitem__(self, key: str) -> Any:
        key = exact_str(key)
        if type(key) is str and _hidden(key):
            raise runtime_policy_error(
                f"the name {key} through globals()", "Names like __builtins__ are not available."
            )
        if _hidden(key):
            raise KeyError(key)
        return _namespaces[id(self)][key]

    def __contains__(self, key: object) -> bool:
        key = exact_str(key)
        return not _hidden(key) and key in _namespaces[id(self)]

    def __setitem__(self, key: str, value: Any) -> None:
        key = exact_str(key)
        if _hidden(key) or key == "__name__":
            raise runtime_policy_error(f"setting {key!r} through globals()", "Set ordinary variable names only.")
        _namespaces[id(self)][key] = value

    def __delitem__(self, key: str) -> None:
        key = exact_str(key)
        if _hidden(key) or key == "__name__":
            raise KeyError(key)
        del _namespaces[id(self)][key]

    def __iter__(self) -> Iterator[str]:
        return iter([key for key in _namespaces[id(self)] if not _hidden(key)])

    def __len__(self) -> int:
        return sum(1 for key in _namespaces[id(self)] if not _hidden(key))

    def __repr__(self) -> str:
        return f"<globals of the session: {', '.join(self) or 'no variables'}>"

    def __reduce__(self) -> Any:
        raise TypeError("globals() cannot be saved in a checkpoint; keep the variables themselves")


def session_globals() -> SessionGlobals:
    """``globals()`` for scripts: the caller's session namespace as a `SessionGlobals`."""
    namespace = sys._getframe(1).f_globals
    table = namespace.get("__builtins__")
    if not isinstance(table, dict) or FORMAT_ATTR_NAME not in table:
        # Called back from library code whose globals are a real module's: never hand those out.
        raise runtime_policy_error("globals() outside the script's own code", "Call globals() in the script itself.")
    view = SessionGlobals()
    _namespaces[id(view)] = namespace
    weakref.finalize(view, _namespaces.pop, id(view), None)
    return view


session_globals.__name__ = session_globals.__qualname__ = "globals"


# ------------------------------------------------------------------ asyncio.run


def run(main: Any, *, debug: bool | None = None) -> Any:
    """`asyncio.run` for scripts: the session already runs an event loop, so only the top level may use it."""
    if isinstance(main, types.CoroutineType):  # inspect.iscoroutine
        main.close()  # never awaited, and says nothing about it
    raise RuntimeError(
        "asyncio.run() cannot start a second event loop here: the session's loop is already running. "
        "Use asyncio.run(main()) or await main() at the top level of the script, or make this function async."
    )


async def run_at_top_level(func: Any, /, *args: Any, **kwargs: Any) -> Any:
    """What a top-level ``asyncio.run(coro)`` becomes: ``await coro`` in the run's own task."""
    if func is run:
        if len(args) != 1 or not isinstance(args[0], types.CoroutineType):
            raise ValueError(f"a coroutine was expected, got {args[0] if args else None!r}")
        return await args[0]
    return func(*args, **kwargs)


register_stand_in("asyncio", "run", run)


def fidelity_builtins() -> dict[str, Any]:
    """The builtins this module replaces or adds: getattr, hasattr, globals and the rewrites' helpers."""
    return {
        "getattr": _getattr,
        "hasattr": _hasattr,
        "globals": session_globals,
        TYPED_ATTR_NAME: typed_attr,
        ASYNC_RUN_NAME: run_at_top_level,
    }
