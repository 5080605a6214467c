"""What do dump and load cost with a 100 MB workspace, the first time and when nothing changed?

A process-mode session (the default; the workspace exists only there) on a memory store holds one file of
``FILE_MB`` MB in its workspace, of one of two kinds: random bytes (incompressible, stored raw) and a CSV-like
text (compresses well). For each kind, measured per repetition:

- ``first_dump_s``: the dump that stores the file (every chunk hashed, compressed, sent, re-hashed by the host);
- ``unchanged_dump_s``: the next dump with the file untouched (hashed again, nothing sent or stored);
- ``load_s``: loading that checkpoint into a fresh session (chunks fetched, verified, written back);
- ``stored_first_mb`` and ``stored_unchanged_mb``: store growth of each dump.

The store is shared by all repetitions, so each writes content of its own (another seed). A session without
files gives the baseline for dump and load. Targets: an unchanged dump stores under 1 MB and
takes well under the first. Writes ``benchmarks/results/workspace.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_workspace [--quick]``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks._common import machine_description, parse_args, print_table, write_jsonl
from snapcell import Limits, Pool
from snapcell.storage import MemoryStore

FILE_MB = 100
QUICK_FILE_MB = 20
REPS = 3
QUICK_REPS = 1
LIMITS = Limits(workspace_bytes=256 * 2**20, max_scratch_bytes=512 * 2**20, max_file_bytes=None)
WRITERS = {
    "random bytes": "import random\nwith open('data.bin', 'wb') as f:\n    f.write(random.randbytes({size}))",
    "csv text": (
        "with open('data.csv', 'w') as f:\n    n, i = 0, 0\n    while n < {size}:\n"
        "        rows = (f'{{j}},item-{{j % 97}},{{j * 0.37 + {seed}:.2f}}\\n' for j in range(i, i + 10000))\n"
        "        n += f.write(''.join(rows))\n"
        "        i += 10000"
    ),
    "no files": "x = 1",
}


def _stored(store: MemoryStore) -> int:
    return sum(o.size for o in store.scan())


def _measure(pool: Pool, store: MemoryStore, code: str) -> dict[str, float]:
    with pool.checkout() as session:
        session.run(code)
        before = _stored(store)
        start = time.perf_counter()
        session.dump()
        first = time.perf_counter() - start
        after_first = _stored(store)
        start = time.perf_counter()
        checkpoint = session.dump()
        unchanged = time.perf_counter() - start
        after_unchanged = _stored(store)
    with pool.checkout() as session:
        start = time.perf_counter()
        session.load_session(checkpoint)
        load = time.perf_counter() - start
    return {
        "first_dump_s": first,
        "unchanged_dump_s": unchanged,
        "load_s": load,
        "stored_first_mb": (after_first - before) / 1e6,
        "stored_unchanged_mb": (after_unchanged - after_first) / 1e6,
    }


def main() -> None:
    args = parse_args(__doc__, f"a {QUICK_FILE_MB} MB file, one repetition")
    size_mb = QUICK_FILE_MB if args.quick else FILE_MB
    reps = QUICK_REPS if args.quick else REPS
    store = MemoryStore()
    samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in WRITERS}
    with Pool(store, isolation="process", limits=LIMITS, min_warm_workers=1) as pool:
        for rep in range(reps):
            kinds = list(WRITERS)
            shift = rep % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                # A new seed each repetition: the store would otherwise already hold last repetition's chunks.
                code = WRITERS[kind].format(size=size_mb * 2**20, seed=rep)
                samples[kind].append(_measure(pool, store, code))
    records: list[dict[str, Any]] = []
    for kind, runs in samples.items():
        record: dict[str, Any] = {"case": kind, "file_mb": 0 if kind == "no files" else size_mb, "reps": reps}
        for key in runs[0]:
            values = [run[key] for run in runs]
            record[key] = round(statistics.median(values), 3)
        records.append(record)
    print(f"workspace file: {size_mb} MB; {machine_description()}; median of {reps}")
    print_table(
        records,
        [
            ("case", "case"),
            ("file MB", "file_mb"),
            ("first dump s", "first_dump_s"),
            ("unchanged dump s", "unchanged_dump_s"),
            ("load s", "load_s"),
            ("stored first MB", "stored_first_mb"),
            ("stored unchanged MB", "stored_unchanged_mb"),
        ],
    )
    write_jsonl("workspace", records)


if __name__ == "__main__":
    main()
