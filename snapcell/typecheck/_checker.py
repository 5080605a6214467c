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
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapcell.errors import ConfigError, TimeLimitExceeded, TypingError
from snapcell.typecheck._declarations import SIMPLE_NAMES, STUBS_MODULE

__all__ = ["Diagnostic", "TypeChecker", "find_ty"]


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
        (self._dir / f"{STUBS_MODULE}.pyi").write_text(stubs, encoding="utf-8")
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
        header = f"import asyncio; from {decls} import *; from {prior} import *; from {STUBS_MODULE} import *\n"
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
            elif key is not None and path == f"{STUBS_MODULE}.pyi":
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
            elif node.id not in SIMPLE_NAMES or node.id == "Any":
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
            return ast.Attribute(value=ast.Name(id=STUBS_MODULE, ctx=ast.Load()), attr=node.id, ctx=ast.Load())

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
    return f"from typing import Any\nimport {STUBS_MODULE}\n{exports}{_SESSION_BUILTINS_STUB}{declarations}\n"


def _prior_module(prior_cells: Sequence[str]) -> str:
    names: set[str] | None = set()
    for source in prior_cells:
        try:
            found = _bound_names(ast.parse(source).body)
        except SyntaxError:
            found = set()
        names = None if found is None or names is None else names | found
    header = f"import asyncio\nfrom {STUBS_MODULE} import *\n"
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
