"""What a type check declares of a session's namespace: each variable with the type its value (or the stubs) gave it.

Runs where the namespace is: in a worker for a process-mode session, in the host inline.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import itertools
import sys
import types
from collections.abc import Callable, Iterable, Mapping

from snapcell._support import is_async_callable

__all__ = [
    "MAX_DEPTH",
    "PLAIN_TYPES",
    "SIMPLE_NAMES",
    "STUBS_MODULE",
    "Text",
    "declarations_from_namespace",
    "importable",
    "string_annotation",
]

STUBS_MODULE = "__snapcell_stubs__"


class Text:
    """An annotation or default that `inspect.Signature` prints verbatim."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


PLAIN_TYPES = {int: "int", str: "str", float: "float", bool: "bool", bytes: "bytes", complex: "complex"}
_SAMPLE = 200
MAX_DEPTH = 4


def declarations_from_namespace(ns: Mapping[str, object], *, types: Mapping[str, str] | None = None) -> str:
    """Write stub declarations that make a live namespace's names known to the checker.

    Plain values get their types (containers with element types when those agree,
    ``Any`` otherwise), functions their signatures where the annotations are
    simple, classes a permissive stub, modules an import, and objects importable
    from a module an import of them. Names starting and ending with ``__`` are left out.

    Args:
        ns: The namespace, name to value; nothing in it is called or changed.
        types: Static types of names, as `TypeChecker.check_with_types` reported them when the value was made;
            one is declared instead of the value's own type while the value still agrees with it (a list is still
            a list, a TypedDict still a dict).

    Returns:
        Declarations text, stable for equal namespaces, for `TypeChecker.check` ``declarations``.
    """
    classes = {id(v): k for k, v in ns.items() if isinstance(v, type) and importable(v) is None}
    imports: dict[str, str] = {}
    lines = []
    for name in sorted(ns):
        if not name.isidentifier() or (name.startswith("__") and name.endswith("__")):
            continue
        static = types.get(name) if types else None
        if static is not None and _agrees(ns[name], static):
            lines.append(f"{name}: {static}")
            continue
        lines.extend(_declare(name, ns[name], classes, imports))
    head = [f"import {module} as {alias}" for module, alias in sorted(imports.items())]
    return "\n".join(head + lines) + "\n"


_RUNTIME_TYPES: dict[str, type] = {t.__name__: t for t in (list, dict, set, frozenset, tuple)}


def _agrees(value: object, static: str) -> bool:
    """Whether a value still is what its static type (a container of stub classes, or one) says at the top."""
    try:
        tree = ast.parse(static, mode="eval").body
    except SyntaxError:
        return False
    outer = tree.value if isinstance(tree, ast.Subscript) else tree
    if isinstance(outer, ast.Name):
        return type(value) is _RUNTIME_TYPES.get(outer.id)
    if isinstance(outer, ast.Attribute) and isinstance(outer.value, ast.Name) and outer.value.id == STUBS_MODULE:
        return type(value) is dict or type(value).__name__ == outer.attr
    return False


