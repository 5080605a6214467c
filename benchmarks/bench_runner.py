"""What does a session cost per operation in process mode, inline mode and pydantic-monty?

Side by side in one event loop, alternating every repetition, with the same scripts and host functions:

- ``checkout``: entering ``pool.checkout()`` with a warm worker ready; ``checkin``: leaving it;
  ``checkout_back_to_back``: a checkout right after a checkin, when the pool may still be replacing the worker.
- ``run_1+1``: ``feed_run("1+1")`` in an open session (mean of ``CALLS`` calls per repetition): a process-mode
  session's first runs are a young worker's, the first of them on caches gone cold while it waited in the pool;
  ``run_1+1_steady``: the mean of the next ``STEADY_CALLS`` calls in that session, a worker that has served some.
- ``host_sync`` / ``host_async``: ``feed_run`` of one call to a sync / async host function.
- ``host_call_each``: a script making ``HOST_CALLS`` sequential host calls, minus ``run_1+1_steady``, per call: the
  round trip alone.
- ``full_turn``: checkout, load the previous state, run a small script, dump, check in. snapcell signs and
  stores its checkpoint in a memory store; monty keeps its dump bytes in the host (no signing, no store).
- ``cold_start``: a new pool to the first result of ``feed_run("1+1")``, then closing it, with no other pool open;
  ``cold_start_2nd_pool``: the same while another pool of the method is open (snapcell's pools share its zygote).
- Memory: resident memory of a fresh host process with one session open, and of its worker, measured in a
  child process per method (RSS from ``/proc``; snapcell's worker reports its own in ``RunResult.memory_bytes``).

``plain exec`` (``exec`` of the compiled code, direct host call) is the in-process floor for ``run_1+1`` and
``host_sync``. ``floor: round trip`` is the cross-process one: a frame the size of a run request sent from this
event loop to a child interpreter that only echoes it (``run_1+1`` a mean of ``CALLS``, ``run_1+1_steady`` of
``STEADY_CALLS``, ``host_call_each`` of ``HOST_CALLS`` round trips): what any design with an asyncio host and a
separate Python process pays before it does any work. ``floor: JSON in Python`` adds the least a worker written in
Python does: a JSON frame each way, the host answering a call in the loop's readiness callback, nothing checked.
Each target's verdict also says how far those floors already are from monty.

Ratios are to ``snapcell process``, the default (x < 1: faster than it). Targets, as ratios to monty in
the same run: process-mode ``run_1+1_steady``, ``host_sync``, ``host_async`` and ``host_call_each`` at most 1.5x
monty's, ``run_1+1`` (a new session's first ten) at most 2x; ``cold_start`` at most 50 ms. Each verdict is printed
with the floors beside it, and written as a ``verdict`` line that ``python -m benchmarks`` prints after its table.

Run from the repository root: ``python -m benchmarks.bench_runner [--quick]``; JSON lines go to
``benchmarks/results/runner.jsonl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from benchmarks._common import (
    alternate_async,
    echo_process,
    metric_fields,
    parse_args,
    print_table,
    python_child,
    ratio,
    summarize_ms,
    wait_warm,
    write_jsonl,
)
from snapcell import AsyncPool

try:
    import pydantic_monty
except ImportError:  # the bench extra is optional; monty rows are left out
    pydantic_monty = None  # type: ignore[assignment]

REPS = 15
QUICK_REPS = 7
WARMUP = 2
CALLS = 10  # feed_run calls averaged per repetition for the per-run metrics
STEADY_CALLS = 100  # the calls after those, for run_1+1_steady
HOST_CALLS = 20  # sequential host calls in one script for host_call_each
COLD_REPS = 3
QUICK_COLD_REPS = 2
BASELINE = "snapcell process"
SETUP_CODE = 'rows = [{"id": i, "name": f"row-{i}", "v": i * 0.5} for i in range(100)]\nturns = 0\n'
TURN_CODE = 'turns += 1\ntotal = sum(r["v"] for r in rows)\n[turns, total]'
HOST_LOOP = f"total = 0\nfor i in range({HOST_CALLS}):\n    total += f(i)\ntotal"
# These process-mode medians at most this many times monty's in the same run (a new session's first ten runs get
# more room: its worker is young); and the cold start at most COLD_START_MS.
TARGETS = {"run_1+1": 2.0, "run_1+1_steady": 1.5, "host_sync": 1.5, "host_async": 1.5, "host_call_each": 1.5}
COLD_START_MS = 50.0
METRICS = (
    "checkout",
    "checkin",
    "checkout_back_to_back",
    "run_1+1",
    "run_1+1_steady",
    "host_sync",
    "host_async",
    "host_call_each",
    "full_turn",
    "cold_start",
    "cold_start_2nd_pool",
)


def f(x: int) -> int:
    return x + 1


async def g(x: int) -> int:
    return x + 1


LOOKUP: dict[str, Callable[..., Any]] = {"f": f, "g": g}
FLOOR = "floor: round trip"
FRAME_BYTES = 96  # about a run request's frame for "1+1", and a host call's
JSON_FLOOR = "floor: JSON in Python"
JSON_FRAME = struct.Struct("!I")
# The least a worker written in Python does for a run or a host call: length-prefixed JSON frames, nothing checked.
# Each {"calls": N} frame is answered with N call frames, each waiting for its result, then {"op": "ran"}.
JSON_CALLER = """
import json, socket, struct, sys
FRAME = struct.Struct("!I")
sock = socket.socket(fileno=int(sys.argv[1]))
buffer = bytearray()

