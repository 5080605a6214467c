"""What does the restricted policy cost per run? (target: under 20 µs per run for a trivial script)

Runs, side by side in one process and alternating so drift hits every variant alike:
``feed_run('1+1')`` and a 1,000-iteration loop, each with the default restricted policy and
with ``Policy.unrestricted()`` (inline sessions, same limits), and plain ``exec`` of the same
code as a baseline. Prints min/median/max microseconds per run and the restricted/unrestricted
difference and ratio; writes JSON lines to ``benchmarks/results/policy.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_policy``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from snapcell import Limits, Policy, Pool

REPS = 7
RUNS_PER_REP = 300
WARMUP = 50
RESULTS = Path(__file__).parent / "results" / "policy.jsonl"
TARGET_US = 20.0

SCRIPTS = {
    "trivial": "1+1",
    "loop_1000": "total = 0\nfor i in range(1000):\n    total += i * 2\ntotal",
}


def per_run_us(call: Callable[[], object], runs: int) -> float:
    """Mean microseconds of ``runs`` calls of ``call``."""
    start = time.perf_counter()
    for _ in range(runs):
        call()
    return (time.perf_counter() - start) / runs * 1e6


def main() -> None:
    """Measure every variant, print a table, append JSON lines."""
    limits = Limits()  # the defaults: a 30 s wall-time watchdog is armed in every variant
    with Pool("memory://", isolation="inline", limits=limits) as pool:
        with (
            pool.checkout(policy=Policy()) as restricted,
            pool.checkout(policy=Policy.unrestricted()) as unrestricted,
        ):
            samples: dict[tuple[str, str], list[float]] = {}
            for script_name, code in SCRIPTS.items():
                compiled = compile(code, "<bench>", "exec")
                variants: dict[str, Callable[[], object]] = {
                    "restricted": lambda code=code: restricted.feed_run(code),
                    "unrestricted": lambda code=code: unrestricted.feed_run(code),
                    "exec": lambda compiled=compiled: exec(compiled, {}),
                }
                for call in variants.values():
                    for _ in range(WARMUP):
                        call()
                for _ in range(REPS):
                    for variant, call in variants.items():
                        samples.setdefault((script_name, variant), []).append(per_run_us(call, RUNS_PER_REP))
    rows = []
    print(f"{'script':<10} {'variant':<13} {'min µs':>9} {'median µs':>10} {'max µs':>9}")
    for (script_name, variant), values in samples.items():
        row = {
            "bench": "policy",
            "script": script_name,
            "variant": variant,
            "min_us": round(min(values), 2),
            "median_us": round(statistics.median(values), 2),
            "max_us": round(max(values), 2),
            "reps": REPS,
            "runs_per_rep": RUNS_PER_REP,
        }
        rows.append(row)
        print(f"{script_name:<10} {variant:<13} {row['min_us']:>9.1f} {row['median_us']:>10.1f} {row['max_us']:>9.1f}")
    print()
    for script_name in SCRIPTS:
        policy_us = statistics.median(samples[(script_name, "restricted")])
        open_us = statistics.median(samples[(script_name, "unrestricted")])
        exec_us = statistics.median(samples[(script_name, "exec")])
        overhead = policy_us - open_us
        verdict = "OK" if script_name != "trivial" or overhead < TARGET_US else "ABOVE TARGET"
        print(
            f"{script_name:<10} policy overhead {overhead:+.1f} µs ({policy_us / open_us:.2f}x unrestricted, "
            f"{policy_us / exec_us:.1f}x plain exec) {verdict if script_name == 'trivial' else ''}"
        )
        rows.append(
            {
                "bench": "policy",
                "script": script_name,
                "variant": "overhead",
                "overhead_us": round(overhead, 2),
                "ratio_vs_unrestricted": round(policy_us / open_us, 3),
                "ratio_vs_exec": round(policy_us / exec_us, 3),
                "target_us": TARGET_US if script_name == "trivial" else None,
            }
        )
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        for row in rows:
            out.write(json.dumps({**row, **meta, "time": time.time()}) + "\n")


if __name__ == "__main__":
    main()
