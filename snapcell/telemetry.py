"""OpenTelemetry spans and the ``snapcell`` logger; without ``opentelemetry-api`` every hook is a cheap no-op.

Install the extra (``pip install 'snapcell[otel]'``) and configure a tracer provider the usual way (the
OpenTelemetry SDK, Logfire, ...): snapcell then records the spans below through the global provider, or through the
one given to `set_tracer_provider`. Without the package nothing is imported and each hook costs a cached check.
The package is imported on the first run, load, dump or cleanup, not when snapcell is imported.

| Span | Recorded for | Attributes |
|------|--------------|------------|
| ``snapcell.turn`` | each turn of `CodeTool.run_code`; the turn's ``snapcell.load``, ``snapcell.run`` and ``snapcell.dump`` are its children | ``snapcell.conversation_id``, ``snapcell.code_bytes``, ``snapcell.duration_s``, ``snapcell.error_type`` (when the turn raised) |
| ``snapcell.run`` | each ``Session.run`` / ``feed_run`` (type check included) | ``snapcell.conversation_id`` (when a caller set it with `conversation_context`), ``snapcell.code_bytes``, ``snapcell.duration_s``, ``snapcell.outcome`` (``ok``, ``error``, ``timeout``, ``worker_lost``), ``snapcell.error_type`` (the script's exception, ``TimeLimitExceeded``, ``WorkerLost``, ...; absent when ok), ``snapcell.output_bytes`` (stdout + stderr, UTF-8), ``snapcell.host_call_count``, ``snapcell.memory_bytes`` (worker RSS, process mode) |
| ``snapcell.host_call`` | each host-function call, a child of ``snapcell.run`` and current while the function runs (its own spans nest under it) | ``snapcell.function``, ``snapcell.duration_s``, ``snapcell.error_type`` (when it raised) |
| ``snapcell.load`` | ``load_session``, and the reload after a lost worker (then a child of ``snapcell.run``) | ``snapcell.conversation_id``, ``snapcell.checkpoint_bytes``, ``snapcell.buffer_count`` (out-of-band buffer sections), ``snapcell.variable_count``, ``snapcell.duration_s``, ``snapcell.error_type`` |
| ``snapcell.dump`` | ``dump`` | ``snapcell.conversation_id``, ``snapcell.checkpoint_bytes``, ``snapcell.bytes_written`` (bytes put into the store), ``snapcell.buffer_count``, ``snapcell.variable_count``, ``snapcell.dropped_count``, ``snapcell.duration_s``, ``snapcell.error_type`` |
| ``snapcell.cleanup`` | the cleanup job (`snapcell.storage.cleanup`, ``snapcell cleanup``) | ``snapcell.dry_run``, ``snapcell.scanned_objects``, ``snapcell.scanned_bytes``, ``snapcell.deleted_objects``, ``snapcell.deleted_bytes``, ``snapcell.over_quota``, ``snapcell.duration_s``, ``snapcell.error_type`` |

A span whose operation raised, or a run whose outcome is not ``ok``, has status ERROR; a raised exception is also
recorded as a span event. Attributes that are unknown are left out, never set to a placeholder.

Logs go through `logging` under the ``snapcell`` logger, which has a `logging.NullHandler` and so stays quiet until the
application configures logging: one DEBUG line per run, load and dump, one INFO line per cleanup.
"""  # noqa: E501

from __future__ import annotations

import functools
import inspect
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from snapcell._support import is_async_callable
from snapcell.errors import CheckpointError, TimeLimitExceeded, WorkerLost

__all__ = [
    "conversation_context",
    "current_conversation",
    "note_checkpoint",
    "set_tracer_provider",
    "trace_checkpoint",
    "trace_cleanup",
    "trace_host_function",
    "trace_run",
    "trace_turn",
]

log = logging.getLogger("snapcell")
log.addHandler(logging.NullHandler())

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any] | None)

