"""The one stable module path of every helper a checkpoint may name: ``snapcell.checkpoint.helpers.<name>``.

A pickle names a function or class by its module and qualified name, so a helper named by the module that defines
it would change the checkpoint format whenever that module moved. Every helper therefore carries this module's path
(`snapcell._support.pickled_helper` sets ``__module__`` and ``__qualname__``) and is an attribute here, whichever
layer defines it:

- The checkpoint code's own reconstruction helpers are defined below (``session_namespace``, ``rebuild_lru_cache``,
  ``code_in_cell``, ``rebuild_recursive_repr``, ``rebuild_datetime_array``, ``rebuild_str_array``), and the
  standard-library value helpers (``rebuild_lock``, ``rebuild_queue``, ``rebuild_stringio``, ...) are imported
  from `_stdvalues`, which keeps them beside the rule for their arguments.
- Helpers of the layers above are registered by the module that owns them when it is imported, into the table of
  `snapcell._support` (``pickled_helper``), and appear here: the interpreter's host-function proxy
  (``host_function``), the policy's guarded builtins (``guarded_getattr``, ``guarded_setattr``, ``sliced_sleep``, ...)
  and its stand-ins for standard-library pieces (``attrgetter``, ``methodcaller``, ``Formatter``, ``dataclass``,
  ``run``, ...).

Why a table rather than imports: the interpreter imports the checkpoint code, so this package may not import the
interpreter (no import circle), and the policy and the checkpoint code stay independent of each other. Nor may
the policy or the interpreter import this package when they are imported: a worker's zygote imports both before it
says ready, and the checkpoint code only once a session first dumps or loads. The table lives in the layer every
other one may import, and reaches this module whichever is imported first.

Which of these names a checkpoint may actually use is the rule's business (`snapcell.checkpoint._rule`: ``HELPERS``
for the helpers, the policy's ``stand_ins`` for its stand-ins); the paths the helpers had before this module,
which older checkpoints name, are aliases there (``ALIASES``, read through ``current_name`` by the host's scan and
the loader alike).
"""

from __future__ import annotations

import functools
import pickle
import reprlib
import types
from collections.abc import Callable
from typing import Any

from snapcell._support import HELPERS_MODULE, pickled_helper, pickled_helpers
from snapcell.checkpoint._stdvalues import (
    rebuild_bytesio,
    rebuild_condition,
    rebuild_event,
    rebuild_lock,
    rebuild_queue,
    rebuild_semaphore,
    rebuild_stringio,
    rebuild_zoneinfo,
)

__all__ = [
    "MODULE",
    "code_in_cell",
    "rebuild_bytesio",
    "rebuild_condition",
    "rebuild_datetime_array",
    "rebuild_event",
    "rebuild_lock",
    "rebuild_lru_cache",
    "rebuild_queue",
    "rebuild_recursive_repr",
    "rebuild_semaphore",
    "rebuild_str_array",
    "rebuild_stringio",
    "rebuild_zoneinfo",
    "session_namespace",
]

MODULE = HELPERS_MODULE


@pickled_helper
def session_namespace() -> dict[str, Any]:
    """Stands for the session namespace in a stream; only the loader's own unpickler resolves it (to the namespace)."""
    raise pickle.UnpicklingError("the session namespace can only be restored by load_namespace")


@pickled_helper
def rebuild_lru_cache(func: Callable[..., Any], maxsize: int | None, typed: bool) -> Callable[..., Any]:
    """A ``functools.lru_cache`` wrapper around ``func`` (its cache starts empty)."""
    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)


@pickled_helper
def code_in_cell(constructor: Callable[..., types.CodeType], args: tuple[Any, ...], filename: str) -> types.CodeType:
    """A code object of a cell, under the cell's name (``<cell-N>``), so restored tracebacks show its lines."""
    return constructor(*args).replace(co_filename=filename)


@pickled_helper
def rebuild_recursive_repr(func: Callable[[Any], str]) -> Callable[[Any], str]:
    """``func`` inside `reprlib.recursive_repr`'s guard again (a dataclass ``__repr__``)."""
    return functools.wraps(func)(reprlib.recursive_repr()(func))


@pickled_helper
def rebuild_datetime_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """A numpy datetime64/timedelta64 array from its int64 buffer (stored out of band like other buffers)."""
    import numpy

    return numpy.frombuffer(buffer, dtype=numpy.int64).reshape(shape).view(numpy.dtype(dtype))


@pickled_helper
def rebuild_str_array(joined: str, separator: str, shape: tuple[int, ...], fortran: bool) -> Any:
    """A numpy object array of strings from their text joined by ``separator`` (which none of them holds).

    Raises:
        ValueError: The text does not hold one string per element of ``shape``.
    """
    import numpy

    count = _str_array_count(joined, separator, shape)
    array = numpy.empty(count, dtype=object)
    array[:] = joined.split(separator)
    return array.reshape(shape, order="F" if fortran else "C")


def _str_array_count(joined: str, separator: str, shape: tuple[int, ...]) -> int:
    """The number of strings `rebuild_str_array` makes, checked against the text (the dump's trial checks the same).

    Raises:
        ValueError: The text does not hold one string per element of ``shape``, or the separator is not one
            character.
    """
    count = 1
    for size in shape:
        count *= size
    if type(separator) is not str or len(separator) != 1 or joined.count(separator) + 1 != count:
        raise ValueError(f"the text does not hold one string per element of an array of shape {shape}")
    return int(count)


# The layers above registered theirs when they were imported; later ones are set here as they register.
globals().update(pickled_helpers())
