"""The host's readings of a worker from /proc: CPU time and peak memory through descriptors kept open."""

from __future__ import annotations

import subprocess
import sys

import pytest

from snapcell import Pool
from snapcell.backends._procstat import ProcStat


def test_readings_follow_the_process_and_stop_with_it() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nx = bytearray(64 * 2**20)\nsum(range(3 * 10**6))\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    stat = ProcStat(child.pid)
    try:
        first = stat.cpu_seconds()
        assert first is not None and first >= 0
        # Read again through the same descriptors: the numbers are current, not those of the first read.
        while (stat.peak_rss() or 0) < 64 * 2**20:
            assert child.poll() is None
        assert (stat.cpu_seconds() or 0) >= first
    finally:
        child.communicate(b"")
    # The descriptors are bound to that process: once it is gone nothing is read, whoever gets its pid next.
    assert stat.cpu_seconds() is None and stat.peak_rss() is None
    stat.close()
    stat.close()
    assert stat.cpu_seconds() is None


def test_a_missing_process_reads_as_unknown() -> None:
    stat = ProcStat(2**22 + 12345)  # above the default pid_max: no such process
    assert stat.cpu_seconds() is None and stat.peak_rss() is None


def test_a_run_reports_the_workers_cpu_time_and_peak_memory() -> None:
    with Pool("memory://", isolation="process") as pool, pool.checkout() as session:
        result = session.run("total = 0\nfor i in range(3_000_000):\n    total += i\nx = bytearray(48 * 2**20)")
        assert result.error is None
        assert result.cpu_time_s is not None and result.cpu_time_s > 0
        assert result.peak_memory_bytes is not None and result.peak_memory_bytes > 48 * 2**20


def test_back_to_back_runs_read_the_cpu_time_once_each_and_other_requests_force_a_fresh_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings: list[float | None] = []
    read = ProcStat.cpu_seconds

    def counting(self: ProcStat) -> float | None:
        readings.append(read(self))
        return readings[-1]

    monkeypatch.setattr(ProcStat, "cpu_seconds", counting)
    with Pool("memory://", isolation="process") as pool, pool.checkout() as session:
        session.run("1 + 1")
        assert len(readings) == 2  # before and after the first run
        session.run("busy = sum(range(2_000_000))")
        session.run("busy = sum(range(2_000_000))")
        assert len(readings) == 4  # each later run starts from the reading that ended the one before
        session.dump()  # a request between runs: its CPU time is not the next run's
        result = session.run("busy = sum(range(2_000_000))")
        assert len(readings) == 6
        assert result.cpu_time_s == readings[-1] - readings[-2]  # type: ignore[operator]
