"""Shared benchmark helpers: an alternating timing loop, min/median/max summaries, JSON lines, a ratio table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"

# One repetition of one method: returns named durations in seconds (e.g. {"dump": 0.1, "load": 0.2}).
Trial = Callable[[], Mapping[str, float]]
AsyncTrial = Callable[[], Awaitable[Mapping[str, float]]]


def timed(func: Callable[[], Any]) -> tuple[Any, float]:
    """Call ``func`` and return its result and the wall-clock seconds it took."""
    start = time.perf_counter()
    result = func()
    return result, time.perf_counter() - start


def alternate(trials: Mapping[str, Trial], reps: int, *, warmup: int = 0) -> dict[str, dict[str, list[float]]]:
    """Run every trial ``reps`` times, rotating the order each repetition so drift hits all methods alike.

    Args:
        trials: Method name to a callable running one repetition and returning named durations (seconds).
        reps: Measured repetitions of each method.
        warmup: Unmeasured repetitions run first.

    Returns:
        Method name to duration name to the measured seconds, one per repetition.
    """
    names = list(trials)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for rep in range(warmup + reps):
        shift = rep % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            durations = trials[name]()
            if rep >= warmup:
                for key, seconds in durations.items():
                    samples[name].setdefault(key, []).append(seconds)
    return samples


async def alternate_async(
    trials: Mapping[str, AsyncTrial], reps: int, *, warmup: int = 0
) -> dict[str, dict[str, list[float]]]:
    """`alternate` for coroutine trials, so async pools of several kinds share one event loop."""
    names = list(trials)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for rep in range(warmup + reps):
        shift = rep % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            durations = await trials[name]()
            if rep >= warmup:
                for key, seconds in durations.items():
                    samples[name].setdefault(key, []).append(seconds)
    return samples


def metric_fields(
    samples: Mapping[str, Sequence[float]], baseline: Mapping[str, Sequence[float]] | None
) -> dict[str, Any]:
    """Record fields for one method: ``<metric>_ms`` (min/median/max) and ``<metric>_ratio`` to the baseline.

    The ratio is this method's median over the baseline's (x < 1: faster than the baseline); it is left out
    when the baseline lacks the metric.
    """
    fields: dict[str, Any] = {}
    for metric, seconds in samples.items():
        summary = summarize_ms(seconds)
        fields[f"{metric}_ms"] = summary
        if baseline is not None and baseline.get(metric):
            fields[f"{metric}_ratio"] = ratio(summary["median"], summarize_ms(baseline[metric])["median"])
    return fields


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Min, median and max of ``seconds``, in milliseconds rounded to microseconds."""
    return {
        "min": round(min(seconds) * 1000, 3),
        "median": round(statistics.median(seconds) * 1000, 3),
        "max": round(max(seconds) * 1000, 3),
    }


def ratio(value: float, baseline: float) -> float | None:
    """``value / baseline`` rounded to 2 decimals; None when the baseline is zero."""
    return round(value / baseline, 2) if baseline else None


async def wait_warm(pool: Any, timeout_s: float = 10.0) -> None:
    """Wait until a snapcell `AsyncPool` in process mode has a started worker to hand out (no-op otherwise).

    A process-mode checkout replaces its worker, so measuring back to back would time interpreter start-ups on
    a busy CPU; pausing here measures a checkout the way a server that is not saturated sees it.
    """
    workers = getattr(pool, "_workers", None)
    deadline = time.monotonic() + timeout_s
    while workers is not None and len(workers._warm) < workers.min_warm and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def wait_warm_sync(pool: Any) -> None:
    """`wait_warm` for a sync `Pool`; it runs the pool's own event loop, which starts workers only while it runs."""
    pool._call(wait_warm(pool._inner))


