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
from snapcell.wire import JSON_SCALARS, NotPlainData, to_plain, type_name

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
    value = _plain_friendly(value)
    try:
        reply["value"] = to_plain(value)
    except NotPlainData as exc:
        text = _refusal(name, value, exc)
        log.error("snapcell: %s; this is a bug in the application", text)
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


_PLAIN_DATA = "None, bools, numbers, strings, bytes, lists, tuples, dicts with str keys, dates, times, Decimals"


def _refusal(name: str, value: Any, exc: NotPlainData) -> str:
    """Why the value a host function returned cannot be sent to the script: the function, the type in the way, and
    what to return instead."""
    kind = exc.kind
    if kind is None:  # too large or too deep: the type is not the trouble
        return f"{name}() returned data that cannot be sent to the script: {exc}"
    label = type_name(kind)
    where = "" if type(value) is kind else "data holding "
    article = "an" if label[:1].lower() in "aeiou" else "a"
    # A dataclass is refused, not turned into a dict: the script would see a dict where the function's signature
    # promises attributes (``order.total``), and inline mode hands over the dataclass itself.
    if dataclasses.is_dataclass(kind):
        hint = "; return dataclasses.asdict(...) to send its fields as a dict"
        label += " (a dataclass)"
    elif callable(getattr(kind, "model_dump", None)):
        hint = "; call .model_dump() on it to send its fields as a dict"
        label += " (a pydantic model)"
    else:
        hint = ""
    return (
        f"{name}() returned {where}{article} {label}, which cannot be sent to the script: a host function returns "
        f"plain data ({_PLAIN_DATA}){hint}"
    )


def _plain_friendly(value: Any) -> Any:
    """Turn pydantic models (the result itself, or the items of a list or tuple result) into their fields' dicts."""
    if type(value) in JSON_SCALARS:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="python")
    if isinstance(value, list | tuple):
        return type(value)(_plain_friendly(v) for v in value) if type(value) in (list, tuple) else value
    return value
