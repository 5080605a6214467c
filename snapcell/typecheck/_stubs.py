"""Type-checker stubs written from host functions' signatures (TypedDicts included), for turns with no hand-written
stubs.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any

from snapcell._support import is_async_callable
from snapcell.typecheck._declarations import MAX_DEPTH, PLAIN_TYPES, Text, importable, string_annotation

__all__ = ["stubs_from_functions"]


_TYPING_NAMES = ("Any", "Literal", "NotRequired", "TypedDict")
_GENERIC_BUILTINS = (list, dict, set, frozenset, tuple, type)
_BUILTIN_TYPES = {t: t.__name__ for t in (*PLAIN_TYPES, object, bytearray, range, slice, *_GENERIC_BUILTINS)}
_LITERAL_TYPES = (str, int, bool, bytes, type(None))


def stubs_from_functions(functions: Mapping[str, Callable[..., Any]]) -> str:
    """Write type-checker stubs of host functions from their signatures, for ``type_check_stubs``.

    Each function becomes a stub under the name it is given by, with its parameters (simple defaults kept, others
    ``...``), its return type and its docstring's first line. TypedDicts its annotations use become stub classes
    with their fields (the keys a script may use), other classes an import of their module when they have one
    (``datetime.date``), and whatever cannot be spelled ``Any``, so a check is never stricter than the functions.

    Args:
        functions: Host functions by name, as passed to ``external_lookup`` or ``CodeTool(tools=...)``.

    Returns:
        Python stub text.
    """
    return _StubWriter(set(functions)).write(functions)


class _StubWriter:
    def __init__(self, taken: set[str]) -> None:
        self._taken = taken | set(_TYPING_NAMES)
        self._classes: dict[type, str] = {}
        self._class_text: list[str] = []
        self._modules: dict[str, str] = {}

    def write(self, functions: Mapping[str, Callable[..., Any]]) -> str:
        defs = [self._function(name, func) for name, func in functions.items()]
        head = [f"from typing import {', '.join(_TYPING_NAMES)}"]
        head += [
            f"import {m}" if m == alias else f"import {m} as {alias}" for m, alias in sorted(self._modules.items())
        ]
        return "\n".join(head) + "\n\n" + "".join(text + "\n" for text in (*self._class_text, *defs))

    def _function(self, name: str, func: Callable[..., Any]) -> str:
        try:
            try:
                signature = inspect.signature(func, eval_str=True)
            except Exception:  # evaluating the host's own annotations may raise anything; use them as written
                signature = inspect.signature(func)
        except (TypeError, ValueError):
            signature = inspect.Signature(
                [
                    inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                    inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
                ]
            )
        params = [
            param.replace(annotation=Text(self._type(param.annotation)), default=self._default(param.default))
            for param in signature.parameters.values()
        ]
        text = str(
            signature.replace(parameters=params, return_annotation=Text(self._type(signature.return_annotation)))
        )
        keyword = "async def" if is_async_callable(func) else "def"
        doc = (inspect.getdoc(func) or "").strip().splitlines()
        body = f"\n    {doc[0]!r}" if doc else " ..."
        return f"{keyword} {name}{text}:{body}"

    @staticmethod
    def _default(default: object) -> object:
        if default is inspect.Parameter.empty:
            return default
        if type(default) in (int, float, bool, type(None)) or (type(default) is str and len(default) <= 40):
            return Text(repr(default))
        return Text("...")

    def _type(self, annotation: object, depth: int = 0) -> str:
        if annotation is inspect.Parameter.empty or depth > MAX_DEPTH * 2:
            return "Any"
        if annotation is None or annotation is type(None):
            return "None"
        if annotation is Any:
            return "Any"
        if isinstance(annotation, str):
            return string_annotation(annotation)
        if isinstance(annotation, type) and annotation in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[annotation]
        import typing  # the host's side only

        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is not None:
            return self._generic(origin, args, depth)
        if isinstance(annotation, type):
            return self._class(annotation, depth)
        return "Any"

    def _generic(self, origin: object, args: tuple[Any, ...], depth: int) -> str:
        import collections.abc
        import typing

        if origin in (typing.Union, types.UnionType):
            return " | ".join(self._type(a, depth + 1) for a in args)
        if origin is typing.Literal:
            if all(type(a) in _LITERAL_TYPES for a in args):
                return f"Literal[{', '.join(repr(a) for a in args)}]"
            return "Any"
        if origin is typing.Annotated:
            return self._type(args[0], depth + 1)
        if origin is collections.abc.Callable:
            if len(args) == 2 and isinstance(args[0], list):
                params = ", ".join(self._type(a, depth + 1) for a in args[0])
                return f"{self._module_name('collections.abc')}.Callable[[{params}], {self._type(args[1], depth + 1)}]"
            return f"{self._module_name('collections.abc')}.Callable[..., Any]"
        if isinstance(origin, type) and (origin in _GENERIC_BUILTINS or origin.__module__ == "collections.abc"):
            base = (
                origin.__name__
                if origin in _GENERIC_BUILTINS
                else f"{self._module_name('collections.abc')}.{origin.__name__}"
            )
            if origin is tuple and args == ():
                return "tuple[()]"
            inner = ", ".join("..." if a is Ellipsis else self._type(a, depth + 1) for a in args)
            return f"{base}[{inner}]" if inner else base
        return "Any"

    def _class(self, cls: type, depth: int) -> str:
        import typing

        if cls in self._classes:
            return self._classes[cls]
        if typing.is_typeddict(cls):
            return self._typeddict(cls, depth)
        origin = importable(cls)
        if origin is None:
            return "Any"
        module, qualname = origin
        return f"{self._module_name(module)}.{qualname}"

    def _typeddict(self, cls: type, depth: int) -> str:
        import typing

        name = cls.__name__ if cls.__name__.isidentifier() else "TypedDict_"
        while name in self._taken:
            name += "_"
        self._taken.add(name)
        self._classes[cls] = name
        try:
            fields = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # the host's own annotations may fail to evaluate in any way; keep them as written
            fields = dict(getattr(cls, "__annotations__", {}))
        optional = set(getattr(cls, "__optional_keys__", frozenset()))
        for key, annotation in list(fields.items()):
            # Postponed annotations hide NotRequired from __optional_keys__ (before 3.12): read the markers here.
            while typing.get_origin(annotation) in (typing.NotRequired, typing.Required):
                (optional.add if typing.get_origin(annotation) is typing.NotRequired else optional.discard)(key)
                annotation = typing.get_args(annotation)[0]
            fields[key] = annotation
        lines = [f"class {name}(TypedDict):"]
        doc = (cls.__doc__ or "").strip().splitlines()
        if doc and cls.__doc__ != typing.TypedDict.__doc__:
            lines.append(f"    {doc[0]!r}")
        for key, annotation in fields.items():
            if not key.isidentifier():
                continue  # a key a class body cannot spell: the stub stays total-free of it
            spelled = self._type(annotation, depth + 1)
            lines.append(f"    {key}: {f'NotRequired[{spelled}]' if key in optional else spelled}")
        if len(lines) == 1 or (len(lines) == 2 and doc):
            lines.append("    pass")
        self._class_text.append("\n".join(lines) + "\n")
        return name

    def _module_name(self, module: str) -> str:
        if module not in self._modules:
            top = module.partition(".")[0]
            self._modules[module] = module if top not in self._taken else f"__snapcell_m{len(self._modules)}__"
        alias = self._modules[module]
        return alias
