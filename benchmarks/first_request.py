"""What does a checkout's first request cost over its later ones, and on which side?

Each checkout gets a worker set up ahead, idle for ``GAP_S``, then runs ``feed_run("1+1")``
``CALLS`` times. Per call: wall time, the host's CPU (this thread's ``thread_time``: the event loop's own work) and
the worker's CPU (its main thread's run time from ``/proc/PID/schedstat``, in nanoseconds, read before and after).
Medians over ``CHECKOUTS`` checkouts (the first is left out: its worker was not set up ahead).

Wall time is noisy on a shared 2-core machine; the two CPU figures are less so, and their sum is close to the wall
time of a call. Not run by ``python -m benchmarks``.

Usage, from the repository root: ``python -m benchmarks.first_request [--gap S] [--checkouts N]``; prints a table
and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from snapcell import AsyncPool

GAP_S = 0.5
CHECKOUTS = 9
CALLS = 8
CODE = "1+1"


def _worker_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


async def measure(gap_s: float, checkouts: int) -> dict[str, list[float]]:
    """Per call index (0 = the checkout's first request): wall, host CPU and worker CPU in milliseconds."""
    found: dict[str, list[float]] = {}
    async with AsyncPool("memory://", isolation="process") as pool:
        for checkout in range(checkouts + 1):
            await asyncio.sleep(gap_s)
            async with pool.checkout() as session:
                pid = session._backend.worker.pid  # type: ignore[attr-defined]
                for call in range(CALLS):
                    worker = _worker_cpu_ns(pid)
                    host = time.thread_time_ns()
                    start = time.perf_counter_ns()
                    await session.feed_run(CODE)
                    wall = time.perf_counter_ns() - start
                    host = time.thread_time_ns() - host
                    worker = _worker_cpu_ns(pid) - worker
                    if checkout == 0:
                        continue
                    for name, ns in (("wall", wall), ("host_cpu", host), ("worker_cpu", worker)):
                        found.setdefault(f"{name}_{call}", []).append(ns / 1e6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap", type=float, default=GAP_S, help="seconds a worker is idle before its checkout")
    parser.add_argument("--checkouts", type=int, default=CHECKOUTS)
    args = parser.parse_args()
    found = asyncio.run(measure(args.gap, args.checkouts))
    medians = {key: round(statistics.median(values), 3) for key, values in found.items()}
    print(f"{'call':>4} {'wall ms':>8} {'host cpu ms':>12} {'worker cpu ms':>14}")
    for call in range(CALLS):
        row = [medians[f"{name}_{call}"] for name in ("wall", "host_cpu", "worker_cpu")]
        print(f"{call + 1:>4} {row[0]:>8.3f} {row[1]:>12.3f} {row[2]:>14.3f}")
    print(json.dumps({"bench": "first_request", "gap_s": args.gap, "checkouts": args.checkouts, **medians}))


if __name__ == "__main__":
    main()
