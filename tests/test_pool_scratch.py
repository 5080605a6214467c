"""Scratch directories of hosts that died without closing their pool are reclaimed by the next pool."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from snapcell import AsyncPool, Pool
from snapcell.sandbox._scratch import _process_start, reclaim_scratch_dirs

HOST = """
import sys
from snapcell import Pool
pool = Pool("memory://", min_warm_workers=0, max_workers=1)
with pool.checkout() as session:
    assert session.feed_run("1 + 1") == 2
    print(pool.aio._workers.scratch_root, flush=True)
    sys.stdin.read()  # a host at work, until the test ends it
"""


def _start_host(temp_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "TMPDIR": str(temp_dir)}
    host = subprocess.Popen(
        [sys.executable, "-c", HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert host.stdout is not None
    line = host.stdout.readline().strip()
    assert line, "the host did not start its pool"
    root = Path(line)
    assert root.parent == temp_dir and any(root.glob("session-*")), "the session has no directory"
    return host, root


def _workers_in(root: Path) -> list[int]:
    """Live processes whose working directory is under ``root`` (a worker works in its session directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cwd.startswith(str(root)) and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _wait_for_workers_to_exit(root: Path) -> None:
    for _ in range(600):  # a hang guard, not a timing bound: at most 60 s
        if not _workers_in(root):
            return
        time.sleep(0.1)
    raise AssertionError(f"workers of a killed host still run: {_workers_in(root)}")


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_killed_hosts_directory_is_reclaimed_and_a_live_hosts_is_not(temp_dir: Path) -> None:
    dead, dead_root = _start_host(temp_dir)
    live, live_root = _start_host(temp_dir)
    try:
        assert dead_root.name.startswith(f"snapcell-workers-{dead.pid}-")  # named after its host
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=60)
        assert dead_root.exists()  # a killed host cannot clean up after itself
        _wait_for_workers_to_exit(dead_root)  # their pid namespace ends them, not at once; a live one keeps its mount
        with Pool("memory://", min_warm_workers=0, max_workers=1) as pool, pool.checkout() as session:
            assert session.feed_run("1 + 1") == 2
            own_root = Path(pool.aio._workers.scratch_root)  # type: ignore[union-attr]
            assert not dead_root.exists()
            assert live_root.exists() and any(live_root.glob("session-*"))
        assert not own_root.exists()  # closed normally: removed by its own pool
    finally:
        for host in (dead, live):
            host.kill()
            host.wait(timeout=60)
            if host.stdout is not None:
                host.stdout.close()
            if host.stdin is not None:
                host.stdin.close()


def test_reclaim_judges_by_host_start_time_ownership_and_lock(temp_dir: Path) -> None:
    pid = os.getpid()
    start = _process_start(pid)
    if start is None:
        pytest.skip("no /proc/<pid>/stat here to read a process's start time from")
    reused = temp_dir / f"snapcell-workers-{pid}-{start + 1}-abc"  # this pid, another start: the pid was reused
    reused.mkdir()
    (reused / "session-x").mkdir()
    (reused / "session-x" / "data").write_bytes(b"x" * 100)
    mine = temp_dir / f"snapcell-workers-{pid}-{start}-abc"  # this very process: alive
    mine.mkdir()
    gone = temp_dir / "snapcell-workers-999999999-1-abc"  # no such pid
    gone.mkdir()
    old_style = temp_dir / "snapcell-workers-k2j4h5g6"  # an older version's name says nothing of its host
    old_style.mkdir()
    not_a_dir = temp_dir / "snapcell-workers-999999998-1-abc"
    not_a_dir.write_text("keep")
    elsewhere = temp_dir / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep")
    link = temp_dir / "snapcell-workers-999999997-1-abc"
    link.symlink_to(elsewhere)

    assert sorted(reclaim_scratch_dirs(dry_run=True)) == sorted([str(reused), str(gone)])
    assert reused.exists() and gone.exists()  # a dry run removes nothing
    removed = reclaim_scratch_dirs()

    assert sorted(removed) == sorted([str(reused), str(gone)])
    assert not reused.exists() and not gone.exists()
    assert mine.exists() and old_style.exists() and not_a_dir.read_text() == "keep"
    assert link.is_symlink() and (elsewhere / "precious").read_text() == "keep"
    assert reclaim_scratch_dirs() == []


def test_a_dead_pids_directory_is_kept_while_its_lock_is_held(temp_dir: Path) -> None:
    """A host in another pid namespace (a container sharing the temp directory) looks dead here, but holds its lock."""
    with Pool("memory://", min_warm_workers=0, max_workers=1) as pool, pool.checkout() as session:
        session.feed_run("1")
        root = Path(pool.aio._workers.scratch_root)  # type: ignore[union-attr]
        foreign = temp_dir / "snapcell-workers-999999999-1-abc"
        os.rename(root, foreign)  # same directory and lock, a name whose pid does not exist here
        try:
            assert reclaim_scratch_dirs() == []
            assert foreign.exists()
        finally:
            os.rename(foreign, root)
    assert not root.exists()


def _count_reclaims(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record each reclaim a pool makes: True when a zygote process was starting (spawned, not ready) meanwhile."""
    from snapcell.backends import _workerpool, _zygotehost

    calls: list[bool] = []
    starting: list[_zygotehost.Zygote] = []
    original = _zygotehost.Zygote.start

    async def start(self: _zygotehost.Zygote, **kwargs: object) -> None:
        starting.append(self)
        try:
            await original(self, **kwargs)  # type: ignore[arg-type]
        finally:
            starting.remove(self)

    def reclaim() -> list[str]:
        calls.append(any(z.process is not None and z.process.poll() is None for z in starting))
        return []

    monkeypatch.setattr(_zygotehost.Zygote, "start", start)
    monkeypatch.setattr(_workerpool, "reclaim_scratch_dirs", reclaim)
    return calls


def test_a_pool_reclaims_once_while_its_zygote_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_reclaims(monkeypatch)
    with Pool("memory://", min_warm_workers=0, max_workers=1) as pool:
        assert calls == []  # not before a worker is needed: then it overlaps the zygote's start-up
        with pool.checkout() as session:
            assert session.feed_run("1 + 1") == 2
        with pool.checkout() as session:
            assert session.feed_run("2 + 2") == 4
    assert calls == [True]


def test_a_pool_that_never_starts_a_worker_reclaims_when_it_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_reclaims(monkeypatch)

    async def main() -> None:
        async with AsyncPool("memory://", min_warm_workers=0, max_workers=1):
            await asyncio.sleep(0)  # its fill task runs, and starts nothing

    asyncio.run(main())
    assert calls == [False]
