"""Resource limits for one run, enforced by the runner and, in process mode, by the worker."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from snapcell.errors import ConfigError

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = ["Limits"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Limits applied to every run of a session.

    ``None`` means no limit. Inline mode enforces wall time (pure-Python code only),
    output, recursion and host calls; memory, CPU, processes, file size and open
    files need a worker process (``isolation="process"``).

    What inline mode cannot do: the wall-time interrupt only lands between Python bytecodes,
    so C-level work (``10**10**8``, ``sorted`` of a huge list, a regex that backtracks
    forever) runs to completion however long it takes, and nothing bounds the memory a
    script allocates. Only the worker process, killed from outside when it overruns its
    grace or its address-space limit, stops those.

    Attributes:
        wall_time_s: Wall-clock seconds one run may take before it is interrupted; the session is kept.
        grace_s: Seconds a worker gets to stop after the interrupt before it is killed and replaced.
        cpu_time_s: CPU seconds a worker may use over its life (process mode); past it the worker is killed
            and replaced (`WorkerLost`, reason ``"timeout"``) and the session restored from its checkpoint.
        memory_bytes: Address space of the worker (process mode).
        max_output_bytes: stdout and stderr kept per stream and run; the tail is kept.
        max_value_repr_bytes: Size of the rendered value of a run; the tail is cut.
        max_recursion_depth: Python recursion limit while a script runs.
        max_host_calls: Host-function calls per run.
        max_processes: Processes the worker may own (process mode; 0 forbids forking).
        max_file_bytes: Largest file the worker may write (process mode).
        max_open_files: File descriptors the worker may hold (process mode).
        max_threads: Threads (and processes) the worker may run at once, its main thread included (process
            mode; RLIMIT_NPROC, enforced when the worker runs under a uid of its own, i.e. a root host).
        max_scratch_bytes: Total bytes of all files in the worker's scratch directory (process mode; a tmpfs of
            this size, when the host runs as root); a write past it fails with ``OSError`` (ENOSPC).
        max_script_bytes: Size of one script in UTF-8; a larger one does not run and its result says so.
        max_value_bytes: Size of a run's value, and of a host call's arguments, as sent from a worker (their
            JSON form; process mode). A larger value comes back as None with its capped repr and a note; larger
            arguments fail the call with `OutputLimitExceeded`.
        dump_time_s: Seconds a dump may take in the worker (``__reduce__`` and ``__getstate__`` of script
            objects run then) before it is stopped and the worker replaced (process mode).
        workspace_bytes: Total bytes of the files a session's workspace may keep in its checkpoint (process mode);
            a dump over it raises `WorkspaceQuotaExceeded` and stores nothing. What a run can write at once is
            bounded by ``max_scratch_bytes`` as well, so the effective quota is the smaller of the two.
        max_artifact_bytes: Bytes of the files written under ``out/`` during a run that come back whole in
            ``RunResult.files`` (process mode); larger artifacts come back as path, size and media type only.
        load_time_s: Seconds a load may take in the worker (``__setstate__`` and reducers run then) before it
            is stopped and the worker replaced (process mode).
    """

    wall_time_s: float | None = 30.0
    grace_s: float = 2.0
    cpu_time_s: float | None = 600.0
    memory_bytes: int | None = 2048 * _MIB
    max_output_bytes: int | None = 64 * 1024
    max_value_repr_bytes: int | None = 16 * 1024
    max_recursion_depth: int | None = 1000
    max_host_calls: int | None = None
    max_processes: int | None = 0
    max_file_bytes: int | None = 256 * _MIB
    max_open_files: int | None = 256
    max_threads: int | None = 128
    max_scratch_bytes: int | None = 256 * _MIB
    max_script_bytes: int | None = _MIB
    max_value_bytes: int | None = _MIB
    dump_time_s: float | None = 60.0
    load_time_s: float | None = 60.0
    workspace_bytes: int | None = 256 * _MIB
    max_artifact_bytes: int = 8 * _MIB

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"Limits.{name} must be a positive number of seconds or None, not {value!r}")
        for name in ("dump_time_s", "load_time_s"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"Limits.{name} must be a positive number of seconds or None, not {value!r}")
        if not _is_number(self.grace_s) or not math.isfinite(self.grace_s) or self.grace_s < 0:
            raise ConfigError(f"Limits.grace_s must be a non-negative number of seconds, not {self.grace_s!r}")
        minimums = {
            "memory_bytes": 64 * _MIB,
            "max_output_bytes": 1,
            "max_value_repr_bytes": 1,
            "max_recursion_depth": 50,
            "max_host_calls": 0,
            "max_processes": 0,
            "max_file_bytes": 0,
            "max_open_files": 16,
            "max_threads": 8,
            "max_scratch_bytes": _MIB,
            "max_script_bytes": 1,
            "max_value_bytes": 1024,
            "workspace_bytes": 0,
            "max_artifact_bytes": 0,
        }
        for name, minimum in minimums.items():
            value = getattr(self, name)
            if value is None and name != "max_artifact_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"Limits.{name} must be an integer >= {minimum} or None, not {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
