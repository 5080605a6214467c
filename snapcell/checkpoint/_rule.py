"""The allowlist rule for the globals a checkpoint names, one rule for the host's scanner and the loader.

A global is a module the policy allows plus a public qualified name (no ``_private`` part, no private module
segment, no path through another module or a serializer's internals), or an exact entry of `HELPERS`, the
serializers' own reconstruction helpers. Helpers that take a module or attribute name as data (``subimport('os')``,
``getattr(x, '__globals__')``) have their arguments checked by the same rule (`call_refusal`): the scanner
requires them to be constants in the stream, the loader checks the values it is given.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from snapcell._support import HELPERS_MODULE
from snapcell.checkpoint._stdvalues import VALUE_HELPERS, value_call_refusal

__all__ = [
    "ALIASES",
    "MOVED_MODULES",
    "OLDER_HELPER_PATHS",
    "current_name",
    "CLASS_DUNDERS",
    "HELPERS",
    "NAMES_ONLY",
    "PLAIN",
    "TYPE_CALL",
    "GlobalRule",
    "Refusal",
    "as_rule",
    "attribute_refusal",
    "call_refusal",
    "code_refusal",
    "global_refusal",
    "module_refusal",
]

AllowModule = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class GlobalRule:
    """The policy's part of the rule: which modules, and which of their public names, a checkpoint may name.

    Attributes:
        allow_module: True when a module (dotted name) may be imported.
        deny_name: True when ``module.name`` is hidden from scripts although public (``io.open``,
            ``typing.ForwardRef``); None denies nothing more.
        deny_attribute: True when an attribute name may not be read through a helper (``gi_frame``, ``co_code``);
            None denies nothing more than private names.
        deny_code_name: True when restored bytecode may not use a name (``__subclasses__``, ``__globals__``,
            ``gi_frame``): code objects arrive by value and no policy check ever saw them; None allows every name.
        stand_ins: Exact ``(module, name)`` pairs of the policy's guarded stand-ins (a script's
            ``operator.attrgetter`` or ``string.Formatter``), which pickle by reference to snapcell's own modules.
    """

    allow_module: AllowModule
    deny_name: Callable[[str, str], bool] | None = None
    deny_attribute: Callable[[str], bool] | None = None
    deny_code_name: Callable[[str], bool] | None = None
    stand_ins: frozenset[tuple[str, str]] = frozenset()


def as_rule(rule: GlobalRule | AllowModule) -> GlobalRule:
    """A `GlobalRule` from a rule or a bare module check."""
    return rule if isinstance(rule, GlobalRule) else GlobalRule(allow_module=rule)


# How a helper's arguments are checked. PLAIN: not at all (they are objects built by the stream).
PLAIN: Final = "plain"
MODULE_ARG: Final = "module"  # first argument: a module name, checked like a global's module
ATTR_ARG: Final = "attribute"  # second argument: an attribute name, public only
ATTR_PATHS: Final = "attribute paths"  # every argument: a public dotted attribute path (attrgetter, methodcaller)
TYPE_NAME: Final = "type name"  # first argument: one of SAFE_TYPE_NAMES
TYPE_CALL: Final = "type"  # builtins.type: one argument only for None/NotImplemented/Ellipsis, or three

# Types the serializers may rebuild by name (cloudpickle `_builtin_type`, dill `_load_type`). Function, module,
# frame and generator types are left out: a function made from code without the session's builtins gets the real
# ones.
SAFE_TYPE_NAMES = frozenset(
    {
        "CodeType", "CellType", "MethodType", "MappingProxyType", "SimpleNamespace", "NoneType", "EllipsisType",
        "NotImplementedType", "GenericAlias", "UnionType", "LockType", "RLockType",
    }
)  # fmt: skip

# The one table of serializer helpers (exact module and name) a checkpoint may name; everything else follows the rule.
HELPERS: dict[tuple[str, str], str] = {
    **{
        ("cloudpickle.cloudpickle", name): PLAIN
        for name in (
            "_class_setstate", "_function_setstate", "_get_dataclass_field_type_sentinel", "_lookup_class_or_track",
            "_make_cell", "_make_dict_items", "_make_dict_keys", "_make_dict_values", "_make_empty_cell",
            "_make_function", "_make_skeleton_class", "_make_skeleton_enum", "_make_typevar",
        )
    },
    ("cloudpickle.cloudpickle", "_builtin_type"): TYPE_NAME,
    ("cloudpickle.cloudpickle", "subimport"): MODULE_ARG,
    ("cloudpickle.cloudpickle", "dynamic_subimport"): MODULE_ARG,
    **{
        ("dill._dill", name): PLAIN
        for name in (
            "_create_lock", "_create_rlock", "_create_stringi", "_create_stringo", "_create_namedtuple",
            "_create_function", "_create_code", "_create_cell", "_create_type",
        )
    },
    ("dill._dill", "_load_type"): TYPE_NAME,
    ("dill._dill", "_import_module"): MODULE_ARG,
    ("dill._dill", "_get_attr"): ATTR_ARG,
    ("copyreg", "_reconstructor"): PLAIN,
    ("copyreg", "__newobj__"): PLAIN,
    ("copyreg", "__newobj_ex__"): PLAIN,
    ("builtins", "getattr"): ATTR_ARG,
    ("builtins", "type"): TYPE_CALL,
    ("operator", "attrgetter"): ATTR_PATHS,
    ("operator", "methodcaller"): ATTR_PATHS,
    # snapcell's own helpers, by their one stable path (`snapcell.checkpoint.helpers`). The policy's stand-ins
    # (``attrgetter``, ``dataclass``, ...) share that path but are the policy's to allow (`GlobalRule.stand_ins`).
    **{
        (HELPERS_MODULE, name): PLAIN
        for name in (
            "session_namespace", "rebuild_datetime_array", "rebuild_lru_cache", "rebuild_recursive_repr",
            "code_in_cell", "host_function", "sliced_sleep", "guarded_getattr", "guarded_hasattr", "guarded_setattr",
            "guarded_delattr", "guarded_dir", "guarded_vars", "rebuild_str_array",
        )
    },
    # Standard-library and data-library internals that their own classes pickle through.
    ("dataclasses", "_MISSING_TYPE"): PLAIN,
    ("dataclasses", "_HAS_DEFAULT_FACTORY_CLASS"): PLAIN,
    ("dataclasses", "_DataclassParams"): PLAIN,
    ("dataclasses", "_FIELD_BASE"): PLAIN,
    ("__future__", "_Feature"): PLAIN,
    ("collections", "_tuplegetter"): PLAIN,
    ("numpy._core.numeric", "_frombuffer"): PLAIN,
    ("numpy.core.numeric", "_frombuffer"): PLAIN,
    ("numpy._core.multiarray", "_reconstruct"): PLAIN,
    ("numpy.core.multiarray", "_reconstruct"): PLAIN,
    ("numpy._core.multiarray", "scalar"): PLAIN,
    ("numpy.core.multiarray", "scalar"): PLAIN,
    ("pandas._libs.internals", "_unpickle_block"): PLAIN,
    ("pandas._libs.arrays", "__pyx_unpickle_NDArrayBacked"): PLAIN,
    ("pandas.core.indexes.base", "_new_Index"): PLAIN,
    ("pandas._libs.tslibs.timestamps", "_unpickle_timestamp"): PLAIN,
    ("pandas._libs.tslibs.timedeltas", "_timedelta_unpickle"): PLAIN,
    ("pandas._libs.tslibs.nattype", "__nat_unpickle"): PLAIN,
}  # fmt: skip
# Standard-library values kept as plain data (asyncio primitives and queues, StringIO/BytesIO, ZoneInfo): each
# helper's arguments are checked by `snapcell.checkpoint._stdvalues.value_call_refusal`.
HELPERS.update(VALUE_HELPERS)
_VALUE_KINDS = frozenset(VALUE_HELPERS.values())
# cloudpickle's makers and setstate helpers, which dill never writes: a dill section that names them is refused (the
# loader's dill unpickler would skip the checks its cloudpickle unpickler makes around them).
NOT_IN_DILL = frozenset(
    ("cloudpickle.cloudpickle", name)
    for name in (
        "_make_function", "_function_setstate", "_class_setstate", "_lookup_class_or_track", "_make_typevar",
        "_make_skeleton_class", "_make_skeleton_enum",
    )
)  # fmt: skip

# Modules whose names are only reachable through HELPERS: a serializer's module holds `os`, `sys` and eval-like
# helpers (``dill._dill`` plus ``"os.mkdir"``), and snapcell's own modules are not script API.
_SERIALIZER_MODULES = ("cloudpickle", "dill", "copyreg", "pickle", "_pickle", "snapcell", "pickletools")

# ---------------------------------------------------------------- ordinary values' globals
# Each entry below widens the rule for one global an ordinary value's pickle needs; each is covered by an attack
# stream in tests/checkpoint/test_rule_widened.py that the host's scan and the loader both refuse.

# Modules a script imports whose other public names are serializer machinery: exactly these names may be named.
# ``copy`` (a script's ``import copy`` pickles as ``subimport('copy')``) also exposes ``copy.dispatch_table``,
# copyreg's table of reducers, which a checkpoint could fill with its own functions for every later dump and copy
# in the process (module views hide it too), and Python 3.13's ``copy.replace``, which reads fields by name like
# ``dataclasses.replace``; ``copy._reconstruct`` is a generic reconstructor and stays out as a private name.
NAMES_ONLY: dict[str, frozenset[str]] = {"copy": frozenset({"copy", "deepcopy", "Error", "error"})}
# A C accelerator's name for a public function of its allowed pure module, which pickle records by ``__module__``
# (``typing.Optional[int]`` pickles as ``_operator.getitem(typing.Union, (int, NoneType))``). The alias stands for
# its public twin exactly: allowed only when the twin is, so no other name of ``_operator`` becomes reachable.
ALIASES: dict[tuple[str, str], tuple[str, str]] = {("_operator", "getitem"): ("operator", "getitem")}
# Where snapcell's helpers were before they all took their stable path, and the names they had there: a pickle names
# a helper by its module, so each older path stays an alias of the helper's stable one, and every checkpoint written
# before loads. Each older name stands for exactly its helper, and is allowed exactly when that helper is (a stand-in
# only under a policy whose rule has it). Entries are never removed.
OLDER_HELPER_PATHS: dict[str, dict[str, str]] = {
    "snapcell.checkpoint._pickle": {
        "_session_namespace": "session_namespace",
        "_rebuild_datetime_array": "rebuild_datetime_array",
        "_rebuild_lru_cache": "rebuild_lru_cache",
        "_rebuild_recursive_repr": "rebuild_recursive_repr",
        "_code_in_cell": "code_in_cell",
    },
    "snapcell.checkpoint._stdvalues": {name: name for _module, name in VALUE_HELPERS},
    "snapcell.interpreter._host": {"host_function": "host_function"},
    "snapcell.policy._guard": {
        "_sliced_sleep": "sliced_sleep",
        "_guarded_attrgetter": "attrgetter",
        "_guarded_methodcaller": "methodcaller",
        **{
            name: name
            for name in (
                "guarded_getattr", "guarded_hasattr", "guarded_setattr", "guarded_delattr", "guarded_dir",
                "guarded_vars",
            )
        },
    },
    "snapcell.policy._standins": {
        name: name
        for name in (
            "attrgetter", "methodcaller", "Formatter", "update_wrapper", "wraps", "singledispatch",
            "singledispatchmethod", "total_ordering", "dataclass", "make_dataclass", "replace", "asdict", "astuple",
            "no_type_check", "final", "runtime_checkable", "update_abstractmethods", "all_tasks", "current_task",
        )
    },
    "snapcell.policy._fidelity": {"run": "run"},
}  # fmt: skip
# Modules whose helpers had moved once before: the same names as in the module each moved to.
MOVED_MODULES: dict[str, str] = {
    "snapcell.runner._host": "snapcell.interpreter._host",
    "snapcell.runner._guard": "snapcell.policy._guard",
    "snapcell.runner._standins": "snapcell.policy._standins",
    "snapcell.runner._fidelity": "snapcell.policy._fidelity",
}
ALIASES.update(
    ((module, old), (HELPERS_MODULE, new)) for module, names in OLDER_HELPER_PATHS.items() for old, new in names.items()
)
ALIASES.update(
    ((old_module, old), (HELPERS_MODULE, new))
    for old_module, module in MOVED_MODULES.items()
    for old, new in OLDER_HELPER_PATHS[module].items()
)


def current_name(module: str, name: str) -> tuple[str, str]:
    """The global a checkpoint's ``module.name`` stands for today: older helper paths and C accelerators resolved.

    The host's scan and the loader both read every global through it, so both see the same helper.
    """
    return ALIASES.get((module, name), (module, name))


# Dunder methods a class's dict may hold by reference (a str-mixin ``Enum`` gets ``enum.Enum.__format__``,
# ``__repr__`` and ``__str__`` copied into its class dict, and ``str.__repr__`` as ``getattr(str, '__repr__')``):
# as the last part of a dotted global below a class, or read by the ``getattr`` helper (`PRIVATE_OK`). Each returns
# text or a new instance; none hands out an object's internals or changes it (unlike ``__reduce_ex__``,
# ``__subclasses__``, ``__init__``, ``__init_subclass__``, ``__getattribute__`` or ``__setattr__``, left out).
CLASS_DUNDERS = frozenset({"__new__", "__format__", "__repr__", "__str__"})
# Pure builtins a checkpoint may name (``functools.partial(pow, 2)``): each does nothing ``operator``'s and
# ``math``'s public functions, already nameable, do not; each only calls the operators of the values it is given,
# and none reads attributes by name, imports, or evaluates text. ``min``/``max``/``sum`` return one of the values
# given, so the scanner treats them as lookups (no BUILD on their result).
PURE_BUILTINS = frozenset({"abs", "pow", "divmod", "round", "min", "max", "sum", "len", "sorted", "any", "all"})
# ---------------------------------------------------------------- end of the ordinary values' globals
# Plain builtins a checkpoint may name (types and constants the pickle protocol itself uses).
SAFE_BUILTINS = frozenset(
    {
        "bool", "bytearray", "bytes", "classmethod", "complex", "dict", "float", "frozenset", "int", "list",
        "object", "property", "range", "set", "slice", "staticmethod", "str", "tuple", "NotImplemented",
        "Ellipsis", "memoryview", "enumerate", "zip", "map", "filter", "reversed",
    }
) | PURE_BUILTINS  # fmt: skip
# Private names the ``getattr`` helper may read: a class's own ``__new__`` (``enum.Enum.__new__`` in every Enum
# subclass) and the text methods of `CLASS_DUNDERS` (a str-mixin Enum's dict holds ``getattr(str, '__repr__')``).
PRIVATE_OK = CLASS_DUNDERS
# Public names the ``getattr`` helper may not read: string formatters walk attribute paths of their arguments
# (``'{0.__init__.__globals__}'.format(obj)``), which the script guard never hands out raw (scripts get a checked
# formatter); a loaded checkpoint may not have them either.
FORMATTERS = frozenset({"format", "format_map"})
# The longest module and qualified names a checkpoint may name, and the most parts a qualified name may have: no
# pickler writes more (a nested class is a few parts), and each part is one lookup for whoever checks the name.
MAX_GLOBAL_CHARS = 512
MAX_NAME_PARTS = 16


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a pickle stream is refused: the first global (or helper argument) the loader would not accept.

    Attributes:
        module: Module of the global.
        name: Its name, or the refused argument of a helper.
        reason: What rule it breaks.
        offset: Byte offset of the opcode in the stream (-1 when not from a scan).
        index: Which pickle in the stream (0-based; streams hold one pickle per variable).
    """

    module: str
    name: str
    reason: str
    offset: int = -1
    index: int = 0

    def describe(self) -> str:
        """One line for people."""
        return f"{self.module}.{self.name} ({self.reason})"


