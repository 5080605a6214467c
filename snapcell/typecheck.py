"""Type-check scripts against host-function stubs with ty, before they run.

The script is checked as written, in a file whose first line is a fixed one-line
preamble (``import asyncio`` and star imports of the declarations, the earlier
cells and the stubs), so a reported line maps back by subtracting one and
columns need no mapping. Top-level ``await``, ``async for``/``async with`` and
async comprehensions are legal in a cell; ty reports them as syntax errors in a
module, and those diagnostics (and only those) are dropped, since ty still
infers the awaited types. Earlier cells live in their own module, star-imported
with an explicit ``__all__`` so that names starting with an underscore come
along; their own diagnostics are never reported.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapcell._support import is_async_callable
from snapcell.errors import ConfigError, TimeLimitExceeded, TypingError

__all__ = ["Diagnostic", "TypeChecker", "declarations_from_namespace", "find_ty", "stubs_from_functions"]

_STUBS_MODULE = "__snapcell_stubs__"
_INSTALL_HINT = "pip install 'snapcell[typecheck]'"
# Diagnostics that only say the cell is not inside an async function: a cell may await at top level.
_TOP_LEVEL_ASYNC = re.compile(
    r"^(`await`|`async for`|`async with`|asynchronous comprehension) outside of an asynchronous function"
    r"|^__future__ imports must be at the top of the file"
)
_HEADER = re.compile(r"^(error|warning|info)\[([\w-]+)\]: ")
_LOCATION = re.compile(r"^\s*(?:-->|:::)\s+(.+?):(\d+):(\d+)\s*$")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def find_ty() -> str:
    """Locate the ty executable: next to ``sys.executable`` first, then on ``PATH``.

    Returns:
        The path of the executable.

    Raises:
        ConfigError: ty is not installed; nothing was started.
    """
    name = "ty.exe" if os.name == "nt" else "ty"
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ty")
    if found is None:
        raise ConfigError(f"type checking needs the ty type checker, which is not installed: {_INSTALL_HINT}")
    return found


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding of the type checker, in the coordinates of the script as written.

    Attributes:
        code: ty's rule name (``"invalid-argument-type"``).
        severity: ``"error"``, ``"warning"`` or ``"info"``.
        message: The checker's message.
        line: Line in the script, 1-based.
        column: Column in that line, 1-based, in characters.
        source_line: The text of that script line.
        stub_note: The stub line the finding conflicts with, when the checker points into the stubs.
        end_line: Last line of the reported span, when known.
        end_column: Column just past the reported span on ``end_line``, when known.
    """

    code: str
    severity: str
    message: str
    line: int
    column: int
    source_line: str
    stub_note: str | None = None
    end_line: int | None = None
    end_column: int | None = None

    def render(self, format: str = "full") -> str:
        """Render as text for a model: ``"concise"`` is one line, ``"full"`` adds the line, a caret and the stub.

        Raises:
            ConfigError: ``format`` is neither ``"full"`` nor ``"concise"``.
        """
        if format not in ("full", "concise"):
            raise ConfigError(f"format must be 'full' or 'concise', not {format!r}")
        kind = "" if self.severity == "error" else f" ({self.severity})"
        head = f"line {self.line}:{self.column}: [{self.code}]{kind} {self.message}"
        if format == "concise":
            return head
        text = self.source_line.expandtabs(1)
        width = 1
        if self.end_line == self.line and self.end_column is not None and self.end_column > self.column:
            width = self.end_column - self.column
        elif self.end_line is not None and self.end_line > self.line:
            width = max(1, len(text) - self.column + 1)
        parts = [head, f"    {text}", "    " + " " * (self.column - 1) + "^" * width]
        if self.stub_note:
            parts.append(f"    stub: {self.stub_note}")
        return "\n".join(parts)


