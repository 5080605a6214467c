"""Source rewrites that send operations the AST check cannot judge to the guard at runtime.

``x.format`` / ``x.format_map`` loads go through `snapcell.policy._guard.format_attr` (templates built at
runtime), the object of every attribute assignment or deletion through ``store_target`` (classes and
functions shared by every session are read-only), and calls that may create a class through a checked
call (no ``__del__``). The names the rewritten code calls are entries of the session's builtins.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass, field

__all__ = [
    "ASYNC_RUN_NAME",
    "AsyncioRunNames",
    "CLASS_CLOCK_NAMES",
    "Plan",
    "FORMAT_ATTR_NAME",
    "TYPED_ATTR_NAME",
    "TYPED_NAMES",
    "async_run_call",
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
# Replaces loads of attributes whose rule depends on the object (`TYPED_NAMES`): ``__snapcell_typed_attr__(x, name)``.
TYPED_ATTR_NAME = "__snapcell_typed_attr__"
# The class clocks of ``datetime.date`` and ``datetime.datetime``, which a pausable run records: loads of them are
# typed attributes too (`snapcell.policy._guard.class_clock` decides by the object).
CLASS_CLOCK_NAMES = frozenset({"now", "today", "utcnow"})
TYPED_NAMES = (
    frozenset({"replace", "__dict__", "_replace", "_asdict", "_fields", "_make", "_field_defaults"}) | CLASS_CLOCK_NAMES
)
# Replaces a top-level ``asyncio.run(coro)``: ``await __snapcell_asyncio_run__(asyncio.run, coro)``.
ASYNC_RUN_NAME = "__snapcell_asyncio_run__"


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
    """True for a load that `format_call` must replace.

    That is a non-literal ``x.format`` / ``x.format_map``, or an attribute of `TYPED_NAMES` (checked with its object).
    """
    if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
        return False
    if node.attr in TYPED_NAMES:
        return True
    return node.attr in ("format", "format_map") and not (
        isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    )


def format_call(node: ast.Attribute) -> ast.Call:
    """``__snapcell_format_attr__(x, "format")`` in place of ``x.format``, at the same location.

    An attribute of `TYPED_NAMES`, or a private one, becomes ``__snapcell_typed_attr__(x, name)`` instead.
    """
    typed = node.attr in TYPED_NAMES or node.attr.startswith("_")  # a private name: checked with its object
    helper = TYPED_ATTR_NAME if typed else FORMAT_ATTR_NAME
    call = ast.Call(func=ast.Name(id=helper, ctx=ast.Load()), args=[node.value, ast.Constant(node.attr)], keywords=[])
    for new in (call, call.func, call.args[1]):
        ast.copy_location(new, node)
    return call


class AsyncioRunNames:
    """How a cell names ``asyncio.run``: ``asyncio.run``, ``aio.run`` after ``import asyncio as aio``, ``run``
    after ``from asyncio import run``. The rewritten call checks at runtime that it really is ``asyncio.run``.
    """

    def __init__(self) -> None:
        self.modules = {"asyncio"}
        self.functions: set[str] = set()

    def note_import(self, alias: ast.alias, from_module: str | None = None) -> None:
        """Remember the names an ``import`` (or ``from from_module import``) binds to asyncio or its ``run``."""
        if from_module is None and alias.name == "asyncio":
            self.modules.add(alias.asname or alias.name)
        elif from_module == "asyncio" and alias.name == "run":
            self.functions.add(alias.asname or alias.name)

    def matches(self, node: ast.AST) -> bool:
        """True for a call of what this cell names ``asyncio.run``."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr == "run" and isinstance(func.value, ast.Name) and func.value.id in self.modules
        return isinstance(func, ast.Name) and func.id in self.functions


def async_run_call(node: ast.Call) -> ast.Await:
    """``await __snapcell_asyncio_run__(f, args...)`` in place of the call ``f(args...)``, at the same location."""
    call = ast.Call(
        func=ast.Name(id=ASYNC_RUN_NAME, ctx=ast.Load()), args=[node.func, *node.args], keywords=node.keywords
    )
    awaited = ast.Await(value=call)
    for new in (awaited, call, call.func):
        ast.copy_location(new, node)
    return awaited


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


@dataclass(slots=True)
class Plan:
    """Edits the policy makes to a checked script, recorded by the check's walk so the tree is walked once.

    ``first`` and ``after`` are the interrupt checks' places (applied by the policy with ``apply_checks``).
    """

    formats: list[tuple[ast.AST, str, int | None, ast.Attribute]] = field(default_factory=list)
    stores: list[ast.Attribute] = field(default_factory=list)
    type_calls: list[ast.Call] = field(default_factory=list)
    first: list[tuple[list[ast.stmt], ast.AST]] = field(default_factory=list)
    after: list[tuple[list[ast.stmt], ast.stmt]] = field(default_factory=list)
    awaits: list[tuple[ast.AST, str, int | None, ast.Call]] = field(default_factory=list)

    def apply_rewrites(self) -> None:
        """Make the recorded rewrites (all but the interrupt checks) in place."""
        # Formats first: type calls shift argument indices and stores wrap whatever their value is by then.
        for parent, name, index, node in self.formats:
            _replace(parent, name, index, format_call(node))
        for call in self.type_calls:
            type_call(call)
        for target in self.stores:
            target.value = store_call(target.value)
        for parent, name, index, run in self.awaits:
            _replace(parent, name, index, async_run_call(run))


def _replace(parent: ast.AST, name: str, index: int | None, new: ast.AST) -> None:
    if index is None:
        setattr(parent, name, new)
    else:
        getattr(parent, name)[index] = new
