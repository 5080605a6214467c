"""Shared benchmark helpers: an alternating timing loop, min/median/max summaries, JSON lines, a ratio table."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"

# One repetition of one method: returns named durations in seconds (e.g. {"dump": 0.1, "load": 0.2}).
Trial = Callable[[], Mapping[str, float]]


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