class TypeChecker:
    """Check scripts with ty against a fixed stubs text, in a private temporary directory.

    One instance serves many checks, from any thread: the stubs are written once,
    and each check writes its own uniquely named files. The directory is removed
    when the instance is closed or garbage-collected.
    """

    def __init__(self, stubs: str = "", *, ty_path: str | None = None, timeout_s: float = 10.0) -> None:
        """Prepare the directory and the stub module.

        Args:
            stubs: Python stub text declaring the host functions and their types.
            ty_path: The ty executable; found with `find_ty` when ``None``.
            timeout_s: Wall-time limit for one ty run, in seconds.

        Raises:
            ConfigError: ty is missing, ``ty_path`` is not an executable file, or ``timeout_s`` is not positive.
        """
        if ty_path is None:
            ty_path = find_ty()
        elif not (Path(ty_path).is_file() and os.access(ty_path, os.X_OK)):
            raise ConfigError(f"ty executable not found at {ty_path!r}: {_INSTALL_HINT}")
        ty_path = os.path.abspath(ty_path)  # ty runs with the temporary directory as its working directory
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be positive, not {timeout_s!r}")
        self.ty_path = ty_path
        self.timeout_s = timeout_s
        self.stubs = stubs
        self._stub_lines = _NEWLINE.split(stubs)
        self._stub_classes = _stub_classes(stubs)
        self._dir = Path(tempfile.mkdtemp(prefix="snapcell-ty-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._counter = itertools.count()
        (self._dir / "ty.toml").write_text("", encoding="utf-8")
        (self._dir / f"{_STUBS_MODULE}.pyi").write_text(stubs, encoding="utf-8")
        self._base_command = [
            ty_path,
            "check",
            "--config-file",
            str(self._dir / "ty.toml"),
            "--python",
            sys.prefix,
            "--python-version",
            f"{sys.version_info.major}.{sys.version_info.minor}",
            "--no-progress",
            "--color",
            "never",
            "--exit-zero",
        ]

    def close(self) -> None:
        """Remove the temporary directory; the checker cannot be used afterwards."""
        self._cleanup()

    def check(self, code: str, *, prior_cells: Sequence[str] = (), declarations: str = "") -> list[Diagnostic]:
        """Type-check one script and return what ty reports about it, errors first.

        Args:
            code: The script as the model wrote it; may await at top level.
            prior_cells: Source of earlier successful cells, oldest first; the names they bind are known.
            declarations: Stub-style declarations of names already in the namespace (see
                `declarations_from_namespace`); ``Any`` is available without an import.

        Returns:
            Diagnostics of every severity, mapped to the script's own lines and columns.

        Raises:
            ConfigError: ``declarations`` does not parse, or ty failed to run; the session is unchanged.
            TimeLimitExceeded: ty ran longer than ``timeout_s``; the script did not run.
        """
        return self._check(code, prior_cells, declarations, reveal=False)[0]

    def _check(
        self, code: str, prior_cells: Sequence[str], declarations: str, *, reveal: bool
    ) -> tuple[list[Diagnostic], dict[str, str]]:
        n = next(self._counter)
        decls, prior, cell = f"__snapcell_decls_{n}__", f"__snapcell_prior_{n}__", f"__snapcell_cell_{n}__.py"
        header = f"import asyncio; from {decls} import *; from {prior} import *; from {_STUBS_MODULE} import *\n"
        declared = _declarations_module(declarations)
        names = _revealable(code) if reveal and self._stub_classes else []
        # Asked after the script, so ty says what each name it bound holds at its end (lines past the script's).
        tail = "".join(f"\n{_REVEAL}({name})" for name in names)
        files = {f"{decls}.pyi": declared, f"{prior}.py": _prior_module(prior_cells), cell: header + code + tail}
        try:
            for name, text in files.items():
                (self._dir / name).write_text(text, encoding="utf-8", newline="")
            found, revealed = self._diagnostics(cell, code, "sarif")
            if self.stubs.strip() and any(d.severity == "error" and d.code != "invalid-syntax" for d in found):
                found = self._with_stub_notes(found, cell)
        finally:
            for name in files:
                (self._dir / name).unlink(missing_ok=True)
        types: dict[str, str] = {}
        if names:
            shadowed = (_bound_names(ast.parse(code).body) or set()) | (
                _bound_names(ast.parse(declarations).body) or set()
            )
            script_lines = len(_NEWLINE.split(code)) + 1  # the preamble's line, then the script's
            for offset, name in enumerate(names, start=script_lines + 1):
                shown = revealed.get(offset)
                static = _static_type(shown, self._stub_classes, shadowed) if shown is not None else None
                if static is not None:
                    types[name] = static
        return sorted(found, key=lambda d: (_SEVERITY_ORDER.get(d.severity, 3), d.line, d.column)), types

    def check_with_types(self, code: str, *, declarations: str = "") -> tuple[list[Diagnostic], dict[str, str]]:
        """Check like `check_or_raise`, and say which types the stubs gave the names the script binds.

        A name's type is reported when ty's type for it at the end of the script uses a class of the stubs
        (``list[Customer]``) and can be spelled in a declaration; other names are left to their runtime values
        (`declarations_from_namespace` takes these types back as ``types``).

        Returns:
            The diagnostics (warnings and infos only), and the types by name, stub classes spelled
            ``__snapcell_stubs__.Customer``.

        Raises:
            TypingError: As for `check_or_raise`.
            ConfigError: As for `check`.
            TimeLimitExceeded: As for `check`.
        """
        found, types = self._check(code, (), declarations, reveal=True)
        _raise_on_errors(found)
        return found, types

    async def acheck_with_types(self, code: str, *, declarations: str = "") -> tuple[list[Diagnostic], dict[str, str]]:
        """Async twin of `check_with_types`, run in a worker thread."""
        import asyncio

        return await asyncio.to_thread(self.check_with_types, code, declarations=declarations)

    async def acheck(self, code: str, *, prior_cells: Sequence[str] = (), declarations: str = "") -> list[Diagnostic]:
        """Async twin of `check`, run in a worker thread so the event loop stays free."""
        import asyncio  # not at module level: a worker imports this module, and its first run needs no asyncio

        return await asyncio.to_thread(self.check, code, prior_cells=prior_cells, declarations=declarations)

    def check_or_raise(self, code: str, *, prior_cells: Sequence[str] = (), declarations: str = "") -> list[Diagnostic]:
        """Check like `check` and raise when ty finds errors; warnings alone pass.

        Returns:
            The diagnostics (warnings and infos only).

        Raises:
            TypingError: The script has type errors; it did not run and the session is unchanged.
                ``diagnostics`` holds every finding, errors first.
            ConfigError: As for `check`.
            TimeLimitExceeded: As for `check`.
        """
        found = self.check(code, prior_cells=prior_cells, declarations=declarations)
        _raise_on_errors(found)
        return found

    async def acheck_or_raise(
        self, code: str, *, prior_cells: Sequence[str] = (), declarations: str = ""
    ) -> list[Diagnostic]:
        """Async twin of `check_or_raise`, run in a worker thread."""
        import asyncio

        return await asyncio.to_thread(self.check_or_raise, code, prior_cells=prior_cells, declarations=declarations)

    def _run(self, cell: str, output_format: str) -> str:
        command = [*self._base_command, "--output-format", output_format, cell]
        try:
            done = subprocess.run(
                command,
                cwd=self._dir,
                capture_output=True,
                timeout=self.timeout_s,
                env=_ty_environment(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TimeLimitExceeded(
                f"type checking took longer than {self.timeout_s} s; the script did not run",
                limit="type_check_timeout_s",
                value=self.timeout_s,
            ) from exc
        except OSError as exc:
            raise ConfigError(f"cannot run ty at {self.ty_path!r} ({exc}): {_INSTALL_HINT}") from exc
        if done.returncode != 0:
            stderr = done.stderr.decode("utf-8", "replace").strip()
            raise ConfigError(f"ty failed (exit status {done.returncode}): {stderr[-2000:]}")
        return done.stdout.decode("utf-8", "replace")

    def _diagnostics(self, cell: str, code: str, output_format: str) -> tuple[list[Diagnostic], dict[int, str]]:
        """The script's diagnostics, and the types ty revealed, by line of the cell file."""
        try:
            report = json.loads(self._run(cell, output_format))
            results = report["runs"][0]["results"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(f"cannot read ty's report ({exc}); is ty {_INSTALL_HINT.split()[-1]} installed?") from exc
        script_lines = _NEWLINE.split(code)
        found = []
        revealed: dict[int, str] = {}
        for result in results:
            diag = _from_sarif(result, cell, script_lines)
            if diag is not None:
                found.append(diag)
            elif result.get("ruleId") == "revealed-type":
                _note_revealed(result, cell, revealed)
        return found, revealed

    def _with_stub_notes(self, found: list[Diagnostic], cell: str) -> list[Diagnostic]:
        # Machine formats drop ty's related locations; the human format keeps them, so read them from there.
        notes: dict[tuple[str, int, int], int] = {}
        key: tuple[str, int, int] | None = None
        primary = ""
        for text in self._run(cell, "full").splitlines():
            header = _HEADER.match(text)
            if header:
                key, primary = None, header.group(2)
                continue
            where = _LOCATION.match(text)
            if not where:
                continue
            path, line, column = Path(where.group(1)).name, int(where.group(2)), int(where.group(3))
            if key is None and path == cell:
                key = (primary, line - 1, column)
            elif key is not None and path == f"{_STUBS_MODULE}.pyi":
                notes.setdefault(key, line)
        stub_names = _stub_definitions(self.stubs)
        result = []
        for diag in found:
            stub_line = notes.get((diag.code, diag.line, diag.column))
            if stub_line is None:
                stub_line = next((stub_names[n] for n in re.findall(r"`(\w+)`", diag.message) if n in stub_names), None)
            if stub_line is not None and 0 < stub_line <= len(self._stub_lines):
                diag = _replace_note(diag, self._stub_lines[stub_line - 1].strip())
            result.append(diag)
        return result


def _raise_on_errors(found: list[Diagnostic]) -> None:
    errors = [d for d in found if d.severity == "error"]
    if not errors:
        return
    count = f"{len(errors)} type error{'s' if len(errors) > 1 else ''}"
    raise TypingError(
        f"The script did not run: {count}, the first at line {errors[0].line}: {errors[0].message}. "
        "Fix it and run it again.",
        diagnostics=found,
        lineno=errors[0].line,
        hint="Fix the script and run it again; nothing ran and no variable changed.",
    )


_REVEAL = "reveal_type"
_REVEALED = re.compile(r"Revealed type: `(.*)`\Z", re.DOTALL)
_MAX_REVEALED = 200  # names of one script whose types are asked for


def _revealable(code: str) -> list[str]:
    """The names a script binds at its top level whose types ty is asked for (none when it does not parse)."""
    try:
        names = _bound_names(ast.parse(code).body)
    except (SyntaxError, ValueError):
        return []
    return sorted(n for n in names or () if n.isidentifier() and not n.startswith("__"))[:_MAX_REVEALED]


def _note_revealed(result: Mapping[str, Any], cell: str, revealed: dict[int, str]) -> None:
    locations = result.get("locations") or [{}]
    physical = locations[0].get("physicalLocation", {})
    if not str(physical.get("artifactLocation", {}).get("uri", "")).endswith("/" + cell):
        return
    match = _REVEALED.match(str(result.get("message", {}).get("text", "")))
    line = physical.get("region", {}).get("startLine")
    if match and isinstance(line, int):
        revealed[line] = match.group(1)


def _stub_classes(stubs: str) -> frozenset[str]:
    try:
        tree = ast.parse(stubs)
    except SyntaxError:
        return frozenset()
    return frozenset(node.name for node in tree.body if isinstance(node, ast.ClassDef))


def _static_type(text: str, stub_classes: frozenset[str], shadowed: set[str]) -> str | None:
    """A revealed type as a declaration, when it uses a stub class and nothing but builtins; else None.

    A union is left out: it is what the script's own branches made of the value, and a later turn that knows the
    value (``None`` or not) should not be held to it.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    if isinstance(tree.body, ast.BinOp):
        return None
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in stub_classes:
                used.add(node.id)
            elif node.id not in _SIMPLE_NAMES or node.id == "Any":
                return None
        elif not isinstance(node, ast.Expression | ast.Load | ast.Subscript | ast.Tuple | ast.BinOp | ast.BitOr):
            if not (isinstance(node, ast.Constant) and node.value in (None, Ellipsis)):
                return None
    if not used or used & shadowed:
        return None

    class _Qualify(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id not in used:
                return node
            return ast.Attribute(value=ast.Name(id=_STUBS_MODULE, ctx=ast.Load()), attr=node.id, ctx=ast.Load())

    return ast.unparse(_Qualify().visit(tree))


def _replace_note(diag: Diagnostic, note: str) -> Diagnostic:
    return Diagnostic(
        diag.code,
        diag.severity,
        diag.message,
        diag.line,
        diag.column,
        diag.source_line,
        note,
        diag.end_line,
        diag.end_column,
    )


def _from_sarif(result: Mapping[str, Any], cell: str, script_lines: list[str]) -> Diagnostic | None:
    code = str(result.get("ruleId", ""))
    message = str(result.get("message", {}).get("text", ""))
    locations = result.get("locations") or [{}]
    physical = locations[0].get("physicalLocation", {})
    uri = str(physical.get("artifactLocation", {}).get("uri", ""))
    region = physical.get("region", {})
    line = int(region.get("startLine", 0)) - 1
    if not uri.endswith("/" + cell) or not 1 <= line <= len(script_lines):
        return None  # the preamble, or another module: earlier cells and declarations are not the script's fault
    if code == "invalid-syntax" and _TOP_LEVEL_ASYNC.match(message):
        return None
    level = str(result.get("level", "error"))
    severity = {"note": "info", "none": "info"}.get(level, level)
    end_line = region.get("endLine")
    return Diagnostic(
        code=code,
        severity=severity,
        message=message,
        line=line,
        column=int(region.get("startColumn", 1)),
        source_line=script_lines[line - 1],
        end_line=int(end_line) - 1 if end_line is not None else None,
        end_column=int(region["endColumn"]) if "endColumn" in region else None,
    )


def _ty_environment() -> dict[str, str]:
    # Keep ty on the interpreter we pass it, whatever environment the host process runs in.
    drop = {"VIRTUAL_ENV", "CONDA_PREFIX", "TY_CONFIG_FILE", "TY_OUTPUT_FORMAT", "PYTHONPATH"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _stub_definitions(stubs: str) -> dict[str, int]:
    try:
        tree = ast.parse(stubs)
    except SyntaxError:
        return {}
    return {
        node.name: node.lineno
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


# Builtins a session adds for its scripts (`snapcell.interpreter`'s runner), declared before the namespace's names.
_SESSION_BUILTINS_STUB = "def memory() -> dict[str, int | None]: ...\n"
_SESSION_BUILTINS = frozenset({"memory"})


def _declarations_module(declarations: str) -> str:
    try:
        tree = ast.parse(declarations)
    except SyntaxError as exc:
        raise ConfigError(f"declarations do not parse: {exc}") from exc
    names = _bound_names(tree.body)
    exports = f"__all__ = {sorted(names | _SESSION_BUILTINS)!r}\n" if names is not None else ""
    return f"from typing import Any\nimport {_STUBS_MODULE}\n{exports}{_SESSION_BUILTINS_STUB}{declarations}\n"


def _prior_module(prior_cells: Sequence[str]) -> str:
    names: set[str] | None = set()
    for source in prior_cells:
        try:
            found = _bound_names(ast.parse(source).body)
        except SyntaxError:
            found = set()
        names = None if found is None or names is None else names | found
    header = f"import asyncio\nfrom {_STUBS_MODULE} import *\n"
    exports = f"__all__ = {sorted(names)!r}\n" if names else ""
    return header + "\n".join(prior_cells) + "\n" + exports


def _bound_names(body: Iterable[ast.stmt]) -> set[str] | None:
    """Names a module body binds, or ``None`` when a star import makes them unknowable."""
    names: set[str] = set()
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            pending.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.comprehension):
            # Comprehension targets are local to it; only a walrus inside binds in the module.
            pending.extend([node.iter, *node.ifs])
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        pending.extend(ast.iter_child_nodes(node))
    return {name for name in names if name != "__all__"}


# ------------------------------------------------------------- declarations


class _Text:
    """An annotation or default that `inspect.Signature` prints verbatim."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_PLAIN = {int: "int", str: "str", float: "float", bool: "bool", bytes: "bytes", complex: "complex"}
_SAMPLE = 200
_MAX_DEPTH = 4


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
    classes = {id(v): k for k, v in ns.items() if isinstance(v, type) and _importable(v) is None}
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
    if isinstance(outer, ast.Attribute) and isinstance(outer.value, ast.Name) and outer.value.id == _STUBS_MODULE:
        return type(value) is dict or type(value).__name__ == outer.attr
    return False


def _declare(name: str, value: object, classes: dict[int, str], imports: dict[str, str]) -> list[str]:
    if isinstance(value, types.ModuleType):
        module = value.__name__
        return [f"import {module}" if module == name else f"import {module} as {name}"]
    origin = _importable(value)
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


def _importable(value: object) -> tuple[str, str] | None:
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
    if kind in _PLAIN:
        return _PLAIN[kind]
    if depth >= _MAX_DEPTH:
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
    origin = _importable(kind)
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
            annotation=_Text(_annotation(param.annotation)),
            default=param.empty if param.default is param.empty else _Text("..."),
        )
        for param in signature.parameters.values()
    ]
    try:
        return str(
            signature.replace(parameters=params, return_annotation=_Text(_annotation(signature.return_annotation)))
        )
    except ValueError:
        return fallback


def _annotation(annotation: object) -> str:
    """Spell an annotation if it only uses builtins, ``None`` and ``Any``; otherwise ``Any``."""
    if isinstance(annotation, str):
        return _string_annotation(annotation)
    if annotation is None or annotation is type(None):
        return "None"
    if annotation in _PLAIN or annotation in (list, dict, set, frozenset, tuple, object, type):
        return annotation.__name__
    args = getattr(annotation, "__args__", None)
    origin = getattr(annotation, "__origin__", None)
    if isinstance(annotation, types.UnionType) and args:
        return " | ".join(_annotation(a) for a in args)
    if isinstance(annotation, types.GenericAlias) and origin in (list, dict, set, frozenset, tuple, type) and args:
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else _annotation(a) for a in args)}]"
    return "Any"


