"""How do checkpoint dump and load time and size grow with the namespace, next to the alternatives?

Each namespace is made by a script, run the same way by every method (in the worker for snapcell, in the
sandbox for monty, with ``exec`` in this process for the pickle baselines). Methods, alternating every
repetition:

- ``snapcell``: the default process mode: ``session.dump()`` (pickled and compressed in the worker, signed and
  put in a memory store by the host) and ``load_session()`` into a fresh session. Each repetition builds the
  namespace in a fresh session first (not timed), so no dump reuses an earlier one's blobs.
- ``pickle+zstd``: ``pickle.dumps`` (protocol 5) of the variables, zstd level 1; ``n/a`` where plain pickle
  cannot hold script-defined functions.
- ``dill``: ``dill.dump_module`` of a module holding the variables, uncompressed.
- ``monty``: pydantic-monty's ``session.dump()`` / ``load_session()`` (uncompressed, unsigned, no store);
  ``n/a`` for numpy and pandas, which its sandbox cannot import.

Then a full turn (checkout, load, run a cell, dump, check in) in process mode on the memory, local and S3
stores (S3 is a moto server on loopback, started here: it measures the client stack and HTTP, not AWS).

Ratios are to ``snapcell`` (x < 1: faster or smaller than snapcell); ``namespace_bytes`` is the size of the
variables as one uncompressed pickle (dill for functions), the x axis of ``docs/assets/chart.png``. Each snapcell
dump is a first dump: a fresh session, an empty store, and a host that has scanned none of its pickles before.

Then the checkpoint path's targets, each with snapcell's median and the baseline's from the same run and a verdict
(``target`` rows): 50 functions and classes dump within dill.dump_module's time; 3 small dicts dump and load within
3x monty's; the DataFrame's first dump within 3x pickle+zstd.

Run from the repository root: ``python -m benchmarks.bench_namespaces [--quick]`` (``--quick`` replaces the
1M-row DataFrame and the 200 MB array with 100k rows and 20 MB, and takes fewer repetitions); JSON lines go to
``benchmarks/results/namespaces.jsonl``.
"""

from __future__ import annotations

import functools
import gc
import io
import pickle
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dill
import zstandard

from benchmarks._common import alternate, metric_fields, parse_args, print_table, timed, wait_warm_sync, write_jsonl
from benchmarks.bench_storage import open_backends
from snapcell import Limits, Policy, Pool
from snapcell.checkpoint import PassedFrames

try:
    import pydantic_monty
except ImportError:  # the bench extra is optional; monty rows are left out
    pydantic_monty = None  # type: ignore[assignment]

REPS = 5
QUICK_REPS = 3
BIG_REPS = 2  # namespaces of 100 MB and more
TURN_REPS = 7
QUICK_TURN_REPS = 3
ZSTD_LEVEL = 1
DF_ROWS = 1_000_000
QUICK_DF_ROWS = 100_000
ARRAY_MB = 200
QUICK_ARRAY_MB = 20
N_DEFS = 25  # functions and as many classes
KEY = "benchmark-signing-key-0123456789abcdef"
LIMITS = Limits(wall_time_s=None, memory_bytes=None)
POLICY = Policy().with_modules(["numpy", "pandas"])
TURN_CODE = "turns += 1\nturns"
TURN_NAMESPACES = ("3 small dicts", "100k dicts", "1M ints")
METHODS = ("snapcell", "pickle+zstd", "dill", "monty")

SMALL = """config = {"model": "m-1", "temperature": 0.2, "tools": ["search", "sql"]}
user = {"id": 42, "name": "Ada", "tags": ["admin", "beta"]}
totals = {"orders": 17, "revenue": 1234.5, "currency": "EUR"}
"""
DICTS = 'rows = [{"id": i, "name": f"n{i}", "v": i * 0.5} for i in range(100_000)]\n'
INTS = "numbers = list(range(1_000_000))\n"
FRAME = """import numpy as np
import pandas as pd
n = {rows}
noise = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) % np.uint64(2**32)) / 2**32
df = pd.DataFrame({{
    "id": np.arange(n),
    "price": noise * 100,
    "name": "item-" + pd.Series(np.arange(n) % 5000).astype(str),
    "at": pd.date_range("2024-01-01", periods=n, freq="s"),
    "kind": pd.Categorical(np.array(["new", "paid", "shipped"])[(noise * 3).astype(int)]),
}})
"""
# Multiplicative hashing stands in for np.random (which the restricted policy hides): values that do not compress.
ARRAY = (
    "import numpy as np\n"
    "array = np.arange({mb} * 131072, dtype=np.uint64) * np.uint64(2654435761) % np.uint64(2**32) / 2**32\n"
)
DEFS = (
    "\n".join(
        f"def f{i}(x, k={i}):\n    return helper(x) + k\n\n\n"
        f"class C{i}:\n    scale = {i}\n\n    def __init__(self, v):\n        self.v = v\n\n"
        f"    def value(self):\n        return self.v * self.scale\n\n"
        for i in range(N_DEFS)
    )
    + "\ndef helper(x):\n    return x * 2\n\n\nobjs = [C3(1), C7(2)]\n"
)


