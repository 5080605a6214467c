"""The restricted policy's check of a script's source before it runs (`Policy.check`): the AST walk.

Raises `PolicyError` at the first blocked construct and plans the rewrites `Policy.transform` applies; the rules
are listed in `snapcell.policy._policy`.
"""

from __future__ import annotations

import ast
import weakref
from typing import Protocol

from snapcell.errors import PolicyError
from snapcell.policy._guard import (
    SAFE_DUNDERS,
    attribute_hint,
    attribute_problem,
    format_problem,
    is_dunder,
    name_denied,
)
from snapcell.policy._rewrite import TYPED_NAMES, AsyncioRunNames, Plan, is_type_call, needs_format_check

__all__ = ["Checker", "ImportRule", "plans"]


class ImportRule(Protocol):
    """What the check asks of the policy (`Policy` is one): which imports it refuses, and the error."""

    def refuses_import(self, name: str) -> bool: ...

    def import_error(self, name: str, *, lineno: int | None = None, line: str = "") -> PolicyError: ...


_SAFE_NAMES = frozenset({"__name__", "__debug__", "__class__", "__slots__", "__match_args__"}) | SAFE_DUNDERS
_FORMAT_HINT = "Use f-strings or plain {} / {0} / {name} fields; attribute paths like {0.attr} are not allowed."


def _line(source: str, lineno: int | None) -> str:
    lines = source.splitlines()
    return lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else ""


def _blocked(node: ast.AST, source: str, what: str, hint: str) -> PolicyError:
    lineno = getattr(node, "lineno", None)
    line = _line(source, lineno)
    return PolicyError(
        f"{what} is not allowed",
        exc_type="PolicyError",
        traceback_text=f"PolicyError: {what} is not allowed (line {lineno})\n    {line.strip()}",
        lineno=lineno,
        hint=hint,
    )


def _first_param(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list):
        return None
    params = [*func.args.posonlyargs, *func.args.args]
    if not params:
        return None
    name = params[0].arg
    for node in ast.walk(func):
        rebinds = (
            isinstance(node, ast.Name)
            and node.id == name
            and not isinstance(node.ctx, ast.Load)
            or isinstance(node, ast.Global | ast.Nonlocal)
            and name in node.names
            or isinstance(node, ast.arg)
            and node.arg == name
            and node is not params[0]
        )
        if rebinds:
            return None
    return name


plans: weakref.WeakKeyDictionary[ast.Module, Plan] = weakref.WeakKeyDictionary()
_LOOPS = (ast.While, ast.For, ast.AsyncFor, ast.ExceptHandler)