def _private(part: str) -> bool:
    return part.startswith("_")


def module_refusal(module: object, rule: GlobalRule | AllowModule) -> str | None:
    """Why a checkpoint may not import ``module`` (None: it may).

    The policy decides the top-level package; below it, no private segment (``json.decoder`` yes, ``typing._x`` no).
    """
    if not isinstance(module, str) or not module:
        return "the module name is not a constant string"
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return "not a module name"
    if parts[0] in _SERIALIZER_MODULES:
        return "a serializer's or snapcell's internals, outside the table of helpers"
    if any(_private(part) for part in parts[1:]):
        return "a private module"
    if not as_rule(rule).allow_module(module):
        if parts[0] not in sys.modules and _not_installed(parts[0]):
            return "a module that is not installed here"  # allowing it would not help: name the real cause
        return "a module the policy does not allow"
    return None


def _not_installed(top: str) -> bool:
    """True when the top-level module ``top`` cannot be found here; looks it up without importing anything."""
    import importlib.util  # only on a refusal

    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):
        return False


def attribute_refusal(name: object, *, dotted: bool = False, rule: GlobalRule | None = None) -> str | None:
    """Why a checkpoint may not read attribute ``name`` (None: it may). Public names only, dotted if allowed."""
    if not isinstance(name, str) or not name:
        return "the attribute name is not a constant string"
    parts = name.split(".") if dotted else [name]
    for part in parts:
        if not part.isidentifier():
            return "not an attribute name"
        if _private(part) and part not in PRIVATE_OK:
            return "a private attribute"
        if part in FORMATTERS:
            return "a string formatter, which reads attribute paths of its arguments (the guard's rule)"
        if rule is not None and rule.deny_attribute is not None and rule.deny_attribute(part):
            return "an attribute the policy hides"
    return None