def receive():
    while True:
        if len(buffer) >= FRAME.size:
            (size,) = FRAME.unpack_from(buffer)
            if len(buffer) >= FRAME.size + size:
                message = json.loads(buffer[FRAME.size : FRAME.size + size])
                del buffer[: FRAME.size + size]
                return message
        data = sock.recv(65536)
        if not data:
            raise SystemExit(0)
        buffer.extend(data)

def send(message):
    payload = json.dumps(message).encode()
    sock.sendall(FRAME.pack(len(payload)) + payload)

while True:
    request = receive()
    for i in range(request["calls"]):
        send({"op": "call", "id": i, "name": "f", "args": [i], "kwargs": {}})
        receive()
    send({"op": "ran", "value": 2})
"""


class Method:
    """One runner behind a common interface: its pools have ``checkout()``, its sessions feed_run/dump/load."""

    def __init__(self, name: str, make_pool: Callable[[], Any]) -> None:
        self.name = name
        self.make_pool = make_pool
        self.pool: Any = None
        self.state: Any = None  # the previous turn's checkpoint: an ID (snapcell) or dump bytes (monty)
        self.session: Any = None

    async def open(self) -> None:
        self.pool = self.make_pool()
        await self.pool.__aenter__()
        async with self.pool.checkout() as session:
            await session.feed_run(SETUP_CODE)
            self.state = await session.dump()

    async def close(self) -> None:
        await self.pool.__aexit__(None, None, None)

    async def wait_warm(self) -> None:
        await wait_warm(self.pool)

    async def each(self, code: str, calls: int, lookup: dict[str, Callable[..., Any]] | None = None) -> float:
        """Mean seconds of ``feed_run(code)`` over ``calls`` calls in the entered session."""
        start = time.perf_counter()
        for _ in range(calls):
            await self.session.feed_run(code, external_lookup=lookup)
        return (time.perf_counter() - start) / calls

    async def trial(self) -> dict[str, float]:
        await self.wait_warm()
        manager: AbstractAsyncContextManager[Any] = self.pool.checkout()
        start = time.perf_counter()
        self.session = await manager.__aenter__()
        out = {"checkout": time.perf_counter() - start}
        try:
            out["run_1+1"] = await self.each("1+1", CALLS)
            out["run_1+1_steady"] = await self.each("1+1", STEADY_CALLS)
            out["host_sync"] = await self.each("f(1)", CALLS, LOOKUP)
            out["host_async"] = await self.each("await g(1)", CALLS, LOOKUP)
            loop_s = await self.each(HOST_LOOP, 1, LOOKUP)
            out["host_call_each"] = max(loop_s - out["run_1+1_steady"], 0.0) / HOST_CALLS
        finally:
            start = time.perf_counter()
            await manager.__aexit__(None, None, None)
            out["checkin"] = time.perf_counter() - start
        start = time.perf_counter()
        async with self.pool.checkout():
            out["checkout_back_to_back"] = time.perf_counter() - start
        await self.wait_warm()
        start = time.perf_counter()
        async with self.pool.checkout() as session:
            await session.load_session(self.state)
            await session.feed_run(TURN_CODE)
            self.state = await session.dump()
        out["full_turn"] = time.perf_counter() - start
        return out

    async def cold_start(self) -> dict[str, float]:
        start = time.perf_counter()
        pool = self.make_pool()
        await pool.__aenter__()
        try:
            async with pool.checkout() as session:
                await session.feed_run("1+1")
                first = time.perf_counter() - start
        finally:
            await pool.__aexit__(None, None, None)
        return {"cold_start": first}


class PlainExec:
    """The floor: ``exec`` of compiled code and a direct host call, no session at all."""

    name = "plain exec"

    def __init__(self) -> None:
        self.code = compile("1+1", "<bench>", "exec")
        self.call = compile("f(1)", "<bench>", "exec")

    async def trial(self) -> dict[str, float]:
        out = {}
        for metric, code in (("run_1+1", self.code), ("host_sync", self.call)):
            start = time.perf_counter()
            for _ in range(CALLS):
                exec(code, {"f": f})
            out[metric] = (time.perf_counter() - start) / CALLS
        return out


class RoundTripFloor:
    """The cross-process floor: a frame to a child that only echoes it, and back, awaited in this event loop.

    The host end waits as snapcell's does, with the socket registered once and a future per wait, so the figure is
    what an asyncio host pays for two wake-ups and two context switches, with no decoding or checking at all.
    """

    name = FLOOR

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.waiter: asyncio.Future[None] | None = None
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())

    def _readable(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def round_trip(self, frame: bytes) -> bytes:
        """Send ``frame`` (at most a socket buffer's worth) and return what comes back, once as long as it."""
        self.sock.send(frame)
        back = b""
        while len(back) < len(frame):
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter
                continue
            if not data:
                raise ConnectionResetError("the echo child closed its socket")
            back += data
        return back

    async def each(self, count: int) -> float:
        """Mean seconds of ``count`` round trips."""
        frame = b"x" * FRAME_BYTES
        start = time.perf_counter()
        for _ in range(count):
            await self.round_trip(frame)
        return (time.perf_counter() - start) / count

    async def trial(self) -> dict[str, float]:
        return {
            "run_1+1": await self.each(CALLS),
            "run_1+1_steady": await self.each(STEADY_CALLS),
            "host_call_each": await self.each(HOST_CALLS),
        }


class JsonFloor:
    """A worker reduced to what Python must do on each end: JSON frames, no checks, the host's answers given in the
    event loop's readiness callback (no task, no future per call). ``run_1+1`` and ``run_1+1_steady``: a request
    answered at once; ``host_call_each``: per call of ``HOST_CALLS``, each a frame to the host and its result back.
    """

    name = JSON_FLOOR

    def __init__(self, sock: socket.socket, lookup: dict[str, Callable[..., Any]] = LOOKUP) -> None:
        self.sock = sock
        self.lookup = lookup
        sock.setblocking(False)
        self.buffer = bytearray()
        self.done: asyncio.Future[None] | None = None
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())

    def _send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message).encode()
        self.sock.sendall(JSON_FRAME.pack(len(payload)) + payload)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        if not data:  # the child is gone: stop watching, and fail the request waiting for it
            self.close()
            if self.done is not None and not self.done.done():
                self.done.set_exception(ConnectionResetError("the JSON floor's child closed its socket"))
            return
        self.buffer.extend(data)
        buffer, size_of = self.buffer, JSON_FRAME.size
        while len(buffer) >= size_of:
            (size,) = JSON_FRAME.unpack_from(buffer)
            if len(buffer) < size_of + size:
                return
            message = json.loads(buffer[size_of : size_of + size])
            del buffer[: size_of + size]
            if message["op"] == "call":
                self._send(
                    {"op": "result", "id": message["id"], "value": self.lookup[message["name"]](*message["args"])}
                )
            elif self.done is not None and not self.done.done():
                self.done.set_result(None)

    async def request(self, calls: int) -> float:
        """Seconds from a request naming ``calls`` host calls to its reply."""
        self.done = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        self._send({"calls": calls})
        await self.done
        return time.perf_counter() - start

    async def trial(self) -> dict[str, float]:
        runs = [await self.request(0) for _ in range(CALLS + STEADY_CALLS)]
        steady = sum(runs[CALLS:]) / STEADY_CALLS
        loop_s = await self.request(HOST_CALLS)
        return {
            "run_1+1": sum(runs[:CALLS]) / CALLS,
            "run_1+1_steady": steady,
            "host_call_each": max(loop_s - steady, 0.0) / HOST_CALLS,
        }


