"""The steady-state round trip of a run and of a host call: the work each does, counted."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from snapcell import AsyncPool, Limits
from snapcell.backends import RunRequest


def double(x: int) -> int:
    return 2 * x


class _CountingSocket:
    """A channel socket that counts the reads made on it (a `socket.socket` takes no instance attributes)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.reads = 0
        self.failed_reads = 0

    def recv_into(self, target: Any, *args: Any) -> int:
        self.reads += 1
        try:
            return self._sock.recv_into(target, *args)
        except BlockingIOError:
            self.failed_reads += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_run_names_its_limits_only_when_they_differ_from_the_last_run_sent() -> None:
    """The same limits go to the worker once, not with every run, and the worker keeps running under them."""

    async def scenario() -> tuple[list[bool], list[str]]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            worker = session._backend.worker  # type: ignore[attr-defined]
            sent: list[bool] = []
            real = worker._send

            async def spy(message: dict[str, Any], *parts: Any) -> None:
                if message.get("op") == "run":
                    sent.append("limits" in message)
                await real(message, *parts)

            worker._send = spy
            code = "print('x' * 300)"
            outputs = []
            for limits in (None, None, Limits(max_output_bytes=100), Limits(max_output_bytes=100), None, None):
                result = await session.run(code, limits=limits)
                outputs.append(result.stdout)
            return sent, outputs

    sent, outputs = asyncio.run(scenario())
    assert sent == [True, False, True, False, True, False]
    full, capped = "x" * 300 + "\n", [len(out) for out in outputs[2:4]]
    assert outputs[:2] == [full, full] and outputs[4:] == [full, full]
    assert all(size < 300 for size in capped), capped  # the tighter limits applied to both runs, then no more


def test_the_hosts_request_task_is_woken_only_when_bytes_have_come() -> None:
    """Each wake-up of a waiting request brings bytes: a stale readiness report costs no task step and no read."""

    async def scenario() -> tuple[int, int, int]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            for _ in range(3):
                await session.feed_run("1 + 1")
            worker = session._backend.worker  # type: ignore[attr-defined]
            counting = _CountingSocket(worker._sock)
            worker._sock = counting
            waits = vain = 0
            real_wait = worker._wait_readable

            async def wait(sock: Any) -> None:
                nonlocal waits, vain
                before = worker._rend
                await real_wait(sock)
                waits += 1
                vain += worker._rend == before

            worker._wait_readable = wait
            try:
                for _ in range(10):
                    assert await session.feed_run("1 + 1") == 2
                assert await session.feed_run("sum(double(i) for i in range(20))", external_lookup={"double": double})
            finally:
                worker._sock = counting._sock
                del worker._wait_readable
            return waits, vain, counting.reads - counting.failed_reads

    waits, vain, reads = asyncio.run(scenario())
    # 31 frames from the worker (10 replies, 20 host calls and a reply), each read whole by one read.
    assert vain == 0 and waits <= 31 and reads <= 31, (waits, vain, reads)


def test_feed_run_takes_no_usage_reading_that_nobody_sees() -> None:
    """feed_run returns only the value: the worker's CPU time and peak memory are not read from /proc for it."""

    async def scenario() -> tuple[int, Any, Any]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("1")
            stat = session._backend.worker.stat  # type: ignore[attr-defined]
            readings = 0
            real_cpu, real_peak = stat.cpu_seconds, stat.peak_rss

            def count(real: Any) -> Any:
                def counted() -> Any:
                    nonlocal readings
                    readings += 1
                    return real()

                return counted

            stat.cpu_seconds, stat.peak_rss = count(real_cpu), count(real_peak)
            for _ in range(10):
                assert await session.feed_run("1 + 1") == 2
            fed = readings
            result = await session.run("x = list(range(10_000))")  # run() still measures: before, after, peak
            return fed, result.cpu_time_s, result.peak_memory_bytes

    fed, cpu, peak = asyncio.run(scenario())
    assert fed == 0
    assert cpu is not None and cpu >= 0 and peak is not None and peak > 0


