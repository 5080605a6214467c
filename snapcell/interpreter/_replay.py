"""A pausable run's outside inputs on the script's side: its clocks and random sources, recorded or replayed.

A run that may pause (its host marks some host functions as pausing) is resumed by running its cell again from the
namespace it started with. For that second run to take the same path, what the script read from its environment
must read the same: `Inputs` holds it, and `recording` installs it for the run.

- ``random``'s module-level functions are seeded with a recorded seed at the start of the cell (and
  ``numpy.random``'s legacy global state, when numpy is already imported), and put back as they were after it: the
  draws are the same, and cost no log.
- ``time.time`` / ``time.time_ns`` (as the policy's module views give them to scripts) and ``os.urandom`` (which
  ``secrets``, ``uuid.uuid4`` and ``random.SystemRandom`` read) are recorded as they return and replayed in order;
  past the end of the record they are live again.
- String hashing is fixed when an interpreter starts: the hash of a probe string is recorded, so a resumed run can
  say when its set and dict orders may differ.

Only the run's own context reads the record (a ``ContextVar``): other runs and threads of the process (inline mode)
see the live clocks. What is not covered: ``datetime.now()`` and ``time.monotonic()`` / ``perf_counter()`` (C
clocks with no Python hook), ``random.Random()`` instances seeded by the OS, numpy imported during the cell.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from snapcell._support import pickled_helper
from snapcell.policy import register_stand_in

__all__ = ["PAUSE_ERROR", "Inputs", "PauseRequested", "ScriptPaused", "inputs_off", "recording"]

# The error type a host reports for a call that pauses the run (a worker raises `ScriptPaused` for it).
PAUSE_ERROR = "SnapcellPause"
_HASH_PROBE = "snapcell:hash-probe"
# Most values of one kind a record holds: a script reading the clock in a loop stops being replayed past this.
_MAX_VALUES = 10_000
# Most bytes of ``os.urandom`` a record keeps (it travels in the run's reply and in the checkpoint); past it the
# bytes are live, so a replay reads other ones there (a difference the host sees only if they reach a host call).
_MAX_URANDOM_BYTES = 64 * 1024


class ScriptPaused(BaseException):
    """Stops a script at a pausing host call.

    A BaseException, so a script's ``except Exception`` does not catch it; it goes through ``asyncio.gather``
    and tasks as any exception does.
    """


class PauseRequested(Exception):
    """Raised by a host-side function to pause the run at this call (the bridge turns it into `ScriptPaused`)."""


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
        for kind, types in (("time", (float,)), ("time_ns", (int,)), ("urandom", (bytes,))):
            values = given.get(kind)
            ok = type(values) is list and all(type(v) in types for v in values)
            self.streams[kind] = list(values) if ok else []  # type: ignore[arg-type]
        self._at = dict.fromkeys(self.streams, 0)
        self.urandom_bytes = sum(len(v) for v in self.streams["urandom"])
        self.urandom_full = False
        self.recorded_hash = given.get("hash")

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
        numpy = sys.modules.get("numpy.random")
        if numpy is None and "numpy" in sys.modules:  # numpy imports its random module on first use
            import importlib

            numpy = importlib.import_module("numpy.random")
        numpy_state = numpy.get_state() if numpy is not None else None
        if numpy is not None:
            numpy.seed(self.seed % 2**32)

        def restore() -> None:
            random.setstate(state)
            if numpy is not None:
                numpy.set_state(numpy_state)

        return restore

    def export(self) -> dict[str, Any]:
        """The record as plain data, for the log (the values read, replayed or live, in order)."""
        return {"seed": self.seed, **{k: v[: self._at[k]] for k, v in self.streams.items()}, "hash": hash(_HASH_PROBE)}


_current: ContextVar[Inputs | None] = ContextVar("snapcell_inputs", default=None)
_live_time = time.time
_live_time_ns = time.time_ns
_live_urandom = os.urandom
_installed = False


def recorded_time() -> float:
    """``time.time`` as scripts see it: the run's record in a pausable run, else the clock."""
    inputs = _current.get()
    return _live_time() if inputs is None else float(inputs.take("time", _live_time))


def recorded_time_ns() -> int:
    """``time.time_ns`` as scripts see it: the run's record in a pausable run, else the clock."""
    inputs = _current.get()
    return _live_time_ns() if inputs is None else int(inputs.take("time_ns", _live_time_ns))


# Scripts read the wall clock through the module views the policy gives them; the process's own ``time`` is left
# alone (an unrestricted policy's scripts get the real module, and so the live clock).
register_stand_in("time", "time", pickled_helper(recorded_time))
register_stand_in("time", "time_ns", pickled_helper(recorded_time_ns))


def _urandom(size: int, /) -> bytes:
    inputs = _current.get()
    if inputs is None:
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
    token = _current.set(inputs)
    restore = inputs.start()
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
