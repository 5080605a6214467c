"""Dataclasses made without compiling source text: for the classes a zygote defines before it says ready.

`dataclasses.dataclass` writes a class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and frozen
``__setattr__`` as source text and compiles each one: about 3.5M instructions a class, and importing `dataclasses`
imports `inspect`. Thirteen such classes made about a quarter of a zygote's start-up. This `dataclass` makes
the same methods from closures over the field names instead, for the few options snapcell uses (``frozen``,
``slots``, ``kw_only``; ``field(default=...)`` and ``field(default_factory=...)``).

To a type checker it *is* `dataclasses.dataclass`: a module imports that one under ``TYPE_CHECKING``, so
each class's constructor is checked as before. At run time a class keeps what its callers rely on: construction
by keyword (and by position unless ``kw_only``) with defaults and factories, ``__post_init__``, equality and
hashing by fields, the dataclass ``repr``, frozenness (`dataclasses.FrozenInstanceError`), slots, ``__match_args__``,
pickling and copying; and `dataclasses.fields`, `~dataclasses.replace`, `~dataclasses.asdict` and
`~dataclasses.is_dataclass` work on it: its ``__dataclass_fields__`` are made by `dataclasses` itself, on first use.
"""

from __future__ import annotations

import _thread
import operator
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["dataclass", "field"]

_T = TypeVar("_T", bound=type)


class _Required:
    """``field()`` with neither a default nor a factory."""


_REQUIRED: Any = _Required()


class _Factory:
    __slots__ = ("factory",)

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory


def field(*, default: Any = _REQUIRED, default_factory: Any = _REQUIRED) -> Any:
    """A field's default, or a factory called for each instance (`dataclasses.field`'s two options used here).

    Raises:
        ValueError: Both were given.
    """
    if default is not _REQUIRED and default_factory is not _REQUIRED:
        raise ValueError("cannot specify both default and default_factory")
    return default if default_factory is _REQUIRED else _Factory(default_factory)


