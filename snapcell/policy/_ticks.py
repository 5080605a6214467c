"""The tree edits behind wall-time limits: checks of an expired flag in loops, handlers and ``finally`` blocks.

The policy applies them when it compiles a cell; the interpreter's watchdog (`snapcell.interpreter`) sets the flag
the checks read when a run's time is up, so pure-Python code stops where it runs.
"""

from __future__ import annotations

import ast

__all__ = ["EXPIRED_NAME", "TICK_NAME", "ScriptInterrupt", "apply_checks", "expired_check", "instrument", "tick"]

TICK_NAME = "__snapcell_tick__"
EXPIRED_NAME = "__snapcell_expired__"


class ScriptInterrupt(BaseException):
    """Raised inside a script whose wall time is up; a BaseException so ``except Exception`` misses it."""


def tick() -> None:
    """Raise `ScriptInterrupt` (called by instrumented code once the run's expired flag is set)."""
    raise ScriptInterrupt


def expired_check(at: ast.AST) -> ast.stmt:
    """``if __snapcell_expired__: __snapcell_tick__()``, located at ``at`` (every node, no later fix-up pass)."""
    call = ast.Call(func=ast.Name(id=TICK_NAME, ctx=ast.Load()), args=[], keywords=[])
    check = ast.If(test=ast.Name(id=EXPIRED_NAME, ctx=ast.Load()), body=[ast.Expr(call)], orelse=[])
    for node in ast.walk(check):
        ast.copy_location(node, at)
    return check


def apply_checks(first: list[tuple[list[ast.stmt], ast.AST]], after: list[tuple[list[ast.stmt], ast.stmt]]) -> None:
    """Insert expired-flag checks recorded by a tree walk.

    Args:
        first: Statement lists (loop bodies, handlers, finally blocks) to start with a check, and their owner.
        after: ``with`` statements to follow with a check, and the statement list holding them.
    """
    for body, owner in first:
        body.insert(0, expired_check(owner))
    for body, stmt in after:
        for index, item in enumerate(body):
            if item is stmt:
                body.insert(index + 1, expired_check(stmt))
                break


class _Instrument(ast.NodeTransformer):
    def _first(self, node: ast.AST, body: list[ast.stmt]) -> None:
        body.insert(0, expired_check(node))

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        self.generic_visit(node)
        self._first(node, node.body)
        return node

    def _loop(self, node: ast.While | ast.For | ast.AsyncFor) -> ast.AST:
        self.generic_visit(node)
        self._first(node, node.body)
        return node

    visit_While = _loop
    visit_For = _loop
    visit_AsyncFor = _loop

    def _try(self, node: ast.Try | ast.TryStar) -> ast.AST:
        self.generic_visit(node)
        if node.finalbody:
            self._first(node, node.finalbody)
        return node

    visit_Try = _try
    visit_TryStar = _try

    def _after(self, node: ast.With | ast.AsyncWith) -> list[ast.stmt]:
        self.generic_visit(node)
        return [node, expired_check(node)]

    visit_With = _after
    visit_AsyncWith = _after


def instrument(tree: ast.Module) -> ast.Module:
    """Insert expired-flag checks into loops, except handlers, finally blocks and after with blocks."""
    _Instrument().visit(tree)
    return tree


# Looked up once: the lookup runs Python code in ctypes, where an interrupt in flight could land.
