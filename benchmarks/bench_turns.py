"""How close is a sandboxed ``run_code`` turn to monty's, and how many turns per second does a pool serve?

Side by side in one event loop, alternating every repetition:

- ``turn``: one ``run_code`` turn back to back on a conversation with a small namespace (a 100-item list of
  dicts, a counter): lease, head read, checkout, load, run, dump, head write, on a local store with SQLite
  heads. monty's row is its checkout + load + run + dump with the state kept as bytes in the host.
- ``turn_dataframe``: the same with a 1,000-row DataFrame in the namespace (monty cannot import pandas: its
  ratio is to monty's ``turn``).
- ``turn_warm`` / ``turn_warm_dataframe``: the same turns with ``keep_warm_s`` set, so the conversation's
  session stays live between turns and nothing is loaded.
- ``throughput``: ``CONVERSATIONS`` conversations of ``TURNS`` turns each, all at once on one tool (default
  pool: one worker per CPU): turns per second, p50/p99 turn latency, turns lost, and the resident memory of each
  worker (RSS, and PSS/USS from ``/proc/<pid>/smaps_rollup``: the zygote's pages a worker still shares
  count in its PSS only by share, and not at all in its USS). Twice: on a ``started`` pool (as a server's after its
  start-up: one turn served and the zygote's second stage, its heavy imports, done) and on a ``fresh`` one, whose
  first turns share the CPU with that second stage.

- ``floor: durable writes``: only what a turn writes to keep its answer through a crash, as a ``run_code`` turn
  does it, each in a thread: a checkpoint-sized file put on the same local store (synced with its directory) and
  the synced SQLite head write that names it. No worker, no run, no load: the least a durable turn costs here,
  which monty's turn (state kept as bytes in the host's memory) does not pay.

- ``cpu_per_turn``: CPU seconds per turn of ``CPU_TURNS`` back-to-back small turns of one conversation, cold and
  warm, of this process and every process under it (`tree_cpu_s`: the host's threads, the zygote, every worker,
  and the workers the zygote has reaped), each run ended once its turns' check-ins, reaping and the pool's refill are
  done; beside monty's turns (this process and monty's worker processes) and the durable writes alone.

Ratios are to monty's ``turn`` (x > 1: slower than monty), and ``cpu_per_turn``'s to monty's. Targets, printed with
the floors beside them (and as ``verdict`` lines for ``python -m benchmarks``): a turn's time beyond the durable
writes (measured alone in the same run) at most 2x monty's turn, 1.5x warm, 5x with the DataFrame; CPU per cold turn
at most 3x monty's turn plus the same writes, 1.5x warm; the load at least 60 turns/s with p99 at most 1 s, nothing
lost. Run from the repository root:
``python -m benchmarks.bench_turns [--quick]``; JSON lines go to ``benchmarks/results/turns.jsonl``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import (
    alternate_async,
    parse_args,
    print_table,
    ratio,
    summarize_ms,
    tree_cpu_s,
    wait_warm,
    write_jsonl,
)
from snapcell import AsyncPool, CodeTool, Policy
from snapcell.heads import SQLiteHeads
from snapcell.storage import LocalStore

try:
    import pydantic_monty
except ImportError:  # the bench extra is optional; monty rows are left out
    pydantic_monty = None  # type: ignore[assignment]

REPS = 20
QUICK_REPS = 8
WARMUP = 2
CONVERSATIONS = 50
TURNS = 10
WARM_WORKERS = 2  # workers started ahead of the cold turns
SETTLE_S = 0.02  # untimed pause before each measured turn: the previous turn's background check-in ends
KEY = "benchmark-signing-key-0123456789"
POLICY = Policy().with_modules(["pandas", "numpy"])
SETUP_CODE = 'rows = [{"id": i, "name": f"row-{i}", "v": i * 0.5} for i in range(100)]\nturns = 0\n'
TURN_CODE = 'turns += 1\ntotal = sum(r["v"] for r in rows)\n[turns, total]'
DF_SETUP = (
    "import pandas as pd\n"
    "df = pd.DataFrame({'id': range(1000), 'name': [f'row-{i}' for i in range(1000)], 'v': [i * 0.5 for i in "
    "range(1000)]})\nturns = 0\n"
)
DF_TURN = "turns += 1\ntotal = float(df['v'].sum())\n[turns, total]"
BASELINE = "monty"
FLOOR = "floor: durable writes"
CHECKPOINT_BYTES = 2048  # about what a small turn's checkpoint weighs (signed, compressed)
CPU_TURNS = 12  # back-to-back turns of one conversation per CPU measurement
COLD_CPU = "CPU per turn: snapcell cold"
WARM_CPU = "CPU per turn: snapcell warm"
# Targets: a turn's time beyond the durable writes, over monty's turn; CPU per turn over monty's plus the writes';
# the load's turns per second and p99.
TURN_TARGETS = {"turn": 2.0, "turn_warm": 1.5, "turn_dataframe": 5.0}
CPU_COLD_BOUND = 3.0
CPU_WARM_BOUND = 1.5
MIN_TURNS_PER_S = 60
MAX_P99_MS = 1000.0


class Tools:
    """The snapcell tools measured: cold (load every turn) and warm (``keep_warm_s``), on one process pool."""

    def __init__(self, root: Path) -> None:
        # Two warm conversations hold a worker each; the cold tool needs its own. Its two turns (small, then
        # DataFrame) run back to back, each on a fresh worker: with one worker started ahead, the DataFrame turn would
        # wait for the start-up of the worker that replaces the small turn's. A checked-in worker holds its slot
        # until it is reaped, so the limit leaves room for those besides the warm sessions and the two started
        # ahead (with 4, a cold turn evicted a warm conversation, and its next turn loaded like a cold one).
        self.pool = AsyncPool(
            LocalStore(root),
            isolation="process",
            policy=POLICY,
            signing_keys=[KEY],
            max_workers=8,
            min_warm_workers=WARM_WORKERS,
        )
        self.heads = SQLiteHeads(root / ".heads.sqlite3")
        self.cold = CodeTool(self.pool, heads=self.heads)
        self.warm = CodeTool(self.pool, heads=self.heads, keep_warm_s=600)

    async def open(self) -> None:
        await self.pool.__aenter__()
        for tool, prefix in ((self.cold, "cold"), (self.warm, "warm")):
            await tool.run_code(f"{prefix}-small", SETUP_CODE)
            await tool.run_code(f"{prefix}-df", DF_SETUP)

    async def close(self) -> None:
        await self.warm.aclose()
        await self.cold.aclose()
        await self.pool.__aexit__(None, None, None)

    async def trial(self) -> dict[str, float]:
        out = {}
        for metric, tool, conversation, code in (
            ("turn", self.cold, "cold-small", TURN_CODE),
            ("turn_dataframe", self.cold, "cold-df", DF_TURN),
            ("turn_warm", self.warm, "warm-small", TURN_CODE),
            ("turn_warm_dataframe", self.warm, "warm-df", DF_TURN),
        ):
            # As a server that is not saturated: the previous turn's check-in and the pool's refill are done.
            await wait_warm(self.pool)
            await asyncio.sleep(SETTLE_S)
            start = time.perf_counter()
            answer = await tool.run_code(conversation, code)
            out[metric] = time.perf_counter() - start
            if "Error" in answer:
                raise RuntimeError(f"{metric}: {answer}")
        return out

    async def settled(self) -> None:
        """Wait until every finished turn's check-in, worker kill and reaping is done and the pool has refilled.

        What a cold turn leaves running (its worker's teardown, the fork and set-up of the worker replacing it) is
        part of that turn's CPU.
        """
        for _ in range(3):
            await asyncio.gather(*self.cold._warm._closing, *self.warm._warm._closing, return_exceptions=True)
            workers = self.pool._workers
            if workers is not None:
                await asyncio.gather(*workers._reaping, return_exceptions=True)
            await wait_warm(self.pool)
            await asyncio.sleep(SETTLE_S)

    async def cpu_trial(self, tool: CodeTool, conversation: str) -> dict[str, float]:
        """CPU seconds per turn of `CPU_TURNS` back-to-back small turns (host, zygote and workers, reaped ones too)."""
        await self.settled()
        start = tree_cpu_s()
        for _ in range(CPU_TURNS):
            answer = await tool.run_code(conversation, TURN_CODE)
            if "Error" in answer:
                raise RuntimeError(answer)
        await self.settled()
        return {"cpu_per_turn": (tree_cpu_s() - start) / CPU_TURNS}

    async def cpu_cold(self) -> dict[str, float]:
        return await self.cpu_trial(self.cold, "cold-small")

    async def cpu_warm(self) -> dict[str, float]:
        return await self.cpu_trial(self.warm, "warm-small")


class DurableWrites:
    """A turn's durable writes alone (see the module docstring): a checkpoint-sized put, then the head write."""

    def __init__(self, root: Path) -> None:
        self.store = LocalStore(root)
        self.heads = SQLiteHeads(root / ".heads.sqlite3")
        self.version: str | None = None
        self.turns = 0

    def close(self) -> None:
        self.heads.close()

    async def trial(self) -> dict[str, float]:
        self.turns += 1
        key, body = f"floor/{self.turns:08d}", os.urandom(CHECKPOINT_BYTES)
        start = time.perf_counter()
        await asyncio.to_thread(self.store.put, key, body)
        self.version = await asyncio.to_thread(
            self.heads.compare_and_set, "floor", self.version, key.encode(), history=[key.encode()]
        )
        return {"turn": time.perf_counter() - start}

    async def cpu_trial(self) -> dict[str, float]:
        """CPU seconds per turn of `CPU_TURNS` durable writes back to back (this process and its threads only)."""
        start = tree_cpu_s()
        for _ in range(CPU_TURNS):
            await self.trial()
        return {"cpu_per_turn": (tree_cpu_s() - start) / CPU_TURNS}


class Monty:
    """monty's turn: checkout, load the previous dump, run, dump (state kept as bytes in the host)."""

    def __init__(self) -> None:
        self.pool: Any = pydantic_monty.AsyncMonty(min_processes=1) if pydantic_monty is not None else None
        self.state: Any = None

    async def open(self) -> None:
        await self.pool.__aenter__()
        async with self.pool.checkout() as session:
            await session.feed_run(SETUP_CODE)
            self.state = await session.dump()

    async def close(self) -> None:
        await self.pool.__aexit__(None, None, None)

    async def trial(self) -> dict[str, float]:
        start = time.perf_counter()
        async with self.pool.checkout() as session:
            await session.load_session(self.state)
            await session.feed_run(TURN_CODE)
            self.state = await session.dump()
        return {"turn": time.perf_counter() - start}

    async def cpu_trial(self) -> dict[str, float]:
        """CPU seconds per turn of `CPU_TURNS` turns back to back (this process and monty's worker processes)."""
        start = tree_cpu_s()
        for _ in range(CPU_TURNS):
            await self.trial()
        await asyncio.sleep(SETTLE_S)
        return {"cpu_per_turn": (tree_cpu_s() - start) / CPU_TURNS}


def _memory(pid: int) -> dict[str, int]:
    """RSS, PSS and USS of ``pid`` in bytes, from /proc/<pid>/smaps_rollup (empty where unreadable)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except OSError:
        return {}
    return {
        "rss": fields.get("Rss", 0),
        "pss": fields.get("Pss", 0),
        "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def _worker_pids(pool: AsyncPool) -> tuple[list[int], list[int]]:
    """The pids of the pool's zygotes and of their live children."""
    workers = pool._workers
    # A pool's zygotes are shared (one per preload set, per event loop): each entry holds the live one, if any.
    shared = workers._zygotes.values() if workers is not None else []
    zygotes = [s.zygote.pid for s in shared if s.zygote is not None]
    children = []
    for zygote in zygotes:
        try:
            for task in os.listdir(f"/proc/{zygote}/task"):
                with open(f"/proc/{zygote}/task/{task}/children") as listing:
                    children += [int(pid) for pid in listing.read().split()]
        except OSError:
            continue
    return zygotes, children


async def throughput(root: Path, *, started: bool) -> dict[str, Any]:
    """``CONVERSATIONS`` x ``TURNS`` turns at once on a pool and tool; latencies, losses and memory.

    ``started``: first serve one turn and wait until the zygote's second stage is done (see the module docstring);
    else the turns start with the pool.
    """
    # Every conversation may wait for a worker: the default queue (4 per worker) would refuse most of them at once
    # with Overloaded, which is the right answer for a server but not what this measures.
    pool = AsyncPool(LocalStore(root), isolation="process", signing_keys=[KEY], max_queued_checkouts=CONVERSATIONS)
    latencies: list[float] = []
    lost = 0
    memory: list[dict[str, int]] = []
    zygote_memory: list[dict[str, int]] = []
    async with pool:
        tool = CodeTool(pool, heads=SQLiteHeads(root / ".heads.sqlite3"), keep_warm_s=600)

        async def conversation(n: int) -> None:
            nonlocal lost
            for turn in range(TURNS):
                code = SETUP_CODE if turn == 0 else TURN_CODE
                start = time.perf_counter()
                try:
                    answer = await tool.run_code(f"conversation-{n}", code)
                except Exception:  # counted as lost; the benchmark goes on
                    lost += 1
                    continue
                latencies.append(time.perf_counter() - start)
                if "Error" in answer or "restarted" in answer:
                    lost += 1

        async def sample() -> None:
            while True:
                await asyncio.sleep(0.2)
                zygotes, children = _worker_pids(pool)
                memory.extend(m for m in map(_memory, children) if m)
                zygote_memory.extend(m for m in map(_memory, zygotes) if m)

        if started:
            async with pool.checkout() as session:  # not a turn of the tool: a warm session would keep its worker
                await session.feed_run("1")
            await _preloaded(pool)
        sampler = asyncio.ensure_future(sample())
        start = time.perf_counter()
        await asyncio.gather(*(conversation(n) for n in range(CONVERSATIONS)))
        elapsed = time.perf_counter() - start
        sampler.cancel()
        await tool.aclose()
    ordered = sorted(latencies)

    def median_mb(samples: list[dict[str, int]], key: str) -> float | None:
        return round(statistics.median(m[key] for m in samples) / 2**20, 1) if samples else None

    return {
        "pool": "started" if started else "fresh",
        "conversations": CONVERSATIONS,
        "turns_per_conversation": TURNS,
        "turns_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 1) if ordered else None,
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1) if ordered else None,
        "lost": lost,
        "worker_rss_mb": median_mb(memory, "rss"),
        "worker_pss_mb": median_mb(memory, "pss"),
        "worker_uss_mb": median_mb(memory, "uss"),
        "zygote_rss_mb": median_mb(zygote_memory, "rss"),
        "workers": pool.max_workers,
    }


