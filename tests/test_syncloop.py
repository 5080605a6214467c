"""The synchronous API's event loop treats Ctrl-C as `asyncio.Runner` does, without its per-call signal cost."""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
from collections.abc import Iterator

import pytest

from snapcell._support._syncloop import SyncLoop


@pytest.fixture(autouse=True)
def _ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt here, as in an interactive Python, however pytest was started.

    A shell starts a background job with SIGINT ignored: then no handler is installed (as `asyncio.Runner` does)
    and the interrupt these tests send themselves would be lost.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_soon() -> None:
    asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)


def test_ctrl_c_cancels_the_call_then_raises_keyboard_interrupt() -> None:
    loop = SyncLoop()
    cleaned: list[str] = []

    async def long_call() -> None:
        _interrupt_soon()
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append("finally ran")

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(long_call(), context=contextvars.copy_context())
        assert cleaned == ["finally ran"]  # cancelled, so the task's clean-up ran before the interrupt surfaced
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert loop.run(asyncio.sleep(0, "next call"), context=contextvars.copy_context()) == "next call"
    finally:
        loop.close()


def test_a_second_ctrl_c_raises_at_once() -> None:
    loop = SyncLoop()

    async def stubborn() -> None:
        _interrupt_soon()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _interrupt_soon()  # swallows the first: the second must still get out
            await asyncio.sleep(3600)

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(stubborn(), context=contextvars.copy_context())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        loop.close()


def test_a_handler_of_the_application_is_left_alone() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    loop = SyncLoop()

    async def call() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0)
        return "done"

    try:
        assert loop.run(call(), context=contextvars.copy_context()) == "done"
        assert seen == [signal.SIGINT]
    finally:
        loop.close()
        signal.signal(signal.SIGINT, previous)


def test_the_callers_context_goes_into_the_call() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    loop = SyncLoop()

    async def read() -> str:
        return var.get()

    try:
        assert loop.run(read(), context=contextvars.copy_context()) == "caller's"
    finally:
        loop.close()
