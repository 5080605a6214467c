"""Which variables a run bound: `RunResult.assigned`, for the note of a cancelled or interrupted run.

Only the names a cell can bind are watched (from its syntax tree), so the cost follows the cell's size, not the
namespace's: the object ID under each before the run, compared after it.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from typing import Any

from snapcell.interpreter._host import HostFunction

__all__ = ["MAX_ASSIGNED", "UNBOUND", "assigned_names", "bindable_names"]

MAX_ASSIGNED = 100


UNBOUND = object()


def bindable_names(tree: ast.AST) -> list[str]:
    """Every name a cell could bind in its namespace: assignment targets, imports, defs, classes, handlers."""
    names: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names[node.id] = None
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = None
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names[node.name] = None
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names[node.rest] = None
    return list(names)


def assigned_names(before: dict[str, int], namespace: dict[str, Any], *, skip: Collection[str]) -> tuple[str, ...]:
    """The watched names the run bound or rebound (a new object under the name), in the cell's order."""
    names = []
    for name, old in before.items():
        value = namespace.get(name, UNBOUND)
        if value is not UNBOUND and id(value) != old and name not in skip:
            if not isinstance(value, HostFunction):
                names.append(name)
                if len(names) >= MAX_ASSIGNED:
                    break
    return tuple(names)
