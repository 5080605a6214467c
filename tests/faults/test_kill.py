"""SIGKILL the host at random points over many turns: no turn lost or run twice, every head loads, nothing leaks.

A driver subprocess (`kill_driver`) runs turns of three conversations through `CodeTool` in process isolation,
with a stable ``holder_id``; the test SIGKILLs it, starts it again (it retries the interrupted turn with the same
turn ID and goes on), and after the last kill lets it finish. Every head-store window is hit on purpose once (the
driver pauses at a hook and is killed there), the other kills come after a random delay (a seeded RNG: the seed is
printed, and ``SNAPCELL_FAULT_SEED`` replays it). Then:

- each conversation's namespace holds every turn exactly once and in order (``log == [1..N]``), and every
  checkpoint in its history loads and holds the turns before it;
- no committed turn ran again (its run is the last one the host function saw), and every turn was acknowledged
  with the answer of the run that committed it;
- no worker of a killed driver outlives it (its pid namespace), no scratch directory of a killed driver survives the
  next pool start, and no scratch tmpfs of a dead worker stays mounted.

The CI run is ``KILLS`` kills per backend; ``-m soak`` runs ``SOAK_KILLS``. Time bounds are hang guards only.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from snapcell import Pool
from snapcell.heads import HeadStore, S3Heads, SQLiteHeads
from snapcell.storage import S3Config, S3Store, Store, open_store
from tests.faults.kill_driver import HOOKS, DriverConfig, next_turns, read_lines, turn_id
from tests.s3server import TEST_CREDENTIALS, TEST_REGION

ROOT = Path(__file__).resolve().parents[2]
KEY = "kill-test-signing-key-0123456789abcdef"
CONVERSATIONS = ("c0", "c1", "c2")
# Every hook once, and two kills at random: with both cores of a 2-core machine busy elsewhere, a backend's run took
# 28-35 s at 10 kills and 10-16 s at 8, well under a third of the 120 s per-test limit.
KILLS = 8
SOAK_KILLS = 120
HANG_GUARD_S = 90.0
# A killed host's workers die with it (their pid namespace); allow a loaded machine this long to deliver and reap.
WORKER_EXIT_GUARD_S = 20.0


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("SNAPCELL_FAULT_SEED") or random.randrange(2**32))
    print(f"fault seed {value}: rerun with SNAPCELL_FAULT_SEED={value}")  # shown when the test fails
    return value


# ------------------------------------------------------------------ the driver


class Driver:
    """One driver subprocess, its stdout lines on a queue and its stderr in a file."""

    def __init__(self, config: DriverConfig, env: dict[str, str], run: int) -> None:
        self.stderr_path = Path(config.state_dir) / f"stderr-{run}"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.kill_driver", config.to_json()],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.pid = self.proc.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def wait_for(self, prefix: str, timeout_s: float = HANG_GUARD_S) -> str | None:
        """The first line starting with ``prefix``, or None when the driver ended before printing one."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.kill()
                pytest.fail(f"the driver printed no {prefix!r} within {timeout_s} s:\n{self.stderr()}")
            if line is None:
                return None
            if line.startswith(prefix):
                return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ------------------------------------------------------------- processes left


