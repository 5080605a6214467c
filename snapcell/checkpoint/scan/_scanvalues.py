"""What the checkpoint scanner (`_scan`) knows about a value on its abstract stack, and the checks made on it.

A value is a string constant, None, a tuple of call arguments, a global (`_Global`), a module a helper imported
(`_ModuleRef`), or unknown: `OPAQUE` for an object the stream made, `FOREIGN` for one that may have existed before
the load (what a lookup returned), which must never get state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from snapcell._support import HELPERS_MODULE
from snapcell.checkpoint._rule import PLAIN, TYPE_CALL, Refusal

__all__ = ["FOREIGN", "GETTER", "MAX_MEMO_KEPT", "OPAQUE"]

# Memo entries the scanner keeps in all: past `_scan`'s limit for constants only globals and lookups' results are
# kept (forgetting one would make it new), and no pickler memoizes that many distinct ones.
MAX_MEMO_KEPT = 1 << 20


class _Opaque:
    """Any value the scanner does not track (the result of a call, a container, a number)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE: Final = _Opaque()
# A value that may be an object that existed before the load (what a lookup returned): never given state.
FOREIGN: Final = _Opaque()
# What ``operator.attrgetter``/``methodcaller`` (or a guarded stand-in) returned: calling it while loading would read
# or call attributes of any object, a module's included (``attrgetter('encoder.ESCAPE_DCT')(json)``), which no
# pickler writes (a getter in a namespace is a value, called by the script later).
GETTER: Final = _Opaque()


class _Attribute(_Opaque):
    """What the ``getattr`` helper gave back: foreign like any lookup, and callable only where the scan can vouch.

    A pickler calls an attribute read through ``getattr`` only for a class's own ``__new__`` (or a module's
    attribute, which is the global ``module.name`` the rule checked): calling anything else while loading (a
    bound method of an existing object, a formatter) runs code no policy check saw.
    """

    __slots__ = ("name", "of_module")

    def __init__(self, name: str, *, of_module: bool) -> None:
        self.name = name
        self.of_module = of_module


class _ModuleRef(_Opaque):
    """What a module-importing helper called with a constant name returns: a module, foreign like a lookup.

    Reading an attribute of it through the ``getattr`` helper is naming the global ``module.attribute``, so the
    rule for globals applies (``getattr(subimport('copy'), 'dispatch_table')`` is ``copy.dispatch_table``).
    """

    __slots__ = ("module",)

    def __init__(self, module: str) -> None:
        self.module = module


# Serializer helpers that hand back an existing object (a sentinel, pandas' NaT): their result is foreign.
_FOREIGN_HELPERS = frozenset(
    {
        ("cloudpickle.cloudpickle", "_get_dataclass_field_type_sentinel"),
        ("dill._dill", "_create_namedtuple"),  # an existing namedtuple class the checkpoint may name (the loader's)
        ("pandas._libs.tslibs.nattype", "__nat_unpickle"),
    }
)
# Classes whose pickles call them for a cached instance and then set its state through the class's own setter:
# numpy's ``dtype('f8')`` is numpy's shared float64 dtype, and every array's pickle ``BUILD``s it (numpy's
# ``__setstate__`` of a dtype, which takes only the dtype's own fields).
_OWN_STATE = frozenset({("numpy", "dtype")})
# copyreg's reconstructors: ``cls.__new__(cls, ...)`` of their first argument (`_reconstructor`: of its second).
_NEW_OF_ARGUMENT = {("copyreg", "__newobj__"): 0, ("copyreg", "__newobj_ex__"): 0, ("copyreg", "_reconstructor"): 1}
# Helpers never called while loading (a namespace holds them as values): the guarded getattr and its kin read and
# write attributes of any object they are given, a module's included; the guarded getters make `GETTER`s.
_NOT_AT_LOAD = frozenset(
    (HELPERS_MODULE, name)
    for name in (
        "guarded_getattr",
        "guarded_hasattr",
        "guarded_setattr",
        "guarded_delattr",
        "guarded_dir",
        "guarded_vars",
    )
)
_GETTERS = frozenset({(HELPERS_MODULE, "attrgetter"), (HELPERS_MODULE, "methodcaller")})
# cloudpickle's state setters: (obj, state) for an object the stream made.
_SETSTATE = frozenset(
    {("cloudpickle.cloudpickle", "_class_setstate"), ("cloudpickle.cloudpickle", "_function_setstate")}
)


@dataclass(frozen=True, slots=True)
class _Global:
    module: str
    name: str
    kind: str  # the helper kind, PLAIN for any other allowed global


class _Refused(Exception):
    def __init__(self, module: str, name: str, reason: str) -> None:
        super().__init__(reason)
        self.refusal = Refusal(module, name, reason)


def _check_target(target: object, how: str) -> None:
    """State may only go to objects the stream made: not to a global or what a lookup returned (a library class)."""
    if isinstance(target, _Global):
        raise _Refused(target.module, target.name, f"{how} on a global (patching it in place)")
    if target is FOREIGN or target is GETTER or type(target) in (_ModuleRef, _Attribute):
        raise _Refused("", "", f"{how} on an object a lookup returned (it may be a library class or function)")


def _forgettable(value: object) -> bool:
    """True for a memo value the scanner may forget: a constant, or a tuple of constants and opaque values."""
    if type(value) is tuple:
        return all(item is OPAQUE or type(item) in (str, type(None)) for item in value)
    return type(value) in (str, type(None))


def _arguments(items: list[object]) -> tuple[object, ...]:
    """A tuple the scanner keeps (call arguments), one level deep: an inner tuple is checked now and is opaque after.

    No check reads an argument inside an inner tuple, and a kept tree could share subtrees through the memo
    (``t = (t, t, t)`` thirty times over is a 100-byte stream), which a walk would visit exponentially often.
    """
    if tuple not in map(type, items):
        return tuple(items)
    return tuple(_no_helpers(item) if type(item) is tuple else item for item in items)


def _no_helpers(values: Iterable[object]) -> _Opaque:
    """A helper that takes names may only be called directly, never stored or passed (``partial(getattr, f)``)."""
    for value in values:
        if type(value) is _Global and value.kind not in (PLAIN, TYPE_CALL):
            raise _Refused(value.module, value.name, "a helper that takes names, passed as a value")
        if type(value) is tuple:
            _no_helpers(value)
    return OPAQUE


def _show(args: object) -> str:
    if isinstance(args, tuple):
        return "(" + ", ".join(repr(a)[:60] for a in args) + ")"
    return "values computed in the stream"
