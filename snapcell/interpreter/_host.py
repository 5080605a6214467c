"""Host functions as seen by scripts: name-only proxies routed to the current run's bridge.

Also what a pausable run needs as soon as a worker starts: the signals that stop a script at a pausing call, and the
wall clock scripts read (a pausable run's record of it, `snapcell.interpreter._replay`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextvars import ContextVar
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol

from snapcell._support import is_async_callable, pickled_helper
from snapcell.errors import ConfigError, OutputLimitExceeded
from snapcell.policy import register_recording_hooks, register_stand_in

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = [
    "PAUSE_ERROR",
    "HostBridge",
    "HostCall",
    "HostFunction",
    "LocalBridge",
    "PauseRequested",
    "ScriptPaused",
    "close_unstarted",
    "current_inputs",
    "host_function",
    "validate_lookup",
]


# The error type a host reports for a call that pauses the run (a worker raises `ScriptPaused` for it).
PAUSE_ERROR = "SnapcellPause"


class ScriptPaused(BaseException):
    """Stops a script at a pausing host call.

    A BaseException, so a script's ``except Exception`` does not catch it; it goes through ``asyncio.gather``
    and tasks as any exception does.
    """


class PauseRequested(Exception):
    """Raised by a host-side function to pause the run at this call (the bridge turns it into `ScriptPaused`)."""


# The record of the pausable run in this context (a `snapcell.interpreter._replay.Inputs`), or None.
current_inputs: ContextVar[Any] = ContextVar("snapcell_inputs", default=None)


def _recorded_clock(kind: str, cast: Callable[[Any], Any]) -> Callable[[], Any]:
    """``time.<kind>`` as scripts see it: the run's record in a pausable run, else the clock."""
    live = getattr(time, kind)

    def read() -> Any:
        inputs = current_inputs.get()
        return live() if inputs is None else cast(inputs.take(kind, live))

    read.__name__ = read.__qualname__ = f"recorded_{kind}"  # its stable name in checkpoints (`pickled_helper`)
    read.__doc__ = f"``time.{kind}`` as scripts see it: the run's record in a pausable run, else the clock."
    return read


# Scripts read the clocks through the module views the policy gives them (registered before any view is built);
# the process's own ``time`` is left alone, and an unrestricted policy's scripts get the live clocks.
_CLOCKS = {
    kind: _recorded_clock(kind, int if kind.endswith("_ns") else float)
    for kind in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns")
}
for _kind, _clock in _CLOCKS.items():
    register_stand_in("time", _kind, pickled_helper(_clock))
recorded_time: Callable[[], float] = _CLOCKS["time"]


class RecordedClock:
    """``datetime.now`` / ``today`` / ``utcnow`` of a class, as a pausable run reads them: from its ``time.time``.

    ``datetime``'s class methods read the C clock directly; the policy routes loads of these names here
    (`snapcell.policy._guard.class_clock`) while a pausable run is current. Pickled (a checkpoint of a variable
    that holds one), it is the class's own method again.
    """

    __slots__ = ("_cls", "_name")

    def __init__(self, cls: type, name: str) -> None:
        self._cls, self._name = cls, name

    def __call__(self, tz: Any = None) -> Any:
        cls, name = self._cls, self._name
        if name == "now":
            return cls.fromtimestamp(recorded_time(), tz)  # type: ignore[attr-defined]
        if tz is not None:
            raise TypeError(f"{cls.__name__}.{name}() takes no arguments (1 given)")
        if name == "today":
            return cls.fromtimestamp(recorded_time())  # type: ignore[attr-defined]
        if sys.version_info >= (3, 12):
            import warnings

            warnings.warn(
                "datetime.datetime.utcnow() is deprecated and scheduled for removal in a future version. Use "
                "timezone-aware objects to represent datetimes in UTC: datetime.datetime.now(datetime.UTC).",
                DeprecationWarning,
                stacklevel=2,
            )
        utc = sys.modules["datetime"].timezone.utc
        return cls.fromtimestamp(recorded_time(), utc).replace(tzinfo=None)  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, tuple[type, str]]:
        return getattr, (self._cls, self._name)

    def __repr__(self) -> str:
        return f"<built-in method {self._name} of type object {self._cls.__qualname__}, recorded>"


def _class_clock(cls: type, name: str, live: Any) -> Any:
    return live if current_inputs.get() is None else RecordedClock(cls, name)


def _first_import(name: str) -> None:
    inputs = current_inputs.get()
    if inputs is not None:
        inputs.imported(name)


register_recording_hooks(class_clock=_class_clock, first_import=_first_import)


@dataclass(frozen=True, slots=True)
class HostCall:
    """One host-function call made by a run.

    Attributes:
        name: The host function's name.
        duration_s: Seconds the call took in the host.
        error: ``"Type: message"`` when the call raised, else None.
    """

    name: str
    duration_s: float
    error: str | None = None


class HostBridge(Protocol):
    """Carries host-function calls from a running script to wherever the host functions live."""

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``name``; returns its value, or an awaitable for an async host function."""
        ...


_bridge: ContextVar[HostBridge | None] = ContextVar("snapcell_host_bridge", default=None)
# The coroutines host-function calls of the current run returned: one never awaited is named and closed at its end.
_coroutines: ContextVar[list[Coroutine[Any, Any, Any]] | None] = ContextVar("snapcell_host_coroutines", default=None)


class HostFunction:
    """What a script sees under a host function's name: a proxy that holds only the name.

    It pickles by name, so checkpoints never contain host code, and every call goes to the
    host function of that name in the *current* run.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bridge = _bridge.get()
        if bridge is None:
            raise RuntimeError(f"host function {self._name}() can only be called while a script runs")
        result = bridge.call(self._name, args, kwargs)
        if type(result) is CoroutineType:
            # Its repr, and any warning about it, name the host function rather than the bridge's method.
            result.__name__ = result.__qualname__ = self._name
            pending = _coroutines.get()
            if pending is not None:
                pending.append(result)
        return result

    def __reduce__(self) -> tuple[Callable[[str], HostFunction], tuple[str]]:
        return host_function, (self._name,)

    def __repr__(self) -> str:
        return f"<host function {self._name}>"

    @property
    def host_name(self) -> str:
        """The name the host function is bound to."""
        return self._name


