"""Pause and resume on the host's side: the log of a run's host calls, and the functions that record or replay it.

CPython cannot save a running frame, so a paused run is resumed the way durable-execution engines resume a
workflow: the cell runs again from the namespace it started with, each host call it made is answered from the log
(its name and arguments checked against it, the function not called again), the paused call returns the answer,
and then the cell goes on live. The worker's clocks and random sources are the runner's part of the log
(`snapcell.interpreter._replay`); this module holds the host calls.
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

from snapcell._support import is_async_callable
from snapcell.checkpoint import PausedRun
from snapcell.errors import ConfigError, SessionError
from snapcell.interpreter import PausedCall, PauseRequested, inputs_off
from snapcell.wire import MalformedMessage, NotPlainData, decode, encode, to_plain

__all__ = ["Answer", "LoggedCall", "Pause", "Replayer", "check_pausing", "pause_from_record", "pause_record"]

# Most values a log may hold when it is read back (it is the host's own, signed; this only bounds a mistake).
_MAX_LOG_ITEMS = 10_000_000


@dataclasses.dataclass(slots=True)
class LoggedCall:
    """One host call of a run, as the log keeps it.

    Attributes:
        name: The host function.
        args: Its positional arguments as plain data.
        kwargs: Its keyword arguments as plain data.
        done: It returned or raised (a call still running when the run paused is called again on resume).
        value: What it returned, as plain data.
        error: ``(type name, message)`` when it raised.
    """

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    done: bool = False
    value: Any = None
    error: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """A session's paused run: the cell, its log so far, and the call it waits at.

    Attributes:
        cell: The cell's source.
        setup: It was run as a setup cell.
        pausing: The host functions that pause.
        calls: The host calls before the paused one, in the order they started.
        call: The paused call.
        inputs: What the worker's clocks and random sources returned (the runner's record).
        hash_seed: The seed the run's interpreter hashed strings with (``PYTHONHASHSEED``); None if not known.
    """

    cell: str
    setup: bool
    pausing: frozenset[str]
    calls: tuple[LoggedCall, ...]
    call: PausedCall
    inputs: dict[str, Any] | None
    hash_seed: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """What the paused call returns on resume: ``value``, or ``error`` raised in the script."""

    value: Any = None
    error: BaseException | None = None

    @classmethod
    def checked(cls, value: Any, error: BaseException | None) -> Answer:
        """An answer the log can keep.

        Raises:
            ConfigError: Both a value and an error, an error that is not an exception, or a value that is not
                plain data.
        """
        if error is not None:
            if not isinstance(error, BaseException):
                raise ConfigError(f"error must be an exception, not {type(error).__name__}")
            if value is not None:
                raise ConfigError("resume with a value or with an error, not both")
            return cls(error=error)
        try:
            return cls(value=_result(value))
        except TypeError as exc:
            raise ConfigError(f"the answer must be plain data (numbers, text, lists, dicts, ...): {exc}") from None


def check_pausing(pausing: Collection[str] | None) -> frozenset[str]:
    """The names of the pausing host functions.

    Raises:
        ConfigError: ``pausing`` is a string or holds something other than public identifiers.
    """
    if pausing is None:
        return frozenset()
    if isinstance(pausing, str | bytes) or not isinstance(pausing, Collection):
        raise ConfigError(f'pausing must be a collection of host-function names, like {{"approve"}}, not {pausing!r}')
    for name in pausing:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigError(f"pausing host-function names must be public identifiers, not {name!r}")
    return frozenset(pausing)


def _plain(value: Any) -> Any:
    """``value`` as plain data for the log; what is not plain data is logged as its repr (compared as such)."""
    try:
        return to_plain(value)
    except NotPlainData:
        try:
            text = repr(value)
        except Exception:  # a script's __repr__ may raise anything
            text = f"<{type(value).__name__}>"
        return {"repr": text[:1000]}


def _result(value: Any) -> Any:
    """A host function's value as the script gets it in a pausable run: plain data, as the log replays it.

    Raises:
        TypeError: It is not plain data (the script sees this, as in process mode).
    """
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="python")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        return to_plain(value)
    except NotPlainData as exc:
        raise TypeError(f"the host function returned data that cannot be logged for resuming: {exc}") from None


def _error(error: tuple[str, str]) -> Exception:
    """A logged failure raised again: the builtin exception of that name, else a RuntimeError naming it.

    As a worker raises a host function's failure, so a script sees the same exception live and replayed.
    """
    kind, message = error
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not kind.startswith("_"):
        return cls(message)
    return RuntimeError(f"{kind}: {message}")


def _describe(name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = f"{name}({', '.join(parts)})"
    return text if len(text) <= 300 else text[:297] + "..."


class Replayer:
    """The host functions of one pausable run: record each call, answer logged ones, pause at a pausing one.

    Args:
        lookup: The run's host functions.
        pausing: The names that pause (bound for the script even when ``lookup`` has no function of that name).
        pause: The paused run being resumed (its log is replayed), or None for a first run.
        answer: What the paused call returns (with ``pause``).
    """

    def __init__(
        self,
        lookup: Mapping[str, Callable[..., Any]],
        pausing: frozenset[str],
        pause: Pause | None = None,
        answer: Answer | None = None,
    ) -> None:
        self._lookup = lookup
        self.pausing = pausing
        self._logged = pause.calls if pause is not None else ()
        self._waiting = pause.call if pause is not None else None
        self._answer = answer
        self.calls: list[LoggedCall] = []
        self.paused: PausedCall | None = None
        self.answered = pause is None
        self.difference: str | None = None
        self.difference_at: int | None = None

    @property
    def replayed_all(self) -> bool:
        """The run reached the paused call, every logged call before it answered from the log."""
        return self.answered and self.difference is None

    def functions(self) -> dict[str, Callable[..., Any]]:
        """The run's host functions, each wrapped to record, replay or pause."""
        names = dict.fromkeys([*self._lookup, *sorted(self.pausing - set(self._lookup))])
        return {name: self._wrap(name, self._lookup.get(name)) for name in names}

    def _enter(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[LoggedCall, bool]:
        """Log a call as it starts; whether its outcome is in the log already (replay) or is to come (live).

        Raises:
            PauseRequested: The run stops here: a pausing call, or the replay left the log.
        """
        if self.paused is not None or self.difference is not None:
            raise PauseRequested(name)  # the run is over: whatever the script does after the pause is dropped
        call = LoggedCall(name, _plain(list(args)), {k: _plain(v) for k, v in kwargs.items()})
        index = len(self.calls)
        if index < len(self._logged):
            want = self._logged[index]
            if (want.name, want.args, want.kwargs) != (call.name, call.args, call.kwargs):
                return self._diverge(index, f"the log has {_describe(want.name, want.args, want.kwargs)}", call)
            self.calls.append(dataclasses.replace(want))
            return self.calls[-1], want.done
        if not self.answered and self._waiting is not None:
            waiting = self._waiting
            if (waiting.name, list(waiting.args), waiting.kwargs) != (call.name, call.args, call.kwargs):
                return self._diverge(
                    index, f"the run paused at {_describe(waiting.name, list(waiting.args), waiting.kwargs)}", call
                )
            self.answered = True
            answer = self._answer or Answer()
            if answer.error is not None:
                call.error = (type(answer.error).__name__, str(answer.error))
            else:
                call.value = _result(answer.value)
            call.done = True
            self.calls.append(call)
            return call, True
        if name in self.pausing:
            self.paused = PausedCall(name=name, args=tuple(call.args), kwargs=call.kwargs)
            raise PauseRequested(name)
        self.calls.append(call)
        return call, False

    def _diverge(self, index: int, logged: str, call: LoggedCall) -> tuple[LoggedCall, bool]:
        self.difference = (
            f"host call {index + 1}: {logged}, the replay called {_describe(call.name, call.args, call.kwargs)}"
        )
        self.difference_at = index
        raise PauseRequested(call.name)

    def _wrap(self, name: str, func: Callable[..., Any] | None) -> Callable[..., Any]:
        if func is not None and is_async_callable(func):

            async def call_async(*args: Any, **kwargs: Any) -> Any:
                entry, logged = self._enter(name, args, kwargs)
                if logged:
                    return _replay(entry)
                return await _finish(entry, func(*args, **kwargs))

            return call_async

        def call(*args: Any, **kwargs: Any) -> Any:
            entry, logged = self._enter(name, args, kwargs)
            if logged:
                return _replay(entry)
            if func is None:  # not reached: a name without a function is a pausing one
                raise SessionError(f"no host function {name}")
            try:
                with inputs_off():
                    value = func(*args, **kwargs)
                if inspect.isawaitable(value):
                    return _finish(entry, value)
                entry.value = _result(value)
            except Exception as exc:
                entry.error, entry.done = (type(exc).__name__, str(exc)), True
                raise
            entry.done = True
            return entry.value

        return call


def _replay(entry: LoggedCall) -> Any:
    if entry.error is not None:
        raise _error(entry.error)
    return entry.value


async def _finish(entry: LoggedCall, awaitable: Any) -> Any:
    try:
        with inputs_off():
            value = await awaitable
        entry.value = _result(value)
    except Exception as exc:
        entry.error, entry.done = (type(exc).__name__, str(exc)), True
        raise
    entry.done = True
    return entry.value


def pause_record(pause: Pause) -> PausedRun:
    """The paused run as a checkpoint's manifest keeps it."""
    calls = [[c.name, c.args, c.kwargs, c.done, c.value, list(c.error) if c.error else None] for c in pause.calls]
    call = pause.call
    log = {
        "calls": calls,
        "call": [call.name, list(call.args), call.kwargs],
        "inputs": pause.inputs,
    }
    return PausedRun(
        cell=pause.cell,
        setup=pause.setup,
        pausing=sorted(pause.pausing),
        log=encode(log).decode(),
        hash_seed=pause.hash_seed,
    )


def pause_from_record(record: PausedRun) -> Pause:
    """The paused run a checkpoint's manifest holds.

    Raises:
        SessionError: The log is not one this release wrote.
    """
    try:
        log = decode(record.log.encode(), max_items=_MAX_LOG_ITEMS)
        calls = tuple(
            LoggedCall(str(n), list(a), dict(k), bool(d), v, (str(e[0]), str(e[1])) if e else None)
            for n, a, k, d, v, e in log["calls"]
        )
        name, args, kwargs = log["call"]
        inputs = log.get("inputs")
        call = PausedCall(name=str(name), args=tuple(args), kwargs=dict(kwargs))
    except (MalformedMessage, KeyError, TypeError, ValueError) as exc:
        raise SessionError(f"the paused run's log cannot be read: {exc}") from exc
    return Pause(
        cell=record.cell,
        setup=record.setup,
        pausing=frozenset(record.pausing),
        calls=calls,
        call=call,
        inputs=inputs if isinstance(inputs, dict) else None,
        hash_seed=record.hash_seed,
    )
