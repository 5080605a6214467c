"""The restricted policy: which imports, builtins and attributes a script may use.

A guardrail that gives the model a clear `PolicyError`; never a security boundary on its own.

Rules of the default (restricted) policy:

- Imports: only `DEFAULT_MODULES` plus ``extra_modules``, and their submodules (``asyncio`` and ``io``
  are importable only as a whole). Scripts receive a read-only `ModuleView` of each module: private
  names, modules outside the policy (``random._os``, ``typing.sys``, ``json.codecs``) and named
  dangerous members (``asyncio.create_subprocess_exec``, ``io.open``, ``typing.get_type_hints``) are
  absent. ``time.sleep`` sleeps in short slices so the wall-time limit can interrupt it.
- Builtins: no ``open``, ``eval``, ``exec``, ``compile``, ``input``, ``breakpoint``, ``locals``,
  ``help``, ``exit``, ``quit``; ``__import__`` goes through the policy; ``getattr``, ``hasattr``,
  ``setattr``, ``delattr``, ``dir`` and ``vars`` apply the attribute rules at runtime; ``globals()``
  returns the session's variables without the interpreter's dunder entries (`snapcell.policy._fidelity`).
- Attributes (checked in the source, and again at runtime by the guarded builtins): dunder
  attributes only from a small set (``__name__``, ``__qualname__``, ``__doc__``, ``__class__``,
  ``__module__``, ``__cause__``, ``__context__``, the read-only ``__annotations__``, ``__mro__``,
  ``__slots__``, ``__version__`` and protocol methods such as ``__init__``, ``__eq__``, ``__enter__``),
  never assigned; a few names are decided by the object's type at runtime (``x.replace`` unless ``x`` is a
  code object, namedtuple's ``_replace``/``_asdict``/``_fields``/``_make``/``_field_defaults``, ``__dict__``
  of the script's own objects); no frame, code, generator, traceback or event-loop internals
  (``gi_frame``, ``f_back``, ``tb_frame``, ``get_loop`` ...). Private (``_name``) attributes only as
  ``self._name`` / ``cls._name`` inside a method of a class the script defines, where the first
  parameter is never rebound. Defining dunder methods in a class is fine, except ``__del__``
  (it would run in the host at an arbitrary later time, outside the run's limits).
- Names: dunder names other than ``__name__``, ``__debug__``, ``__class__``, ``__slots__``,
  ``__match_args__`` and the protocol methods are blocked (``__builtins__``, ``__import__``).
- Format strings: no attribute paths (``'{0.__globals__}'``), checked in literal templates before
  the run, and at runtime for templates built by the script (every non-literal ``x.format`` /
  ``x.format_map`` is rewritten to go through a check) and in ``string.Formatter``.
- String annotations are parsed and checked like code, since ``typing`` may evaluate them.
- Shared objects are read-only: every attribute assignment or deletion (``x.a = v``, ``setattr``, ``del``)
  first checks its object, refusing classes the script did not make (``json.JSONEncoder.default = f``),
  functions it did not define and the objects module views hand out (``decimal.DefaultContext``);
  the script's own classes, functions and instances (of any class) stay writable.
- No ``__del__`` by any route: class statements (metaclasses, ``__prepare__``), ``type(name, bases, ns)``
  calls and ``dataclasses.make_dataclass`` are checked, not only ``def __del__`` in the source.
- Stand-ins for standard-library pieces that lead around these rules (``snapcell.policy._standins``):
  ``operator.attrgetter``/``methodcaller``, ``string.Formatter``, ``functools.update_wrapper``/``wraps``/
  ``singledispatch``, the class decorators that write into their argument, and ``asyncio.all_tasks``/
  ``current_task``, which see only the script's own tasks. Names are checked as plain ``str`` copies, so a
  ``str`` subclass cannot lie to a check.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from snapcell.errors import ConfigError, PolicyError
from snapcell.policy._fidelity import fidelity_builtins
from snapcell.policy._guard import (
    GUARD_GLOBALS,
    ModuleView,
    RecordingHooks,
    attach_submodule,
    attribute_problem,
    exact_str,
    guarded_builtins,
    is_dunder,
    module_allowed,
    module_view,
    name_denied,
    runtime_policy_error,
    special_value,
)
from snapcell.policy._policycheck import Checker, plans
from snapcell.policy._rewrite import rewrite_format_calls
from snapcell.policy._standins import stand_in_builtins
from snapcell.policy._ticks import EXPIRED_NAME, TICK_NAME, apply_checks, instrument, tick

if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass, field

__all__ = ["DATA_MODULES", "DEFAULT_MODULES", "FILE_MODULES", "Policy", "with_file_access"]

DEFAULT_MODULES = frozenset(
    {
        "abc", "array", "asyncio", "base64", "binascii", "bisect", "calendar", "cmath", "collections", "colorsys",
        "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch",
        "fractions", "functools", "graphlib", "hashlib", "heapq", "hmac", "html", "io", "ipaddress", "itertools",
        "json", "keyword", "math", "numbers", "operator", "pprint", "random", "re", "secrets", "statistics",
        "string", "struct", "textwrap", "time", "traceback", "typing", "unicodedata", "uuid", "zlib", "zoneinfo",
        "__future__",
    }
)  # fmt: skip
# Admitted by the default policy of process mode when installed (`Policy.process_default`).
DATA_MODULES = ("numpy", "pandas")
# Private modules that C code of allowed modules imports while a script's frame is current (``datetime.strptime``
# imports ``_strptime`` through the frame's ``__import__``): imported for it, and the script gets nothing back.
_C_IMPORTS = frozenset({"_strptime"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What scripts may import and touch; see the module docstring for the rules.

    Attributes:
        allowed_modules: Top-level modules (and their submodules) scripts may import.
        extra_modules: Added to ``allowed_modules``; the usual way to allow ``numpy`` or ``pandas``.
            Extra modules are trusted as they are, apart from hiding private names and modules outside
            the policy: allowing ``pandas`` allows ``pandas.read_csv`` on any path the process can read.
        restricted: False turns every check off (trusted code only): real builtins, any import.

    Raises:
        ConfigError: A module list is not a collection of non-empty names.
    """

    allowed_modules: frozenset[str] = DEFAULT_MODULES
    extra_modules: frozenset[str] = field(default_factory=frozenset)
    restricted: bool = True

    def __post_init__(self) -> None:
        for name in ("allowed_modules", "extra_modules"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(m, str) and m.isidentifier() for m in value):
                raise ConfigError(f"Policy.{name} must be a collection of top-level module names, not {value!r}")
            object.__setattr__(self, name, frozenset(value))
        if not isinstance(self.restricted, bool):
            raise ConfigError(f"Policy.restricted must be True or False, not {self.restricted!r}")

    @classmethod
    def unrestricted(cls) -> Policy:
        """A policy that checks nothing, for trusted code."""
        return cls(restricted=False)

    @classmethod
    def stdlib_only(cls) -> Policy:
        """The restricted policy with the standard-library modules of `DEFAULT_MODULES` only (inline mode's default)."""
        return cls()

    @classmethod
    def process_default(cls) -> Policy:
        """The default policy of process mode: `stdlib_only` plus those of `DATA_MODULES` that are installed.

        Pass ``policy=Policy.stdlib_only()`` (or ``Policy(extra_modules=...)`` with the modules you want) to
        narrow it.
        """
        return cls(extra_modules=frozenset(m for m in DATA_MODULES if importlib.util.find_spec(m) is not None))

    def with_modules(self, names: Iterable[str]) -> Policy:
        """A copy that also allows the top-level modules ``names``.

        Raises:
            ConfigError: A name is not a top-level module name.
        """
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
        return not self.restricted or module_allowed(name, self.modules)

    def refuses_import(self, name: str) -> bool:
        """True when a script's import of ``name`` is refused: not allowed, and its top-level module is installed.

        A module that is not installed is left to fail as in any Python, with `ModuleNotFoundError`: allowing it
        would not help, so "not allowed" would name the wrong cause (numpy on a host without numpy).
        """
        return not self.allows_module(name) and not _not_installed(name)

    def missing_modules(self) -> frozenset[str]:
        """The allowed top-level modules that are not installed in this interpreter (none when unrestricted)."""
        if not self.restricted:
            return frozenset()
        return frozenset(m for m in self.modules if _not_installed(m))

    # ---------------------------------------------------------------- before the run

    def check(self, tree: ast.Module, source: str, filename: str) -> None:
        """Check a parsed script before it runs.

        Raises:
            PolicyError: The script uses something the policy blocks; it did not run and the session is unchanged.
        """
        if self.restricted:
            checker = Checker(self, source)
            checker.visit(tree)
            plans[tree] = checker.plan

    def transform(self, tree: ast.Module) -> None:
        """Rewrite a checked script in place: interrupt checks and runtime format-string checks.

        Applies the edits `check` recorded on its walk (one pass over the tree in all), or walks the
        tree again when ``tree`` was not checked by this policy.
        """
        if not self.restricted:
            return
        plan = plans.pop(tree, None)
        if plan is None:
            rewrite_format_calls(tree)
            instrument(tree)
            return
        plan.apply_rewrites()
        apply_checks(plan.first, plan.after)

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

    # ------------------------------------------------------------------ at runtime

    def make_builtins(self, *, file_access: bool = False) -> dict[str, Any]:
        """A fresh builtins dict for a session's namespace.

        Args:
            file_access: Give scripts ``open`` on paths (process mode only, where Landlock confines the worker to
                its workspace and mounts); otherwise ``open`` says there is no file access.
        """
        if not self.restricted:
            return dict(vars(builtins))
        table = guarded_builtins()
        table.update(stand_in_builtins())
        table.update(fidelity_builtins())
        if file_access:
            table["open"] = _path_open
        for name, reason in _BLOCKED_BUILTINS.items():
            table.setdefault(name, _blocked_builtin(name, reason))
        table["__import__"] = self._make_import()
        table[TICK_NAME] = tick
        table[EXPIRED_NAME] = False
        return table

    def view(self, name: str) -> ModuleView:
        """The guarded view of the allowed module ``name`` (imported if needed).

        Raises:
            PolicyError: ``name`` is not allowed.
        """
        if not self.allows_module(name):
            raise runtime_policy_error(f"import of {name!r}", self.import_error(name).hint)
        fresh = name not in sys.modules
        module = importlib.import_module(name)
        if fresh and RecordingHooks.first_import is not None:
            RecordingHooks.first_import(name)
        view = module_view(module, self.modules)
        parent_name, _, _ = name.rpartition(".")
        if parent_name:
            attach_submodule(self.view(parent_name), module, self.modules)
        return view

    def _make_import(self) -> Callable[..., Any]:
        def guarded_import(
            name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            name = exact_str(name)  # a str subclass could lie to the checks below
            if name in _C_IMPORTS and not level and not fromlist:
                importlib.import_module(name)
                return None  # C callers (PyImport_Import) read sys.modules themselves
            if not level and type(name) is str and not self.allows_module(name) and _not_installed(name):
                raise _missing_module(name)
            if level or type(name) is not str or not self.allows_module(name):
                raise runtime_policy_error(f"import of {name!r}", self.import_error(str(name)).hint)
            view = self.view(name)
            for item in fromlist or ():
                if item != "*" and item not in vars(view):
                    self._import_item(name, item)
            return view if fromlist else self.view(name.partition(".")[0])

        return guarded_import

    def _import_item(self, package: str, item: str) -> None:
        """Make ``from package import item`` see a submodule, or refuse a hidden name."""
        real = importlib.import_module(package)
        if not name_denied(package, item) and self.allows_module(f"{package}.{item}"):
            if not hasattr(real, item) or isinstance(getattr(real, item), types.ModuleType):
                try:
                    self.view(f"{package}.{item}")
                except ModuleNotFoundError:
                    return  # not a submodule: IMPORT_FROM raises the usual ImportError
                return
        if hasattr(real, item) or f"{package}.{item}" in sys.modules:
            raise runtime_policy_error(f"importing {item!r} from {package!r}", "Use the module's public names.")

    def find_global_overrides(self) -> dict[tuple[str, str], Any]:
        """Replacements the checkpoint loader uses: guarded module imports and guarded helpers."""
        if not self.restricted:
            return {}

        def subimport(name: str) -> ModuleView:
            if not self.allows_module(name):
                if _not_installed(name):
                    raise _refused(f"the checkpoint imports module {name!r}, which is not installed here")
                raise _refused(f"the checkpoint imports module {name!r}, which the policy does not allow")
            return self.view(name)

        return {
            ("cloudpickle.cloudpickle", "subimport"): subimport,
            ("cloudpickle.cloudpickle", "dynamic_subimport"): lambda name, _vars: subimport(name),
            **GUARD_GLOBALS,
        }

    def global_resolver(self) -> Callable[[str, str], Any] | None:
        """How the checkpoint loader resolves ``module.name`` for allowed modules (None: unrestricted)."""
        if not self.restricted:
            return None

        def resolve(module: str, name: str) -> Any:
            target: Any = importlib.import_module(module)
            owner = module
            for part in name.split("."):
                if is_dunder(part) or attribute_problem(part) is not None and not part.startswith("_"):
                    raise _refused(f"the checkpoint refers to {module}.{name}, which is not allowed")
                if isinstance(target, types.ModuleType) and not part.startswith("_") and name_denied(owner, part):
                    raise _refused(f"the checkpoint refers to {module}.{name}, which is not allowed")
                target = getattr(target, part)
                if isinstance(target, types.ModuleType):
                    if not self.allows_module(target.__name__):
                        raise _refused(f"the checkpoint refers to {module}.{name}, which is not allowed")
                    owner = target.__name__
            if isinstance(target, types.ModuleType):
                return self.view(target.__name__)
            return special_value(module, name, target)

        return resolve


# Modules a worker adds to the policy for file access in its workspace (process mode only).
FILE_MODULES = frozenset({"pathlib"})


def with_file_access(policy: Policy) -> Policy:
    """The policy a process-mode session runs under: ``policy`` plus `FILE_MODULES` (its workspace's files).

    The worker's runner and the host's checkpoint rule both use it, so a script's ``pathlib`` is loadable and signable.
    """
    if not policy.restricted:
        return policy
    return Policy(
        allowed_modules=policy.allowed_modules | FILE_MODULES,
        extra_modules=policy.extra_modules,
        restricted=True,
    )


# Builtins scripts do not get; calling one says why instead of a puzzling NameError.
_BLOCKED_BUILTINS = {
    "open": "there is no file access in inline mode; keep data in variables (process mode has a workspace)",
    "eval": "run code directly instead",
    "exec": "run code directly instead",
    "compile": "run code directly instead",
    "input": "scripts cannot read input",
    "breakpoint": "there is no debugger",
    "locals": "use the variables by name",
    "exit": "scripts cannot end the session; return a value instead",
    "quit": "scripts cannot end the session; return a value instead",
    "help": "there is no interactive help; read the function's docstring instead",
}


def _path_open(
    file: Any,
    mode: str = "r",
    buffering: int = -1,
    encoding: str | None = None,
    errors: str | None = None,
    newline: str | None = None,
    closefd: bool = True,
) -> Any:
    """``open`` for scripts in a worker: a path only (never a descriptor number, no ``opener``)."""
    if not isinstance(file, str | bytes | os.PathLike):
        raise runtime_policy_error("open()", "open() takes a file path relative to the workspace, such as 'data.csv'.")
    return open(os.fspath(file), mode, buffering, encoding, errors, newline, closefd)


def _not_installed(name: str) -> bool:
    """True when the top-level module of ``name`` cannot be found; looks it up without importing anything."""
    top = name.partition(".")[0]
    if not top.isidentifier() or top in sys.modules:
        return False  # not a module name (never a path to probe), or imported already
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):
        return False


def _missing_module(name: str) -> ModuleNotFoundError:
    """What a script's import of a module that is not installed raises (so ``except ImportError`` works)."""
    top = name.partition(".")[0]
    return ModuleNotFoundError(f"No module named {top!r}: it is not installed where this session runs", name=top)


def _blocked_builtin(name: str, reason: str) -> Callable[..., Any]:
    def blocked(*args: Any, **kwargs: Any) -> Any:
        raise runtime_policy_error(f"{name}()", f"{name}() is not available: {reason}.")

    blocked.__name__ = blocked.__qualname__ = name
    return blocked


def _refused(message: str) -> Exception:
    """The loader's error for a global the policy refuses (pickle is imported by then: the loader is running)."""
    from pickle import UnpicklingError  # a worker's first run does not import pickle

    return UnpicklingError(message)
