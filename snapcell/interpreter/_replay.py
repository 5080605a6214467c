"""A pausable run's outside inputs on the script's side: its clocks and random sources, recorded or replayed.

A run that may pause (its host marks some host functions as pausing) is resumed by running its cell again from the
namespace it started with. For that second run to take the same path, what the script read from its environment
must read the same: `Inputs` holds it, and `recording` installs it for the run.

- ``random``'s module-level functions are seeded with a recorded seed at the start of the cell (and
  ``numpy.random``'s legacy global state, when numpy is imported before or during the cell), and put back as they
  were after it: the draws are the same, and cost no log.
- ``time.time`` / ``time_ns`` / ``monotonic`` / ``perf_counter`` (and their ``_ns`` twins, as the policy's module
  views give them to scripts: the stand-ins in `_host`, imported with every worker), ``datetime``'s class clocks
  (``now``, ``today``, ``utcnow``: read from the recorded ``time.time``) and ``os.urandom`` (which
  ``secrets``, ``uuid.uuid4`` and ``random.SystemRandom`` read) are recorded as they return and replayed in order;
  past the end of the record they are live again. What a module reads while it is imported is not recorded: a
  process imports it once, so a resume in the same process would not read it again.
- String hashing is fixed when an interpreter starts, so it is the host's to replay: it records the seed it started
  the worker with, and resumes in a worker started with the same (not in inline mode, which runs in the host's
  interpreter). The hash of a probe string is recorded too, so a resumed run can say when its set orders may differ.

Only the run's own context reads the record (a ``ContextVar``): other runs and threads of the process (inline mode)
see the live clocks. What is not covered: ``random.Random()`` instances seeded by the OS (C code reads the OS), and
clocks of other classes (pandas' ``Timestamp.now``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

from snapcell.interpreter._host import current_inputs as _current

__all__ = ["Inputs", "inputs_off", "recording"]

_HASH_PROBE = "snapcell:hash-probe"
# The values a record holds, by kind, and the types each kind's values must have (a log is read back from a checkpoint).
_KINDS = (
    ("time", (float,)),
    ("time_ns", (int,)),
    ("monotonic", (float,)),
    ("monotonic_ns", (int,)),
    ("perf_counter", (float,)),
    ("perf_counter_ns", (int,)),
    ("urandom", (bytes,)),
)
# Most values of one kind a record holds: a script reading the clock in a loop stops being replayed past this.
_MAX_VALUES = 10_000
# Most bytes of ``os.urandom`` a record keeps (it travels in the run's reply and in the checkpoint); past it the
# bytes are live, so a replay reads other ones there (a difference the host sees only if they reach a host call).
_MAX_URANDOM_BYTES = 64 * 1024
# How far up the stack a read of the OS's randomness looks for an import in progress.
_MAX_FRAMES = 64


class Inputs:
    """A run's clocks and random sources: what a replayed run reads again, and what the run reads past that.

    Args:
        given: What an earlier run of the same cell recorded (`export`), or None for a first run.
    """

    def __init__(self, given: Mapping[str, Any] | None = None) -> None:
        given = given or {}
        seed = given.get("seed")
        self.seed: int = seed if type(seed) is int else int.from_bytes(_live_urandom(8), "big")
        self.streams: dict[str, list[Any]] = {}
        for kind, types in _KINDS:
            values = given.get(kind)
            ok = type(values) is list and all(type(v) in types for v in values)
            self.streams[kind] = list(values) if ok else []  # type: ignore[arg-type]
        self._at = dict.fromkeys(self.streams, 0)
        self.urandom_bytes = sum(len(v) for v in self.streams["urandom"])
        self.urandom_full = False
        self.recorded_hash = given.get("hash")
        self._restores: list[Callable[[], None]] = []
        self._numpy_seeded = False

    def take(self, kind: str, live: Callable[[], Any], check: Callable[[Any], bool] | None = None) -> Any:
        """The next value of ``kind``: the recorded one while there is one, else a live one, recorded."""
        stream, at = self.streams[kind], self._at[kind]
        self._at[kind] = at + 1
        if at < len(stream) and (check is None or check(stream[at])):
            return stream[at]
        value = live()
        if at == len(stream) and len(stream) < _MAX_VALUES:
            stream.append(value)
        return value

    def has_next(self, kind: str) -> bool:
        """Whether the record holds a next value of ``kind`` (else the next one is live)."""
        return self._at[kind] < len(self.streams[kind])

    def start(self) -> Callable[[], None]:
        """Seed the module-level random sources as the cell starts; returns what puts their states back after it.

        Put back, because in inline mode they are the host process's own.
        """
        import random

        state = random.getstate()
        random.seed(self.seed)
        self._restores = [lambda: random.setstate(state)]
        self._numpy_seeded = False
        if "numpy" in sys.modules:
            self._seed_numpy()

        def restore() -> None:
            for undo in reversed(self._restores):
                undo()
            self._restores = []

        return restore

    def imported(self, name: str) -> None:
        """A module the cell's import brought into the process: numpy's global state is seeded as at the start.

        So a run whose process imports numpy in the cell draws what a run whose process had it already draws.
        """
        if not self._numpy_seeded and "numpy" in sys.modules:
            self._seed_numpy()

    def _seed_numpy(self) -> None:
        import importlib

        # numpy imports its random module on first use; importing it reads the OS's randomness (not recorded).
        numpy = importlib.import_module("numpy.random")
        state = numpy.get_state()
        numpy.seed(self.seed % 2**32)
        self._restores.append(lambda: numpy.set_state(state))
        self._numpy_seeded = True

    def export(self) -> dict[str, Any]:
        """The record as plain data, for the log (the values read, replayed or live, in order)."""
        return {"seed": self.seed, **{k: v[: self._at[k]] for k, v in self.streams.items()}, "hash": hash(_HASH_PROBE)}


_live_urandom = os.urandom
_installed = False


def _importing() -> bool:
    """Whether a module is being imported: its import-time reads happen in one run of a process only."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _urandom(size: int, /) -> bytes:
    inputs = _current.get()
    if inputs is None or _importing():
        return _live_urandom(size)
    if not inputs.has_next("urandom"):
        if inputs.urandom_full or inputs.urandom_bytes + size > _MAX_URANDOM_BYTES:
            inputs.urandom_full = True  # the record ends here: past it, bytes are live
            return _live_urandom(size)
        inputs.urandom_bytes += size
    data: bytes = inputs.take("urandom", lambda: _live_urandom(size), lambda v: len(v) == size)
    return data


_urandom.__module__, _urandom.__qualname__, _urandom.__name__ = "posix", "urandom", "urandom"


def _install() -> None:
    """Route ``os.urandom`` through the current run's record (live outside a pausable run).

    ``uuid.uuid4`` reads ``os.urandom``, and ``random.SystemRandom`` (so ``secrets``) the ``random`` module's own
    name for it: both are looked up at each call, so one swap serves every module that already imported them.
    """
    global _installed
    if _installed:
        return
    import random  # only a pausable run needs it: a worker says ready without it

    os.urandom = _urandom
    random._urandom = _urandom  # type: ignore[attr-defined]
    _installed = True


@contextmanager
def recording(inputs: Inputs) -> Iterator[None]:
    """Give the code run in this context ``inputs`` as its clocks and random sources."""
    _install()
    restore = inputs.start()  # before the record is current: importing numpy.random reads the OS's randomness
    token = _current.set(inputs)
    try:
        yield
    finally:
        _current.reset(token)
        restore()


@contextmanager
def inputs_off() -> Iterator[None]:
    """Live clocks in this context: a host function called from a script (inline mode) is no part of the record."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)
