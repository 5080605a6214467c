"""Guarded stand-ins for the standard-library pieces that lead around the policy.

Module views hand these out in place of the real objects (`register_stand_in`). Each closes a route
found in review, and behaves like the original for ordinary code:

- ``operator.attrgetter`` / ``methodcaller``: classes of their own, so ``type(attrgetter('x'))`` is this
  guarded class and not the unchecked C type; ``format`` / ``format_map`` reached through them are checked.
- ``string.Formatter``: no longer a subclass of the real one, so ``super(Formatter, f).get_field`` cannot
  reach the unchecked ``get_field``.
- ``functools.update_wrapper`` / ``wraps``: only the usual names, or public ones, are copied (never
  ``__globals__``), private entries of a ``__dict__`` stay behind, and the wrapper must be the script's.
- ``functools.singledispatch`` / ``singledispatchmethod``: ``register`` by annotation resolves the annotation
  itself; ``typing.get_type_hints`` would evaluate strings with the real builtins.
- ``typing.get_type_hints``: resolves string annotations in the session without evaluating code (`_typehints`).
- Class decorators that write into their argument (``dataclass``, ``total_ordering``, ``no_type_check``,
  ``final``, ``runtime_checkable``, ``update_abstractmethods``) refuse classes shared by every session.
- ``asyncio.all_tasks`` / ``current_task``: only the script's own tasks, never the host's.
- ``__build_class__``, ``type(name, bases, ns)`` and ``make_dataclass``: no class gets a ``__del__``.
- ``dataclasses.replace`` / ``asdict`` / ``astuple``: dataclass instances with ordinary field names only (they read
  every field by name; a class whose metaclass is a dataclass would give out ``object.__getattribute__``).

A guardrail, not a boundary: see DESIGN.md ("The runner and its boundary").
"""

from __future__ import annotations

import abc
import builtins
import functools
import keyword
import operator
import re
import string
import sys
import types
import typing
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from snapcell.policy._fidelity import checked_name, typed_attr
from snapcell.policy._guard import (
    attribute_problem,
    check_attr,
    exact_str,
    format_attr,
    format_problem,
    is_dunder,
    register_stand_in,
    runtime_policy_error,
    script_function,
    store_target,
)
from snapcell.policy._rewrite import STORE_TARGET_NAME, TYPE_CALL_NAME, TYPED_NAMES

__all__ = ["stand_in_builtins"]

_FORMAT_NAMES = ("format", "format_map")


def get_type_hints(obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False) -> dict[str, Any]:
    """`typing.get_type_hints`, resolving string annotations in the session without evaluating code (`_typehints`,
    imported on the first call: few scripts ask, and a zygote says ready without it).

    Raises:
        PolicyError: Called with namespaces, from outside the script's code, or an annotation needs evaluating.
    """
    if globalns is not None or localns is not None:
        raise runtime_policy_error(
            "typing.get_type_hints with namespaces", "Call typing.get_type_hints(obj): names resolve in the session."
        )
    from snapcell.policy._typehints import resolve_type_hints

    return resolve_type_hints(obj, sys._getframe(1).f_globals, include_extras)


def _final(cls: type) -> None:
    """Refuse a subclass: one could override ``__init__`` and skip the checks."""
    raise TypeError(f"{cls.__name__} cannot be subclassed: it would bypass the policy's checks")


# --------------------------------------------------------------- operator


def _get(obj: Any, name: str) -> Any:
    name = checked_name(name)
    if name in TYPED_NAMES:
        return typed_attr(obj, name)
    return format_attr(obj, name) if name in _FORMAT_NAMES else getattr(obj, name)


