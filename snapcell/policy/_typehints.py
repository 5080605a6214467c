"""``typing.get_type_hints`` for scripts: string annotations resolved without evaluating code.

The real function evaluates every string annotation (and every forward reference it meets, however it was
made) with `eval`, past the policy's check of the script's source, and in the globals of the class's module (for a
script's class, the host's ``__main__``). This one reads the same annotations and resolves each string itself, in
the session's namespace: names, public attributes, subscripts, ``|``, tuples, lists and constants only, so a string
annotation can do no more than the same expression written in the script. Forward references bound to a module are
refused.

A guardrail, not a boundary: see DESIGN.md ("The runner and its boundary").
"""

from __future__ import annotations

import ast
import functools
import operator
import types
import typing
from collections.abc import Mapping
from typing import Any

from snapcell.policy._guard import check_attr, runtime_policy_error
from snapcell.policy._rewrite import FORMAT_ATTR_NAME

__all__ = ["resolve_type_hints"]

# Longest string annotation resolved, and how deep annotations (and strings within them) may nest.
_MAX_TEXT = 2_000
_MAX_DEPTH = 50
_HINT = "Annotations resolve without running code: use names, public attributes, subscripts and | in them."


class _Scope:
    """Where names in an annotation resolve: the class being read (if any), the session, its builtins."""

    def __init__(self, namespace: dict[str, Any], local: Mapping[str, Any] | None) -> None:
        self.namespace = namespace
        self.local = local

    def lookup(self, name: str) -> Any:
        if name.startswith("_"):
            raise runtime_policy_error(f"the name {name} in a string annotation", _HINT)
        if self.local is not None and name in self.local:
            return self.local[name]
        if name in self.namespace:
            return self.namespace[name]
        table = self.namespace.get("__builtins__")
        if isinstance(table, dict) and name in table:
            return table[name]
        raise NameError(f"name {name!r} is not defined")


def _evaluate(text: str, scope: _Scope, depth: int) -> Any:
    """The value of a string annotation, from the constructs `_HINT` names only."""
    if len(text) > _MAX_TEXT:
        raise runtime_policy_error(f"a string annotation of {len(text)} characters", _HINT)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise SyntaxError(f"the annotation {text!r} is not an expression: {exc.msg}") from None
    return _node(tree.body, text, scope, depth)


def _node(node: ast.expr, text: str, scope: _Scope, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise runtime_policy_error(f"the annotation {text[:80]!r} (nested too deeply)", _HINT)
    depth += 1
    if isinstance(node, ast.Name):
        return scope.lookup(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_node(node.value, text, scope, depth), check_attr(node.attr))
    if isinstance(node, ast.Subscript):
        return _node(node.value, text, scope, depth)[_node(node.slice, text, scope, depth)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _node(node.left, text, scope, depth) | _node(node.right, text, scope, depth)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_node(item, text, scope, depth) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Constant):
        return node.value
    raise runtime_policy_error(f"evaluating the annotation {text[:80]!r}", _HINT)


def _resolve(value: Any, scope: _Scope, depth: int = 0) -> Any:
    """``value`` with every string and forward reference in it resolved, as `typing.get_type_hints` would."""
    if depth > _MAX_DEPTH:
        raise runtime_policy_error("an annotation nested too deeply", _HINT)
    depth += 1
    if value is None:
        return type(None)
    if isinstance(value, str):
        return _resolve(_evaluate(value, scope, depth), scope, depth)
    if isinstance(value, typing.ForwardRef):
        if value.__forward_module__ is not None:
            raise runtime_policy_error("a forward reference bound to a module", _HINT)
        return _resolve(value.__forward_arg__, scope, depth)
    if isinstance(value, types.GenericAlias):
        args = tuple(_resolve(arg, scope, depth) for arg in value.__args__)
        origin: Any = value.__origin__
        return types.GenericAlias(origin, args) if args != value.__args__ else value
    if isinstance(value, types.UnionType):
        return functools.reduce(operator.or_, (_resolve(arg, scope, depth) for arg in value.__args__))
    if isinstance(value, typing._GenericAlias) and value.__origin__ is not typing.Literal:  # type: ignore[attr-defined]
        args = tuple(_resolve(arg, scope, depth) for arg in value.__args__)
        return value.copy_with(args) if args != value.__args__ else value
    return value


def _strip(value: Any) -> Any:
    """``value`` without ``Annotated``, ``Required`` and ``NotRequired`` (``include_extras=False``)."""
    return typing._strip_annotations(value)  # type: ignore[attr-defined]


def resolve_type_hints(obj: Any, namespace: dict[str, Any], include_extras: bool = False) -> dict[str, Any]:
    """`typing.get_type_hints` of ``obj`` called from code whose globals are ``namespace``, resolving string
    annotations there without evaluating code (the stand-in scripts call is `_standins.get_type_hints`).

    Raises:
        PolicyError: The caller is not the script's own code, or an annotation needs more than names, public
            attributes, subscripts and ``|`` (a call, a private or special name), or a forward reference names a
            module.
    """
    table = namespace.get("__builtins__")
    if not isinstance(table, dict) or FORMAT_ATTR_NAME not in table:
        raise runtime_policy_error("typing.get_type_hints outside the script's own code", _HINT)
    hints: dict[str, Any] = {}
    if isinstance(obj, type):
        for base in reversed(obj.__mro__):
            annotations = type.__dict__["__dict__"].__get__(base).get("__annotations__", {})
            if isinstance(annotations, types.GetSetDescriptorType):
                continue  # `type` itself
            scope = _Scope(namespace, type.__dict__["__dict__"].__get__(base))
            for name, value in dict(annotations).items():
                hints[name] = _resolve(value, scope)
    else:
        annotations = getattr(obj, "__annotations__", None)
        if annotations is None:
            if isinstance(obj, types.ModuleType | types.FunctionType | types.MethodType) or callable(obj):
                return {}
            raise TypeError(f"{obj!r} is not a module, class, method, or function.")
        scope = _Scope(namespace, None)
        hints = {name: _resolve(value, scope) for name, value in dict(annotations).items()}
    return hints if include_extras else {name: _strip(value) for name, value in hints.items()}
