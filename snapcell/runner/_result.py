"""The outcome of one run, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapcell.errors import ScriptError
from snapcell.runner._host import HostCall

__all__ = ["Artifact", "RunResult"]


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
class RunResult:
    """What one run did.

    Attributes:
        value: Value of the script's trailing expression (None without one). In process mode it is
            plain data, or None when the value is not plain data (see ``value_repr``).
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

    @property
    def ok(self) -> bool:
        """True when the script ran to the end without an error."""
        return self.error is None