def _proc_status(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as status:
        return dict(line.split(":", 1) for line in status.read().splitlines() if ":" in line)


def workers_of(hosts: set[int]) -> list[str]:
    """Live worker processes (``snapcell.worker._worker``) whose host, by argument or parent, is in ``hosts``.

    A worker's last argument is its host's pid; after the host dies its parent is someone else, so both count.
    """
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                argv = file.read().split(b"\0")
            if not any(b"snapcell.worker" in arg for arg in argv):
                continue
            status = _proc_status(pid)
        except OSError:
            continue  # gone meanwhile
        if status.get("State", "").strip().startswith(("Z", "X")):
            continue  # dead, waiting to be reaped
        args = [a for a in argv if a]
        host = int(args[-1]) if args and args[-1].isdigit() else -1
        if host in hosts or int(status.get("PPid", "0").strip() or 0) in hosts:
            found.append(f"pid {pid} (host {host}): {b' '.join(args).decode(errors='replace')}")
    return found


def assert_no_worker_outlives(host: int) -> None:
    deadline = time.monotonic() + WORKER_EXIT_GUARD_S
    while (left := workers_of({host})) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"workers of killed host {host} still run: {left}"


def scratch_mounts(under: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        lines = mounts.read().splitlines()
    return [line for line in lines if line.startswith("snapcell-scratch ") and str(under) in line]


# ------------------------------------------------------------------ backends


@dataclass
class Backend:
    """Where one run's checkpoints and heads live, for the driver and for the checks."""

    name: str
    store: str
    endpoint: str = ""

    def open(self) -> tuple[Store, HeadStore]:
        if self.name == "s3":
            bucket, _, prefix = self.store.partition("/")
            config = S3Config(endpoint_url=self.endpoint, region_name=TEST_REGION, **TEST_CREDENTIALS)
            store = S3Store(bucket, prefix, config=config)
            return store, S3Heads(store)
        return open_store(f"file://{self.store}"), SQLiteHeads(Path(self.store) / ".heads.sqlite3", create=False)


@pytest.fixture
def local_backend(tmp_path: Path) -> Backend:
    return Backend("local", str(tmp_path / "store"))


@pytest.fixture
def s3_backend(s3_server: str) -> Backend:
    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    bucket = f"kill-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    client.close()
    return Backend("s3", f"{bucket}/proj", s3_server)


# ------------------------------------------------------------------ the run


@dataclass
class Tally:
    kills: int = 0
    by_hook: dict[str, int] = field(default_factory=dict)
    dirs_left_by_kills: int = 0
    # Informative only: any worker start on the machine sweeps a dead worker's mount, maybe before it is counted.
    mounts_left_by_kills: int = 0
    workers_killed_with_host: int = 0
    driver_runs: int = 0


class KillRun:
    """Start, kill and restart drivers over one backend; then check what they left."""

    def __init__(self, backend: Backend, tmp_path: Path, rng: random.Random, turns: int) -> None:
        self.backend = backend
        self.rng = rng
        self.turns = turns
        self.state = tmp_path / "state"
        self.temp = tmp_path / "tmp"  # the drivers' TMPDIR: their scratch directories, and no one else's
        self.state.mkdir()
        self.temp.mkdir()
        self.env = {
            **os.environ,
            "SNAPCELL_SIGNING_KEY": KEY,
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(self.temp),
        }
        self.dead: set[int] = set()
        self.tally = Tally()

    def config(self, pause: tuple[str, str, int] | None) -> DriverConfig:
        return DriverConfig(
            backend=self.backend.name,
            store=self.backend.store,
            endpoint=self.backend.endpoint,
            state_dir=str(self.state),
            conversations=CONVERSATIONS,
            turns=self.turns,
            holder_id="kill-driver",
            pause=pause,
        )

    def start(self, pause: tuple[str, str, int] | None = None) -> Driver:
        self.tally.driver_runs += 1
        return Driver(self.config(pause), self.env, self.tally.driver_runs)

    def kill(self, driver: Driver, why: str) -> None:
        had_workers = bool(workers_of({driver.pid}))
        driver.kill()
        self.dead.add(driver.pid)
        self.tally.kills += 1
        self.tally.by_hook[why] = self.tally.by_hook.get(why, 0) + 1
        assert_no_worker_outlives(driver.pid)
        self.tally.workers_killed_with_host += had_workers
        self.tally.dirs_left_by_kills += any(self.temp.glob(f"snapcell-workers-{driver.pid}-*"))
        self.tally.mounts_left_by_kills += len(scratch_mounts(self.temp / f"snapcell-workers-{driver.pid}-"))

    def kill_at_hook(self, hook: str) -> None:
        """Kill the driver when it reaches ``hook`` in the next turn of a conversation with turns to go."""
        upcoming = next_turns(self.state, CONVERSATIONS)
        # Two turns to go at least: the next turn may already be committed (killed before its ack), and then the
        # hooks of a running turn come only in the turn after it.
        candidates = [c for c in CONVERSATIONS if upcoming[c] < self.turns]
        assert candidates, "too few turns for the kills: raise the turns per conversation"
        conversation = self.rng.choice(candidates)
        driver = self.start((hook, conversation, upcoming[conversation]))
        if driver.wait_for("paused ") is None:
            driver.kill()
            pytest.fail(f"the driver ended before reaching hook {hook!r}:\n{driver.stderr()}")
        self.kill(driver, hook)

    def kill_at_random(self) -> None:
        driver = self.start()
        if self.rng.random() < 0.2:
            time.sleep(self.rng.uniform(0.0, 0.6))  # while it starts: imports, pool, first workers
        else:
            if driver.wait_for("ready") is None:
                driver.kill()
                pytest.fail(f"the driver ended before its pool was up:\n{driver.stderr()}")
            # A few more turns acknowledged (so kills land at every stage of a turn, not only the first), then a
            # random moment: progress, not time, bounds the turns a kill costs.
            self.wait_for_acks(driver, self.rng.randint(0, 1))
            # A random moment, but at most two more turns on: a fast driver (warm zygote workers) could otherwise
            # finish every turn before the kill.
            self.pause_at_most(driver, self.rng.uniform(0.0, 0.4), more_acks=2)
        if driver.proc.poll() is not None:
            driver.kill()
            pytest.fail(f"the driver ended before it was killed (code {driver.proc.returncode}):\n{driver.stderr()}")
        self.kill(driver, "random")

    def pause_at_most(self, driver: Driver, seconds: float, *, more_acks: int) -> None:
        """Let the driver run for ``seconds``, or until it acknowledged ``more_acks`` more turns or ended."""
        target = len(read_lines(self.state / "acks")) + more_acks
        until = time.monotonic() + seconds
        while time.monotonic() < until and driver.proc.poll() is None:
            if len(read_lines(self.state / "acks")) >= target:
                return
            time.sleep(0.005)

    def wait_for_acks(self, driver: Driver, more: int) -> None:
        target = len(read_lines(self.state / "acks")) + more
        deadline = time.monotonic() + HANG_GUARD_S
        while len(read_lines(self.state / "acks")) < target and driver.proc.poll() is None:
            if time.monotonic() > deadline:
                driver.kill()
                pytest.fail(f"the driver made no progress in {HANG_GUARD_S} s:\n{driver.stderr()}")
            time.sleep(0.02)

    def run(self, kills: int) -> None:
        # Every hook at least once (a soak: about one kill in three at a hook), the rest at random.
        at_hooks = [*HOOKS] * max(1, kills // (3 * len(HOOKS)))
        plan = [*at_hooks, *["random"] * max(kills - len(at_hooks), 0)]
        self.rng.shuffle(plan)
        for step in plan:
            if step == "random":
                self.kill_at_random()
            else:
                self.kill_at_hook(step)
        final = self.start()
        assert final.wait_for("done") is not None, f"the last driver did not finish:\n{final.stderr()}"
        code = final.proc.wait(timeout=HANG_GUARD_S)
        final.kill()  # reaped already: this only closes its pipe
        assert code == 0, final.stderr()

    # ------------------------------------------------------------- checks

    def check_turns(self) -> None:
        calls = read_lines(self.state / "calls")
        acks = read_lines(self.state / "acks")
        for conversation in CONVERSATIONS:
            acked = [turn for c, turn, _ in acks if c == conversation]
            assert acked == list(range(1, self.turns + 1)), f"{conversation}: acknowledged turns {acked}"
        for conversation, turn, token in acks:
            runs = [t for c, k, t in calls if (c, k) == (conversation, turn)]
            assert token in runs, f"turn {turn} of {conversation} answered for a run that never happened: {runs}"
            assert runs[-1] == token, f"turn {turn} of {conversation} ran again after it was committed: {runs}"

    def check_heads(self) -> None:
        store, heads = self.backend.open()
        try:
            with Pool(store, isolation="inline", signing_keys=[KEY]) as pool:
                for conversation in CONVERSATIONS:
                    head = heads.get(conversation)
                    assert head is not None and head.checkpoint_id is not None
                    assert head.lease_owner is None, f"{conversation}: lease left behind by {head.lease_owner!r}"
                    assert head.turn(turn_id(conversation, self.turns)) is not None
                    checkpoints = (head.checkpoint_id, *head.history)
                    assert len(checkpoints) == min(self.turns, heads.max_history + 1)  # type: ignore[attr-defined], f"{conversation}: {len(checkpoints)} checkpoints"
                    for age, checkpoint_id in enumerate(checkpoints):
                        with pool.checkout() as session:
                            session.load_session(checkpoint_id)
                            log = session.feed_run("log")
                        assert log == list(range(1, self.turns + 1 - age)), f"{conversation}, {age} back: {log}"
        finally:
            heads.close()
            close = getattr(store, "close", None)
            if close is not None:
                close()

    def check_leftovers(self) -> None:
        assert workers_of(self.dead) == []
        left = sorted(p.name for p in self.temp.glob("snapcell-workers-*"))
        assert left == [], f"scratch directories left after the last pool start and close: {left}"
        assert scratch_mounts(self.temp) == []

    def check(self) -> None:
        self.check_turns()
        self.check_heads()
        self.check_leftovers()
        # The checks above could not have failed had no kill left anything to clean up.
        assert self.tally.dirs_left_by_kills > 0 and self.tally.workers_killed_with_host > 0, self.tally
        assert set(self.tally.by_hook) >= set(HOOKS), self.tally


def _kill_run(backend: Backend, tmp_path: Path, seed: int, kills: int) -> None:
    rng = random.Random(seed)
    run = KillRun(backend, tmp_path, rng, turns=2 * kills + 4)
    try:
        run.run(kills)
        run.check()
    finally:
        print(f"seed {seed}: {run.tally}")
        for pid in sorted(run.dead):
            for line in workers_of({pid}):
                print(f"left running: {line}")


def test_kills_on_a_local_store_with_sqlite_heads(local_backend: Backend, tmp_path: Path, seed: int) -> None:
    _kill_run(local_backend, tmp_path, seed, KILLS)


@pytest.mark.integration
def test_kills_on_s3_with_s3_heads(s3_backend: Backend, tmp_path: Path, seed: int) -> None:
    _kill_run(s3_backend, tmp_path, seed, KILLS)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_soak_kills_on_a_local_store(local_backend: Backend, tmp_path: Path, seed: int) -> None:
    _kill_run(local_backend, tmp_path, seed, SOAK_KILLS)


@pytest.mark.soak
@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_soak_kills_on_s3(s3_backend: Backend, tmp_path: Path, seed: int) -> None:
    _kill_run(s3_backend, tmp_path, seed, SOAK_KILLS)
