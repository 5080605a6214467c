"""Runtime side of the restricted policy: guarded module views and guarded builtins.

The AST check (`snapcell.policy._policy`) stops what it can see in the source; this module stops
the dynamic versions: ``getattr(f, "__glo" + "bals__")``, ``operator.attrgetter(name)``, a format
string built at runtime, ``vars(module)``, and module pivots such as ``random._os``, which are
unreachable because scripts only ever hold a `ModuleView` of an allowed module.

A guardrail, not a boundary: see DESIGN.md ("The runner and its boundary").
"""

from __future__ import annotations

import builtins
import linecache
import string
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

from snapcell._support import HELPERS_MODULE, pickled_helper
from snapcell.errors import PolicyError
from snapcell.policy._rewrite import FORMAT_ATTR_NAME

__all__ = [
    "FORMAT_ATTR_NAME",
    "ModuleView",
    "attribute_problem",
    "check_attr",
    "exact_str",
    "format_problem",
    "guarded_builtins",
    "module_view",
    "runtime_policy_error",
    "script_function",
    "store_target",
    "warm_guarded_builtins",
]

# Dunder attributes a script may read: harmless names, and the protocol methods people call
# explicitly (``super().__init__()``, ``Base.__eq__(self, other)``).
SAFE_DUNDERS = frozenset(
    {
        "__name__", "__qualname__", "__doc__", "__class__", "__module__", "__cause__", "__context__",
        "__init__", "__new__", "__post_init__", "__repr__", "__str__", "__format__", "__bytes__", "__hash__",
        "__bool__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__len__", "__length_hint__",
        "__iter__", "__next__", "__aiter__", "__anext__", "__reversed__", "__contains__", "__getitem__",
        "__setitem__", "__delitem__", "__missing__", "__enter__", "__exit__", "__aenter__", "__aexit__",
        "__await__", "__call__", "__add__", "__sub__", "__mul__", "__matmul__", "__truediv__", "__floordiv__",
        "__mod__", "__divmod__", "__pow__", "__lshift__", "__rshift__", "__and__", "__xor__", "__or__",
        "__radd__", "__rsub__", "__rmul__", "__rmatmul__", "__rtruediv__", "__rfloordiv__", "__rmod__",
        "__rdivmod__", "__rpow__", "__rlshift__", "__rrshift__", "__rand__", "__rxor__", "__ror__", "__iadd__",
        "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
        "__ixor__", "__neg__", "__pos__", "__abs__", "__invert__", "__int__", "__float__", "__complex__",
        "__index__", "__round__", "__trunc__", "__floor__", "__ceil__", "__copy__", "__deepcopy__",
        "__annotations__", "__mro__", "__slots__", "__version__",  # read-only (never assigned)
        "__required_keys__", "__optional_keys__", "__total__", "__origin__", "__args__", "__parameters__",
    }
)  # fmt: skip

# Non-dunder attributes that lead to frames, code objects or the event loop's process and network
# parts. Blocked on every object, by attribute, by getattr and through operator.attrgetter.
INTERNAL_NAMES = frozenset(
    {
        "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "gi_suspended",
        "cr_frame", "cr_code", "cr_await", "cr_origin", "cr_running", "cr_suspended",
        "ag_frame", "ag_code", "ag_await", "ag_running",
        "tb_frame", "tb_next", "tb_lasti", "tb_lineno",
        "f_back", "f_globals", "f_builtins", "f_locals", "f_code", "f_trace", "f_trace_lines",
        "f_trace_opcodes", "f_lasti",
        "co_code", "co_consts", "co_names", "co_varnames", "co_cellvars", "co_freevars", "co_filename",
        "co_lnotab", "co_linetable", "co_exceptiontable", "co_positions", "co_lines", "replace",
        "func_globals", "func_code", "im_func", "im_self",
        "get_loop", "get_stack", "print_stack", "get_coro",
        "subprocess_exec", "subprocess_shell", "create_connection", "create_server", "create_unix_connection",
        "create_unix_server", "create_datagram_endpoint", "connect_accepted_socket", "connect_read_pipe",
        "connect_write_pipe", "sock_connect", "sock_accept", "sock_recv", "sock_recv_into", "sock_sendall",
        "sock_sendfile", "sock_sendto", "sock_recvfrom", "sendfile", "start_tls", "getaddrinfo", "getnameinfo",
        "run_in_executor", "set_default_executor", "add_reader", "add_writer", "add_signal_handler",
        "set_exception_handler", "set_task_factory", "call_exception_handler",
    }
)  # fmt: skip