_SIMPLE_NAMES = frozenset(
    {*_PLAIN.values(), "list", "dict", "set", "frozenset", "tuple", "object", "type", "None", "Any"}
)


def _string_annotation(text: str) -> str:
    """Keep a postponed annotation if it is made of builtin names only; otherwise ``Any``."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return "Any"
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _SIMPLE_NAMES:
            return "Any"
        if not isinstance(
            node, ast.Expression | ast.Name | ast.Load | ast.Subscript | ast.Tuple | ast.BinOp | ast.BitOr
        ):
            if not (isinstance(node, ast.Constant) and node.value in (None, Ellipsis)):
                return "Any"
    return ast.unparse(tree)


# ------------------------------------------------------------- stubs of host functions

_TYPING_NAMES = ("Any", "Literal", "NotRequired", "TypedDict")
_GENERIC_BUILTINS = (list, dict, set, frozenset, tuple, type)
_BUILTIN_TYPES = {t: t.__name__ for t in (*_PLAIN, object, bytearray, range, slice, *_GENERIC_BUILTINS)}
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
            param.replace(annotation=_Text(self._type(param.annotation)), default=self._default(param.default))
            for param in signature.parameters.values()
        ]
        text = str(
            signature.replace(parameters=params, return_annotation=_Text(self._type(signature.return_annotation)))
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
            return _Text(repr(default))
        return _Text("...")

    def _type(self, annotation: object, depth: int = 0) -> str:
        if annotation is inspect.Parameter.empty or depth > _MAX_DEPTH * 2:
            return "Any"
        if annotation is None or annotation is type(None):
            return "None"
        if annotation is Any:
            return "Any"
        if isinstance(annotation, str):
            return _string_annotation(annotation)
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
        origin = _importable(cls)
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