def test_a_run_whose_caller_reads_only_its_value_is_not_summarized() -> None:
    """The worker summarizes the namespace (a walk of its variables) only for a caller that reads the summary."""

    async def scenario() -> tuple[str, str, str]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("rows = list(range(1000))\nname = 'x'")
            backend = session._backend  # type: ignore[attr-defined]
            plain = {"lookup": {}, "setup": False, "limits": Limits()}
            quiet = await backend.run(RunRequest(code="1 + 1", report=False, **plain))
            full = await backend.run(RunRequest(code="1 + 1", **plain))
            return quiet.namespace_summary, full.namespace_summary, (await session.run("2")).namespace_summary

    quiet, full, public = asyncio.run(scenario())
    assert quiet == "" and "2 variables" in full and "2 variables" in public, (quiet, full, public)


def test_a_run_whose_caller_reads_only_its_value_reads_neither_the_workers_memory_nor_its_out_directory() -> None:
    """For `feed_run` the worker skips its memory reading (a pread of /proc) and the walks of ``out/`` before and
    after the run: the value is all the caller reads. `run` still reports both."""

    async def scenario() -> tuple[Any, Any, Any]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            backend = session._backend  # type: ignore[attr-defined]
            plain = {"lookup": {}, "setup": False, "limits": Limits()}
            write = "from pathlib import Path\nPath('out').mkdir(exist_ok=True)\nPath('out/{}.txt').write_text('x')\n1"
            quiet = await backend.run(RunRequest(code=write.format("quiet"), report=False, **plain))
            full = await backend.run(RunRequest(code=write.format("full"), **plain))
            public = await session.run(write.format("public"))
            return quiet, full, public

    quiet, full, public = asyncio.run(scenario())
    assert quiet.value == 1 and quiet.memory_bytes is None and quiet.files == ()
    assert isinstance(full.memory_bytes, int) and [f.path for f in full.files] == ["out/full.txt"]
    assert isinstance(public.memory_bytes, int) and [f.path for f in public.files] == ["out/public.txt"]


def test_feed_run_inline_does_not_summarize_the_namespace_nor_read_the_cpu_clock(monkeypatch: Any) -> None:
    from snapcell import Pool
    from snapcell.interpreter import _runner

    summarized: list[int] = []
    real = _runner.summarize_namespace
    monkeypatch.setattr(_runner, "summarize_namespace", lambda ns: summarized.append(len(ns)) or real(ns))
    clock_reads: list[float] = []
    real_clock = _runner.time.process_time
    monkeypatch.setattr(_runner.time, "process_time", lambda: clock_reads.append(0.0) or real_clock())
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        for _ in range(5):
            session.feed_run("x = 1")
        fed, fed_clock = len(summarized), len(clock_reads)
        full = session.run("x")
        assert "1 variable" in full.namespace_summary and full.cpu_time_s is not None
    assert fed == 0 and fed_clock == 0 and len(summarized) == 1


def test_a_runs_reply_budgets_are_worked_out_once_per_limits(monkeypatch: Any) -> None:
    """The budgets of a run's frames (a lookup that hashes every field of the limits) are reused for equal limits."""
    from snapcell.backends import _process

    asked: list[tuple[str, Any]] = []
    real = _process.reply_budget

    def counted(kind: str, limits: Limits, *args: Any) -> Any:
        asked.append((kind, limits))
        return real(kind, limits, *args)

    monkeypatch.setattr(_process, "reply_budget", counted)

    async def scenario() -> tuple[int, int, bool]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("1")
            asked.clear()
            for _ in range(10):
                await session.feed_run("1 + 1")
            same = len(asked)
            tight = Limits(max_value_bytes=1024)
            result = await session.run("'x' * 5000", limits=tight)  # the worker keeps the value back: over budget
            return same, len(asked), result.value is None and result.value_repr is not None

    same, after, kept_back = asyncio.run(scenario())
    assert same == 0 and after == 2 and kept_back