def methods() -> list[Method]:
    found = [
        Method("snapcell process", lambda: AsyncPool("memory://", isolation="process")),
        Method("snapcell inline", lambda: AsyncPool("memory://", isolation="inline")),
    ]
    if pydantic_monty is not None:
        monty = pydantic_monty
        found.append(Method("monty", lambda: monty.AsyncMonty(min_processes=1)))
    return found


@asynccontextmanager
async def opened(found: list[Method]) -> AsyncIterator[list[Method]]:
    try:
        for method in found:
            await method.open()
        yield found
    finally:
        for method in found:
            if method.pool is not None:
                await method.close()


async def measure(quick: bool) -> dict[str, dict[str, list[float]]]:
    found = methods()
    async with opened(found), contextlib.AsyncExitStack() as stack:
        floor = PlainExec()
        echo = RoundTripFloor(stack.enter_context(echo_process()))
        stack.callback(echo.close)
        json_floor = JsonFloor(stack.enter_context(python_child(JSON_CALLER)))
        stack.callback(json_floor.close)
        floors = {floor.name: floor.trial, echo.name: echo.trial, json_floor.name: json_floor.trial}
        trials = {m.name: m.trial for m in found} | floors
        samples = await alternate_async(trials, QUICK_REPS if quick else REPS, warmup=WARMUP)
        second = await alternate_async({m.name: m.cold_start for m in found}, QUICK_COLD_REPS if quick else COLD_REPS)
    for name, metrics in second.items():
        samples[name]["cold_start_2nd_pool"] = metrics["cold_start"]
    cold = await alternate_async({m.name: m.cold_start for m in found}, QUICK_COLD_REPS if quick else COLD_REPS)
    for name, metrics in cold.items():
        samples[name].update(metrics)
    return samples


