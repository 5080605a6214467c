"""Source rewrites that send operations the AST check cannot judge to the guard at runtime.

``x.format`` / ``x.format_map`` loads go through `snapcell.runner._guard.format_attr` (templates built at
runtime), the object of every attribute assignment or deletion through ``store_target`` (classes and
functions shared by every session are read-only), and calls that may create a class through a checked
call (no ``__del__``). The names the rewritten code calls are entries of the session's builtins.
"""

from __future__ import annotations

import ast

__all__ = [
    "FORMAT_ATTR_NAME",
    "STORE_TARGET_NAME",
    "TYPE_CALL_NAME",
    "format_call",
    "is_type_call",
    "needs_format_check",
    "rewrite_format_calls",
    "store_call",
    "type_call",
]

# Replaces ``x.format`` / ``x.format_map`` loads so format strings built at runtime are checked.
FORMAT_ATTR_NAME = "__snapcell_format_attr__"
# Wraps the object of every attribute assignment or deletion (``x.attr = v`` becomes
# ``__snapcell_store_target__(x).attr = v``) so classes and functions shared by every session stay unpatched.
STORE_TARGET_NAME = "__snapcell_store_target__"
# Replaces ``type(...)`` calls other than ``type(x)``: ``__snapcell_type_call__(type, name, bases, ns)``.
TYPE_CALL_NAME = "__snapcell_type_call__"


def store_call(node: ast.expr) -> ast.Call:
    """``__snapcell_store_target__(node)``, at the location of ``node``."""
    call = ast.Call(func=ast.Name(id=STORE_TARGET_NAME, ctx=ast.Load()), args=[node], keywords=[])
    ast.copy_location(call, node)
    ast.copy_location(call.func, node)
    return call


# Calls of these attributes may create a class: ``type.__new__(type, n, b, ns)``, ``int.__class__(n, b, ns)``.
_CLASS_MAKERS = frozenset({"__new__", "__class__", "__call__"})


def is_type_call(node: ast.Call) -> bool:
    """True for a call that may create a class.

    That is ``type(...)`` other than ``type(x)``, and ``x.__new__(...)``, ``x.__class__(...)`` or ``x.__call__(...)``.
    """
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in _CLASS_MAKERS
    return (
        isinstance(func, ast.Name)
        and func.id == "type"
        and (len(node.args) != 1 or bool(node.keywords) or isinstance(node.args[0], ast.Starred))
    )


def type_call(node: ast.Call) -> None:
    """Rewrite ``f(a, b, c)`` in place to ``__snapcell_type_call__(f, a, b, c)``; ``f`` is still evaluated first."""
    callee = ast.Name(id=TYPE_CALL_NAME, ctx=ast.Load())
    ast.copy_location(callee, node.func)
    node.args.insert(0, node.func)
    node.func = callee


def needs_format_check(node: ast.AST) -> bool:
    """True for a non-literal ``x.format`` / ``x.format_map`` load, which `format_call` must replace."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("format", "format_map")
        and isinstance(node.ctx, ast.Load)
        and not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str))
    )


def format_call(node: ast.Attribute) -> ast.Call:
    """``__snapcell_format_attr__(x, "format")`` in place of ``x.format``, at the same location."""
    call = ast.Call(
        func=ast.Name(id=FORMAT_ATTR_NAME, ctx=ast.Load()), args=[node.value, ast.Constant(node.attr)], keywords=[]
    )
    for new in (call, call.func, call.args[1]):
        ast.copy_location(new, node)
    return call


class _FormatRewriter(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            node.value = store_call(node.value)
        return format_call(node) if needs_format_check(node) else node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if is_type_call(node):
            type_call(node)
        return node


def rewrite_format_calls(tree: ast.Module) -> None:
    """Apply every rewrite of this module to ``tree`` in place (for a tree the policy's check did not walk).

    Non-literal ``x.format`` / ``x.format_map`` go through ``format_attr``, the object of every attribute
    assignment through ``store_target``, and calls that may create a class through the checked call.
    """
    _FormatRewriter().visit(tree)