@dataclass(frozen=True)
class Namespace:
    name: str
    script: str
    reps: int
    numeric: bool = False  # needs numpy or pandas (monty cannot import them)
    functions: bool = False  # holds script-defined functions (plain pickle cannot)


def namespaces(quick: bool) -> list[Namespace]:
    rows, mb = (QUICK_DF_ROWS, QUICK_ARRAY_MB) if quick else (DF_ROWS, ARRAY_MB)
    reps = QUICK_REPS if quick else REPS
    return [
        Namespace("3 small dicts", SMALL, reps),
        Namespace("100k dicts", DICTS, reps),
        Namespace("1M ints", INTS, reps),
        Namespace(f"DataFrame {rows // 1000}k rows", FRAME.format(rows=rows), reps if quick else BIG_REPS, True),
        Namespace(f"{mb} MB float64", ARRAY.format(mb=mb), reps if mb < 100 else BIG_REPS, True),
        Namespace(f"{2 * N_DEFS} functions+classes", DEFS, reps, functions=True),
    ]


def host_variables(script: str) -> types.ModuleType:
    """Run ``script`` in this process, in a module registered in ``sys.modules`` (dill needs that)."""
    module = types.ModuleType("bench_namespace")
    sys.modules["bench_namespace"] = module
    exec(compile(script, "<namespace>", "exec"), module.__dict__)
    return module


def variables(module: types.ModuleType) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items() if not k.startswith("__") and not isinstance(v, types.ModuleType)}


class Methods:
    """One repetition of each method on one namespace; records each method's checkpoint size."""

    def __init__(self, ns: Namespace, pool: Pool, monty: Any) -> None:
        self.ns = ns
        self.pool = pool
        self.monty = monty
        self.module = host_variables(ns.script)
        self.imports = "\n".join(line for line in ns.script.splitlines() if line.startswith("import "))
        self.sizes: dict[str, int] = {}

    def snapcell(self) -> dict[str, float]:
        store = self.pool.store
        for info in list(store.scan()):  # an empty store, so blobs are neither shared nor left out of the size
            store.delete(info.key)
        # A first dump: the host has scanned none of its pickles before (a pool remembers the streams it passed).
        self.pool._inner._passed_frames = PassedFrames()
        wait_warm_sync(self.pool)
        with self.pool.checkout() as session:
            result = session.run(self.ns.script)
            if result.error is not None:
                raise result.error
            wait_warm_sync(self.pool)  # the replacement worker's start-up would compete for the CPU
            checkpoint_id, dump_s = timed(session.dump)
        self.sizes["snapcell"] = sum(info.size for info in store.scan())  # the checkpoint and its blobs
        wait_warm_sync(self.pool)
        with self.pool.checkout() as session:
            # The other methods run where numpy and pandas are imported already: so does the loading worker.
            session.run(self.imports)
            wait_warm_sync(self.pool)
            _, load_s = timed(lambda: session.load_session(checkpoint_id))
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def pickle_zstd(self) -> dict[str, float]:
        names = variables(self.module)

        def dump() -> bytes:
            return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(pickle.dumps(names, protocol=5))

        blob, dump_s = timed(dump)
        self.sizes["pickle+zstd"] = len(blob)
        _, load_s = timed(lambda: pickle.loads(zstandard.ZstdDecompressor().decompress(blob)))
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def dill(self) -> dict[str, float]:
        def dump() -> bytes:
            out = io.BytesIO()
            dill.dump_module(out, module=self.module)
            return out.getvalue()

        sys.modules["bench_namespace"] = self.module
        blob, dump_s = timed(dump)
        self.sizes["dill"] = len(blob)
        fresh = types.ModuleType("bench_namespace")
        sys.modules["bench_namespace"] = fresh
        try:
            _, load_s = timed(lambda: dill.load_module(io.BytesIO(blob), module=fresh))
        finally:
            sys.modules["bench_namespace"] = self.module
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def monty_trial(self) -> dict[str, float]:
        with self.monty.checkout() as session:
            session.feed_run(self.ns.script)
            state, dump_s = timed(session.dump)
        self.sizes["monty"] = len(state)
        with self.monty.checkout() as session:
            _, load_s = timed(lambda: session.load_session(state))
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def trials(self) -> dict[str, Callable[[], dict[str, float]]]:
        found: dict[str, Callable[[], dict[str, float]]] = {"snapcell": self.snapcell, "dill": self.dill}
        if not self.ns.functions:
            found["pickle+zstd"] = self.pickle_zstd
        if self.monty is not None and not self.ns.numeric:
            found["monty"] = self.monty_trial
        return found

    def namespace_bytes(self) -> int:
        names = variables(self.module)
        return len(dill.dumps(names) if self.ns.functions else pickle.dumps(names, protocol=5))