def dataclass(cls: _T | None = None, /, *, frozen: bool = False, slots: bool = False, kw_only: bool = False) -> Any:
    """Make ``cls`` a dataclass as ``dataclasses.dataclass(frozen=..., slots=..., kw_only=...)`` would; compile nothing.

    Raises:
        TypeError: As `dataclasses.dataclass` would (a field without a default after one with a default), or ``cls``
            inherits from another dataclass (not supported here).
        ValueError: A mutable (unhashable) default; use ``field(default_factory=...)``.
    """

    def wrap(cls: _T) -> _T:
        return _make(cls, frozen=frozen, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar


def _make(cls: _T, *, frozen: bool, slots: bool, kw_only: bool) -> _T:
    for base in cls.__mro__[1:]:
        if "__dataclass_fields__" in vars(base):
            raise TypeError(f"{cls.__qualname__}: this dataclass cannot inherit from the dataclass {base.__qualname__}")
    annotations = cls.__dict__.get("__annotations__", {})
    names = tuple(name for name, annotation in annotations.items() if not _is_classvar(annotation))
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    for name in names:
        value = cls.__dict__.get(name, _REQUIRED)
        if isinstance(value, _Factory):
            factories[name] = value.factory
        elif value is not _REQUIRED:
            if type(value).__hash__ is None:
                raise ValueError(f"mutable default {type(value)} for field {name} is not allowed: use default_factory")
            defaults[name] = value
        elif not kw_only and (defaults or factories):
            raise TypeError(f"non-default argument {name!r} follows default argument")
    namespace = {key: value for key, value in cls.__dict__.items() if key not in ("__dict__", "__weakref__")}
    for name in names:
        namespace.pop(name, None)
    if slots:
        if "__slots__" in cls.__dict__:
            raise TypeError(f"{cls.__name__} already specifies __slots__")
        namespace["__slots__"] = names
    else:
        namespace.update(defaults)  # class attributes, as dataclasses leaves them
    holder: list[type] = []  # the new class, for its methods
    methods = _methods(names, defaults, factories, kw_only=kw_only, post_init="__post_init__" in namespace)
    if frozen:
        methods.update(_frozen_methods(holder, names, slots=slots))
    for key, method in methods.items():
        method.__qualname__ = f"{cls.__qualname__}.{key}"
        namespace.setdefault(key, method)  # a method the class defines itself is kept, as dataclasses keeps it
    if "__hash__" not in cls.__dict__ or (cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__):
        namespace["__hash__"] = _hash(names) if frozen else None
    namespace.setdefault("__match_args__", () if kw_only else names)
    namespace["__record__"] = (names, defaults, factories, frozen, kw_only)
    namespace["__dataclass_fields__"] = _DataclassView()
    namespace["__dataclass_params__"] = _DataclassView()
    made: _T = type(cls)(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    holder.append(made)
    return made


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return lambda obj: ()


def _arguments(
    positional: tuple[str, ...], known: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The arguments of a call of ``__init__`` by field name, refused as Python refuses a bad call."""
    if len(args) > len(positional):
        given = len(args) + 1
        raise TypeError(f"__init__() takes {len(positional) + 1} positional arguments but {given} were given")
    values = dict(zip(positional, args, strict=False))
    for key, value in kwargs.items():
        if key not in known:
            raise TypeError(f"__init__() got an unexpected keyword argument {key!r}")
        if key in values:
            raise TypeError(f"__init__() got multiple values for argument {key!r}")
        values[key] = value
    return values


def _refuse(
    names: tuple[str, ...],
    defaults: dict[str, Any],
    factories: dict[str, Callable[[], Any]],
    positional: tuple[str, ...],
    known: frozenset[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> typing.NoReturn:
    """Raise the TypeError Python raises for a bad call of ``__init__`` (an unknown keyword before a missing field).

    Raises:
        TypeError: Always.
    """
    values = _arguments(positional, known, args, kwargs)
    missing = [repr(n) for n in names if n not in values and n not in defaults and n not in factories]
    raise TypeError(f"__init__() missing {len(missing)} required argument(s): {', '.join(missing)}")


def _methods(
    names: tuple[str, ...],
    defaults: dict[str, Any],
    factories: dict[str, Callable[[], Any]],
    *,
    kw_only: bool,
    post_init: bool,
) -> dict[str, Any]:
    known = frozenset(names)
    positional = () if kw_only else names
    set_field = object.__setattr__
    values_of = _values_of(names)

    # Each field with its default (or _REQUIRED) and factory (or None): one pass over it per instance, with no
    # intermediate dict, when the call is by keyword (RunResult and HostCall are made on every run and call).
    plan = tuple((name, defaults.get(name, _REQUIRED), factories.get(name)) for name in names)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not args:
            values = kwargs
        elif not kwargs and len(args) <= len(positional):
            values = dict(zip(positional, args, strict=False))
        else:
            values = _arguments(positional, known, args, kwargs)
        given = values.get
        found = 0
        for name, default, factory in plan:
            value = given(name, _REQUIRED)
            if value is not _REQUIRED:
                found += 1
            elif default is not _REQUIRED:
                value = default
            elif factory is not None:
                value = factory()
            else:
                _refuse(names, defaults, factories, positional, known, args, kwargs)
            set_field(self, name, value)
        if found != len(values):  # a keyword that names no field
            _refuse(names, defaults, factories, positional, known, args, kwargs)
        if post_init:
            self.__post_init__()

    running: set[tuple[int, int]] = set()

    def __repr__(self: Any) -> str:
        key = (id(self), _thread.get_ident())
        if key in running:
            return "..."
        running.add(key)
        try:
            shown = ", ".join(f"{name}={value!r}" for name, value in zip(names, values_of(self), strict=True))
        finally:
            running.discard(key)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return bool(values_of(self) == values_of(other))
        return NotImplemented

    return {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__}


def _frozen_methods(holder: list[type], names: tuple[str, ...], *, slots: bool) -> dict[str, Any]:
    known = frozenset(names)

    def refuse(name: str) -> BaseException:
        from dataclasses import FrozenInstanceError  # only when refusing: no import of dataclasses before

        return FrozenInstanceError(f"cannot assign to field {name!r}")

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is holder[0] or name in known:
            raise refuse(name)
        owner: type[Any] = holder[0]
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is holder[0] or name in known:
            raise refuse(name)
        owner: type[Any] = holder[0]
        super(owner, self).__delattr__(name)

    methods: dict[str, Any] = {"__setattr__": __setattr__, "__delattr__": __delattr__}
    if slots:  # a frozen object's default unpickling would assign its slots through __setattr__
        values_of = _values_of(names)

        def __getstate__(self: Any) -> list[Any]:
            return list(values_of(self))

        def __setstate__(self: Any, state: list[Any]) -> None:
            for name, value in zip(names, state, strict=False):
                object.__setattr__(self, name, value)

        methods.update({"__getstate__": __getstate__, "__setstate__": __setstate__})
    return methods


def _hash(names: tuple[str, ...]) -> Callable[[Any], int]:
    values_of = _values_of(names)

    def __hash__(self: Any) -> int:
        return hash(values_of(self))

    return __hash__


class _DataclassView:
    """``__dataclass_fields__`` and ``__dataclass_params__``: made by `dataclasses` from the same fields on first read.

    Read by `dataclasses.fields`, ``replace``, ``asdict`` and ``is_dataclass``: none of them on a worker's start.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if owner is None:
            owner = type(obj)
        import dataclasses

        made = next(c for c in owner.__mro__ if "__record__" in vars(c))
        names, defaults, factories, frozen, kw_only = vars(made)["__record__"]
        annotations = vars(made)["__annotations__"]
        namespace: dict[str, Any] = {
            "__module__": made.__module__,
            "__qualname__": made.__qualname__,
            "__annotations__": {name: annotations[name] for name in names},
            **defaults,
        }
        namespace.update({name: dataclasses.field(default_factory=f) for name, f in factories.items()})
        shadow: type = dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(type(made.__name__, (), namespace))
        for name in ("__dataclass_fields__", "__dataclass_params__"):
            type.__setattr__(made, name, vars(shadow)[name])
        return vars(made)[self.name]