_TRACER_NAME = "snapcell"
_UNRESOLVED: Any = object()
_api: Any = _UNRESOLVED  # the opentelemetry.trace module, or None when it is not installed
_provider: Any = None  # set by set_tracer_provider; None means the global provider
_cached: tuple[Any, Any] | None = None  # (provider, tracer)
_conversation: ContextVar[str | None] = ContextVar("snapcell_conversation_id", default=None)
Attributes = dict[str, str | int | float | bool]


# ------------------------------------------------------------------ setup


def _trace_api() -> Any:
    global _api
    if _api is _UNRESOLVED:
        try:
            from opentelemetry import trace
        except ImportError:
            _api = None
        else:
            _api = trace
    return _api


def _tracer() -> Any:
    """The snapcell tracer, or None when opentelemetry is not installed or no tracer provider is configured."""
    global _cached
    api = _trace_api()
    if api is None:
        return None
    provider = _provider if _provider is not None else api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        # The API without a provider (none set yet, or the no-op one): every span would be a non-recording one, so
        # none is started (each costs microseconds on every run). Checked on every call: one may be set later.
        return None
    if _cached is None or _cached[0] is not provider:
        from snapcell._support import VERSION as __version__

        _cached = (provider, provider.get_tracer(_TRACER_NAME, __version__))
    return _cached[1]


def set_tracer_provider(provider: Any) -> None:
    """Send snapcell's spans to ``provider`` instead of OpenTelemetry's global one (None: back to the global one).

    Args:
        provider: An ``opentelemetry.trace.TracerProvider``, or None.
    """
    global _provider, _cached
    _provider = provider
    _cached = None


@contextmanager
def conversation_context(conversation_id: str | None) -> Iterator[None]:
    """Label the runs, loads and dumps inside the block with a conversation ID (``snapcell.conversation_id``).

    The ID lives in a context variable, so it follows the current task and its children.

    Args:
        conversation_id: The conversation, or None to clear the label.
    """
    token = _conversation.set(conversation_id)
    try:
        yield
    finally:
        _conversation.reset(token)


def current_conversation() -> str | None:
    """The conversation ID set by the innermost `conversation_context`, if any."""
    return _conversation.get()


# ------------------------------------------------------------------ spans


class _Scope:
    """A span that is current while the block runs, then finished with its duration and error.

    Works without a span too (opentelemetry missing, DEBUG logging on): it then only times and logs.
    """

    __slots__ = ("_finish", "_log_level", "_token", "attributes", "name", "outcome", "span", "start")

    def __init__(self, span: Any, name: str, *, finish: bool = True, log_level: int = logging.DEBUG) -> None:
        self.span = span
        self.name = name
        self.start = time.perf_counter()
        self.attributes: Attributes = {}
        self.outcome: str | None = None
        self._finish = finish
        self._log_level = log_level
        self._token: Any = None

    @property
    def recording(self) -> bool:
        """True when attributes set on this scope go anywhere (a recording span, or the log)."""
        return (self.span is not None and self.span.is_recording()) or log.isEnabledFor(self._log_level)

    def set(self, attributes: Mapping[str, str | int | float | bool | None]) -> None:
        """Add attributes; None values are left out."""
        self.attributes.update({k: v for k, v in attributes.items() if v is not None})

    def __enter__(self) -> _Scope:
        if self.span is not None:
            from opentelemetry import context

            self._token = context.attach(_api.set_span_in_context(self.span))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            from opentelemetry import context

            context.detach(self._token)
            self._token = None
        if self._finish:
            self.finish(exc)

    def finish(self, exc: BaseException | None) -> None:
        """End the span: duration, error type, status; log one line."""
        self.attributes["snapcell.duration_s"] = round(time.perf_counter() - self.start, 6)
        if exc is not None:
            self.attributes["snapcell.error_type"] = type(exc).__name__
            if self.outcome is None and self.name == "snapcell.run":
                self.outcome = "worker_lost" if isinstance(exc, WorkerLost) else "error"
        if self.outcome is not None:
            self.attributes["snapcell.outcome"] = self.outcome
        span = self.span
        if span is not None and span.is_recording():
            span.set_attributes(self.attributes)
            if exc is not None:
                span.record_exception(exc)
            if exc is not None or self.outcome not in (None, "ok"):
                from opentelemetry.trace import Status, StatusCode

                error = self.attributes.get("snapcell.error_type", self.outcome)
                span.set_status(Status(StatusCode.ERROR, f"{self.outcome or 'error'}: {error}"))
        if span is not None:
            span.end()
        if log.isEnabledFor(self._log_level):
            details = " ".join(f"{k.removeprefix('snapcell.')}={v}" for k, v in sorted(self.attributes.items()))
            log.log(self._log_level, "snapcell: %s %s", self.name, details)