# Per-module rules. An allowlist names everything a script may use; a denylist removes names.
_MODULE_ALLOW: dict[str, frozenset[str]] = {
    "asyncio": frozenset(
        {
            "ALL_COMPLETED", "FIRST_COMPLETED", "FIRST_EXCEPTION", "Barrier", "BoundedSemaphore",
            "BrokenBarrierError", "CancelledError", "Condition", "Event", "Future", "InvalidStateError",
            "LifoQueue", "Lock", "PriorityQueue", "Queue", "QueueEmpty", "QueueFull", "Semaphore", "Task",
            "TaskGroup", "Timeout", "TimeoutError", "all_tasks", "as_completed", "create_task", "current_task",
            "ensure_future", "gather", "iscoroutine", "iscoroutinefunction", "isfuture", "run", "shield", "sleep",
            "timeout", "timeout_at", "wait", "wait_for",
        }
    ),
    "io": frozenset(
        {
            "BytesIO", "StringIO", "TextIOWrapper", "IOBase", "RawIOBase", "BufferedIOBase", "TextIOBase",
            "IncrementalNewlineDecoder", "UnsupportedOperation", "SEEK_SET", "SEEK_CUR", "SEEK_END",
            "DEFAULT_BUFFER_SIZE",
        }
    ),
}  # fmt: skip
_MODULE_DENY: dict[str, frozenset[str]] = {
    "typing": frozenset({"ForwardRef"}),  # evaluates strings as code (get_type_hints is a stand-in)
    "traceback": frozenset({"walk_stack", "walk_tb", "clear_frames"}),  # hand out frame objects
    "contextlib": frozenset({"chdir"}),
    "zoneinfo": frozenset({"reset_tzpath"}),
    "time": frozenset({"clock_settime", "clock_settime_ns", "tzset"}),
    "uuid": frozenset({"getnode"}),  # may run ifconfig/ipconfig in a subprocess
    "enum": frozenset({"global_enum"}),  # writes the members into sys.modules[cls.__module__], a real module
    "copy": frozenset({"dispatch_table"}),  # copyreg's reducers for every later dump and copy in the process
}
# Modules imported only as a whole: their submodules hold the process and network parts.
TOP_LEVEL_ONLY = frozenset({"asyncio", "io"})
# C accelerator modules that back an allowed module (``_sre`` is ``re``), for the ``__module__`` check.
_ACCELERATORS = {
    "sre": "re",
    "blake2": "hashlib",
    "sha3": "hashlib",
    "md5": "hashlib",
    "sha1": "hashlib",
    "sha256": "hashlib",
    "sha512": "hashlib",
    "collections_abc": "collections",
    "pydecimal": "decimal",
    "pydatetime": "datetime",
}

_SLEEP_SLICE_S = 0.05


