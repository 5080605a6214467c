"""How much does the store grow over a long conversation that grows one dict a little each turn?

300 turns each add 100 keys (a 40-character hex value each) to one dict, ending at 30,000 entries; a checkpoint
is written after every turn, and nothing is cleaned up. Measured side by side in one run, inline isolation, on a
memory store (store growth counts every object the store holds: checkpoints and blobs):

- snapcell: ``session.dump()`` — the dict is cut into parts of 512 items, each its own pickle stored once as a
  content-addressed blob, so a turn stores its last part and a small body;
- before (one stream): the same namespace with frame blobs off (``DumpOptions(frame_blob_threshold_bytes=None)``),
  signed: the whole dict in every checkpoint, as before format 3;
- pickle+zstd: the namespace pickled and zstd-compressed (level 1) every turn, what a plain implementation stores.

Reports total store bytes after the last turn, the average bytes added by each of the last 10 turns, and the last
checkpoint's size. Writes ``benchmarks/results/growth.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_growth [--quick]``.
"""

from __future__ import annotations

import hashlib
import pickle
import time
from typing import Any

import zstandard

from benchmarks._common import machine_description, parse_args, print_table, write_jsonl
from snapcell import Pool
from snapcell.checkpoint import DumpOptions, Keyring, dump_namespace
from snapcell.storage import MemoryStore

TURNS = 300
QUICK_TURNS = 100
PER_TURN = 100
KEY = "benchmark-signing-key-0123456789"
ONE_STREAM = DumpOptions(frame_blob_threshold_bytes=None)  # the "before" dump: frame blobs off
TURN = "data.update((f'k{{i:06d}}', hashlib.sha1(str(i).encode()).hexdigest()) for i in range({start}, {stop}))"


def _stored(store: MemoryStore) -> int:
    return sum(o.size for o in store.scan())


def _measure(turns: int) -> list[dict[str, Any]]:
    store = MemoryStore("growth")
    keyring = Keyring([KEY])
    data: dict[str, str] = {}
    totals = {"snapcell": [0], "before (one stream)": [0], "pickle+zstd": [0]}
    last = {}
    started = time.perf_counter()
    with Pool(store, isolation="inline", signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run("import hashlib\ndata = {}")
        for turn in range(turns):
            start, stop = turn * PER_TURN, (turn + 1) * PER_TURN
            session.feed_run(TURN.format(start=start, stop=stop))
            data.update((f"k{i:06d}", hashlib.sha1(str(i).encode()).hexdigest()) for i in range(start, stop))
            session.dump()
            totals["snapcell"].append(_stored(store))
            last["snapcell"] = session.checkpoint_bytes or 0
            old = dump_namespace({"data": data}, namespace={}, created_at=time.time(), options=ONE_STREAM)
            signed = len(keyring.sign(bytes(old.body), keyring.new_id()))
            totals["before (one stream)"].append(totals["before (one stream)"][-1] + signed)
            last["before (one stream)"] = signed
            plain = len(zstandard.compress(pickle.dumps({"data": data}, protocol=5), 1))
            totals["pickle+zstd"].append(totals["pickle+zstd"][-1] + plain)
            last["pickle+zstd"] = plain
    elapsed = time.perf_counter() - started
    records = []
    for method, series in totals.items():
        records.append(
            {
                "method": method,
                "turns": turns,
                "entries": turns * PER_TURN,
                "total_bytes": series[-1],
                "per_turn_last10_bytes": (series[-1] - series[-11]) // 10,
                "last_checkpoint_bytes": last[method],
                "run_s": round(elapsed, 1),
            }
        )
    return records


def main() -> None:
    args = parse_args(__doc__, f"{QUICK_TURNS} turns instead of {TURNS}")
    turns = QUICK_TURNS if args.quick else TURNS
    records = _measure(turns)
    base = records[0]["total_bytes"]
    rows = [
        {
            **r,
            "total_mb": round(r["total_bytes"] / 1e6, 2),
            "per_turn_kb": round(r["per_turn_last10_bytes"] / 1e3, 1),
            "last_kb": round(r["last_checkpoint_bytes"] / 1e3, 1),
            "x": round(r["total_bytes"] / base, 1),
        }
        for r in records
    ]
    print(f"{turns} turns growing one dict to {turns * PER_TURN:,} entries; {machine_description()}")
    print_table(
        rows,
        [
            ("method", "method"),
            ("store MB", "total_mb"),
            ("x snapcell", "x"),
            ("added/turn KB (last 10)", "per_turn_kb"),
            ("last checkpoint KB", "last_kb"),
        ],
    )
    write_jsonl("growth", records)


if __name__ == "__main__":
    main()
