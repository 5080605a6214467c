"""The outcome of one run, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapcell.errors import ScriptError
from snapcell.runner._host import HostCall

__all__ = ["RunResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What one run did.

    Attributes:
        value: Value of the script's trailing expression (None without one). Inline mode returns the object
            itself. In process mode it crosses as plain data, as faithfully as that allows (see
            `snapcell.runner._values`): containers, numbers, text, bytes, dates and Decimals as themselves, numpy
            arrays and pandas frames rebuilt from their buffers (when the host has numpy / pandas), anything
            else as a `ScriptValue` (type name and repr). A value over ``Limits.max_value_bytes`` is None, with a
            note, and its capped ``value_repr``.
        value_repr: ``repr`` of the value, computed where the script ran and capped; None without a value.
        stdout: Captured standard output (the tail, when it was over the limit).
        stderr: Captured standard error.
        duration_s: Wall-clock seconds the run took.
        external_calls: Host-function calls the run made, in completion order.
        notes: One-line notes for the model: restarts, timeouts, dropped or restored variables.
        error: The script's error, or None when it succeeded.
        memory_bytes: Memory in use by the session after the run: the worker's resident set size in process mode;
            None in inline mode, where the process is the host's and its size says nothing about the session.
        namespace_summary: One line on the namespace after the run: how many variables, their estimated size and
            the largest ones (``"4 variables, ~7.7 MiB; largest: rows (list, ~7.6 MiB), ..."``); empty when there
            are none. Sizes are cheap estimates (sampled for containers); see ``Manifest`` for exact pickled sizes.
    """

    value: Any = None
    value_repr: str | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    external_calls: tuple[HostCall, ...] = ()
    notes: tuple[str, ...] = ()
    error: ScriptError | None = None
    memory_bytes: int | None = None
    variables: tuple[str, ...] = field(default=())
    namespace_summary: str = ""

    @property
    def ok(self) -> bool:
        """True when the script ran to the end without an error."""
        return self.error is None
