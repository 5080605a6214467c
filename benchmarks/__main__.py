"""Run every ``benchmarks/bench_*.py``, each in its own interpreter, print one table and draw the chart.

Usage, from the repository root: ``python -m benchmarks [--quick] [--only NAME ...]``. ``NAME`` is a script's
name without ``bench_`` (``runner``, ``namespaces``, ...). ``--quick`` is passed to every script that takes it.
Each script appends JSON lines to ``benchmarks/results/``; the combined table is built from the lines this run
added, and is also written as Markdown to ``benchmarks/results/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import chart
from benchmarks._common import RESULTS_DIR, describe_probe, machine_description, machine_probe, print_table

HERE = Path(__file__).parent
ROOT = HERE.parent
SCRIPT_TIMEOUT_S = 1800
# Fields that describe a run rather than a case or a measurement.
STAMP = {"bench", "benchmark", "time", "python", "machine", "cpus", "reps", "checks", "runs_per_rep", "target_us"}
# Inputs and derived figures that would only lengthen the table.
SKIP = {"payload_bytes", "namespace_bytes", "put_get_median_ms", "host_rss_baseline_bytes"}
UNITS = {"_ms": "ms", "_us": "µs", "_s": "s", "_bytes": "bytes"}


def scripts(only: list[str] | None) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if only:
        wanted = {name.removeprefix("bench_").removesuffix(".py") for name in only}
        unknown = wanted - {p.stem.removeprefix("bench_") for p in found}
        if unknown:
            raise SystemExit(f"no benchmark named {', '.join(sorted(unknown))}; have: {[p.stem for p in found]}")
        found = [p for p in found if p.stem.removeprefix("bench_") in wanted]
    return found


def sizes() -> dict[Path, int]:
    return {path: path.stat().st_size for path in RESULTS_DIR.glob("*.jsonl")} if RESULTS_DIR.exists() else {}


def new_records(before: dict[Path, int], script: Path) -> list[dict[str, Any]]:
    """The JSON lines a script appended since ``before``: to ``<name>.jsonl``, or else to any results file."""
    own = RESULTS_DIR / f"{script.stem.removeprefix('bench_')}.jsonl"
    grown = [p for p in sorted(RESULTS_DIR.glob("*.jsonl")) if p.stat().st_size != before.get(p, 0)]
    records = []
    for path in [own] if own in grown else grown:
        with path.open() as results:
            results.seek(before.get(path, 0))
            for line in results:
                if line.strip():
                    record = json.loads(line)
                    record.setdefault("bench", record.get("benchmark", path.stem))
                    records.append(record)
    return records


def unit_of(key: str) -> tuple[str, str]:
    for suffix, unit in UNITS.items():
        if key.endswith(suffix):
            return key.removesuffix(suffix), unit
    return key, ""


def rows_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per measurement in a record, whatever the script's schema.

    Measurements are ``<metric>_<unit>`` dicts of min/median/max, flat ``min_/median_/max_<unit>`` triples, or
    plain numbers with a unit suffix; ``<metric>_ratio`` goes beside its metric. Strings name the case.
    """
    labels = [str(v) for k, v in record.items() if isinstance(v, str) and k not in STAMP and k != "note"]
    case = " · ".join(labels)
    base = {"bench": record["bench"], "case": case}
    rows: list[dict[str, Any]] = []
    if "note" in record:
        return [{**base, "metric": record["note"], "median": "n/a"}]
    flat = {k for k in record if k.startswith(("min_", "median_", "max_"))}
    for key, value in record.items():
        if key in STAMP or key in SKIP or key.endswith("_ratio") or key.startswith("ratio"):
            continue
        metric, unit = unit_of(key)
        if isinstance(value, dict) and "median" in value:
            rows.append({**base, "metric": metric, "unit": unit, **value, "x": record.get(f"{metric}_ratio")})
        elif key.startswith("median_"):
            _, unit = unit_of(key)
            lo, hi = key.replace("median_", "min_"), key.replace("median_", "max_")
            rows.append(
                {**base, "metric": "time", "unit": unit, "min": record.get(lo), "median": value, "max": record.get(hi)}
            )
        elif key in flat or isinstance(value, bool) or not isinstance(value, int | float) or not unit:
            continue
        elif unit == "bytes" and value >= 2**20:
            rows.append({**base, "metric": metric, "unit": "MiB", "median": round(value / 2**20, 1)})
        else:
            rows.append({**base, "metric": metric, "unit": unit, "median": value})
        if rows and rows[-1]["metric"] == metric and rows[-1].get("x") is None:
            rows[-1]["x"] = record.get(f"{metric}_ratio")
    for key, value in record.items():
        if key.startswith("ratio_") and isinstance(value, int | float):
            rows.append({**base, "metric": key, "unit": "x", "median": value})
    return rows


COLUMNS = [
    ("bench", "bench"),
    ("case", "case"),
    ("metric", "metric"),
    ("unit", "unit"),
    ("min", "min"),
    ("median", "median"),
    ("max", "max"),
    ("x snapcell", "x"),
]


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row.get(key)) for _, key in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def run_script(path: Path, quick: bool) -> tuple[int, float, str]:
    """Run one script from the repository root; return its exit code, seconds, and the tail of its output."""
    command = [sys.executable, "-m", f"benchmarks.{path.stem}"]
    if quick and "--quick" in path.read_text():
        command.append("--quick")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - start, f"timed out after {SCRIPT_TIMEOUT_S} s"
    return done.returncode, time.perf_counter() - start, (done.stdout + done.stderr)[-3000:]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the reduced set: under 2 minutes on 2 cores")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scripts (e.g. runner namespaces)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    verdicts: list[str] = []
    failed = []
    total = time.perf_counter()
    for path in scripts(args.only):
        before = sizes()
        print(f"running {path.stem} ...", end=" ", flush=True)
        code, seconds, output = run_script(path, args.quick)
        print(f"{'ok' if code == 0 else f'FAILED ({code})'} in {seconds:.1f} s", flush=True)
        if code != 0:
            failed.append(path.stem)
            print(output, file=sys.stderr)
        for record in new_records(before, path):
            if "verdict" in record:  # a target's verdict line, printed after the table
                verdicts.append(str(record["verdict"]))
            else:
                rows.extend(rows_of(record))
    probe = describe_probe(machine_probe())
    print(f"\n{machine_description()}; {'--quick, ' if args.quick else ''}{time.perf_counter() - total:.0f} s")
    print(f"{probe}\n")
    print_table(rows, COLUMNS)
    print("\nx snapcell: this row's median over snapcell's in the same case and run (x < 1: faster or smaller)")
    if verdicts:
        print("\ntargets (medians of this run; the floors beside them are what any design pays):")
        print("\n".join(f"  {line}" for line in verdicts))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    targets = "".join(f"- {line}\n" for line in verdicts)
    (RESULTS_DIR / "summary.md").write_text(f"{machine_description()}; {probe}\n\n{markdown(rows)}\n{targets}")
    image = chart.render()
    if image is not None:
        print(f"chart: {image.relative_to(ROOT)}; Markdown table: {(RESULTS_DIR / 'summary.md').relative_to(ROOT)}")
    if failed:
        raise SystemExit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