def is_dunder(name: str) -> bool:
    """True for ``__name__``-style names."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def attribute_problem(name: str, *, store: bool = False) -> str | None:
    """Why a script may not read (or, with ``store``, assign or delete) attribute ``name``; None if it may."""
    if name in INTERNAL_NAMES:
        return f"the attribute .{name} (frame, code and event-loop internals are not available to scripts)"
    if is_dunder(name):
        if store or name not in SAFE_DUNDERS:
            return f"{'assigning ' if store else ''}the special attribute .{name}"
        return None
    if name.startswith("_"):
        return f"the private attribute .{name}"
    return None


def attribute_hint(name: str) -> str:
    """What to do instead of using the attribute ``name``."""
    if name in INTERNAL_NAMES:
        return "Frames, code objects and tracebacks are off limits; use traceback.format_exc() for error text."
    if is_dunder(name):
        return "Use public APIs instead: type(x), isinstance(), x.__class__.__name__ and super().__init__() work."
    return "Private names are reachable only as self._name (or cls._name) inside the class's own methods."


def format_problem(fmt: str) -> str | None:
    """Why ``fmt`` may not be used as a ``str.format`` template (attribute paths); None if it may."""
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return None  # format() itself will raise the real error
    for _literal, field, spec, _conversion in parsed:
        if field and _has_attribute_path(field):
            return f"the attribute path {{{field}}} in a format string"
        if spec and "{" in spec:
            problem = format_problem(spec)
            if problem:
                return problem
    return None


def _has_attribute_path(field: str) -> bool:
    """True when a replacement field reads an attribute (``0.attr``); ``0[key.with.dots]`` only indexes."""
    in_index = False
    for char in field:
        if char == "[":
            in_index = True
        elif char == "]":
            in_index = False
        elif char == "." and not in_index:
            return True
    return False


def runtime_policy_error(what: str, hint: str) -> PolicyError:
    """A `PolicyError` raised while the script runs, located at the script's innermost line."""
    lineno, cell, line = None, None, ""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<cell-"):
            lineno, cell = frame.f_lineno, frame.f_code.co_filename
            line = linecache.getline(cell, lineno).strip()
            break
        frame = frame.f_back
    where = f" (line {lineno})\n    {line}" if lineno else ""
    return PolicyError(
        f"{what} is not allowed",
        exc_type="PolicyError",
        traceback_text=f"PolicyError: {what} is not allowed{where}",
        lineno=lineno,
        cell=cell,
        hint=hint,
    )


def exact_str(value: Any) -> Any:
    """``value`` as a plain `str` when it is a `str` subclass, so its own methods cannot lie to a check.

    A subclass may override ``__eq__``, ``__hash__``, ``startswith`` or ``__str__``; `str.__str__`
    copies the characters without calling any of them. Anything else comes back unchanged.
    """
    if type(value) is str or not isinstance(value, str) or not issubclass(type(value), str):
        return value
    return str.__str__(value)


def check_attr(name: Any, *, store: bool = False) -> Any:
    """Refuse attribute ``name`` when the rules block it; return it as a plain `str` (the name to use)."""
    name = exact_str(name)
    if type(name) is not str:
        return name  # getattr() raises its own TypeError
    problem = attribute_problem(name, store=store)
    if problem:
        raise runtime_policy_error(problem, attribute_hint(name))
    return name


def _check_format(fmt: str) -> None:
    problem = format_problem(exact_str(fmt))
    if problem:
        raise runtime_policy_error(problem, "Use f-strings or plain {} / {0} / {name} fields; no {0.attr} paths.")


def script_function(func: Any) -> bool:
    """True for a function a script defined: its globals are a session namespace with the policy's builtins."""
    if type(func) is not types.FunctionType:
        return False
    table = func.__globals__.get("__builtins__")
    return isinstance(table, dict) and FORMAT_ATTR_NAME in table


def _importable(cls: type) -> bool:
    """True when ``cls`` is what its module and qualified name lead to: a class of a real module.

    A script's classes are not (their module is ``__main__`` of the host, or whatever a metaclass or
    ``type()`` recorded); a class restored from a checkpoint is not either.
    """
    module_name = type.__dict__["__module__"].__get__(cls)
    target: Any = sys.modules.get(module_name) if isinstance(module_name, str) else None
    for part in type.__dict__["__qualname__"].__get__(cls).split("."):
        if isinstance(target, types.ModuleType):
            target = vars(target).get(part)
        elif isinstance(target, type):
            target = type.__dict__["__dict__"].__get__(target).get(part)
        else:
            return False
    return target is cls


def shared_problem(obj: Any) -> str | None:
    """Why a script may not change attributes of ``obj`` (shared by every session in the process); None if it may.

    Shared: classes of real modules (``json.JSONEncoder``, found by their module and qualified name),
    functions a script did not define, and the objects module views hand out (``decimal.DefaultContext``).
    Instances a script creates, its own classes and functions stay writable.
    """
    if isinstance(obj, type):
        if not _importable(obj) and id(obj) not in _shared_ids:
            return None
        return f"changing the class {obj.__module__}.{obj.__qualname__}"
    if id(obj) in _shared_ids or (type(obj) is types.FunctionType and not script_function(obj)):
        return f"changing {type(obj).__name__} {getattr(obj, '__qualname__', '')}".rstrip()
    return None