# Run in a fresh child process per method, so the host figure counts only that method's imports and session.
MEMORY_PROBE = """
import asyncio, json, sys
from benchmarks._common import rss_bytes
method, setup = sys.argv[1], sys.argv[2]
baseline = rss_bytes()

async def probe():
    if method == "monty":
        import pydantic_monty
        pool = pydantic_monty.AsyncMonty(min_processes=1)
    else:
        import snapcell
        pool = snapcell.AsyncPool("memory://", isolation=method.split()[-1])
    async with pool:
        async with pool.checkout() as session:
            if method == "snapcell process":
                worker = (await session.run(setup)).memory_bytes  # the worker reads its own RSS
            else:
                await session.feed_run(setup)
                worker = rss_bytes(session.worker_pid) if method == "monty" else None
            return {"host_rss_bytes": rss_bytes(), "worker_rss_bytes": worker, "host_rss_baseline_bytes": baseline}

print(json.dumps(asyncio.run(probe())), flush=True)
"""


def memory(found: list[str]) -> dict[str, dict[str, Any]]:
    """Host and worker RSS of one open session per method, each measured in a fresh child process."""
    reports = {}
    for name in found:
        # monty 1.4 sometimes aborts during interpreter teardown, after the report is printed: keep the report.
        out = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, name, SETUP_CODE], capture_output=True, text=True, check=False
        )
        lines = out.stdout.strip().splitlines()
        if not lines:
            raise RuntimeError(f"memory probe of {name} failed: {out.stderr[-2000:]}")
        reports[name] = json.loads(lines[-1])
    return reports


def main() -> None:
    args = parse_args(__doc__, "fewer repetitions")
    samples = asyncio.run(measure(args.quick))
    names = list(samples)
    mem = memory([n for n in names if n not in ("plain exec", FLOOR, JSON_FLOOR)])
    base = samples[BASELINE]
    records = [
        {"method": name, **metric_fields(samples[name], base), **mem.get(name, {})}
        | {"reps": QUICK_REPS if args.quick else REPS}
        for name in names
    ]
    rows = []
    for metric in METRICS:
        for name in names:
            if metric in samples[name]:
                summary = summarize_ms(samples[name][metric])
                rows.append(
                    {
                        "metric": metric,
                        "method": name,
                        **summary,
                        "ratio": ratio(summary["median"], summarize_ms(base[metric])["median"]),
                    }
                )
    for name, report in mem.items():
        rows.append({"metric": "host RSS MB", "method": name, "median": report["host_rss_bytes"] / 2**20})
        if report.get("worker_rss_bytes"):
            rows.append({"metric": "worker RSS MB", "method": name, "median": report["worker_rss_bytes"] / 2**20})
    print_table(
        rows,
        [("metric", "metric"), ("method", "method"), ("min ms", "min"), ("median", "median"), ("max", "max")]
        + [("x process", "ratio")],
    )
    if "monty" in samples:
        med = {name: {k: summarize_ms(v)["median"] for k, v in samples[name].items()} for name in names}
        print()
        for metric, bound in TARGETS.items():
            ours, theirs = med[BASELINE][metric], med["monty"][metric]
            times = ours / theirs if theirs else float("inf")
            verdict = "met" if times <= bound else "MISSED"
            beside = "".join(
                f"; {name} {med[name][metric]:.3f} ms = {med[name][metric] / theirs:.1f}x monty"
                for name in (FLOOR, JSON_FLOOR)
                if theirs and med.get(name, {}).get(metric)
            )
            line = (
                f"target {metric}: process {ours:.3f} ms vs monty {theirs:.3f} ms = {times:.1f}x "
                f"(at most {bound}x): {verdict}{beside}"
            )
            print(line)
            records.append({"verdict": line})
        cold = med[BASELINE]["cold_start"]
        line = (
            f"target cold_start: process {cold:.1f} ms (at most {COLD_START_MS:g} ms): "
            f"{'met' if cold <= COLD_START_MS else 'MISSED'}; monty {med['monty']['cold_start']:.1f} ms"
        )
        print(line)
        records.append({"verdict": line})
    path = write_jsonl("runner", records)
    print(f"\nratios are to {BASELINE} (x < 1: faster than it); results appended to {path}")


if __name__ == "__main__":
    main()
