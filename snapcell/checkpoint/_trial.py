"""The dump's own check that a frame restores: the loader's unpickler, without effect on live objects."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

from snapcell.checkpoint._classes import ProcessClasses
from snapcell.checkpoint._unpickle import FindGlobal, _RestrictedUnpickler

__all__ = ["make_trial_load"]


def make_trial_load(find_global: FindGlobal, builtins_table: Any) -> Callable[[bytes, list[Any]], Any]:
    """The loader's unpickler for a dump's own check that a frame restores, with no effect on live objects.

    Restored functions get a throwaway namespace; a class the stream names by its tracker id is the live class,
    whose state is not set again (the state itself is still unpickled, and so checked).
    """

    def trial(data: bytes, buffers: list[Any]) -> Any:
        unpickler = _TrialUnpickler(
            io.BytesIO(data),
            find_global=find_global,
            namespace={"__builtins__": builtins_table},
            buffers=buffers,
            classes=ProcessClasses(),
        )
        return unpickler.load()

    return trial


class _TrialUnpickler(_RestrictedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if (module, name) == ("cloudpickle.cloudpickle", "_class_setstate"):
            return functools.partial(self._set_state, _keep_class)
        return found


def _keep_class(obj: Any, _state: Any) -> Any:
    return obj