def store_target(obj: Any, /) -> Any:
    """``obj``, unless it is shared by every session (see `shared_problem`): then raise `PolicyError`.

    Runs before every attribute assignment of a script, so the usual case (an instance of a script's
    class) costs one set lookup of its type.
    """
    if type(obj) in _watched_types:
        problem = shared_problem(obj)
        if problem:
            raise runtime_policy_error(
                f"{problem} (shared by every session)",
                "Standard-library classes and functions are read-only; subclass them or set attributes on your"
                " own instances.",
            )
    return obj


# ------------------------------------------------------------------ module views


class ModuleView(types.ModuleType):
    """What a script gets for an allowed module: its public names, minus anything leading outside the policy.

    Read-only (scripts cannot patch a module other sessions share) and pickled as a reference to the
    module's name, re-guarded when a checkpoint is loaded.
    """

    def __getattr__(self, name: str) -> Any:
        real = sys.modules.get(self.__name__)
        modules = _view_modules.get(id(self))
        if real is not None and modules is not None and not name.startswith("_"):
            # Packages such as numpy import submodules lazily (module __getattr__): numpy.random
            # appears only on first use, after the view was built.
            lazy = getattr(real, name, None)
            if isinstance(lazy, types.ModuleType) and _keep(self.__name__, name, lazy, modules):
                attach_submodule(self, lazy, modules)
                return vars(self)[name]
        if real is not None and hasattr(real, name):
            raise AttributeError(
                f"module {self.__name__!r} has no attribute {name!r} available to scripts (the policy hides it)"
            )
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise runtime_policy_error(f"changing the module attribute {self.__name__}.{name}", "Modules are read-only.")

    def __delattr__(self, name: str) -> None:
        raise runtime_policy_error(f"deleting the module attribute {self.__name__}.{name}", "Modules are read-only.")

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        from cloudpickle.cloudpickle import subimport

        return subimport, (self.__name__,)

    # `copy` would otherwise rebuild a view from __reduce__, which imports the real, unguarded module.
    def __copy__(self) -> ModuleView:
        return self

    def __deepcopy__(self, memo: Any) -> ModuleView:
        return self

    def __repr__(self) -> str:
        return f"<module {self.__name__!r}>"


_views: dict[tuple[frozenset[str], str], ModuleView] = {}
_views_lock = threading.RLock()


def top_level_allowed(module_name: str, modules: frozenset[str]) -> bool:
    """True when ``module_name`` belongs to an allowed package (C accelerators count as their module)."""
    top = module_name.split(".", 1)[0]
    if top == "builtins" or top in modules:
        return True
    bare = top.lstrip("_")
    return bare in modules or _ACCELERATORS.get(bare) in modules


def module_allowed(name: str, modules: frozenset[str]) -> bool:
    """True when a script may import ``name`` under a policy allowing the top-level ``modules``."""
    top, _, rest = name.partition(".")
    if top not in modules:
        return False
    return not (rest and top in TOP_LEVEL_ONLY)


def name_denied(module_name: str, name: str) -> bool:
    """True when the module rules hide ``module_name.name`` from scripts (before looking at its value)."""
    if name.startswith("_"):
        return True
    allow = _MODULE_ALLOW.get(module_name)
    if allow is not None and name not in allow:
        return True
    return name in _MODULE_DENY.get(module_name, ())


def _keep(module_name: str, name: str, value: Any, modules: frozenset[str]) -> bool:
    if name_denied(module_name, name):
        return False
    if isinstance(value, types.ModuleType):
        return module_allowed(value.__name__, modules)
    if isinstance(value, type) or callable(value):
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and not top_level_allowed(owner, modules):
            return False
    return True


# The policy's modules for each view (views are cached for the life of the process, so ids are stable).
_view_modules: dict[int, frozenset[str]] = {}
# Ids of the objects views hand out (the modules keep them alive, so ids stay valid): shared by every
# session in the process, so scripts may not set or delete their attributes.
_shared_ids: set[int] = set()
# Types whose instances may be shared: classes (every metaclass of a class a view hands out), functions,
# and the types of the other objects views hand out. Stores on anything else skip the check.
_watched_types: set[type] = {type, types.FunctionType}


