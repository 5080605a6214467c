"""The dump's own check that a frame restores: the loader's unpickler, without effect on live objects."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from snapcell.checkpoint._classes import LoadClasses
from snapcell.checkpoint._unpickle import FindGlobal, _RestrictedUnpickler

__all__ = ["make_trial_load"]


def make_trial_load(find_global: FindGlobal, builtins_table: Any) -> Callable[[bytes, list[Any]], Any]:
    """The loader's unpickler for a dump's own check that a frame restores, with no effect on live objects.

    Restored functions get a throwaway namespace and classes are made afresh with their state, as a load makes
    them (never the live class under the same tracker id, which may be another inline session's), and are not
    registered with cloudpickle.
    """

    def trial(data: bytes, buffers: list[Any]) -> Any:
        unpickler = _RestrictedUnpickler(
            io.BytesIO(data),
            find_global=find_global,
            namespace={"__builtins__": builtins_table},
            buffers=buffers,
            classes=LoadClasses(register=False),
        )
        return unpickler.load()

    return trial
