"""Package namespaces whose public names are imported on first use (PEP 562).

A worker imports only the modules a first run needs; a package's ``__init__`` that imported every part would pull
in the rest (pydantic for the checkpoint format, asyncio for the inline backend) before the zygote could say ready.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    exports: Mapping[str, tuple[str, ...]],
    namespace: dict[str, Any],
    *,
    moved: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names ``exports`` lists by the module holding them.

    A name is imported from its module on first use and then kept in ``namespace`` (the package's globals), an
    ordinary attribute from then on. A submodule not imported yet resolves as an attribute too, as it would have
    once the eager ``__init__`` had imported it. A name in ``moved`` (by the package that has it now) is not
    exported here: asking for it raises an `AttributeError` that names where it lives.
    """
    where = {name: module for module, names in exports.items() for name in names}
    elsewhere = {name: home for home, names in (moved or {}).items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            try:
                return import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
            if name in elsewhere:
                raise AttributeError(
                    f"{package}.{name} lives in {elsewhere[name]}: use {elsewhere[name]}.{name}"
                    f" (from {elsewhere[name]} import {name})"
                )
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