def module_view(module: types.ModuleType, modules: frozenset[str]) -> ModuleView:
    """The (cached, shared, read-only) view of ``module`` for a policy allowing ``modules``."""
    key = (modules, module.__name__)
    view = _views.get(key)
    if view is not None:
        return view
    with _views_lock:
        view = _views.get(key)
        if view is not None:
            return view
        view = ModuleView(module.__name__, module.__doc__)
        _views[key] = view  # before filling: packages and their submodules refer to each other
        _view_modules[id(view)] = modules
        content = vars(view)
        for name, value in list(vars(module).items()):
            if not _keep(module.__name__, name, value, modules):
                continue
            if isinstance(value, types.ModuleType):
                value = module_view(value, modules)
            else:
                value = _SPECIAL.get((module.__name__, name), value)
                _shared_ids.add(id(value))
                _watched_types.add(type(value))
            content[name] = value
        version = vars(module).get("__version__")
        if type(version) is str:  # pd.__version__
            content["__version__"] = version
        return view


def attach_submodule(parent: ModuleView, child: types.ModuleType, modules: frozenset[str]) -> None:
    """Make a newly imported submodule reachable from its parent package's view."""
    vars(parent)[child.__name__.rpartition(".")[2]] = module_view(child, modules)


# --------------------------------------------------------- guarded replacements


def _sliced_sleep(seconds: float) -> None:
    """`time.sleep` in short slices, so a wall-time interrupt lands between them."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, _SLEEP_SLICE_S))


_sliced_sleep.__name__ = "sleep"
pickled_helper(_sliced_sleep, "sliced_sleep")

# Stand-ins pickled by reference, by their stable path (module, name); the checkpoint loader maps them back.
# `snapcell.policy._standins` adds the rest of both tables when it is imported (the policy imports it).
GUARD_GLOBALS: dict[tuple[str, str], Any] = {(HELPERS_MODULE, "sliced_sleep"): _sliced_sleep}

_SPECIAL: dict[tuple[str, str], Any] = {("time", "sleep"): _sliced_sleep}


def register_stand_in(module: str, name: str, value: Any) -> None:
    """Make module views hand out ``value`` for ``module.name``, and let checkpoints name it by its stable path.

    A checkpoint names it ``snapcell.checkpoint.helpers.<value.__name__>`` (`pickled_helper`). Call before the first
    view of ``module`` is built (views are cached).
    """
    _SPECIAL[(module, name)] = value
    GUARD_GLOBALS[(HELPERS_MODULE, value.__name__)] = pickled_helper(value)


class RecordingHooks:
    """What a pausable run's record (`snapcell.interpreter._replay`, which the policy cannot import) asks the guard.

    Attributes:
        class_clock: ``(cls, name, live)`` -> what a script reads for ``cls.now`` / ``today`` / ``utcnow`` of
            ``datetime``'s own classes (``live`` outside a pausable run).
        first_import: Called after a script's import brought a module into the process.
    """

    class_clock: Callable[[type, str, Any], Any] | None = None
    first_import: Callable[[str], None] | None = None


def register_recording_hooks(
    *, class_clock: Callable[[type, str, Any], Any], first_import: Callable[[str], None]
) -> None:
    """Let a pausable run's record see the clocks of ``datetime`` and the modules a script imports first."""
    RecordingHooks.class_clock = class_clock
    RecordingHooks.first_import = first_import


def class_clock(obj: Any, name: str) -> Any:
    """``obj.name`` for a name of `CLASS_CLOCK_NAMES`: recorded in a pausable run when it is ``datetime``'s own clock.

    A class that defines its own ``now`` (pandas' ``Timestamp``, a script's class) keeps it: only the class methods
    of ``datetime.date`` and ``datetime.datetime`` are known to read the wall clock and nothing else.
    """
    value = getattr(obj, name)
    hook, datetime = RecordingHooks.class_clock, sys.modules.get("datetime")
    if hook is None or datetime is None:
        return value
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in type.__dict__["__mro__"].__get__(cls):
        if name in type.__dict__["__dict__"].__get__(klass):
            if klass is datetime.datetime or klass is datetime.date:
                return hook(cls, name, value)
            return value
    return value