def parse_args(doc: str | None, quick_help: str) -> argparse.Namespace:
    """The command line every benchmark script takes: ``--quick`` for the reduced set."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser.parse_args()


def rss_bytes(pid: int | None = None) -> int | None:
    """Resident memory of a process (this one by default) from ``/proc``; None where that is unreadable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def machine_description() -> str:
    """One line naming the CPU model, core count, memory, OS and Python, for tables quoted elsewhere."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as info:
            total_kib = int(info.readline().split()[1])
            memory = f", {total_kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu}, {cores} cores{memory}, {platform.system()} {platform.release()}, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


# A fresh interpreter (not a fork: the benchmark may have threads) that sends back whatever arrives on its socket
# until the other end closes: a worker that does no work at all.
_ECHO = (
    "import socket, sys\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "while data := s.recv(65536):\n"
    "    s.sendall(data)\n"
)


@contextlib.contextmanager
def python_child(source: str) -> Iterator[socket.socket]:
    """A child ``python -I -c source FD`` with one end of a socketpair as descriptor FD; yields the other end.

    On exit this end is closed (the child should then end) and the child is waited for.
    """
    parent, child = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-I", "-c", source, str(child.fileno())], pass_fds=[child.fileno()])
    child.close()
    try:
        yield parent
    finally:
        parent.close()
        process.wait()


def echo_process() -> contextlib.AbstractContextManager[socket.socket]:
    """A child ``python -I`` that echoes every byte sent on the yielded (blocking) socket; ended on exit."""
    return python_child(_ECHO)


def machine_probe(round_trips: int = 2000, idle_trials: int = 5) -> dict[str, float]:
    """How this machine prices what a sandboxed turn is made of, in microseconds (medians), to read other numbers by.

    - ``round_trip_us``: one byte to a child process over a socketpair and back (two wake-ups, two context switches):
      the floor under every request to a worker.
    - ``syscall_us`` / ``syscall_after_idle_us``: one ``stat`` of a missing path, back to back and after 0.1 s asleep.
      On some virtual machines a process's first system calls after a pause cost ten times the usual; a worker's
      first request after waiting in the pool, and a cold turn, pay that on every call they make.
    """
    times = []
    with echo_process() as parent:
        for _ in range(round_trips):
            start = time.perf_counter()
            parent.send(b"x")
            parent.recv(1)
            times.append(time.perf_counter() - start)

    def stat_s() -> float:
        start = time.perf_counter()
        with contextlib.suppress(OSError):
            os.stat("/nonexistent-snapcell-probe")
        return time.perf_counter() - start

    warm = [stat_s() for _ in range(200)]
    idle = []
    for _ in range(idle_trials):
        time.sleep(0.1)
        idle.append(stat_s())
    return {
        "round_trip_us": round(statistics.median(times) * 1e6, 1),
        "syscall_us": round(statistics.median(warm) * 1e6, 2),
        "syscall_after_idle_us": round(statistics.median(idle) * 1e6, 1),
    }


def describe_probe(probe: Mapping[str, float]) -> str:
    """`machine_probe`'s numbers as one line."""
    return (
        f"process round trip {probe['round_trip_us']:.0f} us, stat {probe['syscall_us']:.1f} us "
        f"({probe['syscall_after_idle_us']:.0f} us after 0.1 s idle)"
    )


def write_jsonl(name: str, records: Sequence[Mapping[str, Any]]) -> Path:
    """Append ``records`` to ``benchmarks/results/<name>.jsonl``, each stamped with the bench, time and machine."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.jsonl"
    stamp = {
        "bench": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    with path.open("a") as out:
        for record in records:
            out.write(json.dumps({**stamp, **record}, sort_keys=True) + "\n")
    return path


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Print ``rows`` as an aligned text table; ``columns`` are (header, key) pairs, missing values show as '-'."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    table = [[header for header, _ in columns]] + [[cell(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    numeric = [any(isinstance(row.get(key), int | float) for row in rows) for _, key in columns]
    for index, line in enumerate(table):
        cells = zip(line, widths, numeric, strict=True)
        print("  ".join(text.rjust(width) if is_number else text.ljust(width) for text, width, is_number in cells))
        if index == 0:
            print("  ".join("-" * width for width in widths))


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found += [int(child) for child in listing.read().split()]
    except OSError:  # gone meanwhile: its CPU is in its parent's reaped-children time once reaped
        pass
    return found


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of a live process: its own (every live thread's, from schedstat, in ns) and its reaped children's.

    A process's own time is read from each thread's ``schedstat`` (nanoseconds) rather than ``stat``'s clock ticks,
    which cost a short warm turn a tick's worth of rounding per process; the children it has reaped are only in
    ``stat`` (``cutime``/``cstime``, ticks), which are summed once per process for all of them.
    """
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0]) / 1e9
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) * _TICK_S  # cutime, cstime (fields 16 and 17 of stat)
    except (OSError, ValueError, IndexError):
        return 0.0
    return total


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every process under it, reaped ones included.

    This process's own time and its reaped children's come from ``getrusage`` (every thread, live or ended); each
    live descendant's from `_process_cpu_s`. A descendant that ends between two readings moves from its own figure
    to its parent's reaped-children time, whole, so the difference of two readings is the CPU the tree used between
    them (to a clock tick per process that reaped children meanwhile).
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    pending = _children(os.getpid())
    while pending:
        pid = pending.pop()
        total += _process_cpu_s(pid)
        pending += _children(pid)
    return total
