"""Draw dump and load time by namespace size from ``benchmarks/results/namespaces.jsonl`` into a PNG.

Uses each method's latest record per namespace. Run from the repository root:
``python -m benchmarks.chart [OUT.png]`` (default ``docs/assets/chart.png``, shown by the documentation's
performance page); ``python -m benchmarks`` calls it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, machine_description

CHART = Path(__file__).parents[1] / "docs" / "assets" / "chart.png"
SOURCE = RESULTS_DIR / "namespaces.jsonl"
METHODS = {"snapcell": "o", "pickle+zstd": "s", "dill": "^", "monty": "d"}  # markers: the namespaces differ in kind


def latest(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The last record of each (method, namespace) that has dump and load times."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("method") in METHODS and "dump_ms" in record and "namespace_bytes" in record:
            found[(record["method"], record["namespace"])] = record
    return found


def render(out: Path = CHART, source: Path = SOURCE) -> Path | None:
    """Write the chart to ``out``; None (and nothing written) when there are no results yet."""
    if not source.exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = latest(source)
    if not records:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    for axis, metric, title in ((axes[0], "dump_ms", "dump"), (axes[1], "load_ms", "load")):
        for method, style in METHODS.items():
            points = sorted(
                (r["namespace_bytes"], r[metric]["median"], r["namespace"])
                for (m, _), r in records.items()
                if m == method
            )
            if points:
                axis.plot([p[0] / 2**20 for p in points], [p[1] for p in points], style, label=method)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("namespace size, MiB (uncompressed pickle)")
        axis.set_ylabel("median ms (log)")
        axis.set_title(f"checkpoint {title} time")
        axis.grid(True, which="both", alpha=0.3)
    snapcell = sorted((r["namespace_bytes"], r["namespace"]) for (m, _), r in records.items() if m == "snapcell")
    for size, name in snapcell:
        axes[0].annotate(name, (size / 2**20, records[("snapcell", name)]["dump_ms"]["median"]), fontsize=7)
    axes[1].legend()
    fig.suptitle(f"snapcell (process mode) vs alternatives: {machine_description()}", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    path = render(Path(sys.argv[1]) if len(sys.argv) > 1 else CHART)
    print(f"chart written to {path}" if path else f"no results in {SOURCE}; run python -m benchmarks first")


if __name__ == "__main__":
    main()