def special_value(module: str, name: str, value: Any) -> Any:
    """The guarded stand-in for ``module.name`` when there is one (``operator.attrgetter``), else ``value``."""
    return _SPECIAL.get((module, name), value)


@pickled_helper
def guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """`getattr` that refuses dunder, private and frame/code names."""
    name = check_attr(name)
    if name in ("format", "format_map"):
        return format_attr(obj, name)
    return getattr(obj, name, *default)


@pickled_helper
def guarded_hasattr(obj: Any, name: str) -> bool:
    """`hasattr` that refuses dunder, private and frame/code names."""
    return hasattr(obj, check_attr(name))


@pickled_helper
def guarded_setattr(obj: Any, name: str, value: Any) -> None:
    """`setattr` that refuses dunder, private and frame/code names, and objects the script does not own."""
    setattr(store_target(obj), check_attr(name, store=True), value)


@pickled_helper
def guarded_delattr(obj: Any, name: str) -> None:
    """`delattr` that refuses dunder, private and frame/code names, and objects the script does not own."""
    delattr(store_target(obj), check_attr(name, store=True))


def _visible(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if attribute_problem(n) is None)


@pickled_helper
def guarded_dir(*args: Any) -> list[str]:
    """`dir` listing only the names a script may use."""
    if not args:
        caller = sys._getframe(1)
        return _visible(caller.f_locals)
    return _visible(dir(*args))


@pickled_helper
def guarded_vars(*args: Any) -> dict[str, Any]:
    """`vars` of an instance or module view; classes and the caller's scope are refused."""
    if len(args) != 1:
        raise runtime_policy_error("vars() without an argument", "Pass the object: vars(obj).")
    (obj,) = args
    if isinstance(obj, ModuleView):
        return {n: v for n, v in vars(obj).items() if attribute_problem(n) is None}
    if isinstance(obj, type | types.ModuleType):
        raise runtime_policy_error("vars() of a class or module", "Use dir(obj) to list its public names.")
    result: dict[str, Any] = vars(obj)
    if shared_problem(obj):
        return dict(result)  # a copy: writing to it must not change an object every session shares
    return result


def format_attr(obj: Any, name: str) -> Any:
    """``obj.format`` / ``obj.format_map``, checking the template when ``obj`` is a string (or ``str``)."""
    method = getattr(obj, name)
    if isinstance(obj, str):
        _check_format(obj)
        return method
    if isinstance(obj, type) and issubclass(obj, str):

        def unbound(template: Any, /, *args: Any, **kwargs: Any) -> Any:
            if isinstance(template, str):
                _check_format(template)
            return method(template, *args, **kwargs)

        return unbound
    return method


SAFE_BUILTIN_NAMES = frozenset(
    {
        "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
        "classmethod", "complex", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
        "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "memoryview", "min",
        "next", "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set",
        "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip", "NotImplemented",
        "Ellipsis", "None", "True", "False", "__build_class__", "__name__",
    }
)  # fmt: skip


# `guarded_builtins` as a zygote's warm-up built it (`warm_guarded_builtins`): its children copy it rather than walk
# the builtins again (~50 page faults of theirs). Only a zygote fills it: nothing changes its builtins afterwards.
_WARM_BUILTINS: list[dict[str, Any]] = []


def warm_guarded_builtins() -> None:
    """Build the guarded builtins once now (in a zygote), for `guarded_builtins` in its forked workers to copy."""
    _WARM_BUILTINS[:] = [_build_guarded_builtins()]


def guarded_builtins() -> dict[str, Any]:
    """The safe builtins plus guarded getattr/setattr/hasattr/delattr/dir/vars (imports are added by the policy).

    A fresh dict each call (a session may change its own).
    """
    if _WARM_BUILTINS:
        return dict(_WARM_BUILTINS[0])
    return _build_guarded_builtins()


def _build_guarded_builtins() -> dict[str, Any]:
    table = {name: getattr(builtins, name) for name in SAFE_BUILTIN_NAMES if hasattr(builtins, name)}
    for name, value in vars(builtins).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            table[name] = value
    table.update(
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        setattr=guarded_setattr,
        delattr=guarded_delattr,
        dir=guarded_dir,
        vars=guarded_vars,
    )
    table[FORMAT_ATTR_NAME] = format_attr
    return table
