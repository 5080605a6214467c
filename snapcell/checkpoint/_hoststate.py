"""What a checkpoint may not get hold of when it loads in the host's own process (inline): the host's state.

Two checks, shared by the host's scanner (`_scan`, on what the host has imported) and the loader (`_findglobal`, on
the objects it resolves):

- `state_refusal`: a global that is a library's mutable module-level state (``json.encoder.ESCAPE_DCT``,
  ``keyword.kwlist``) or a method of a library's shared instance (``random.seed`` is the module-level
  ``random.Random``'s) would let a plain call or an ``APPEND``/``SETITEM`` opcode change the host for every later
  session. A ``functools.partial(random.choice, ...)`` in a namespace is therefore dropped and named, like any
  value that cannot be restored.
- `makes_new_objects`: whether calling a class (or its ``__new__``) surely makes a new object, which the stream
  may then give state (``BUILD``); an Enum returns an existing member, a function may return its argument.
"""

from __future__ import annotations

import _random
import array
import collections
import functools
import inspect
import sys
import types
from typing import Any, Final

__all__ = ["MISSING", "makes_new_objects", "resolved_global", "state_refusal"]

MISSING: Final = object()

# Containers a library keeps its state in. Subclasses count (a module-level ``OrderedDict`` or ``Counter``).
_MUTABLE = (dict, list, set, bytearray, collections.deque, array.array, types.SimpleNamespace)
# Classes whose own ``__new__`` always makes a new object of the class it is given (the builtin containers,
# immutable builtins, whose instances take no state, and the C bases that pickle with their state:
# ``functools.partial``, ``random.Random``'s).
_NEW_MAKERS = frozenset(
    {
        object, dict, list, set, frozenset, tuple, bytearray, bytes, str, int, float, complex, bool,
        collections.deque, collections.OrderedDict, collections.defaultdict, functools.partial,
        _random.Random,
    }
)  # fmt: skip


def state_refusal(value: object) -> str | None:
    """Why a checkpoint may not name ``value`` as a global (None: it may): it is the host's mutable state."""
    if isinstance(value, _MUTABLE):
        return "the host's mutable state (a library's module-level container)"
    if isinstance(value, types.MethodType | types.BuiltinMethodType):
        owner = getattr(value, "__self__", None)
        if owner is not None and not isinstance(owner, type | types.ModuleType):
            return "the host's state (a method of a library's shared instance)"
    return None


def resolved_global(module: str, name: str) -> Any:
    """The object ``module.name`` is in this process, read without running code; `MISSING` when not imported here."""
    target: Any = sys.modules.get(module)
    if target is None:
        return MISSING
    for part in name.split("."):
        try:
            target = inspect.getattr_static(target, part)
        except AttributeError:
            return MISSING
    if isinstance(target, staticmethod | classmethod):
        return MISSING  # a class's own method: not an instance's
    return target


def makes_new_objects(cls: object, *, called: bool) -> bool:
    """True when ``cls.__new__(cls, ...)`` (or ``cls(...)`` when ``called``) surely makes a new object.

    The resolved ``__new__`` must be one of the builtins' (a library class without its own ``__new__``), and a
    call must go through ``type.__call__`` (an Enum's metaclass hands back an existing member).
    """
    if not isinstance(cls, type):
        return False
    if called and type(cls).__call__ is not type.__call__:
        return False
    for klass in cls.__mro__:
        if "__new__" in vars(klass):
            return klass in _NEW_MAKERS
    return False