def checkpoint_rows(quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    monty = pydantic_monty.Monty(min_processes=1) if pydantic_monty is not None else None
    with Pool("memory://", signing_keys=[KEY], policy=POLICY, limits=LIMITS) as pool:
        if monty is not None:
            monty.__enter__()
        try:
            for ns in namespaces(quick):
                methods = Methods(ns, pool, monty)
                size = methods.namespace_bytes()
                samples = alternate(methods.trials(), ns.reps)
                base = samples["snapcell"]
                for method in METHODS:
                    record: dict[str, Any] = {"method": method, "namespace": ns.name, "namespace_bytes": size}
                    if method not in samples:
                        why = "cannot import numpy/pandas" if ns.numeric else "cannot pickle script-defined functions"
                        rows.append({**record, "note": f"n/a: {why}"})
                        continue
                    record |= metric_fields(samples[method], base) | {"reps": ns.reps}
                    record["size_bytes"] = methods.sizes[method]
                    record["size_ratio"] = round(methods.sizes[method] / methods.sizes["snapcell"], 2)
                    rows.append(record)
                del methods
                sys.modules.pop("bench_namespace", None)
                gc.collect()
        finally:
            if monty is not None:
                monty.__exit__(None, None, None)
    return rows


@dataclass(frozen=True)
class Target:
    """A target of the checkpoint path: snapcell's median ``metric`` at most ``bound`` times ``baseline``'s."""

    namespace: str
    metric: str
    baseline: str
    bound: float

    def describe(self) -> str:
        what = "first dump" if self.namespace.startswith("DataFrame") else self.metric
        return f"{what} <= {self.bound:g}x {self.baseline}"


def targets(quick: bool) -> list[Target]:
    frame = next(ns.name for ns in namespaces(quick) if ns.name.startswith("DataFrame"))
    return [
        Target(f"{2 * N_DEFS} functions+classes", "dump", "dill", 1.0),
        Target("3 small dicts", "dump", "monty", 3.0),
        Target("3 small dicts", "load", "monty", 3.0),
        Target(frame, "dump", "pickle+zstd", 3.0),
    ]


def target_rows(rows: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """Each target's verdict, with snapcell's and the baseline's medians from the same run beside it."""
    medians = {
        (row["namespace"], row["method"], metric): row[f"{metric}_ms"]["median"]
        for row in rows
        for metric in ("dump", "load")
        if f"{metric}_ms" in row
    }
    out = []
    for target in targets(quick):
        record: dict[str, Any] = {"method": "target", "namespace": target.namespace, "target": target.describe()}
        mine = medians.get((target.namespace, "snapcell", target.metric))
        theirs = medians.get((target.namespace, target.baseline, target.metric))
        if mine is None or theirs is None:
            out.append({**record, "note": f"n/a: no {target.baseline if theirs is None else 'snapcell'} row"})
            continue
        ratio = mine / theirs
        met = ratio <= target.bound
        record["met"] = "met" if met else "missed"
        # The line `python -m benchmarks` prints after its table, as every benchmark's verdict reads.
        record["verdict"] = (
            f"target {target.namespace} {target.describe()}: snapcell {mine:.3f} ms vs {target.baseline} "
            f"{theirs:.3f} ms = {ratio:.1f}x (at most {target.bound:g}x): {'met' if met else 'MISSED'}"
        )
        record[f"snapcell_{target.metric}_ms"] = mine
        record[f"baseline_{target.metric}_ms"] = theirs
        record["ratio_to_baseline"] = round(ratio, 2)
        out.append(record)
    return out


class Turns:
    """Full turns of one namespace on several pools, each continuing from its own last checkpoint."""

    def __init__(self, pools: dict[str, Pool], script: str) -> None:
        self.pools = pools
        self.heads: dict[str, bytes] = {}
        self.sizes: dict[str, int] = {}
        for name, pool in pools.items():
            with pool.checkout() as session:
                session.feed_run(script + "turns = 0\n")
                self.heads[name] = session.dump()

    def turn(self, name: str) -> dict[str, float]:
        wait_warm_sync(self.pools[name])
        start = time.perf_counter()
        with self.pools[name].checkout() as session:
            loading = time.perf_counter()
            session.load_session(self.heads[name])
            loaded = time.perf_counter()
            session.feed_run(TURN_CODE)
            dumping = time.perf_counter()
            self.heads[name] = session.dump()
            dumped = time.perf_counter()
            self.sizes[name] = session.checkpoint_bytes or 0
        return {"full_turn": time.perf_counter() - start, "load": loaded - loading, "dump": dumped - dumping}


def turn_rows(quick: bool) -> list[dict[str, Any]]:
    """Full turns in process mode on each store, alternating stores; ratios are to the memory store."""
    scripts = {ns.name: ns.script for ns in namespaces(quick) if ns.name in TURN_NAMESPACES}
    rows: list[dict[str, Any]] = []
    with open_backends() as stores:
        pools = {name: Pool(store, signing_keys=[KEY], limits=LIMITS) for name, store in stores.items()}
        try:
            for ns_name, script in scripts.items():
                turns = Turns(pools, script)
                trials = {name: functools.partial(turns.turn, name) for name in pools}
                samples = alternate(trials, QUICK_TURN_REPS if quick else TURN_REPS, warmup=1)
                for name in pools:
                    rows.append(
                        {
                            "method": f"snapcell process, {name} store",
                            "namespace": ns_name,
                            "size_bytes": turns.sizes[name],
                            **metric_fields(samples[name], samples["memory"]),
                        }
                    )
        finally:
            for pool in pools.values():
                pool.close()
    return rows


def main() -> None:
    args = parse_args(__doc__, "100k-row DataFrame and 20 MB array instead of 1M rows and 200 MB; fewer reps")
    rows = checkpoint_rows(args.quick)
    turns = turn_rows(args.quick)
    flat = [
        {
            **row,
            "dump_median": row.get("dump_ms", {}).get("median"),
            "load_median": row.get("load_ms", {}).get("median"),
            "dump_min": row.get("dump_ms", {}).get("min"),
            "dump_max": row.get("dump_ms", {}).get("max"),
            "size": row.get("size_bytes", row.get("note")),
        }
        for row in rows
    ]
    print_table(
        flat,
        [
            ("namespace", "namespace"),
            ("method", "method"),
            ("dump ms min", "dump_min"),
            ("median", "dump_median"),
            ("max", "dump_max"),
            ("load ms median", "load_median"),
            ("size bytes", "size"),
            ("dump x", "dump_ratio"),
            ("load x", "load_ratio"),
            ("size x", "size_ratio"),
        ],
    )
    print()
    print_table(
        [
            {
                **row,
                **row["full_turn_ms"],
                "load_median": row["load_ms"]["median"],
                "dump_median": row["dump_ms"]["median"],
            }
            for row in turns
        ],
        [
            ("full turn", "method"),
            ("namespace", "namespace"),
            ("min ms", "min"),
            ("median", "median"),
            ("max", "max"),
            ("load ms median", "load_median"),
            ("dump ms median", "dump_median"),
            ("checkpoint bytes", "size_bytes"),
            ("x memory", "full_turn_ratio"),
        ],
    )
    verdicts = target_rows(rows, args.quick)
    print()
    print_table(
        [
            {
                **row,
                "mine": row.get("snapcell_dump_ms", row.get("snapcell_load_ms")),
                "theirs": row.get("baseline_dump_ms", row.get("baseline_load_ms")),
                "verdict": row.get("met", row.get("note")),
            }
            for row in verdicts
        ],
        [
            ("target", "target"),
            ("namespace", "namespace"),
            ("snapcell ms", "mine"),
            ("baseline ms", "theirs"),
            ("x baseline", "ratio_to_baseline"),
            ("verdict", "verdict"),
        ],
    )
    path = write_jsonl("namespaces", rows + turns + verdicts)
    print(f"\nratios are to snapcell (x < 1: faster or smaller); full turns to the memory store; appended to {path}")


if __name__ == "__main__":
    main()
