"""The loader's resolver for the globals a checkpoint names: the rule (`_rule`) applied as the unpickler asks.

`make_find_global` builds the function every restricted unpickler's ``find_class`` calls; helpers that take names
as data are wrapped so their arguments are checked on every call, and the builtins a checkpoint may call by name
(``getattr``, ``type``, cloudpickle's ``_builtin_type``) are replaced by guarded versions.
"""

from __future__ import annotations

import collections
import functools
import importlib
import pickle
import types
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import dill

import snapcell.checkpoint.helpers as helpers
from snapcell.checkpoint._hoststate import state_refusal
from snapcell.checkpoint._rule import (
    CLASS_DUNDERS,
    HELPERS,
    PLAIN,
    TYPE_CALL,
    GlobalRule,
    attribute_refusal,
    call_refusal,
    code_refusal,
    current_name,
    global_refusal,
    module_refusal,
)

__all__ = ["FindGlobal", "checked", "make_find_global"]

FindGlobal = Callable[[str, str], Any]


def _public_getattr(rule: GlobalRule, obj: object, name: str, *default: object) -> Any:
    """``getattr`` for checkpoints (enum members and ``object.__new__`` pickle through it): public names only.

    An attribute of a module is the global ``module.name`` and follows the rule for globals, as in the host's scan
    (``getattr(copy, 'dispatch_table')`` is refused like ``copy.dispatch_table``).
    """
    problem = attribute_refusal(name)
    if problem is None and isinstance(obj, types.ModuleType):
        problem = global_refusal(obj.__name__, name, rule)
    if problem is not None:
        raise pickle.UnpicklingError(f"the checkpoint reads the attribute {name!r}, which is not allowed: {problem}")
    value = getattr(obj, name, *default)
    if isinstance(value, types.ModuleType) and not isinstance(obj, types.ModuleType):
        raise pickle.UnpicklingError(f"the checkpoint reads the module {name!r} through an attribute")
    if isinstance(obj, types.ModuleType):
        _refuse_state(obj.__name__, name, value)
    return value


def _refuse_state(module: str, name: str, value: Any) -> Any:
    """``value``, unless it is the host's mutable state (`state_refusal`): an inline load must not change it."""
    problem = state_refusal(value)
    if problem is not None:
        raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, which is not allowed: {problem}")
    return value


def _own_helper(name: str) -> Any:
    """A helper of snapcell's, by its stable name (`snapcell.checkpoint.helpers`), as the rule allowed it."""
    if name == "session_namespace":
        # Only the loader's own unpickler hands out the namespace it restores into.
        raise pickle.UnpicklingError("the session namespace can only be restored by load_namespace")
    helper = getattr(helpers, name, None)
    if helper is None:
        # A helper of a layer above registers when its module is imported; the runner that loads imports them all.
        raise pickle.UnpicklingError(f"the checkpoint refers to {helpers.MODULE}.{name}, which is not loaded here")
    return helper


def _class_dunder(owner: object, name: str) -> Any:
    """A class's own dunder method of `CLASS_DUNDERS`, named by a dotted global; never another object's."""
    if not isinstance(owner, type) or name not in CLASS_DUNDERS:
        raise pickle.UnpicklingError(f"the checkpoint reads {name!r} of something other than a class")
    return getattr(owner, name)


def _guarded_subimport(rule: GlobalRule) -> Callable[[str], Any]:
    def subimport(name: str, *_vars: Any) -> Any:
        problem = module_refusal(name, rule)
        if problem is not None:
            raise pickle.UnpicklingError(f"the checkpoint imports module {name!r}, which is not allowed: {problem}")
        return importlib.import_module(name)

    return subimport


def _guarded_type(*args: Any) -> Any:
    """``type`` for checkpoints: the type of None, NotImplemented or Ellipsis, or a new class (three arguments)."""
    problem = call_refusal(TYPE_CALL, args, lambda _m: False)
    if problem is not None:
        raise pickle.UnpicklingError(f"the checkpoint calls type() on something it may not: {problem}")
    return type(*args)


def checked(kind: str, func: Callable[..., Any], rule: GlobalRule | Callable[[str], bool]) -> Callable[..., Any]:
    """``func`` with its name arguments checked by the rule (`call_refusal`) on every call."""
    if kind == PLAIN:
        return func

    def checked(*args: Any, **kwargs: Any) -> Any:
        problem = call_refusal(kind, args, rule)
        if problem is not None:
            name = getattr(func, "__name__", None) or getattr(getattr(func, "func", None), "__name__", "a helper")
            raise pickle.UnpicklingError(f"the checkpoint calls {name}{args!r:.80}, which is refused: {problem}")
        return func(*args, **kwargs)

    return checked


def _builtin_type(rule: GlobalRule, name: str) -> Any:
    """cloudpickle's ``_builtin_type`` (the name is checked by the rule first); code objects are checked when made."""
    if name == "CodeType":
        return functools.partial(_checked_code, rule, types.CodeType)
    return getattr(types, name) if hasattr(types, name) else dill._dill._load_type(name)


