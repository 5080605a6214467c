"""Type-check scripts against host-function stubs with ty, before they run (host side).

Three parts: `TypeChecker` runs ty on a cell (`_checker`); `declarations_from_namespace` declares a session's
variables to it (`_declarations`, run where the namespace is: a worker imports only that part); and
`stubs_from_functions` writes stubs from host functions' signatures (`_stubs`). Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.typecheck._checker import Diagnostic, TypeChecker, find_ty
    from snapcell.typecheck._declarations import declarations_from_namespace
    from snapcell.typecheck._stubs import stubs_from_functions

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.typecheck._checker": (
        "Diagnostic",
        "TypeChecker",
        "find_ty",
    ),
    "snapcell.typecheck._declarations": ("declarations_from_namespace",),
    "snapcell.typecheck._stubs": ("stubs_from_functions",),
}

__all__ = ["Diagnostic", "TypeChecker", "declarations_from_namespace", "find_ty", "stubs_from_functions"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
