"""What the checkpoint scanner (`_scan`) knows about a call in a pickle stream: whether the loader may make it, and
whether what it gives back is new (`OPAQUE`: the stream may give it state) or may be an existing object (`FOREIGN`).
"""

from __future__ import annotations

import importlib
import sys

from snapcell.checkpoint._hoststate import MISSING, makes_new_objects, resolved_global, state_refusal
from snapcell.checkpoint._rule import (
    ATTR_ARG,
    ATTR_PATHS,
    CLASS_DUNDERS,
    HELPERS,
    MODULE_ARG,
    PLAIN,
    GlobalRule,
    call_refusal,
    global_refusal,
)
from snapcell.checkpoint.scan._scanvalues import (
    _FOREIGN_HELPERS,
    _GETTERS,
    _NEW_OF_ARGUMENT,
    _NOT_AT_LOAD,
    _OWN_STATE,
    FOREIGN,
    GETTER,
    OPAQUE,
    _Attribute,
    _Global,
    _ModuleRef,
    _Refused,
    _show,
)

__all__: list[str] = []


# Modules one scan may import to learn what a class makes; past that, what an unimported module's class makes is
# foreign (a stream naming many missing modules would otherwise cost a search of the import path for each).
_MAX_IMPORTS = 64


class _Calls:
    """What the scanner knows about calls: which may be made while loading, and what each gives back."""

    def __init__(self, rule: GlobalRule) -> None:
        self.rule = rule
        # Whether instances a global makes are new objects (`instance_of`), per global.
        self.makers: dict[tuple[str, str, bool], bool] = {}
        self.imported: set[str] = set()  # modules this scan tried to import (a bounded number)

    def check(self, func: object, args: object, how: str) -> None:
        if type(func) is _Attribute and not func.of_module and func.name not in CLASS_DUNDERS:
            raise _Refused(
                "builtins", "getattr", f"a call of the attribute {func.name!r} that getattr read (through {how})"
            )
        if func is GETTER or (isinstance(func, _Global) and (func.module, func.name) in _NOT_AT_LOAD):
            raise _Refused(
                getattr(func, "module", ""),
                getattr(func, "name", ""),
                f"an attribute getter or setter, used through {how}",
            )
        if isinstance(func, _Global) and func.kind != PLAIN:
            if how != "call":
                raise _Refused(func.module, func.name, f"a helper that takes names, used through {how}")
            problem = call_refusal(func.kind, args, self.rule)
            if problem is None and func.kind == ATTR_ARG and isinstance(args, tuple) and type(args[0]) is _ModuleRef:
                problem = global_refusal(args[0].module, args[1], self.rule) or state_refusal(
                    resolved_global(args[0].module, str(args[1]))
                )
            if problem is not None:
                raise _Refused(func.module, func.name, f"called with {_show(args)}: {problem}")

    def result(self, func: object, args: object) -> object:
        """What a REDUCE pushes: a module for a module helper called with a constant, else foreign or opaque.

        Opaque (an object the stream made, which may get state) only when the callee surely makes a new object:
        a serializer's reconstructor, or a class whose ``__new__`` is a builtin's (`makes_new_objects`). Anything
        else may hand back an existing one (an Enum's member, ``heapq.heappop``'s or ``statistics.mode``'s
        argument), which is foreign.
        """
        if not isinstance(func, _Global):
            return FOREIGN  # a callable the stream computed may return anything
        if func.kind == MODULE_ARG and isinstance(args, tuple) and args and isinstance(args[0], str):
            return _ModuleRef(args[0])
        if func.kind == ATTR_ARG and isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], str):
            return _Attribute(args[1], of_module=type(args[0]) is _ModuleRef)
        key = (func.module, func.name)
        if func.kind == ATTR_PATHS or key in _GETTERS:
            return GETTER
        if func.kind != PLAIN or key in _FOREIGN_HELPERS:
            return FOREIGN
        if key in _NEW_OF_ARGUMENT:
            at = _NEW_OF_ARGUMENT[key]
            return self.instance_of(args[at] if isinstance(args, tuple) and len(args) > at else FOREIGN, False)
        if key in HELPERS or key in self.rule.stand_ins or key in _OWN_STATE:
            return OPAQUE
        return self.instance_of(func, True)

    def instance_of(self, cls: object, called: bool) -> object:
        """What ``cls(...)`` (``called``) or ``cls.__new__(cls, ...)`` gives: opaque only when surely a new object."""
        if cls is OPAQUE:
            return OPAQUE  # a class the stream made (cloudpickle's skeleton class)
        if type(cls) is not _Global or cls.kind != PLAIN:
            return FOREIGN
        key = (cls.module, cls.name, called)
        known = self.makers.get(key)
        if known is None:
            if cls.module not in sys.modules and len(self.imported) < _MAX_IMPORTS:
                self.imported.add(cls.module)
                try:  # an allowed module (the rule passed it): the inline load would import it too
                    importlib.import_module(cls.module)
                except Exception:
                    pass
            value = resolved_global(cls.module, cls.name)
            known = self.makers[key] = value is not MISSING and makes_new_objects(value, called=called)
        return OPAQUE if known else FOREIGN