def _open(name: str, attributes: Attributes, *, log_level: int = logging.DEBUG) -> _Scope | None:
    """Start a scope, or None when neither a tracer nor the log would see it."""
    tracer = _tracer()
    if tracer is None and not log.isEnabledFor(log_level):
        return None
    span = tracer.start_span(name, attributes=attributes) if tracer is not None else None
    scope = _Scope(span, name, log_level=log_level)
    scope.attributes.update(attributes)
    return scope


def _conversation_attributes() -> Attributes:
    conversation = _conversation.get()
    return {"snapcell.conversation_id": conversation} if conversation else {}


def _utf8_len(text: object) -> int:
    return len(text.encode(errors="replace")) if isinstance(text, str) else 0


@contextmanager
def trace_turn(code: object) -> Iterator[None]:
    """Record a ``snapcell.turn`` span around one turn of a conversation, current while it runs.

    The turn's load, run and dump spans start inside it and so are its children. Enter it inside
    `conversation_context`, which names the conversation.
    """
    scope = _open("snapcell.turn", {"snapcell.code_bytes": _utf8_len(code), **_conversation_attributes()})
    if scope is None:
        yield
        return
    with scope:
        yield


def trace_run(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Record a ``snapcell.run`` span around a session's ``run(code, ...)`` (a decorator)."""

    @functools.wraps(method)
    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        code = args[0] if args else kwargs.get("code")
        scope = _open("snapcell.run", {"snapcell.code_bytes": _utf8_len(code), **_conversation_attributes()})
        if scope is None:
            return await method(self, *args, **kwargs)
        with scope:
            result = await method(self, *args, **kwargs)
            if scope.recording:
                _describe_run(scope, result)
        return result

    return run


def _describe_run(scope: _Scope, result: Any) -> None:
    error = getattr(result, "error", None)
    if error is None:
        scope.outcome = "ok"
    else:
        scope.outcome = "timeout" if isinstance(error, TimeLimitExceeded) else "error"
        scope.set({"snapcell.error_type": getattr(error, "exc_type", None) or type(error).__name__})
    memory = getattr(result, "memory_bytes", None)
    scope.set(
        {
            "snapcell.output_bytes": _utf8_len(getattr(result, "stdout", ""))
            + _utf8_len(getattr(result, "stderr", "")),
            "snapcell.host_call_count": len(getattr(result, "external_calls", ())),
            "snapcell.memory_bytes": memory if isinstance(memory, int) else None,
        }
    )


def trace_checkpoint(
    name: str,
) -> Callable[
    [Callable[Concatenate[S, P], Coroutine[Any, Any, R]]], Callable[Concatenate[S, P], Coroutine[Any, Any, R]]
]:
    """Record a ``snapcell.load`` or ``snapcell.dump`` span around a session method (a decorator factory).

    After the method, the session's ``checkpoint_bytes`` and ``manifest`` describe the checkpoint.
    """

    def decorate(
        method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
        @functools.wraps(method)
        async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            scope = _open(name, _conversation_attributes())
            if scope is None:
                return await method(self, *args, **kwargs)
            with scope:
                result = await method(self, *args, **kwargs)
                if scope.recording:
                    _describe_checkpoint(scope, self, dump=name.endswith("dump"))
            return result

        return wrapper

    return decorate


def _describe_checkpoint(scope: _Scope, session: Any, *, dump: bool) -> None:
    size = getattr(session, "checkpoint_bytes", None)
    manifest = getattr(session, "manifest", None)
    variables = getattr(manifest, "variables", None)
    dropped = getattr(manifest, "dropped", None)
    scope.set(
        {
            "snapcell.checkpoint_bytes": size,
            "snapcell.bytes_written": size if dump else None,
            "snapcell.variable_count": len(variables) if variables is not None else None,
            "snapcell.dropped_count": len(dropped) if dump and dropped is not None else None,
        }
    )


def note_checkpoint(body: bytes | bytearray | memoryview) -> None:
    """Add ``snapcell.buffer_count`` to the current span from a checkpoint body (only when it is recorded).

    Reads the section table without decompressing or unpickling anything; a malformed body is left to the
    loader to report.
    """
    api = _trace_api()
    if api is None:
        return
    span = api.get_current_span()
    if not span.is_recording():
        return
    from snapcell.checkpoint import SectionKind, parse_container

    try:
        sections = parse_container(body).sections
    except CheckpointError:
        return
    span.set_attribute("snapcell.buffer_count", sum(1 for s in sections if s.kind is SectionKind.BUFFER))


def trace_cleanup(func: Callable[P, R]) -> Callable[P, R]:
    """Record a ``snapcell.cleanup`` span around the cleanup job (a decorator)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        scope = _open("snapcell.cleanup", {}, log_level=logging.INFO)
        if scope is None:
            return func(*args, **kwargs)
        with scope:
            report = func(*args, **kwargs)
            scope.set(
                {
                    "snapcell.dry_run": getattr(report, "dry_run", None),
                    "snapcell.scanned_objects": getattr(report, "scanned_objects", None),
                    "snapcell.scanned_bytes": getattr(report, "scanned_bytes", None),
                    "snapcell.deleted_objects": _sum_of(report, "deleted_expired_objects", "deleted_quota_objects"),
                    "snapcell.deleted_bytes": _sum_of(report, "deleted_expired_bytes", "deleted_quota_bytes"),
                    "snapcell.over_quota": getattr(report, "over_quota", None),
                }
            )
        return report

    return wrapper


def _sum_of(report: object, *names: str) -> int | None:
    values = [getattr(report, name, None) for name in names]
    return sum(v for v in values if isinstance(v, int)) if any(isinstance(v, int) for v in values) else None


# ------------------------------------------------------------- host calls


def trace_host_function(name: str, func: F) -> F:
    """Wrap a host function so each call records a ``snapcell.host_call`` span (unchanged without a tracer).

    The span is current while the function runs, async functions included, so the function's own spans nest
    under it. None passes through.

    Args:
        name: The name the script calls the function by.
        func: The host function, sync or async, or None.
    """
    if func is None:
        return func
    tracer = _tracer()
    if tracer is None:
        return func
    attributes: Attributes = {"snapcell.function": name}

    if is_async_callable(func):

        @functools.wraps(func)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            with _Scope(tracer.start_span("snapcell.host_call", attributes=attributes), "snapcell.host_call"):
                return await func(*args, **kwargs)

        return call_async  # type: ignore[return-value]

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        scope = _Scope(
            tracer.start_span("snapcell.host_call", attributes=attributes), "snapcell.host_call", finish=False
        )
        done = False
        try:
            with scope:
                result = func(*args, **kwargs)
            done = True
        finally:
            if not done:
                scope.finish(sys.exc_info()[1])
        if inspect.isawaitable(result):
            return _finish_later(scope, result)
        scope.finish(None)
        return result

    return call  # type: ignore[return-value]


async def _finish_later(scope: _Scope, awaitable: Awaitable[Any]) -> Any:
    """Await a sync host function's awaitable result with its span current, then end the span."""
    done = False
    try:
        with scope:
            result = await awaitable
        done = True
    finally:
        scope.finish(None if done else sys.exc_info()[1])
    return result