def test_a_scalar_or_an_empty_container_becomes_plain_data_without_a_walk(monkeypatch: Any) -> None:
    """A host call's usual result (a number, text) and keyword arguments ({}) need no walk; the rest is walked."""
    import pytest

    from snapcell.wire import _plain

    walks: list[int] = []
    real = _plain.value_kinds
    monkeypatch.setattr(_plain, "value_kinds", lambda: walks.append(1) or real())
    for value in (3, 2.5, "text", None, True, {}, []):
        assert _plain.to_plain(value) == value and type(_plain.to_plain(value)) is type(value)
    assert walks == []
    assert _plain.to_plain([1, {"a": b"x"}]) == [1, {"a": b"x"}] and walks
    with pytest.raises(_plain.NotPlainData):
        _plain.to_plain(2**20_000)  # still refused: too large
    with pytest.raises(_plain.NotPlainData):
        _plain.to_plain(1, max_items=0)


def test_a_runs_reply_leaves_out_its_empty_fields_and_the_result_still_has_them() -> None:
    async def scenario() -> tuple[set[str], Any, set[str], Any]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            worker = session._backend.worker  # type: ignore[attr-defined]
            replies: list[dict[str, Any]] = []
            real = worker._receive

            async def spy(budget: Any) -> Any:
                got = await real(budget)
                replies.append(got[0])
                return got

            worker._receive = spy
            quiet = await session.run("1 + 1")
            noisy = await session.run("print('out')\nx = 1\n''")
            return set(replies[0]), quiet, set(replies[1]), noisy

    quiet_keys, quiet, noisy_keys, noisy = asyncio.run(scenario())
    assert quiet_keys == {"op", "value", "value_repr", "duration_s", "memory_bytes"}, quiet_keys  # nothing else
    assert (quiet.value, quiet.stdout, quiet.stderr, quiet.notes, quiet.error, quiet.assigned) == (
        2,
        "",
        "",
        (),
        None,
        (),
    )
    assert {"stdout", "assigned", "value_repr"} <= noisy_keys and "stderr" not in noisy_keys
    assert (noisy.stdout, noisy.stderr, noisy.assigned, noisy.value, noisy.value_repr) == (
        "out\n",
        "",
        ("x",),
        "",
        "''",
    )


def test_a_frame_the_socket_takes_whole_is_sent_without_the_send_lock() -> None:
    """The send lock keeps concurrent frames apart; a frame sent whole while nobody holds it needs none."""

    async def later(x: int) -> int:
        await asyncio.sleep(0.001)
        return x

    async def scenario() -> tuple[int, Any, Any]:
        async with AsyncPool("memory://", isolation="process") as pool, pool.checkout() as session:
            await session.feed_run("1")
            worker = session._backend.worker  # type: ignore[attr-defined]
            taken = 0
            real = worker._send_lock.acquire

            async def counted() -> bool:
                nonlocal taken
                taken += 1
                return bool(await real())

            worker._send_lock.acquire = counted
            for _ in range(5):
                await session.feed_run("1 + 1")
            total = await session.feed_run("sum(double(i) for i in range(20))", external_lookup={"double": double})
            gathered = await session.feed_run(
                "import asyncio\nsum(await asyncio.gather(*(later(i) for i in range(30))))",
                external_lookup={"later": later},
            )
            return taken, total, gathered

    taken, total, gathered = asyncio.run(scenario())
    assert total == 380 and gathered == 435  # concurrent results still arrive whole, each to its call
    assert taken == 0, taken


def test_binding_host_functions_does_not_walk_the_namespace_on_every_run() -> None:
    """Each run binds its host functions and unbinds the last run's others: the work is theirs, not every variable's."""
    from snapcell import Pool

    looked_at = 0

    class Probe:
        @property  # type: ignore[misc]
        def __class__(self) -> type:  # isinstance() looks here when the type does not match
            nonlocal looked_at
            looked_at += 1
            return Probe

    def ping() -> int:
        return 1

    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        namespace = session._inner._backend.runner.namespace  # type: ignore[attr-defined]
        namespace.update({f"p{i}": Probe() for i in range(200)})
        session.feed_run("1", external_lookup={"ping": ping})  # the first bind in this namespace walks it once
        walked = looked_at
        for _ in range(5):
            assert session.feed_run("ping()", external_lookup={"ping": ping}) == 1
        assert session.feed_run("'ping' in dir()", external_lookup={}) is False  # the last run's binding is gone
        later = looked_at - walked
    assert walked >= 200 and later == 0, (walked, later)