def _checked_code(rule: GlobalRule, make: Callable[..., types.CodeType], *args: Any) -> types.CodeType:
    code = make(*args)
    problem = code_refusal(code, rule) if isinstance(code, types.CodeType) else "not a code object"
    if problem is not None:
        raise pickle.UnpicklingError(f"the checkpoint holds code that is refused: {problem}")
    return code


_UNRESOLVED = object()
_MAX_RESOLVED = 4096


def make_find_global(
    allow_module: GlobalRule | Callable[[str], bool],
    overrides: Mapping[tuple[str, str], Any] | None = None,
    *,
    resolve: FindGlobal | None = None,
) -> FindGlobal:
    """Build the resolver the restricted unpickler uses for every global a checkpoint names.

    Every global first passes `global_refusal`, the same rule the host applies before it signs (see `_scan`):
    public names of modules ``allow_module`` accepts, plus the exact serializer helpers of ``HELPERS``. Helpers
    that take names as data check them on every call. Then ``overrides`` (guarded stand-ins), the helpers
    themselves, and attributes of allowed modules (``resolve``, when given, is the policy's guarded lookup).
    Anything else is refused, so loading never imports an arbitrary module.
    """
    rule = allow_module if isinstance(allow_module, GlobalRule) else GlobalRule(allow_module=allow_module)
    overrides = {
        ("builtins", "getattr"): functools.partial(_public_getattr, rule),
        ("builtins", "type"): _guarded_type,
        # Code objects are checked as they are made: they arrive by value and no policy check ever saw them.
        ("cloudpickle.cloudpickle", "_builtin_type"): functools.partial(_builtin_type, rule),
        ("dill._dill", "_load_type"): functools.partial(_builtin_type, rule),
        ("dill._dill", "_create_code"): functools.partial(_checked_code, rule, dill._dill._create_code),
        **(overrides or {}),
    }
    subimport = _guarded_subimport(rule)

    def resolve_global(module: str, name: str) -> Any:
        problem = global_refusal(module, name, rule)
        if problem is not None:
            raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, which is not allowed: {problem}")
        module, name = current_name(module, name)  # ``_operator.getitem`` is ``operator.getitem``
        kind = HELPERS.get((module, name), PLAIN)
        if (module, name) in overrides:
            return checked(kind, overrides[(module, name)], rule)
        if module == "cloudpickle.cloudpickle":
            if name in ("subimport", "dynamic_subimport"):
                return subimport
            return checked(kind, getattr(cloudpickle.cloudpickle, name), rule)
        if module == helpers.MODULE:
            return checked(kind, _own_helper(name), rule)
        if module.split(".")[0] in ("snapcell", "dill", "copyreg") or module == "builtins":
            target: Any = importlib.import_module(module)
            return checked(kind, _refuse_state(module, name, getattr(target, name)), rule)
        if resolve is not None and (module, name) not in HELPERS:
            owner, _, last = name.rpartition(".")
            if owner and last in CLASS_DUNDERS:
                # Classes pickle their own ``__new__`` by reference (``enum.Enum.__new__`` in every Enum subclass),
                # and a str-mixin Enum's dict holds ``enum.Enum.__format__`` (`CLASS_DUNDERS`).
                return _class_dunder(resolve(module, owner), last)
            return checked(kind, _refuse_state(module, name, resolve(module, name)), rule)
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
            if isinstance(target, types.ModuleType):
                raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, a path through a module")
        return checked(kind, _refuse_state(module, name, target), rule)

    find_global = _remembering(resolve_global)
    overrides[("dill._dill", "_create_namedtuple")] = functools.partial(_create_namedtuple, find_global)
    return find_global


def _remembering(resolve: FindGlobal) -> FindGlobal:
    """``resolve``, asked once per distinct global: a stream names a memoized global again for four bytes.

    A refusal is not kept (it ends the frame's load); what resolved is the same object each time it is named.
    """
    resolved: dict[tuple[str, str], Any] = {}

    def find_global(module: str, name: str) -> Any:
        found = resolved.get((module, name), _UNRESOLVED)
        if found is _UNRESOLVED:
            found = resolve(module, name)
            if len(resolved) < _MAX_RESOLVED:
                resolved[(module, name)] = found
        return found

    return find_global


def _create_namedtuple(
    find_global: FindGlobal, name: str, fieldnames: Any, modulename: str, defaults: Any = None
) -> type[tuple[Any, ...]]:
    """dill's ``_create_namedtuple``, whose look-up of an existing class goes through the rule.

    dill's own imports ``modulename`` and hands back any class or module of that name (``subprocess.Popen``), past
    the rule; here an existing namedtuple class is used only when the checkpoint may name it, else a new one is made.
    """
    try:
        existing = find_global(modulename, name)
    except (pickle.UnpicklingError, ImportError, AttributeError):
        existing = None
    if isinstance(existing, type) and issubclass(existing, tuple) and hasattr(existing, "_fields"):
        return existing
    return collections.namedtuple(name, fieldnames, defaults=defaults, module=modulename)


def _is_builtin_exception(name: str) -> bool:
    value = getattr(__import__("builtins"), name, None)
    return isinstance(value, type) and issubclass(value, BaseException)
