"""The outcome of one run, as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from snapcell.errors import RunCancelledError, ScriptError, TimeLimitExceeded
from snapcell.interpreter._host import HostCall

if TYPE_CHECKING:
    from dataclasses import dataclass, field
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass, field

__all__ = ["Artifact", "PausedCall", "RunResult", "RunStatus"]

RunStatus = Literal["ok", "error", "timeout", "cancelled", "lost", "paused"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    """A file the script wrote under ``out/`` in its workspace during a run (process mode).

    Attributes:
        path: Its path in the workspace (``"out/chart.png"``).
        size_bytes: Its size.
        media_type: Its media type, from the extension (``"image/png"``; ``application/octet-stream`` if unknown).
        data: Its bytes, or None when they did not fit in ``Limits.max_artifact_bytes`` (read it with
            ``session.read_file(path)``).
    """

    path: str
    size_bytes: int
    media_type: str
    data: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PausedCall:
    """The pausing host call a run stopped at: what it waits for.

    Attributes:
        name: The host function's name.
        args: Its positional arguments, as plain data (a value that is not plain data is given as its repr).
        kwargs: Its keyword arguments, likewise.
    """

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What one run did.

    Attributes:
        value: Value of the script's trailing expression (None without one). Inline mode returns the object
            itself. In process mode it crosses as plain data, as faithfully as that allows (see
            `snapcell.wire._values`): containers, numbers, text, bytes, dates and Decimals as themselves, numpy
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
        files: Artifacts: the files the run wrote under ``out/`` (process mode), with their bytes up to a cap.
        namespace_summary: One line on the namespace after the run: how many variables, their estimated size and
            the largest ones (``"4 variables, ~7.7 MiB; largest: rows (list, ~7.6 MiB), ..."``); empty when there
            are none. Sizes are cheap estimates (sampled for containers); see ``Manifest`` for exact pickled sizes.
        status: How the run ended: ``"ok"``; ``"error"`` (the script failed or was refused); ``"timeout"`` (the
            wall-time limit stopped it); ``"cancelled"`` (its caller cancelled it, see `RunCancelled`); ``"lost"``
            (its worker died; nothing of the run is kept); ``"paused"`` (the script called a pausing host function:
            ``paused`` says which; `AsyncSession.resume` goes on from there). Derived from ``error`` unless given.
        restarted: The session had to start a new interpreter (its worker was lost before) for this run: variables
            are those of the last checkpoint, and the setup cells were run again.
        cpu_time_s: CPU seconds the run used: the worker's user + system time in process mode (measured by the
            host), the host process's in inline mode; None when unknown.
        peak_memory_bytes: The worker's peak resident set size after the run (measured by the host); None in
            inline mode.
        assigned: Variables the run bound or rebound to a new object (at most 100 names; 64 in process mode).
        paused: The pausing host call the run stopped at (status ``"paused"``), else None.
        inputs: What the run's clocks and random sources returned, when it could pause (see
            `snapcell.interpreter._replay`); None otherwise.
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
    files: tuple[Artifact, ...] = ()
    status: RunStatus | None = None
    restarted: bool = False
    cpu_time_s: float | None = None
    peak_memory_bytes: int | None = None
    assigned: tuple[str, ...] = ()
    paused: PausedCall | None = None
    inputs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status is None:
            object.__setattr__(self, "status", _status(self.error))

    @property
    def ok(self) -> bool:
        """True when the script ran to the end without an error (and its worker did not die)."""
        return self.error is None and self.status != "lost"


def _status(error: ScriptError | None) -> RunStatus:
    if error is None:
        return "ok"
    if isinstance(error, RunCancelledError):
        return "cancelled"
    if isinstance(error, TimeLimitExceeded) and error.limit == "wall_time_s":
        return "timeout"
    return "error"
