"""What does a checkpoint's trip through storage cost on each backend?

Times ``put`` (create-only) and ``get`` of a small (2 KB) and a large (~5 MB) payload on the memory store, a local
directory and S3 through a moto server on loopback (started by this script, so it measures the client stack and
the HTTP round trip, not AWS). Backends alternate within each repetition so drift affects all of them alike.
Prints min/median/max milliseconds and appends JSON lines to ``benchmarks/results/storage.jsonl``.

Run from the repository root: ``python -m benchmarks.bench_storage``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from snapcell.storage import LocalStore, MemoryStore, S3Config, S3Store, Store

REPS = 15
WARMUP = 2
PAYLOADS = {"2KB": 2 * 1024, "5MB": 5 * 1024 * 1024}
BACKENDS = ("memory", "local", "s3")
RESULTS = Path(__file__).parent / "results" / "storage.jsonl"


def start_moto_server(timeout_s: float = 30.0) -> tuple[str, Callable[[], None]]:
    """Start ``python -m moto.server`` on a free loopback port; return its URL and a stop function.

    A copy of ``tests/s3server.py``'s helper, so the benchmark needs no pytest.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        proc.terminate()
        proc.wait(timeout=10)

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as response:
                response.read()
            return endpoint, stop
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"moto server did not start on {endpoint}") from None
            time.sleep(0.05)


@contextmanager
def open_backends() -> Iterator[dict[str, Store]]:
    """Open one store per backend; S3 gets a fresh bucket on a private moto server."""
    endpoint, stop = start_moto_server()
    try:
        with tempfile.TemporaryDirectory(prefix="snapcell-bench-") as tmp:
            config = S3Config(
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
            )
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            s3 = S3Store(bucket, "bench", config=config)
            s3.client.create_bucket(Bucket=bucket)
            stores: dict[str, Store] = {"memory": MemoryStore("bench"), "local": LocalStore(tmp), "s3": s3}
            try:
                yield stores
            finally:
                for store in stores.values():
                    store.close()
    finally:
        stop()


def trip(store: Store, data: bytes) -> tuple[float, float]:
    """Put then get ``data`` under a fresh key; return (put, get) milliseconds. The object is deleted after."""
    key = f"checkpoints/bench/{uuid.uuid4().hex}"
    start = time.perf_counter()
    store.put(key, data)
    middle = time.perf_counter()
    if store.get(key) != data:
        raise RuntimeError(f"{store.url} returned different bytes")
    end = time.perf_counter()
    store.delete(key)
    return (middle - start) * 1000, (end - middle) * 1000


def main() -> None:
    payloads = {name: os.urandom(size) for name, size in PAYLOADS.items()}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with open_backends() as stores:
        for rep in range(WARMUP + REPS):
            order = BACKENDS[rep % len(BACKENDS) :] + BACKENDS[: rep % len(BACKENDS)]
            for payload_name, data in payloads.items():
                for backend in order:
                    result = trip(stores[backend], data)
                    if rep >= WARMUP:
                        samples.setdefault((backend, payload_name), []).append(result)

    header = f"{'backend':<8} {'payload':<7} {'put min/med/max ms':>24} {'get min/med/max ms':>24} {'put+get med':>12}"
    print(header)
    print("-" * len(header))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with RESULTS.open("a") as out:
        for payload_name in PAYLOADS:
            for backend in BACKENDS:
                puts = [p for p, _ in samples[(backend, payload_name)]]
                gets = [g for _, g in samples[(backend, payload_name)]]
                both = [p + g for p, g in samples[(backend, payload_name)]]
                print(
                    f"{backend:<8} {payload_name:<7} {_fmt(puts):>24} {_fmt(gets):>24} {statistics.median(both):>12.2f}"
                )
                record = {
                    "bench": "storage",
                    "time": stamp,
                    "python": platform.python_version(),
                    "machine": platform.machine(),
                    "backend": backend,
                    "payload": payload_name,
                    "payload_bytes": PAYLOADS[payload_name],
                    "reps": REPS,
                    "put_ms": _stats(puts),
                    "get_ms": _stats(gets),
                    "put_get_median_ms": round(statistics.median(both), 3),
                }
                out.write(json.dumps(record, sort_keys=True) + "\n")
    print(f"results appended to {RESULTS}")


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _fmt(values: list[float]) -> str:
    s = _stats(values)
    return f"{s['min']:.2f}/{s['median']:.2f}/{s['max']:.2f}"


if __name__ == "__main__":
    main()
