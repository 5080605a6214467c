"""The host's side of a run's host-function calls: call the function, turn its value into plain data, record it.

An async function is called as soon as its call frame is read, in the request's own task, and what is left to
await is finished in a task of its own, so gathered calls overlap. A sync function runs in a thread (at most
`MAX_HOST_THREADS` at once in a process; more wait for one), as agent frameworks run sync tools: one that blocks
(a database query, an HTTP call) holds up its own run, never the event loop every other conversation shares. It
runs in a copy of the caller's context (`contextvars`). A run cancelled meanwhile stops waiting for it, but a
thread cannot be stopped: the function runs to its end and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from snapcell._support import is_async_callable
from snapcell.interpreter import PAUSE_ERROR, HostCall, PauseRequested
from snapcell.telemetry import trace_host_function
from snapcell.wire import JSON_SCALARS, NotPlainData, to_plain

__all__ = ["MAX_HOST_THREADS", "PendingCall", "call_host", "finish_call"]

log = logging.getLogger("snapcell")

# Sync host functions running at once in this process; more calls wait for a thread.
MAX_HOST_THREADS = 32
_threads: ThreadPoolExecutor | None = None
_threads_lock = threading.Lock()


def _host_threads() -> ThreadPoolExecutor:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(MAX_HOST_THREADS, thread_name_prefix="snapcell-host-function")
        return _threads


@dataclasses.dataclass(slots=True)
class PendingCall:
    """A call whose function returned an awaitable: the reply to fill once it is awaited."""

    reply: dict[str, Any]
    name: str
    start: float
    awaitable: Awaitable[Any]


def call_host(
    message: dict[str, Any],
    lookup: Mapping[str, Callable[..., Any]],
    calls: list[HostCall] | None,
    traced: dict[str, Callable[..., Any] | None] | None = None,
) -> dict[str, Any] | PendingCall:
    """Call the host function a (checked) call frame names: the ``result`` reply, or what is left to await.

    A failure of the function, or a value that is not plain data, becomes an error in the reply (for the script,
    which may catch it); it is logged for the application.

    Args:
        message: The call frame.
        lookup: The run's host functions.
        calls: Where the call is recorded.
        traced: The run's host functions as wrapped for tracing so far, by name (each call still gets its span).
    """
    name = str(message.get("name"))
    if traced is None:
        func = trace_host_function(name, lookup.get(name))
    elif name in traced:
        func = traced[name]
    else:
        func = traced[name] = trace_host_function(name, lookup.get(name))
    start = time.perf_counter()
    reply: dict[str, Any] = {"op": "result", "id": message.get("id")}
    try:
        if func is None:
            raise NameError(f"host function {name[:100]!r} is not available in this run")
        args, kwargs = message.get("args") or [], message.get("kwargs") or {}
        kwargs = {str(k): v for k, v in kwargs.items()}
        if not is_async_callable(func):
            call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
            return PendingCall(reply, name, start, asyncio.get_running_loop().run_in_executor(_host_threads(), call))
        value = func(*args, **kwargs)
    except Exception as exc:  # a host function's failure goes to the script, which may catch it
        _failed(reply, name, start, calls, exc, logged=func is not None)
        return reply
    if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
        return PendingCall(reply, name, start, value)
    _settle(reply, name, start, calls, value)
    return reply


async def finish_call(pending: PendingCall, calls: list[HostCall] | None) -> dict[str, Any]:
    """Await what a host function returned: the ``result`` reply."""
    try:
        value = await pending.awaitable
        if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
            value = await value  # a sync function that returned a coroutine (a lambda around an async call)
    except Exception as exc:  # a host function's failure goes to the script, which may catch it
        _failed(pending.reply, pending.name, pending.start, calls, exc, logged=True)
        return pending.reply
    _settle(pending.reply, pending.name, pending.start, calls, value)
    return pending.reply


def _settle(reply: dict[str, Any], name: str, start: float, calls: list[HostCall] | None, value: Any) -> None:
    try:
        reply["value"] = to_plain(_plain_friendly(value))
    except NotPlainData as exc:
        log.error(
            "snapcell: the host function %s returned data that cannot be sent to the script (%s); this is a bug "
            "in the application: return plain data (numbers, strings, bytes, lists, dicts, dates, Decimals)",
            name,
            exc,
        )
        text = f"{name}() returned data that cannot be sent: {exc}"
        reply["error"] = {"type": "TypeError", "message": text}
        if calls is not None:
            calls.append(HostCall(name, time.perf_counter() - start, f"TypeError: {text}"))
        return
    if calls is not None:
        calls.append(HostCall(name, time.perf_counter() - start))


def _failed(
    reply: dict[str, Any], name: str, start: float, calls: list[HostCall] | None, exc: Exception, *, logged: bool
) -> None:
    if isinstance(exc, PauseRequested):  # not a failure: the worker stops its script here
        reply["error"] = {"type": PAUSE_ERROR, "message": name}
        return
    if logged:  # no function of that name is the script's mistake, not the application's
        log.warning("snapcell: the host function %s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
    reply["error"] = {"type": type(exc).__name__, "message": str(exc)[:10_000]}
    if calls is not None:
        calls.append(HostCall(name, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"))


def _plain_friendly(value: Any) -> Any:
    """Turn common host return types (pydantic models, dataclasses) into plain data."""
    if type(value) in JSON_SCALARS:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="python")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return type(value)(_plain_friendly(v) for v in value) if type(value) in (list, tuple) else value
    return value