async def _preloaded(pool: AsyncPool, timeout_s: float = 30.0) -> None:
    """Wait until the pool's zygote has finished its heavy imports (`AsyncPool.isolation_report` says so)."""
    deadline = time.monotonic() + timeout_s
    while "(importing)" in (await pool.isolation_report()).get("start", "") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def measure(quick: bool, root: Path) -> tuple[dict[str, dict[str, list[float]]], list[dict[str, Any]]]:
    tools = Tools(root / "turns")
    monty = Monty()
    floor = DurableWrites(root / "floor")
    trials: dict[str, Callable[[], Any]] = {"snapcell process": tools.trial, FLOOR: floor.trial}
    cpu: dict[str, Callable[[], Any]] = {COLD_CPU: tools.cpu_cold, WARM_CPU: tools.cpu_warm, FLOOR: floor.cpu_trial}
    reps = QUICK_REPS if quick else REPS
    try:
        await tools.open()
        if monty.pool is not None:
            await monty.open()
            trials["monty"] = monty.trial
            cpu["monty"] = monty.cpu_trial
        samples = await alternate_async(trials, reps, warmup=WARMUP)
        for name, metrics in (await alternate_async(cpu, max(3, reps // 2), warmup=1)).items():
            samples.setdefault(name, {}).update(metrics)
    finally:
        floor.close()
        await tools.close()
        if monty.pool is not None:
            await monty.close()
    loads = []
    for started in (True, False):
        loads.append(await throughput(root / f"throughput-{'started' if started else 'fresh'}", started=started))
    return samples, loads


def verdicts(samples: dict[str, dict[str, list[float]]], loads: list[dict[str, Any]]) -> list[str]:
    """One line per target: the figure, the bound, met or MISSED, and the floors beside it."""
    med = {name: {k: summarize_ms(v)["median"] for k, v in metrics.items()} for name, metrics in samples.items()}
    lines = []
    if BASELINE in med:
        monty, writes = med[BASELINE]["turn"], med[FLOOR]["turn"]
        for metric, bound in TURN_TARGETS.items():
            ours = med["snapcell process"][metric]
            times = (ours - writes) / monty
            lines.append(
                f"target {metric}: ({ours:.2f} ms - durable writes {writes:.2f} ms) / monty's turn {monty:.2f} ms = "
                f"{times:.1f}x (at most {bound}x): {'met' if times <= bound else 'MISSED'}; "
                f"floor: the writes alone are {writes / monty:.1f}x monty's turn"
            )
        monty_cpu, writes_cpu = med[BASELINE]["cpu_per_turn"], med[FLOOR]["cpu_per_turn"]
        for name, bound in ((COLD_CPU, CPU_COLD_BOUND), (WARM_CPU, CPU_WARM_BOUND)):
            ours = med[name]["cpu_per_turn"]
            times = ours / (monty_cpu + writes_cpu)
            lines.append(
                f"target {name}: {ours:.2f} ms / (monty's turn {monty_cpu:.2f} ms + durable writes {writes_cpu:.2f} ms "
                f"of CPU) = {times:.1f}x (at most {bound}x): {'met' if times <= bound else 'MISSED'}"
            )
    for load in loads:
        met = load["turns_per_s"] >= MIN_TURNS_PER_S and (load["p99_ms"] or 1e9) <= MAX_P99_MS and not load["lost"]
        lines.append(
            f"target throughput ({load['pool']} pool): {load['turns_per_s']} turns/s (at least {MIN_TURNS_PER_S}), "
            f"p99 {load['p99_ms']} ms (at most {MAX_P99_MS:g}), {load['lost']} lost: {'met' if met else 'MISSED'}"
        )
    return lines


def main() -> None:
    args = parse_args(__doc__, "fewer repetitions")
    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        samples, loads = asyncio.run(measure(args.quick, Path(tmp)))
    rows, records = [], []
    for name, metrics in samples.items():
        for metric, seconds in metrics.items():
            summary = summarize_ms(seconds)
            # CPU per turn is compared with monty's CPU per turn; every time with monty's turn.
            own = samples.get(BASELINE, {}).get("cpu_per_turn" if metric == "cpu_per_turn" else "turn")
            x = ratio(summary["median"], summarize_ms(own)["median"]) if own else None
            rows.append({"metric": metric, "method": name, **summary, "ratio": x})
            records.append({"method": name, "metric": metric, f"{metric}_ms": summary, "monty_ratio": x})
    print_table(
        rows,
        [("metric", "metric"), ("method", "method"), ("min ms", "min"), ("median", "median"), ("max", "max")]
        + [("x monty", "ratio")],
    )
    for load in loads:
        print(
            f"\nthroughput on a {load['pool']} pool: {load['conversations']} conversations x "
            f"{load['turns_per_conversation']} turns on {load['workers']} workers: {load['turns_per_s']} turns/s, "
            f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms, {load['lost']} lost; per worker RSS "
            f"{load['worker_rss_mb']} MB, PSS {load['worker_pss_mb']} MB, USS {load['worker_uss_mb']} MB "
            f"(zygote RSS {load['zygote_rss_mb']} MB)"
        )
        records.append({"method": "snapcell process", "metric": "throughput", **load})
    print()
    for line in verdicts(samples, loads):
        print(line)
        records.append({"verdict": line})
    path = write_jsonl("turns", [r | {"reps": QUICK_REPS if args.quick else REPS} for r in records])
    print(f"\nratios are to monty's turn (checkout+load+run+dump); results appended to {path}")


if __name__ == "__main__":
    main()
