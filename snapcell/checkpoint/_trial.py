"""The dump's own check that a frame restores: the loader's unpickler, without effect on live objects."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from snapcell.checkpoint._classes import LoadClasses
from snapcell.checkpoint._rule import current_name
from snapcell.checkpoint._unpickle import FindGlobal, _RestrictedUnpickler
from snapcell.checkpoint.helpers import MODULE as HELPERS_MODULE
from snapcell.checkpoint.helpers import _str_array_count

__all__ = ["make_trial_load"]


def make_trial_load(find_global: FindGlobal, builtins_table: Any) -> Callable[[bytes, list[Any]], Any]:
    """The loader's unpickler for a dump's own check that a frame restores, with no effect on live objects.

    Restored functions get a throwaway namespace and classes are made afresh with their state, as a load makes
    them (never the live class under the same tracker id, which may be another inline session's), and are not
    registered with cloudpickle. A string array (``rebuild_str_array``) is checked as the load checks it, and
    stands as an array of its shape without its strings: splitting a text column's text again only to drop it
    cost the trial as much as the load.
    """

    def find(module: str, name: str) -> Any:
        found = find_global(module, name)  # the rule, as at load
        if current_name(module, name) == (HELPERS_MODULE, "rebuild_str_array"):
            return _checked_str_array
        return found

    def trial(data: bytes, buffers: list[Any]) -> Any:
        unpickler = _RestrictedUnpickler(
            io.BytesIO(data),
            find_global=find,
            namespace={"__builtins__": builtins_table},
            buffers=buffers,
            classes=LoadClasses(register=False),
        )
        return unpickler.load()

    return trial


def _checked_str_array(joined: str, separator: str, shape: tuple[int, ...], fortran: bool) -> Any:
    """`rebuild_str_array`'s checks, and an object array of that shape holding None."""
    import numpy

    _str_array_count(joined, separator, shape)
    return numpy.empty(shape, dtype=object, order="F" if fortran else "C")
