"""A run that asks for its dump (``then_dump``): one request, two replies, and nothing else changes."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import Limits, Policy, Pool
from snapcell.backends._process import WorkerProcess
from snapcell.errors import UnpicklableValue
from snapcell.interpreter._runner import Runner
from snapcell.wire._wire import FRAME, decode, encode, to_plain
from snapcell.worker._worker import Worker
from snapcell.worker._workerchannel import Channel


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The op of every request the host sends to a worker, in order (a follow-on is not sent)."""
    ops: list[str] = []
    send = WorkerProcess._send

    async def counted(self: WorkerProcess, message: dict[str, Any], *parts: Any) -> None:
        ops.append(str(message.get("op")) + ("+" + str(message["then"].get("op")) if "then" in message else ""))
        await send(self, message, *parts)

    monkeypatch.setattr(WorkerProcess, "_send", counted)
    return ops


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="process") as opened:
        yield opened


def test_the_dump_asked_for_with_the_run_needs_no_request_of_its_own(pool: Pool, sent: list[str]) -> None:
    with pool.checkout() as session:
        result = session.run("x = [1, 2]\nlen(x)", then_dump=True)
        checkpoint = session.dump()
    assert result.value == 2
    assert sent.count("run+dump") == 1 and "dump" not in sent
    with pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("x") == [1, 2]
        assert session.dump() != checkpoint


def test_a_script_error_still_dumps_what_the_run_left(pool: Pool, sent: list[str]) -> None:
    with pool.checkout() as session:
        result = session.run("y = 3\n1 / 0", then_dump=True)
        checkpoint = session.dump()
    assert result.error is not None and "dump" not in sent
    with pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("y") == 3


def test_a_dump_nobody_took_is_read_and_dropped_before_the_next_request(pool: Pool, sent: list[str]) -> None:
    with pool.checkout() as session:
        session.run("a = 1", then_dump=True)
        assert session.feed_run("a + 1") == 2  # the worker's dump reply is not taken for this run's
        session.run("b = 2", then_dump=True)
        session.load_session(first := _dumped(pool, "c = 5"))
        assert session.feed_run("c") == 5
        assert session.checkpoint_id == first
        second = session.dump()  # asked for now: the one under way went with the load
    assert sent.count("dump") >= 1
    with pool.checkout() as session:
        session.load_session(second)
        assert session.feed_run("sorted(k for k in ('a', 'b', 'c') if k in globals())") == ["c"]


def test_a_dump_that_must_fail_on_an_unpicklable_value_is_asked_for_again(pool: Pool, sent: list[str]) -> None:
    with pool.checkout() as session:
        session.run("gen = (i for i in range(3))\nz = 1", then_dump=True)
        with pytest.raises(UnpicklableValue):
            session.dump(on_unpicklable="fail")  # the dump under way skips; this one was asked to fail
        assert session.feed_run("z") == 1
    assert "dump" in sent


def test_a_session_checked_in_with_its_dump_under_way_gives_no_worker_a_stray_reply(pool: Pool) -> None:
    for _ in range(3):
        with pool.checkout() as session:
            session.run("big = 'x' * 100_000", then_dump=True)
    with pool.checkout() as session:
        assert session.feed_run("1 + 1") == 2
        assert session.feed_run("'big' in globals()") is False


def _dumped(pool: Pool, code: str) -> bytes:
    with pool.checkout() as session:
        session.feed_run(code)
        return session.dump()


def _served(requests: list[dict[str, Any]]) -> list[str]:
    """Serve ``requests`` (then a close) with a worker in this process; the op of every reply frame it sent."""
    host, child = socket.socketpair()
    previous = signal.getsignal(signal.SIGUSR1)
    served = Worker(Channel(child), Runner(policy=Policy(), limits=Limits()))
    try:
        for message in [*requests, {"op": "close"}]:
            payload = encode(message)
            host.sendall(FRAME.pack(len(payload), 0) + payload)
        served.serve()
        child.close()
        data, ops = b"", []
        while chunk := host.recv(1 << 20):
            data += chunk
        while data:
            size, blob_size = FRAME.unpack_from(data)
            ops.append(str(decode(data[FRAME.size : FRAME.size + size])["op"]))
            data = data[FRAME.size + size + blob_size :]
        return ops
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if "loop" in vars(served):
            served.loop.close()
            asyncio.set_event_loop(None)
        host.close()
        child.close()


_DUMP = {"op": "dump", "created_at": 0.0, "level": 1, "on_unpicklable": "skip", "known_blobs": []}


def test_the_worker_serves_a_follow_on_right_after_its_request_and_only_after_one_that_succeeded() -> None:
    limits = to_plain(dataclasses.asdict(Limits()))
    run = {"op": "run", "code": "x = 1\nx", "host": {}, "setup": False, "limits": limits}
    assert _served([{**run, "then": _DUMP}, _DUMP]) == ["ran", "dumped", "dumped", "closed"]
    # A request answered with an error (here a load whose parts do not add up) ends the chain.
    bad_load = {"op": "load", "parts": [5, 5], "blobs": [], "then": run}
    assert _served([bad_load]) == ["error", "closed"]