def global_refusal(module: object, name: object, rule: GlobalRule | AllowModule) -> str | None:
    """Why the loader refuses the global ``module.name`` (None: it resolves it). The rule of this module.

    Args:
        module: The module the pickle names.
        name: The qualified name the pickle names.
        rule: The policy's part of the rule (or just its module check).
    """
    if not isinstance(module, str) or not isinstance(name, str):
        return "the module or name is not a constant string"
    if len(module) > MAX_GLOBAL_CHARS or len(name) > MAX_GLOBAL_CHARS or name.count(".") >= MAX_NAME_PARTS:
        return f"a name too long to be a global (over {MAX_GLOBAL_CHARS} characters or {MAX_NAME_PARTS} parts)"
    rule = as_rule(rule)
    if (module, name) in HELPERS or (module, name) in rule.stand_ins:
        return None
    if (module, name) in ALIASES:
        return global_refusal(*current_name(module, name), rule)
    if module in NAMES_ONLY and name not in NAMES_ONLY[module]:
        return "a name of a module whose other names are serializer machinery"
    if module == "builtins":
        if name in SAFE_BUILTINS or _is_builtin_exception(name):
            return None
        return "a builtin that checkpoints may not use"
    problem = module_refusal(module, rule)
    if problem is not None:
        return problem
    parts = name.split(".")
    if rule.deny_name is not None and rule.deny_name(module, parts[0]):
        return "a name the policy hides"
    for position, part in enumerate(parts):
        if not part.isidentifier():
            return "not a qualified name"
        if _private(part) and not (part in CLASS_DUNDERS and position == len(parts) - 1 and position > 0):
            return "a private name"
    if len(parts) > 1:
        return _dotted_refusal(module, parts)
    return None


