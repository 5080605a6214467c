"""The host's side of a run's host-function calls: call the function, turn its value into plain data, record it.

An async function is called as soon as its call frame is read, in the request's own task, and what is left to
await is finished in a task of its own, so gathered calls overlap. A sync function runs in a thread (at most
`MAX_HOST_THREADS` at once in a process; more wait for one), as agent frameworks run sync tools: one that blocks
(a database query, an HTTP call) holds up its own run, never the event loop every other conversation shares. It
runs in a copy of the caller's context (`contextvars`). A run cancelled meanwhile stops waiting for it, but a
thread cannot be stopped: the function runs to its end and its result is dropped.

The hop to the thread and back is as light as the event loop allows, because each step costs a hand-off of the GIL
between the loop's thread and the function's: the thread is given the call itself (no executor future, no task
waiting on one), and once the function returns, the same thread settles the call and hands the reply to the
caller's ``answer`` (`ThreadedCall`), which sends it to the worker from that thread when nothing else is being sent.
The event loop then turns at most twice per call (the call's frame read, and the request's step that hands it
over).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from snapcell._support import is_async_callable
from snapcell.interpreter import PAUSE_ERROR, HostCall, PauseRequested
from snapcell.telemetry import trace_host_function
from snapcell.wire import JSON_SCALARS, NotPlainData, to_plain, type_name

__all__ = ["MAX_HOST_THREADS", "Answer", "PendingCall", "ThreadedCall", "answer_threaded", "call_host", "finish_call"]

log = logging.getLogger("snapcell")

# Sync host functions running at once in this process; more calls wait for a thread.
MAX_HOST_THREADS = 32


class _Threads:
    """At most ``limit`` threads running jobs from one queue; a job starts at once while a thread is idle or may
    be started, and waits for one otherwise.

    Lighter than `concurrent.futures.ThreadPoolExecutor` (no future per job, no semaphore to release after it): the
    fewer Python steps a thread takes around a job, the fewer times it holds the GIL the event loop waits for.
    Threads are started as needed and wait for jobs for the process's life; at the interpreter's exit, as an
    executor's threads do, they end once the jobs given them are done (a host function still running is waited for).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Threads waiting for a job and not yet promised one; threads started; jobs queued with no thread promised.
        self._idle = self._started = self._backlog = 0
        self._exiting = False
        self._running: list[threading.Thread] = []

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in a thread (it must not raise).

        Raises:
            RuntimeError: The interpreter is exiting.
        """
        with self._lock:
            if self._exiting:
                raise RuntimeError("cannot call a sync host function after the interpreter's shutdown began")
            if self._idle:
                self._idle -= 1
            elif self._started < self._limit:
                if not self._started:
                    # The hook `concurrent.futures` uses: it runs before the interpreter joins its threads.
                    threading._register_atexit(self._exit)  # type: ignore[attr-defined]
                self._started += 1
                thread = threading.Thread(target=self._serve, name=f"snapcell-host-function-{self._started}")
                thread.start()
                self._running.append(thread)
            else:
                self._backlog += 1
        self._jobs.put(job)

    def _exit(self) -> None:
        """End every thread once the jobs given to it are done (at the interpreter's exit)."""
        self.shutdown(wait=False)

    def shutdown(self, *, wait: bool = True) -> None:
        """Take no more jobs; end every thread once the jobs given to it are done (``wait``: wait for that)."""
        with self._lock:
            first = not self._exiting
            self._exiting = True
            running = list(self._running)
        if first:
            for _ in running:
                self._jobs.put(None)
        if wait:
            for thread in running:
                thread.join()

    def _serve(self) -> None:
        get, lock = self._jobs.get, self._lock
        while True:
            job = get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a bug in snapcell's answer: logged, and the thread stays for the next call
                log.exception("snapcell: answering a host-function call failed")
            del job  # nothing of a call outlives it while the thread waits
            with lock:
                if self._backlog:  # a queued job is this thread's
                    self._backlog -= 1
                else:
                    self._idle += 1


_threads: _Threads | None = None
_threads_lock = threading.Lock()


def _host_threads() -> _Threads:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = _Threads(MAX_HOST_THREADS)
        return _threads


@dataclasses.dataclass(slots=True)
class ThreadedCall:
    """A sync function's call handed to a thread: what `answer_threaded` settles once the function is done."""

    reply: dict[str, Any]
    name: str
    start: float


# Given to `Answer` when the function ended with a BaseException: the script gets an error, the exception goes on.
_NO_RETURN = RuntimeError("the host function did not return")

# Called in the function's thread once it is done: the call, the function's value, its exception (None: returned).
Answer = Callable[[ThreadedCall, Any, "Exception | None"], None]


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
    answer: Answer | None = None,
) -> dict[str, Any] | PendingCall | ThreadedCall:
    """Call the host function a (checked) call frame names: the ``result`` reply, or what is left to await.

    A failure of the function, or a value that is not plain data, becomes an error in the reply (for the script,
    which may catch it); it is logged for the application.

    Args:
        message: The call frame.
        lookup: The run's host functions.
        calls: Where the call is recorded (for a sync function given ``answer``: by ``answer``).
        traced: The run's host functions as wrapped for tracing so far, by name (each call still gets its span).
        answer: For a sync function: a `ThreadedCall` is returned at once, and ``answer`` is called in the
            function's thread once it is done. Without it, a sync function's call is a `PendingCall`.
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
            threaded = ThreadedCall(reply, name, start)
            if answer is not None:
                _host_threads().submit(functools.partial(_in_thread, call, answer, threaded))
                return threaded
            loop = asyncio.get_running_loop()
            future: asyncio.Future[Any] = loop.create_future()
            _host_threads().submit(
                functools.partial(_in_thread, call, functools.partial(_to_loop, loop, future), threaded)
            )
            return PendingCall(reply, name, start, future)
        value = func(*args, **kwargs)
    except Exception as exc:  # a host function's failure goes to the script, which may catch it
        _failed(reply, name, start, calls, exc, logged=func is not None)
        return reply
    if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
        return PendingCall(reply, name, start, value)
    _settle(reply, name, start, calls, value)
    return reply


def _in_thread(call: Callable[[], Any], answer: Answer, threaded: ThreadedCall) -> None:
    """Run a sync host function (in a host thread) and give its outcome to ``answer``."""
    value: Any = None
    failure: Exception | None = _NO_RETURN  # stays so only if the function ended with a BaseException
    try:
        value = call()
        failure = None
    except Exception as exc:  # a host function's failure goes to the script, which may catch it
        failure = exc
    finally:
        answer(threaded, value, failure)


def _to_loop(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], _: ThreadedCall, value: Any, failure: Exception | None
) -> None:
    """An `Answer` that settles ``future`` in ``loop`` (with the value, or the exception)."""
    try:
        loop.call_soon_threadsafe(_resolve, future, value, failure)
    except RuntimeError:  # the loop is closed: nobody waits for the answer any more
        pass


def _resolve(future: asyncio.Future[Any], value: Any, failure: Exception | None) -> None:
    if future.done():  # the run stopped waiting
        return
    if failure is not None:
        future.set_exception(failure)
    else:
        future.set_result(value)


def answer_threaded(
    threaded: ThreadedCall, value: Any, failure: Exception | None
) -> tuple[dict[str, Any] | PendingCall, list[HostCall]]:
    """Settle a sync function's call from its outcome (in any thread): the ``result`` reply, or what is left to
    await (the function returned an awaitable), and the call's record (none yet for what is left to await)."""
    records: list[HostCall] = []
    if failure is not None:
        _failed(threaded.reply, threaded.name, threaded.start, records, failure, logged=True)
        return threaded.reply, records
    if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
        return PendingCall(threaded.reply, threaded.name, threaded.start, value), records
    _settle(threaded.reply, threaded.name, threaded.start, records, value)
    return threaded.reply, records


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
