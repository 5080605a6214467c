"""How long do dump and load take, and how big is a checkpoint, compared with plain pickle+zstd and dill?

For each namespace, three methods serialize the same objects and restore them:

- ``snapcell``: ``session.dump()`` / ``load_session()`` on a memory store, inline isolation (pickling,
  compression, signing, storing, verifying and unpickling; no worker process).
- ``pickle+zstd``: ``pickle.dumps`` (protocol 5, buffers in band) of a dict of the variables, zstd level 1.
- ``dill``: ``dill.dump_module`` of a module holding the variables into a BytesIO, ``load_module`` back; size raw.

Methods alternate within each repetition. Prints dump ms min/median/max, load ms median, size in bytes, and
ratios to snapcell; appends JSON lines to ``benchmarks/results/checkpoint.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_checkpoint [--quick]`` (``--quick`` skips 200 MB).
"""

from __future__ import annotations

import argparse
import gc
import io
import pickle
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import dill
import numpy as np
import zstandard

from benchmarks._common import alternate, print_table, ratio, summarize_ms, timed, write_jsonl
from snapcell import Limits, Policy, Pool
from snapcell.checkpoint import Keyring

REPS = 3
BIG_REPS = 1  # the 200 MB namespace
ZSTD_LEVEL = 1
N_DICTS = 100_000
N_INTS = 1_000_000
N_FLOATS = 25_000_000  # 200 MB of float64
KEY = "benchmark-signing-key-0123456789abcdef"
METHODS = ("snapcell", "pickle+zstd", "dill")


def small_dicts() -> dict[str, Any]:
    return {
        "config": {"model": "m-1", "temperature": 0.2, "tools": ["search", "sql"]},
        "user": {"id": 42, "name": "Ada", "tags": ["admin", "beta"]},
        "totals": {"orders": 17, "revenue": 1234.5, "currency": "EUR"},
    }


def many_dicts() -> dict[str, Any]:
    return {"rows": [{"id": i, "name": f"n{i}", "v": i * 0.5} for i in range(N_DICTS)]}


def int_list() -> dict[str, Any]:
    return {"numbers": list(range(N_INTS))}


def float_array() -> dict[str, Any]:
    return {"array": np.random.default_rng(0).random(N_FLOATS)}


NAMESPACES: dict[str, tuple[Callable[[], dict[str, Any]], int]] = {
    "3 small dicts": (small_dicts, REPS),
    "100k dicts": (many_dicts, REPS),
    "1M ints": (int_list, REPS),
    "200MB float64": (float_array, BIG_REPS),
}


class Methods:
    """One repetition of each method over the same variables; records the checkpoint size."""

    def __init__(self, variables: Mapping[str, Any], pool: Pool) -> None:
        self.variables = dict(variables)
        self.pool = pool
        self.keyring = Keyring([KEY])
        self.sizes: dict[str, int] = {}

    def snapcell(self) -> dict[str, float]:
        with self.pool.checkout() as session:
            # Host functions hand the session the very objects the other methods see (no copies, no source text).
            code = "\n".join(f"{name} = get({name!r})" for name in self.variables)
            session.feed_run(code, external_lookup={"get": self.variables.__getitem__})
            checkpoint_id, dump_s = timed(session.dump)
            self.sizes["snapcell"] = session.checkpoint_bytes or 0
        with self.pool.checkout() as session:
            _, load_s = timed(lambda: session.load_session(checkpoint_id))
        self.pool.store.delete(self.keyring.parse_id(checkpoint_id).storage_key)
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def pickle_zstd(self) -> dict[str, float]:
        def dump() -> bytes:
            data = pickle.dumps(self.variables, protocol=5)
            return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)

        blob, dump_s = timed(dump)
        self.sizes["pickle+zstd"] = len(blob)
        _, load_s = timed(lambda: pickle.loads(zstandard.ZstdDecompressor().decompress(blob)))
        gc.collect()
        return {"dump": dump_s, "load": load_s}

    def dill(self) -> dict[str, float]:
        module = types.ModuleType("bench_namespace")
        module.__dict__.update(self.variables)

        def dump() -> bytes:
            out = io.BytesIO()
            dill.dump_module(out, module=module)
            return out.getvalue()

        sys.modules["bench_namespace"] = module
        try:
            blob, dump_s = timed(dump)
            self.sizes["dill"] = len(blob)
            fresh = types.ModuleType("bench_namespace")
            sys.modules["bench_namespace"] = fresh
            _, load_s = timed(lambda: dill.load_module(io.BytesIO(blob), module=fresh))
        finally:
            sys.modules.pop("bench_namespace", None)
        gc.collect()
        return {"dump": dump_s, "load": load_s}


def run(quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    policy = Policy().with_modules(["numpy"])
    limits = Limits(wall_time_s=None, memory_bytes=None)
    with Pool("memory://", signing_keys=[KEY], isolation="inline", policy=policy, limits=limits) as pool:
        for namespace, (build, reps) in NAMESPACES.items():
            if quick and namespace.startswith("200MB"):
                continue
            methods = Methods(build(), pool)
            samples = alternate(
                {"snapcell": methods.snapcell, "pickle+zstd": methods.pickle_zstd, "dill": methods.dill}, reps
            )
            base = samples["snapcell"]
            for method in METHODS:
                dump_ms, load_ms = summarize_ms(samples[method]["dump"]), summarize_ms(samples[method]["load"])
                rows.append(
                    {
                        "method": method,
                        "namespace": namespace,
                        "reps": reps,
                        "dump_ms": dump_ms,
                        "load_ms": load_ms,
                        "size_bytes": methods.sizes[method],
                        "dump_ratio": ratio(dump_ms["median"], summarize_ms(base["dump"])["median"]),
                        "load_ratio": ratio(load_ms["median"], summarize_ms(base["load"])["median"]),
                        "size_ratio": ratio(methods.sizes[method], methods.sizes["snapcell"]),
                    }
                )
            del methods
            gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 200 MB namespace")
    args = parser.parse_args()
    rows = run(args.quick)
    flat = [
        {
            **row,
            "dump_min": row["dump_ms"]["min"],
            "dump_median": row["dump_ms"]["median"],
            "dump_max": row["dump_ms"]["max"],
            "load_median": row["load_ms"]["median"],
        }
        for row in rows
    ]
    print_table(
        flat,
        [
            ("method", "method"),
            ("namespace", "namespace"),
            ("dump ms min", "dump_min"),
            ("median", "dump_median"),
            ("max", "dump_max"),
            ("load ms median", "load_median"),
            ("size bytes", "size_bytes"),
            ("dump x", "dump_ratio"),
            ("load x", "load_ratio"),
            ("size x", "size_ratio"),
        ],
    )
    path = write_jsonl("checkpoint", rows)
    print(f"\nratios are to snapcell (x < 1: faster or smaller than snapcell); results appended to {path}")


if __name__ == "__main__":
    main()