class Checker(ast.NodeVisitor):
    """Walks a script, raises `PolicyError` at the first blocked construct, and plans the rewrites."""

    def __init__(self, policy: ImportRule, source: str) -> None:
        self.policy = policy
        self.source = source
        self.selves: list[str] = []
        self.plan = Plan()
        self.nested = 0  # inside a def, lambda, class or generator expression: no top-level await there
        self.asyncio_run = AsyncioRunNames()

    def _top_level_run(self, node: ast.AST) -> bool:
        return not self.nested and self.asyncio_run.matches(node)

    def generic_visit(self, node: ast.AST) -> None:
        plan = self.plan
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        if isinstance(item, ast.With | ast.AsyncWith):
                            plan.after.append((value, item))
                        elif needs_format_check(item) or self._other_private(item):
                            plan.formats.append((node, name, index, item))  # type: ignore[arg-type]
                        elif self._top_level_run(item):
                            plan.awaits.append((node, name, index, item))  # type: ignore[arg-type]
                        self.visit(item)
            elif isinstance(value, ast.AST):
                if needs_format_check(value) or self._other_private(value):
                    plan.formats.append((node, name, None, value))  # type: ignore[arg-type]
                elif self._top_level_run(value):
                    plan.awaits.append((node, name, None, value))  # type: ignore[arg-type]
                self.visit(value)
        if isinstance(node, _LOOPS):
            plan.first.append((node.body, node))
        elif isinstance(node, ast.Try | ast.TryStar) and node.finalbody:
            plan.first.append((node.finalbody, node))

    def fail(self, node: ast.AST, what: str, hint: str) -> PolicyError:
        return _blocked(node, self.source, what, hint)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self.policy.refuses_import(alias.name):
                raise self.policy.import_error(alias.name, lineno=node.lineno, line=_line(self.source, node.lineno))
            self.asyncio_run.note_import(alias)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            raise self.fail(node, "relative imports", "Import allowed modules by their full name.")
        if self.policy.refuses_import(module):
            raise self.policy.import_error(module, lineno=node.lineno, line=_line(self.source, node.lineno))
        for alias in node.names:
            self.asyncio_run.note_import(alias, module)
            if alias.name != "*" and name_denied(module, alias.name):
                if module == "__future__" and not alias.name.startswith("_"):
                    continue
                raise self.fail(node, f"importing {alias.name!r} from {module!r}", "Use the module's public names.")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        store = not isinstance(node.ctx, ast.Load)
        problem = attribute_problem(node.attr, store=store)
        if problem and not self._own_private(node) and (store or node.attr not in TYPED_NAMES):
            if self._other_private(node):
                self.generic_visit(node)  # `other._x`, `t._x`: checked at runtime (the script's own objects only)
                return
            raise self.fail(node, problem, attribute_hint(node.attr))
        if store:
            self.plan.stores.append(node)
        self.generic_visit(node)

    def _other_private(self, node: ast.AST) -> bool:
        """True for ``other._x`` read anywhere but as ``self._x`` in a method (decided by the object at runtime)."""
        return (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and node.attr.startswith("_")
            and not is_dunder(node.attr)
            and not self._own_private(node)
        )

    def _own_private(self, node: ast.Attribute) -> bool:
        name = node.attr
        return (
            name.startswith("_")
            and not is_dunder(name)
            and isinstance(node.value, ast.Name)
            and node.value.id in self.selves
        )

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__") and node.id.endswith("__") and node.id not in _SAFE_NAMES:
            raise self.fail(node, f"the name {node.id}", "Names like __builtins__ and __import__ are not available.")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for name in ("decorator_list", "bases"):
            for index, item in enumerate(getattr(node, name)):
                if needs_format_check(item):
                    self.plan.formats.append((node, name, index, item))
                self.visit(item)
        for keyword in node.keywords:
            self.visit(keyword)
        self.nested += 1
        for stmt in node.body:
            if isinstance(stmt, ast.With | ast.AsyncWith):
                self.plan.after.append((node.body, stmt))
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self._visit_function(stmt, _first_param(stmt))
            else:
                self.visit(stmt)
        self.nested -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._visit_function(node, None)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, self_name: str | None) -> None:
        if node.name == "__del__":
            raise self.fail(node, "defining __del__", "Finalizers would run outside the run; use a with block.")
        for annotation in _annotations(node):
            self._check_annotation(annotation)
        if self_name is not None:
            self.selves.append(self_name)
        self.nested += 1
        try:
            self.generic_visit(node)
        finally:
            self.nested -= 1
            if self_name is not None:
                self.selves.pop()

    def visit_Lambda(self, node: ast.Lambda | ast.GeneratorExp) -> None:
        self.nested += 1
        self.generic_visit(node)
        self.nested -= 1  # no finally: a PolicyError ends the walk

    visit_GeneratorExp = visit_Lambda

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_annotation(node.annotation)
        self.generic_visit(node)

    def _check_annotation(self, annotation: ast.expr) -> None:
        for sub in ast.walk(annotation):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    parsed = ast.parse(sub.value.strip(), mode="eval")
                except SyntaxError:
                    continue
                for inner in ast.walk(parsed):
                    ast.copy_location(inner, sub)
                self.visit(parsed)

    def visit_Call(self, node: ast.Call) -> None:
        if is_type_call(node):
            self.plan.type_calls.append(node)
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if callee in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            store = callee in ("setattr", "delattr")
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and (store or name.value not in TYPED_NAMES)
            ):
                problem = attribute_problem(name.value, store=store)
                if problem and not (not store and _private(name.value)):  # private reads: decided by the object
                    raise self.fail(node, problem, attribute_hint(name.value))
        elif callee in ("attrgetter", "methodcaller"):
            for text in literal[: 1 if callee == "methodcaller" else None]:
                for part in text.split("."):
                    if attribute_problem(part) and part not in TYPED_NAMES:
                        raise self.fail(node, attribute_problem(part) or "", attribute_hint(part))
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("format", "format_map")
            and isinstance(func.value, ast.Constant)
            and isinstance(func.value.value, str)
        ):
            problem = format_problem(func.value.value)
            if problem:
                raise self.fail(node, problem, _FORMAT_HINT)
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:
            problem = attribute_problem(name)
            if problem:
                raise self.fail(node, problem, attribute_hint(name))
        self.generic_visit(node)


def _private(name: str) -> bool:
    return name.startswith("_") and not is_dunder(name) and attribute_problem(name) == f"the private attribute .{name}"


def _annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    args = node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    found = [p.annotation for p in params if p is not None and p.annotation is not None]
    return [*found, node.returns] if node.returns is not None else found
