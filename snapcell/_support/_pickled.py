"""The one stable module path of snapcell's pickled helpers, and the table their owners fill at import time.

A pickle names a function or class by ``__module__`` and ``__qualname__``, so a helper that moves would change the
checkpoint format. Every helper a checkpoint may name therefore carries the path ``snapcell.checkpoint.helpers.<name>``
whichever layer defines it: `pickled_helper` sets that path and records the helper here, and the module
`snapcell.checkpoint.helpers` holds every recorded helper as an attribute (it takes the ones recorded before it was
imported, and this module hands it the later ones). The table sits in the bottom layer because its owners sit on
both sides of the checkpoint code: the policy and the interpreter (above it, which a worker imports long before any
checkpoint code, see `snapcell.worker`'s zygote) and the checkpoint code itself.
"""

from __future__ import annotations

import sys
from typing import Any, Final, TypeVar

__all__ = ["HELPERS_MODULE", "pickled_helper", "pickled_helpers"]

HELPERS_MODULE: Final = "snapcell.checkpoint.helpers"

_Helper = TypeVar("_Helper")
_helpers: dict[str, Any] = {}


def pickled_helper(helper: _Helper, name: str | None = None) -> _Helper:
    """Make checkpoints name ``helper`` as ``snapcell.checkpoint.helpers.<name>``, wherever it is defined.

    Usable as a decorator. Call it when the defining module is imported, before anything pickles the helper.

    Args:
        helper: A function or class defined at a module's top level.
        name: Its stable name (default: its ``__name__``); part of the checkpoint format, never to change.

    Returns:
        ``helper`` itself, its ``__module__`` and ``__qualname__`` set to the stable path.

    Raises:
        ValueError: Another helper already has that name.
    """
    name = name or helper.__name__  # type: ignore[attr-defined]
    if _helpers.get(name, helper) is not helper:
        raise ValueError(f"two pickled helpers are named {name!r}: {_helpers[name]!r} and {helper!r}")
    helper.__module__ = HELPERS_MODULE
    helper.__qualname__ = name
    _helpers[name] = helper
    module = sys.modules.get(HELPERS_MODULE)
    if module is not None:
        # Imported already: pickle looks the helper up there (``getattr(module, qualname) is helper``).
        setattr(module, name, helper)
    return helper


def pickled_helpers() -> dict[str, Any]:
    """Every helper recorded so far, by stable name."""
    return dict(_helpers)