def _dotted_refusal(module: str, parts: list[str]) -> str | None:
    """A dotted name may go through classes, never through a module (``typing.sys.modules`` is a module pivot)."""
    owner = sys.modules.get(module)
    if owner is None:
        return None  # not imported here: nothing to walk; the loader's resolver walks it under the policy
    target: Any = owner
    for part in parts[:-1]:
        try:
            target = inspect.getattr_static(target, part)
        except AttributeError:
            return "a name that does not exist"
        if isinstance(target, types.ModuleType):
            return "a path through another module"
    if _private(parts[-1]) and not isinstance(target, type):
        return "a dunder method of something other than a class"
    return None


def _is_builtin_exception(name: str) -> bool:
    value = getattr(__import__("builtins"), name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def call_refusal(kind: str, args: object, rule: GlobalRule | AllowModule) -> str | None:
    """Why a helper that takes names as data may not be called with ``args`` (None: it may).

    The scanner passes the constants it tracked (anything else is `OPAQUE`, which fails every check); the loader
    passes the real arguments. Either way the same rule decides.
    """
    if kind == PLAIN:
        return None
    rule = as_rule(rule)
    if not isinstance(args, tuple):
        return "its arguments are not constants in the stream"
    if kind == MODULE_ARG:
        return module_refusal(args[0], rule) if args else "no module name"
    if kind == ATTR_ARG:
        return attribute_refusal(args[1], rule=rule) if len(args) >= 2 else "no attribute name"
    if kind == ATTR_PATHS:
        for arg in args:
            problem = attribute_refusal(arg, dotted=True, rule=rule)
            if problem is not None:
                return problem
        return None if args else "no attribute name"
    if kind == TYPE_NAME:
        return None if args and isinstance(args[0], str) and args[0] in SAFE_TYPE_NAMES else "a type it may not build"
    if kind == TYPE_CALL:
        if len(args) == 3:
            return None
        if len(args) == 1 and (args[0] is None or args[0] is NotImplemented or args[0] is Ellipsis):
            return None
        return "type() of an object other than None, NotImplemented or Ellipsis"
    if kind in _VALUE_KINDS:
        return value_call_refusal(kind, args, rule.allow_module)
    return "an unknown helper"


def code_refusal(code: types.CodeType, rule: GlobalRule) -> str | None:
    """Why the loader refuses a restored code object (None: it may run): a name its bytecode uses is denied.

    Attribute reads, globals and imports in bytecode all go through ``co_names``; nested code objects (inner
    functions, comprehensions) are checked too.
    """
    if rule.deny_code_name is None:
        return None
    pending = [code]
    while pending:
        current = pending.pop()
        for name in current.co_names:
            if rule.deny_code_name(name):
                return f"its code uses the name {name!r}, which scripts may not use"
        pending.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return None
