"""The test command itself: a test that outlives its time limit fails alone, and the run goes on to its summary."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests import procs

ROOT = Path(__file__).resolve().parents[1]


def test_one_test_past_its_timeout_fails_alone_and_the_run_reports(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(60)\n\ndef test_after_it():\n    pass\n"
    )
    # The project's own pytest configuration, with a short per-test limit in place of its usual one.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
        + ["-p", "no:cacheprovider", "--timeout=2", str(tmp_path / "test_inner.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Timeout" in done.stdout


def test_the_ctrl_c_tests_pass_when_pytest_starts_with_sigint_ignored() -> None:
    """A shell starts a background job with SIGINT ignored; the tests that send themselves Ctrl-C must not hang."""
    import signal

    # -x: a hang ends the inner run at its first test, so this test fails on the inner result, well within its own
    # time limit, rather than when the outer limit cuts it off after every Ctrl-C test has hung.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "--timeout=30"]
        + ["tests/test_syncloop.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_an_s3_server_does_not_outlive_a_run_that_ends_without_cleaning_up() -> None:

    script = (
        "import os, sys\n"
        "from tests.s3server import start_moto_server\n"
        "endpoint, stop = start_moto_server()\n"
        "print(endpoint, flush=True)\n"
        "os._exit(1)  # as a run that is killed: no fixture's clean-up runs\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    port = done.stdout.strip().rsplit(":", 1)[-1]
    assert port.isdigit(), done.stdout + done.stderr

    assert _servers_left((b"moto.server", port.encode())) == []


def test_a_postgres_server_does_not_outlive_a_run_that_ends_without_cleaning_up() -> None:

    import pytest

    from tests.pgserver import find_postgres_binaries, remove_stale_clusters

    if find_postgres_binaries() is None:
        pytest.skip("no PostgreSQL server binaries on this machine")
    script = (
        "import os, sys\n"
        "from tests.pgserver import start_postgres_server\n"
        "url, stop = start_postgres_server()\n"
        "print(url, flush=True)\n"
        "os._exit(1)  # as a run that is killed: no fixture's clean-up runs\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    port = done.stdout.strip().rsplit(":", 1)[-1].partition("/")[0]
    assert port.isdigit(), done.stdout + done.stderr

    assert _servers_left((b"-p", port.encode())) == []
    # Its directory is left behind; the next run's server removes it before it starts (or another run on this
    # machine already did): afterwards no directory of a dead server is left.
    left = [
        root
        for root in Path(tempfile.gettempdir()).glob("snapcell-pg-*")
        if f"-p {port} " in f"{_read(root / 'data' / 'postmaster.opts')} "
    ]
    remove_stale_clusters()
    assert remove_stale_clusters() == []
    assert not any(root.exists() for root in left)


def _read(path: Path) -> str:
    try:
        return path.read_text().replace('"', "")
    except OSError:
        return ""


def test_a_cluster_of_a_live_run_is_never_swept_whatever_its_server_is_doing(tmp_path: Path) -> None:
    """``initdb`` starts and stops backends that leave a ``postmaster.pid`` naming a process that is gone: a
    concurrent run's sweep must go by whether the directory's run lives, not by that file."""
    from tests.pgserver import remove_stale_clusters

    root = Path(tempfile.mkdtemp(prefix="snapcell-pg-"))
    (root / "data").mkdir()
    (root / "data" / "postmaster.pid").write_text("999999999\n")  # a backend that has exited
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
            str(root / "owner.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "locked"
        assert root not in remove_stale_clusters() and root.exists()
    finally:
        owner.communicate("", timeout=60)  # the run ends: the kernel lets go of its lock
    assert root in remove_stale_clusters() and not root.exists()


def _servers_left(words: tuple[bytes, ...]) -> list[str]:
    """The pids of running processes whose command line holds all of ``words``, once there are none or after a
    hang guard for a loaded machine (a killed run's server exits when the kernel gets to it)."""
    import os
    import time

    def servers() -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(word in argv for word in words) and procs.alive(int(pid)):
                found.append(pid)
        return found

    deadline = time.monotonic() + 30
    while servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    return servers()
