"""How much latency does type checking add to a run? (target: under 100 ms median per check)

Runs ``TypeChecker.check`` on a typical 10-line script against host stubs, with
one checker reused across checks as a session would, and reports min/median/max
milliseconds for a passing script, a passing script with earlier cells, and a
failing script (which costs a second ty run to find stub notes).

Run from the repository root: ``python -m benchmarks.bench_typecheck``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from snapcell.typecheck import TypeChecker

CHECKS = 40
WARMUP = 3
RESULTS = Path(__file__).parent / "results" / "typecheck.jsonl"

STUBS = """
from typing import TypedDict
class Customer(TypedDict):
    id: str
    name: str
    churned_at: str | None
def list_customers() -> list[Customer]: ...
async def list_open_tickets(customer_id: str) -> list[dict[str, str]]: ...
"""

SCRIPT = """import asyncio
customers = list_customers()
churned = [c for c in customers if c["churned_at"]]
tickets = await asyncio.gather(*[list_open_tickets(c["id"]) for c in churned])
by_customer = {c["name"]: len(t) for c, t in zip(churned, tickets)}
worst = max(by_customer, key=lambda name: by_customer[name], default=None)
total = sum(by_customer.values())
share = {name: n / total for name, n in by_customer.items()} if total else {}
print(f"{len(churned)} churned, {total} open tickets, worst: {worst}")
share
"""

FAILING = SCRIPT.replace('list_open_tickets(c["id"])', "list_open_tickets(len(c))")
LATER = 'top = sorted(share, key=lambda k: share[k])[:3]\nprint(top, worst, tickets[0][0]["id"])\ntop\n'


def measure(checker: TypeChecker, code: str, prior_cells: list[str]) -> list[float]:
    """Time ``CHECKS`` checks of ``code``, after ``WARMUP`` untimed ones; milliseconds."""
    for _ in range(WARMUP):
        checker.check(code, prior_cells=prior_cells)
    times = []
    for _ in range(CHECKS):
        start = time.perf_counter()
        checker.check(code, prior_cells=prior_cells)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    """Run the scenarios, print a table and append JSON lines to ``RESULTS``."""
    checker = TypeChecker(STUBS)
    scenarios = {"passing": (SCRIPT, []), "passing+prior": (LATER, [SCRIPT]), "failing": (FAILING, [])}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    print(f"{'scenario':<16}{'min ms':>9}{'median ms':>11}{'max ms':>9}")
    try:
        with RESULTS.open("a", encoding="utf-8") as out:
            for name, (code, prior) in scenarios.items():
                times = measure(checker, code, prior)
                row = {
                    "benchmark": "typecheck",
                    "scenario": name,
                    "checks": CHECKS,
                    "min_ms": round(min(times), 2),
                    "median_ms": round(statistics.median(times), 2),
                    "max_ms": round(max(times), 2),
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "time": time.time(),
                }
                out.write(json.dumps(row) + "\n")
                print(f"{name:<16}{row['min_ms']:>9.1f}{row['median_ms']:>11.1f}{row['max_ms']:>9.1f}")
    finally:
        checker.close()


if __name__ == "__main__":
    main()