class attrgetter:
    """`operator.attrgetter` that applies the attribute rules on every call."""

    __slots__ = ("_attrs",)

    def __init__(self, attr: str, /, *attrs: str) -> None:
        names = tuple(exact_str(name) for name in (attr, *attrs))
        for name in names:
            if type(name) is not str:
                raise TypeError("attribute name must be a string")
            for part in name.split("."):
                checked_name(part)
        self._attrs = names

    def __init_subclass__(cls, **kwargs: Any) -> None:
        _final(cls)

    def __call__(self, obj: Any, /) -> Any:
        values = []
        for name in self._attrs:
            value = obj
            for part in name.split("."):
                value = _get(value, part)
            values.append(value)
        return values[0] if len(values) == 1 else tuple(values)

    def __repr__(self) -> str:
        return f"operator.attrgetter({', '.join(map(repr, self._attrs))})"

    def __reduce__(self) -> tuple[Any, tuple[str, ...]]:
        return attrgetter, self._attrs


class methodcaller:
    """`operator.methodcaller` that applies the attribute rules on every call."""

    __slots__ = ("_name", "_args", "_kwargs")

    def __init__(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        name = exact_str(name)
        if type(name) is not str:
            raise TypeError("method name must be a string")
        self._name = checked_name(name)
        self._args = args
        self._kwargs = kwargs

    def __init_subclass__(cls, **kwargs: Any) -> None:
        _final(cls)

    def __call__(self, obj: Any, /) -> Any:
        return _get(obj, self._name)(*self._args, **self._kwargs)

    def __repr__(self) -> str:
        parts = [repr(self._name), *map(repr, self._args), *(f"{k}={v!r}" for k, v in self._kwargs.items())]
        return f"operator.methodcaller({', '.join(parts)})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._kwargs:
            return functools.partial(methodcaller, self._name, **self._kwargs), self._args
        return methodcaller, (self._name, *self._args)


# ----------------------------------------------------------------- string


class Formatter:
    """`string.Formatter` whose fields may not read attributes (``{0.attr}``).

    Not a subclass of the real class, whose unchecked ``get_field`` would stay reachable through
    ``super()``; the other methods are the real ones, which only call ``self``'s.
    """

    format = string.Formatter.format
    vformat = string.Formatter.vformat
    _vformat = string.Formatter._vformat
    get_value = string.Formatter.get_value
    check_unused_args = string.Formatter.check_unused_args
    format_field = string.Formatter.format_field
    convert_field = string.Formatter.convert_field
    parse = string.Formatter.parse

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        """Look up a replacement field, refusing attribute paths."""
        field_name = exact_str(field_name)
        if type(field_name) is str:
            problem = format_problem("{" + field_name + "}")
            if problem:
                raise runtime_policy_error(problem, "Use plain {} / {0} / {name} / {0[key]} fields; no {0.attr} paths.")
        return string.Formatter.get_field(self, field_name, args, kwargs)  # type: ignore[arg-type]


# -------------------------------------------------------------- functools


def _wrapper_names(names: Any, usual: tuple[str, ...]) -> tuple[str, ...]:
    checked = tuple(exact_str(name) for name in names)
    for name in checked:
        if type(name) is not str:
            raise TypeError("attribute names must be strings")
        if name not in usual:
            check_attr(name)
    return checked


def update_wrapper(
    wrapper: Any,
    wrapped: Any,
    assigned: Any = functools.WRAPPER_ASSIGNMENTS,
    updated: Any = functools.WRAPPER_UPDATES,
) -> Any:
    """`functools.update_wrapper` limited to the usual names or public ones, onto the script's own objects."""
    assigned = _wrapper_names(assigned, functools.WRAPPER_ASSIGNMENTS)
    updated = _wrapper_names(updated, functools.WRAPPER_UPDATES)
    store_target(wrapper)
    for name in assigned:
        try:
            value = getattr(wrapped, name)
        except AttributeError:
            continue
        setattr(wrapper, name, dict(value) if name == "__annotations__" and isinstance(value, dict) else value)
    for name in updated:
        source = getattr(wrapped, name, {})
        public = {k: v for k, v in dict(source).items() if not (isinstance(k, str) and attribute_problem(k))}
        getattr(wrapper, name).update(public)
    wrapper.__wrapped__ = wrapped
    return wrapper


def wraps(
    wrapped: Any, assigned: Any = functools.WRAPPER_ASSIGNMENTS, updated: Any = functools.WRAPPER_UPDATES
) -> functools.partial[Any]:
    """`functools.wraps` through the guarded `update_wrapper`."""
    assigned = _wrapper_names(assigned, functools.WRAPPER_ASSIGNMENTS)
    updated = _wrapper_names(updated, functools.WRAPPER_UPDATES)
    return functools.partial(update_wrapper, wrapped=wrapped, assigned=assigned, updated=updated)


@functools.cache
def _dotted() -> re.Pattern[str]:
    """A dotted name, spaces allowed around its parts; compiled on first use (a zygote says ready without it)."""
    return re.compile(r"\s*[A-Za-z]\w*(?:\s*\.\s*[A-Za-z]\w*)*\s*")


def _dispatch_type(value: Any) -> bool:
    if isinstance(value, type):
        return True
    if typing.get_origin(value) in (typing.Union, types.UnionType):
        return all(isinstance(arg, type) for arg in typing.get_args(value))
    return False


def _resolve_annotation(func: Any, value: Any) -> Any:
    """The class a ``register`` annotation names, resolved without evaluating code."""
    if isinstance(value, typing.ForwardRef):
        value = value.__forward_arg__
    if not isinstance(value, str):
        return value
    table = func.__globals__ if isinstance(func, types.FunctionType) else None
    alternatives = str.__str__(value).split("|")
    if table is None or not all(_dotted().fullmatch(text) for text in alternatives):
        raise runtime_policy_error(
            f"registering by the string annotation {value!r}",
            "Name the class: @f.register(SomeClass), or annotate with the class itself.",
        )
    found = []
    for text in alternatives:
        first, *rest = (part.strip() for part in text.split("."))
        namespace_builtins = table.get("__builtins__", {})
        if first in table:
            target = table[first]
        elif isinstance(namespace_builtins, dict) and first in namespace_builtins:
            target = namespace_builtins[first]
        else:
            raise NameError(f"name {first!r} is not defined")
        for part in rest:
            target = getattr(target, check_attr(part))
        found.append(target)
    return functools.reduce(operator.or_, found)


def _guarded_register(register: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(cls: Any, func: Any = None) -> Any:
        if func is None and not _dispatch_type(cls):
            annotations = getattr(cls, "__annotations__", None)
            if isinstance(annotations, Mapping) and annotations:
                func, cls = cls, _resolve_annotation(cls, next(iter(annotations.values())))
        return register(cls, func)

    guarded.__name__ = guarded.__qualname__ = "register"
    return guarded


def singledispatch(func: Any) -> Any:
    """`functools.singledispatch` whose ``register`` resolves annotations without `typing.get_type_hints`."""
    dispatcher = functools.singledispatch(func)
    dispatcher.register = _guarded_register(dispatcher.register)  # type: ignore[method-assign]
    return dispatcher


class singledispatchmethod(functools.singledispatchmethod):  # type: ignore[type-arg]
    """`functools.singledispatchmethod` over the guarded `singledispatch`."""

    def __init__(self, func: Any) -> None:
        super().__init__(func)
        self.dispatcher.register = _guarded_register(self.dispatcher.register)  # type: ignore[method-assign]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        _final(cls)


# -------------------------------------------------- decorators that write


def dataclass(cls: Any = None, /, **options: Any) -> Any:
    """`dataclasses.dataclass`, refusing classes shared by every session."""

    def wrap(target: Any) -> Any:
        store_target(target)
        if isinstance(target, type):
            # Field names go into source text that dataclasses exec()s; a class statement only makes identifiers,
            # but type() or a metaclass can put any string in __annotations__.
            annotations = type.__dict__["__dict__"].__get__(target).get("__annotations__", {})
            for name in annotations if isinstance(annotations, dict) else ():
                if not (type(name) is str and name.isidentifier() and not keyword.iskeyword(name)):
                    raise runtime_policy_error(f"the dataclass field name {name!r}", "Field names must be identifiers.")
        import dataclasses  # on a script's first dataclass: a zygote says ready without it

        return dataclasses.dataclass(target, **options)

    return wrap if cls is None else wrap(cls)


def make_dataclass(cls_name: str, fields: Any, *, namespace: Any = None, **options: Any) -> type:
    """`dataclasses.make_dataclass` without a ``__del__``."""
    if isinstance(namespace, Mapping) and "__del__" in namespace:
        raise _finalizer_error()
    import dataclasses

    cls = dataclasses.make_dataclass(cls_name, fields, namespace=namespace, **options)
    refuse_finalizer(cls)
    if "module" not in options:
        # The caller's module, as CPython 3.12+ records it (3.11 records ``types``): a script's class is its own.
        cls.__module__ = "__main__"
    return cls


def _field_kinds() -> dict[str, Any]:
    """The field-type sentinels of `dataclasses`: ``_FIELD``, ``_FIELD_CLASSVAR``, ``_FIELD_INITVAR``."""
    import dataclasses  # imported on first use: a zygote says ready without it

    return vars(dataclasses)


def _dataclass_fields(obj: Any, what: str) -> list[tuple[str, dataclasses.Field[Any]]] | None:
    """The fields of a dataclass instance with their names (None for anything else), refusing special names.

    ``replace``, ``asdict`` and ``astuple`` read ``getattr(obj, name)`` for every field. Given a class whose metaclass
    is a dataclass with a field ``__getattribute__`` they would hand out ``object.__getattribute__``, an attribute
    reader no check sees; a checkpoint can build such a class with ``abc.ABCMeta`` and public names only, so the
    loader gets these stand-ins too. The name checked is the one read later: each field's own
    ``name``, read once, from the class's table only (the standard library reads the table again from the instance,
    whose ``__dict__`` a checkpoint's BUILD fills with any key, and a table's key need not be its field's name).
    """
    fields = getattr(type(obj), "__dataclass_fields__", None)
    if fields is None:
        return None
    import dataclasses

    named = (
        [(field.name, field) for field in list(fields.values()) if type(field) is dataclasses.Field]
        if type(fields) is dict and not isinstance(obj, type)
        else None
    )
    if named is None or len(named) != len(fields) or any(type(n) is not str or is_dunder(n) for n, _f in named):
        raise runtime_policy_error(
            f"dataclasses.{what}() of a class, or of a dataclass with special field names",
            f"{what}() takes dataclass instances with ordinary field names.",
        )
    return named


def _instance_fields(obj: Any, what: str) -> list[str] | None:
    """The names of the instance fields of ``obj`` (not ``ClassVar`` or ``InitVar``), as `_dataclass_fields` checks."""
    named = _dataclass_fields(obj, what)
    if named is None:
        return None
    return [name for name, field in named if field._field_type is _field_kinds()["_FIELD"]]  # type: ignore[attr-defined]


def replace(obj: Any, /, **changes: Any) -> Any:
    """`dataclasses.replace` of a dataclass instance whose fields have ordinary names (`_dataclass_fields`).

    The standard library's loop over the checked fields (it would read the table again, from the instance).
    """
    named = _dataclass_fields(obj, "replace")
    if named is None:
        raise TypeError("replace() should be called on dataclass instances")
    kinds = _field_kinds()
    for name, field in named:
        kind = field._field_type  # type: ignore[attr-defined]
        if kind is kinds["_FIELD_CLASSVAR"]:
            continue
        if not field.init:
            if name in changes:
                raise ValueError(f"field {name} is declared with init=False, it cannot be specified with replace()")
            continue
        if name not in changes:
            if kind is kinds["_FIELD_INITVAR"] and field.default is kinds["MISSING"]:
                raise ValueError(f"InitVar {name!r} must be specified with replace()")
            changes[name] = getattr(obj, name)
    return type(obj)(**changes)


def asdict(obj: Any, *, dict_factory: Callable[[list[tuple[str, Any]]], Any] = dict) -> Any:
    """`dataclasses.asdict`, checking every dataclass instance it meets (`_dataclass_fields`)."""
    if _dataclass_fields(obj, "asdict") is None:
        raise TypeError("asdict() should be called on dataclass instances")
    return _plain(obj, dict_factory, "asdict")


def astuple(obj: Any, *, tuple_factory: Callable[[list[Any]], Any] = tuple) -> Any:
    """`dataclasses.astuple`, checking every dataclass instance it meets (`_dataclass_fields`)."""
    if _dataclass_fields(obj, "astuple") is None:
        raise TypeError("astuple() should be called on dataclass instances")
    return _plain(obj, tuple_factory, "astuple")


def _plain(obj: Any, factory: Callable[[list[Any]], Any], what: str) -> Any:
    """The standard library's recursion of ``asdict``/``astuple``, each instance checked before a field is read.

    Reimplemented rather than checked beforehand: a field's value may differ between two reads.
    """
    names = _instance_fields(obj, what)
    if names is not None:
        if what == "asdict":
            return factory([(name, _plain(getattr(obj, name), factory, what)) for name in names])
        return factory([_plain(getattr(obj, name), factory, what) for name in names])
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple: its own type, built from positions
        return type(obj)(*[_plain(v, factory, what) for v in obj])
    if isinstance(obj, list | tuple):
        return type(obj)(_plain(v, factory, what) for v in obj)
    if isinstance(obj, dict):
        items = [(_plain(k, factory, what), _plain(v, factory, what)) for k, v in obj.items()]
        if isinstance(obj, defaultdict):  # as Python 3.12 handles it
            result = type(obj)(obj.default_factory)
            result.update(items)
            return result
        return type(obj)(items)
    import copy  # on first use: a zygote says ready without it

    return copy.deepcopy(obj)


def total_ordering(cls: Any) -> Any:
    """`functools.total_ordering`, refusing classes shared by every session."""
    return functools.total_ordering(store_target(cls))


def no_type_check(arg: Any) -> Any:
    """`typing.no_type_check`, refusing classes and functions shared by every session."""
    return typing.no_type_check(store_target(arg))


def final(arg: Any) -> Any:
    """`typing.final`, refusing classes and functions shared by every session."""
    return typing.final(store_target(arg))


def runtime_checkable(cls: Any) -> Any:
    """`typing.runtime_checkable`, refusing classes shared by every session."""
    return typing.runtime_checkable(store_target(cls))


def update_abstractmethods(cls: Any) -> Any:
    """`abc.update_abstractmethods`, refusing classes shared by every session."""
    return abc.update_abstractmethods(store_target(cls))


# ------------------------------------------------------------------ classes


def _finalizer_error() -> Exception:
    return runtime_policy_error("defining __del__", "Finalizers would run outside the run; use a with block.")


def refuse_finalizer(cls: type) -> None:
    """Refuse (and remove) a ``__del__`` that the new class ``cls`` defines, or inherits from a script's function.

    Raises:
        PolicyError: ``cls`` or a script class it derives from defines ``__del__``; it was removed.
    """
    for klass in type.__dict__["__mro__"].__get__(cls):
        finalizer = type.__dict__["__dict__"].__get__(klass).get("__del__")
        # The new class itself may not have one at all; a base only when a script wrote it.
        if finalizer is not None and (klass is cls or script_function(finalizer)):
            type.__delattr__(klass, "__del__")
            raise _finalizer_error()


def guarded_build_class(func: Any, name: Any, /, *bases: Any, **kwargs: Any) -> Any:
    """``__build_class__`` that refuses a class given a ``__del__`` by a metaclass or ``__prepare__``."""
    cls = builtins.__build_class__(func, name, *bases, **kwargs)
    if issubclass(type(cls), type):
        refuse_finalizer(cls)
    return cls


_TYPE_NEW = type.__new__
_TYPE_CALL = type.__dict__["__call__"]


def _is_metaclass(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, type)


def checked_type_call(callee: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``callee(*args, **kwargs)`` for a call that may create a class, refusing a new class with ``__del__``.

    A new class comes from a metaclass called with (name, bases, namespace), or from ``type.__new__`` /
    ``type.__call__`` given a metaclass first; anything else is called as it is.
    """
    if len(args) == 3 and _is_metaclass(callee):
        namespace = args[2]
    elif len(args) == 4 and (callee is _TYPE_NEW or callee is _TYPE_CALL) and _is_metaclass(args[0]):
        namespace = args[3]
    else:
        return callee(*args, **kwargs)
    if isinstance(namespace, Mapping) and "__del__" in namespace:
        raise _finalizer_error()
    if type(namespace) is dict and "__module__" not in namespace:
        # type() names the module after its caller's globals, which would be this module's.
        at = len(args) - 1
        args = (*args[:at], {"__module__": sys._getframe(1).f_globals.get("__name__"), **namespace})
    result = callee(*args, **kwargs)
    if issubclass(type(result), type):
        refuse_finalizer(result)
    return result


# ------------------------------------------------------------------ asyncio


# Reached only by a script that imported asyncio: this module imports it there, not before (a first run needs none).
if TYPE_CHECKING:
    import asyncio
    import dataclasses


def _script_namespace() -> dict[str, Any] | None:
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<cell-"):
            return frame.f_globals
        frame = frame.f_back
    return None


def _own(task: asyncio.Task[Any], namespace: dict[str, Any] | None) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    return namespace is not None and frame is not None and frame.f_globals is namespace


def _no_loop(loop: Any) -> None:
    if loop is not None:
        raise runtime_policy_error("passing an event loop", "Scripts use the running loop; leave out loop=.")


def all_tasks(loop: Any = None) -> set[asyncio.Task[Any]]:
    """`asyncio.all_tasks` limited to the tasks running the script's own coroutines."""
    import asyncio

    _no_loop(loop)
    namespace = _script_namespace()
    return {task for task in asyncio.all_tasks() if _own(task, namespace)}


def current_task(loop: Any = None) -> asyncio.Task[Any] | None:
    """`asyncio.current_task`, or None when the current task is not the script's (a synchronous cell)."""
    import asyncio

    _no_loop(loop)
    task = asyncio.current_task()
    return task if task is not None and _own(task, _script_namespace()) else None


def stand_in_builtins() -> dict[str, Any]:
    """The builtins the policy's code rewrites and class statements call."""
    return {
        "__build_class__": guarded_build_class,
        STORE_TARGET_NAME: store_target,
        TYPE_CALL_NAME: checked_type_call,
    }


_STAND_INS: list[tuple[str, str, Any]] = [
    ("operator", "attrgetter", attrgetter),
    ("operator", "methodcaller", methodcaller),
    ("string", "Formatter", Formatter),
    ("functools", "update_wrapper", update_wrapper),
    ("functools", "wraps", wraps),
    ("functools", "singledispatch", singledispatch),
    ("functools", "singledispatchmethod", singledispatchmethod),
    ("functools", "total_ordering", total_ordering),
    ("dataclasses", "dataclass", dataclass),
    ("dataclasses", "make_dataclass", make_dataclass),
    ("dataclasses", "replace", replace),
    ("dataclasses", "asdict", asdict),
    ("dataclasses", "astuple", astuple),
    ("typing", "get_type_hints", get_type_hints),
    ("typing", "no_type_check", no_type_check),
    ("typing", "final", final),
    ("typing", "runtime_checkable", runtime_checkable),
    ("abc", "update_abstractmethods", update_abstractmethods),
    ("asyncio", "all_tasks", all_tasks),
    ("asyncio", "current_task", current_task),
]
for _module, _name, _value in _STAND_INS:
    register_stand_in(_module, _name, _value)