def _declare(name: str, value: object, classes: dict[int, str], imports: dict[str, str]) -> list[str]:
    if isinstance(value, types.ModuleType):
        module = value.__name__
        return [f"import {module}" if module == name else f"import {module} as {name}"]
    origin = importable(value)
    if origin is not None:
        module, qualname = origin
        return [f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")]
    if isinstance(value, type):
        return [
            f"class {name}:",
            "    def __init__(self, *args: Any, **kwargs: Any) -> None: ...",
            "    def __getattr__(self, name: str) -> Any: ...",
        ]
    if callable(value) and _type_expr(value, 0, classes, imports) == "Any":
        keyword = "async def" if is_async_callable(value) else "def"
        return [f"{keyword} {name}{_signature(value)}: ..."]
    return [f"{name}: {_type_expr(value, 0, classes, imports)}"]


def importable(value: object) -> tuple[str, str] | None:
    """The module and name ``value`` can be imported under, if it is a function or class defined in one."""
    if not isinstance(value, type | types.FunctionType | types.BuiltinFunctionType):
        return None
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not isinstance(module, str) or module in ("__main__", "builtins") or module.startswith("__snapcell"):
        return None
    if "." in qualname or sys.modules.get(module) is None:
        return None
    return (module, qualname) if getattr(sys.modules[module], qualname, None) is value else None


def _type_expr(value: object, depth: int, classes: dict[int, str], imports: dict[str, str]) -> str:
    kind = type(value)
    if value is None:
        return "None"
    if kind in PLAIN_TYPES:
        return PLAIN_TYPES[kind]
    if depth >= MAX_DEPTH:
        return "Any"
    if isinstance(value, list | set | frozenset | tuple) and kind in (list, set, frozenset, tuple):
        if kind is tuple and len(value) <= 8:
            parts = [_type_expr(v, depth + 1, classes, imports) for v in value]
            return f"tuple[{', '.join(parts)}]" if parts else "tuple[()]"
        items = itertools.islice(value, _SAMPLE)
        element = _common(_type_expr(v, depth + 1, classes, imports) for v in items)
        return f"tuple[{element}, ...]" if kind is tuple else f"{kind.__name__}[{element}]"
    if isinstance(value, dict) and kind is dict:
        pairs = list(itertools.islice(value.items(), _SAMPLE))
        keys = _common(_type_expr(k, depth + 1, classes, imports) for k, _ in pairs)
        values = _common(_type_expr(v, depth + 1, classes, imports) for _, v in pairs)
        return f"dict[{keys}, {values}]"
    if id(kind) in classes:
        return classes[id(kind)]
    if kind.__module__ == "builtins" and getattr(builtins, kind.__qualname__, None) is kind:
        return str(kind.__qualname__)
    origin = importable(kind)
    if origin is None:
        return "Any"
    module, qualname = origin
    alias = imports.setdefault(module, f"__snapcell_m{len(imports)}__")
    return f"{alias}.{qualname}"


def _common(exprs: Iterable[str]) -> str:
    distinct = set(exprs)
    return distinct.pop() if len(distinct) == 1 else "Any"


def _signature(func: Callable[..., object]) -> str:
    fallback = "(*args: Any, **kwargs: Any) -> Any"
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError, NameError, AttributeError):
        return fallback
    params = [
        param.replace(
            annotation=Text(_annotation(param.annotation)),
            default=param.empty if param.default is param.empty else Text("..."),
        )
        for param in signature.parameters.values()
    ]
    try:
        return str(
            signature.replace(parameters=params, return_annotation=Text(_annotation(signature.return_annotation)))
        )
    except ValueError:
        return fallback


def _annotation(annotation: object) -> str:
    """Spell an annotation if it only uses builtins, ``None`` and ``Any``; otherwise ``Any``."""
    if isinstance(annotation, str):
        return string_annotation(annotation)
    if annotation is None or annotation is type(None):
        return "None"
    if annotation in PLAIN_TYPES or annotation in (list, dict, set, frozenset, tuple, object, type):
        return annotation.__name__
    args = getattr(annotation, "__args__", None)
    origin = getattr(annotation, "__origin__", None)
    if isinstance(annotation, types.UnionType) and args:
        return " | ".join(_annotation(a) for a in args)
    if isinstance(annotation, types.GenericAlias) and origin in (list, dict, set, frozenset, tuple, type) and args:
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else _annotation(a) for a in args)}]"
    return "Any"


SIMPLE_NAMES = frozenset(
    {*PLAIN_TYPES.values(), "list", "dict", "set", "frozenset", "tuple", "object", "type", "None", "Any"}
)


def string_annotation(text: str) -> str:
    """Keep a postponed annotation if it is made of builtin names only; otherwise ``Any``."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return "Any"
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in SIMPLE_NAMES:
            return "Any"
        if not isinstance(
            node, ast.Expression | ast.Name | ast.Load | ast.Subscript | ast.Tuple | ast.BinOp | ast.BitOr
        ):
            if not (isinstance(node, ast.Constant) and node.value in (None, Ellipsis)):
                return "Any"
    return ast.unparse(tree)