@pickled_helper
def host_function(name: str) -> HostFunction:
    """Rebuild a host-function proxy when a checkpoint is loaded (its stable name: `snapcell.checkpoint.helpers`)."""
    return HostFunction(name)


def validate_lookup(
    lookup: Mapping[str, Callable[..., Any]] | None, *, what: str = "external_lookup"
) -> dict[str, Callable[..., Any]]:
    """Check an ``external_lookup`` mapping; ``what`` names the argument in error messages.

    Raises:
        ConfigError: ``lookup`` is not a mapping, a name is not an identifier or a value is not callable; nothing ran.
    """
    if lookup is None:
        return {}
    if not isinstance(lookup, Mapping):
        raise ConfigError(
            f"{what} must be a mapping of names to functions, like {{'fetch': fetch}}, not {type(lookup).__name__}"
        )
    result: dict[str, Callable[..., Any]] = {}
    for name, func in lookup.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigError(f"host function names must be public identifiers, not {name!r}")
        if not callable(func):
            raise ConfigError(f"{what}[{name!r}] must be callable, not {type(func).__name__}")
        result[name] = func
    return result


class CallCounter:
    """Counts a run's host-function calls against ``Limits.max_host_calls``; shared by every bridge."""

    def __init__(self, max_calls: int | None) -> None:
        self._max_calls = max_calls
        self._started = 0

    def admit(self, name: str, *, available: bool) -> None:
        """Count one call of ``name``.

        Raises:
            NameError: No host function of that name in this run (the script may catch it).
            OutputLimitExceeded: The run made more calls than allowed.
        """
        if not available:
            raise NameError(f"host function {name!r} is not available in this run")
        self._started += 1
        if self._max_calls is not None and self._started > self._max_calls:
            raise OutputLimitExceeded(
                f"the run made more than {self._max_calls} host-function calls",
                limit="max_host_calls",
                value=self._max_calls,
                hint="Batch the work into fewer calls.",
            )


class LocalBridge:
    """Calls host functions in this process (inline mode, and the host side of a worker)."""

    def __init__(self, lookup: Mapping[str, Callable[..., Any]], *, max_calls: int | None) -> None:
        self._lookup = lookup
        self._counter = CallCounter(max_calls)
        self.calls: list[HostCall] = []

    def _admit(self, name: str) -> Callable[..., Any]:
        func = self._lookup.get(name)
        self._counter.admit(name, available=func is not None)
        if func is None:  # admit has raised already; this narrows the type
            raise NameError(name)
        from snapcell.telemetry import trace_host_function  # host side only: a worker imports this module too

        return trace_host_function(name, func)

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        func = self._admit(name)
        if is_async_callable(func):
            # Made when awaited: a call the script never awaits leaves no coroutine of the host's unawaited.
            return self._call_async(name, lambda: func(*args, **kwargs))
        start = time.perf_counter()
        try:
            result = func(*args, **kwargs)
        except PauseRequested:
            raise ScriptPaused(name) from None
        except Exception as exc:
            self.calls.append(HostCall(name, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"))
            _log_failure(name, exc)
            raise
        import inspect  # not before a worker needs it: a zygote says ready without it

        if inspect.isawaitable(result):
            return self._call_async(name, lambda: result, start)
        self.calls.append(HostCall(name, time.perf_counter() - start))
        return result

    async def _call_async(self, name: str, make: Callable[[], Awaitable[Any]], start: float | None = None) -> Any:
        start = time.perf_counter() if start is None else start
        try:
            result = await make()
        except PauseRequested:
            raise ScriptPaused(name) from None
        except Exception as exc:
            self.calls.append(HostCall(name, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"))
            _log_failure(name, exc)
            raise
        self.calls.append(HostCall(name, time.perf_counter() - start))
        return result


def _log_failure(name: str, exc: Exception) -> None:
    """Give the developer the host function's traceback (the script only sees the exception)."""
    from snapcell.telemetry import log  # imports logging, which a worker does not need

    log.warning("snapcell: the host function %s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc)


def bind_bridge(bridge: HostBridge | None) -> Any:
    """Make ``bridge`` the current context's bridge; returns a token for `unbind_bridge`."""
    return _bridge.set(bridge), _coroutines.set([])


def unbind_bridge(token: Any) -> list[str]:
    """Undo `bind_bridge`, and close the host-function coroutines the run never awaited.

    Such a coroutine cannot be awaited after its run (its bridge is gone), and left alone it would warn that it was
    never awaited when it is collected, into a later run's output.

    Returns:
        The names of the host functions whose calls were never awaited (they did not run), in call order.
    """
    bridge_token, coroutines_token = token
    pending = _coroutines.get() or []
    _bridge.reset(bridge_token)
    _coroutines.reset(coroutines_token)
    return [name for coro in pending if (name := close_unstarted(coro)) is not None]


def close_unstarted(coro: Coroutine[Any, Any, Any]) -> str | None:
    """Close ``coro`` if it never started (no code of it runs); returns its name then, else None."""
    import inspect  # only when a run made a coroutine: a zygote says ready without it

    if inspect.getcoroutinestate(coro) != inspect.CORO_CREATED:
        return None
    coro.close()
    return str(getattr(coro, "__qualname__", "a coroutine"))
