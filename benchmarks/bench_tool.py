"""What does one full ``run_code`` turn cost?

A turn is: take the conversation's lease, read its head, check out a session, load the checkpoint, run a small
script (a namespace of a few variables: a 100-item list of dicts, a counter), dump, move the head by
compare-and-swap and release the lease. Measured with `SQLiteHeads` on a local store, and with `S3Heads` on an
`S3Store` against a moto server on loopback (started here; it measures the client stack and HTTP round trips, not
AWS), in inline and process isolation. Setups alternate within each repetition. Prints min/median/max
milliseconds and appends JSON lines to ``benchmarks/results/tool.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_tool``.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from snapcell import Pool, SyncCodeTool
from snapcell.heads import S3Heads, SQLiteHeads
from snapcell.storage import LocalStore, S3Config, S3Store

REPS = 30
WARMUP = 3
ISOLATIONS = ("inline", "process")
BACKENDS = ("sqlite+local", "s3+s3")
KEY = "benchmark-signing-key-0123456789"
SETUP_CODE = "rows = [{'id': i, 'name': f'row-{i}', 'score': i * 0.5} for i in range(100)]\nturns = 0"
TURN_CODE = "turns += 1\ntotal = sum(r['score'] for r in rows)\nturns, total"
RESULTS = Path(__file__).parent / "results" / "tool.jsonl"


def _tools(stack: ExitStack, tmp: Path) -> Iterator[tuple[str, str, Callable[[], SyncCodeTool] | str]]:
    """Yield (backend, isolation, tool factory or the reason it is unavailable)."""
    endpoint: str | None = None
    for backend in BACKENDS:
        for isolation in ISOLATIONS:
            if backend == "sqlite+local":
                root = tmp / f"{isolation}-store"
                store: Any = LocalStore(root)
                heads: Any = SQLiteHeads(root / ".heads.sqlite3")
            else:
                if endpoint is None:
                    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
                    from tests.s3server import TEST_CREDENTIALS, TEST_REGION, start_moto_server

                    endpoint, stop = start_moto_server()
                    stack.callback(stop)
                    config = S3Config(endpoint_url=endpoint, region_name=TEST_REGION, **TEST_CREDENTIALS)
                    bucket = f"bench-{uuid.uuid4().hex[:12]}"
                    S3Store(bucket, config=config).client.create_bucket(Bucket=bucket)
                store = S3Store(bucket, f"tool-{isolation}", config=config)
                heads = S3Heads(store)
            try:
                pool = stack.enter_context(Pool(store, isolation=isolation, signing_keys=[KEY]))
                tool = SyncCodeTool(pool, heads=heads)
                tool.run_code("bench", SETUP_CODE)
            except Exception as exc:  # a benchmark reports an unavailable setup and goes on
                yield backend, isolation, f"unavailable: {type(exc).__name__}: {exc}"
                continue
            yield backend, isolation, lambda tool=tool: tool  # type: ignore[misc]


def main() -> int:
    samples: dict[tuple[str, str], list[float]] = {}
    skipped: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tool-") as tmpdir, ExitStack() as stack:
        tools: dict[tuple[str, str], SyncCodeTool] = {}
        for backend, isolation, made in _tools(stack, Path(tmpdir)):
            if isinstance(made, str):
                skipped[(backend, isolation)] = made
            else:
                tools[(backend, isolation)] = made()
        names = list(tools)
        for rep in range(WARMUP + REPS):
            shift = rep % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                answer = tools[name].run_code("bench", TURN_CODE)
                elapsed = time.perf_counter() - start
                if not answer.startswith("("):
                    raise RuntimeError(f"unexpected answer from {name}: {answer}")
                if rep >= WARMUP:
                    samples.setdefault(name, []).append(elapsed)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{'heads+store':<14} {'isolation':<10} {'min ms':>8} {'median ms':>10} {'max ms':>8}")
    with RESULTS.open("a") as out:
        for (backend, isolation), values in samples.items():
            ms = [v * 1000 for v in values]
            row = {
                "bench": "tool_turn",
                "backend": backend,
                "isolation": isolation,
                "reps": len(ms),
                "min_ms": round(min(ms), 3),
                "median_ms": round(statistics.median(ms), 3),
                "max_ms": round(max(ms), 3),
                "python": platform.python_version(),
                "time": stamp,
            }
            out.write(json.dumps(row) + "\n")
            print(f"{backend:<14} {isolation:<10} {row['min_ms']:>8} {row['median_ms']:>10} {row['max_ms']:>8}")
        for (backend, isolation), reason in skipped.items():
            out.write(json.dumps({"bench": "tool_turn", "backend": backend, "isolation": isolation,
                                  "skipped": reason, "time": stamp}) + "\n")  # fmt: skip
            print(f"{backend:<14} {isolation:<10} {reason[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
