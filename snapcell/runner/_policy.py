"""The restricted policy: which imports, builtins and attributes a script may use.

A guardrail that gives the model a clear `PolicyError`; never a security boundary on its own.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from snapcell.errors import ConfigError, PolicyError

__all__ = ["DEFAULT_MODULES", "Policy"]

DEFAULT_MODULES = frozenset(
    {
        "abc", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
        "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq", "io", "itertools",
        "json", "math", "numbers", "operator", "pprint", "random", "re", "statistics", "string", "struct",
        "textwrap", "time", "traceback", "typing", "unicodedata", "uuid", "zoneinfo", "__future__",
    }
)  # fmt: skip

_SAFE_BUILTIN_NAMES = frozenset(
    {
        "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
        "classmethod", "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
        "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
        "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set", "slice",
        "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip", "getattr", "hasattr", "setattr",
        "delattr", "NotImplemented", "Ellipsis", "None", "True", "False", "__build_class__", "__name__",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What scripts may import and touch.

    Attributes:
        allowed_modules: Top-level modules (and their submodules) scripts may import.
        extra_modules: Added to ``allowed_modules``; the usual way to allow ``numpy`` or ``pandas``.
        restricted: False turns every check off (trusted code only): real builtins, any import.
    """

    allowed_modules: frozenset[str] = DEFAULT_MODULES
    extra_modules: frozenset[str] = field(default_factory=frozenset)
    restricted: bool = True

    def __post_init__(self) -> None:
        for name in ("allowed_modules", "extra_modules"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
                raise ConfigError(f"Policy.{name} must be a collection of module names, not {value!r}")
            object.__setattr__(self, name, frozenset(value))

    @classmethod
    def unrestricted(cls) -> Policy:
        """A policy that checks nothing, for trusted code."""
        return cls(restricted=False)

    def with_modules(self, names: Iterable[str]) -> Policy:
        """A copy that also allows ``names``."""
        return Policy(
            allowed_modules=self.allowed_modules,
            extra_modules=self.extra_modules | frozenset(names),
            restricted=self.restricted,
        )

    @property
    def modules(self) -> frozenset[str]:
        """Every allowed top-level module."""
        return self.allowed_modules | self.extra_modules

    def allows_module(self, name: str) -> bool:
        """True when ``name`` (or the package it belongs to) may be imported."""
        if not self.restricted:
            return True
        return name.split(".", 1)[0] in self.modules

    def check(self, tree: ast.Module, source: str, filename: str) -> None:
        """Check a parsed script before it runs.

        Raises:
            PolicyError: The script uses something the policy blocks; it did not run.
        """
        if not self.restricted:
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._check_import(node, source)
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                raise _blocked(node, source, f"access to the private attribute .{node.attr}")
            elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id != "__name__":
                raise _blocked(node, source, f"the name {node.id}")

    def _check_import(self, node: ast.Import | ast.ImportFrom, source: str) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise _blocked(node, source, "relative imports")
            names = [node.module or ""]
        else:
            names = [alias.name for alias in node.names]
        for name in names:
            if not self.allows_module(name):
                raise self.import_error(name, lineno=node.lineno, line=_line(source, node.lineno))

    def import_error(self, name: str, *, lineno: int | None = None, line: str = "") -> PolicyError:
        """The error for a blocked import of ``name``."""
        allowed = ", ".join(sorted(m for m in self.modules if m != "__future__"))
        return PolicyError(
            f"import of {name!r} is not allowed",
            exc_type="PolicyError",
            traceback_text=f"PolicyError: import of {name!r} is not allowed"
            + (f" (line {lineno})\n    {line.strip()}" if lineno else ""),
            lineno=lineno,
            hint=f"Allowed modules: {allowed}.",
        )

    def make_builtins(self) -> dict[str, Any]:
        """A fresh builtins dict for a session's namespace."""
        if not self.restricted:
            return dict(vars(builtins))
        table = {name: getattr(builtins, name) for name in _SAFE_BUILTIN_NAMES if hasattr(builtins, name)}
        for name, value in vars(builtins).items():
            if isinstance(value, type) and issubclass(value, BaseException):
                table[name] = value
        table["__import__"] = self._make_import()
        return table

    def _make_import(self) -> Callable[..., Any]:
        def guarded_import(
            name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            if level:
                raise self.import_error(name)
            if not self.allows_module(name):
                raise self.import_error(name)
            module = importlib.import_module(name)
            return module if fromlist else importlib.import_module(name.split(".", 1)[0])

        return guarded_import

    def find_global_overrides(self) -> dict[tuple[str, str], Any]:
        """Replacements the checkpoint loader uses for dangerous globals (a guarded ``getattr``)."""
        return {}


def _line(source: str, lineno: int | None) -> str:
    lines = source.splitlines()
    return lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else ""


def _blocked(node: ast.AST, source: str, what: str) -> PolicyError:
    lineno = getattr(node, "lineno", None)
    line = _line(source, lineno)
    return PolicyError(
        f"{what} is not allowed",
        exc_type="PolicyError",
        traceback_text=f"PolicyError: {what} is not allowed (line {lineno})\n    {line.strip()}",
        lineno=lineno,
        hint="Use public names and the allowed modules only.",
    )
