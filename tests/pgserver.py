"""A real PostgreSQL server on loopback, for tests.

Import the fixtures into a conftest or a test module (``from tests.pgserver import postgres_server, postgres_url``)
to get the session-scoped ``postgres_server`` fixture (the URL of the server's maintenance database) and the
per-test ``postgres_url`` (a database of the test's own, dropped afterwards). However many modules import them, one
server runs per test session. Without PostgreSQL's server binaries on the machine (``initdb`` and ``postgres``, in
``/usr/lib/postgresql/*/bin`` or on ``PATH``), every test that asks for them skips and says so.

The server runs from a temporary directory as the ``postgres`` user when the tests run as root (PostgreSQL refuses
to run as root), listens on a free port of 127.0.0.1 only, has no Unix socket, trusts every local connection (the
superuser is ``postgres``, no password) and syncs nothing to disk. It dies with the process that started it, also
when that process is killed (its parent-death signal), and is stopped with ``pg_ctl stop`` at the end of the run;
the directory of a server whose run was killed is removed by the next run.

This module does not import snapcell; `start_postgres_server` needs nothing but the binaries, the per-test database
needs psycopg.
"""

from __future__ import annotations

import ctypes
import fcntl
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "find_postgres_binaries",
    "postgres_server",
    "postgres_url",
    "remove_stale_clusters",
    "start_postgres_server",
]

_STARTUP_TIMEOUT_S = 60.0
_SUPERUSER = "postgres"
_NEEDED = ("initdb", "postgres", "pg_ctl", "pg_isready")
_OWNER_LOCK = "owner.lock"
# The owner locks of the clusters this process made and has not removed, by directory.
_OWNED: dict[Path, int] = {}


def find_postgres_binaries() -> Path | None:
    """The directory of PostgreSQL's server binaries: the newest ``/usr/lib/postgresql/N/bin``, else ``PATH``'s."""

    def version(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        if all(os.access(Path(candidate) / name, os.X_OK) for name in _NEEDED):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the server's process before it starts (after it took the ``postgres`` user's IDs, which would clear the
    setting): SIGKILL when the process that started it ends, however it ends.

    A run that is killed or ends with ``os._exit`` runs no fixture's clean-up; the server must not outlive it. Its
    backends notice that the postmaster is gone and exit by themselves.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _server_user() -> dict[str, Any]:
    """``subprocess`` options that run a command as the ``postgres`` user when this process is root, else nothing.

    Raises:
        RuntimeError: Running as root on a machine without a ``postgres`` user.
    """
    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "PostgreSQL refuses to run as root and this machine has no 'postgres' user to run it as; "
            "create one (the postgresql package does) or run the tests as another user"
        ) from None
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def remove_stale_clusters() -> list[Path]:
    """Remove the directories of earlier servers whose run has ended (killed: its clean-up never ran); return them.

    A run holds an exclusive lock on its directory's ``owner.lock`` from the moment it makes the directory until it
    removes it, and the kernel lets go of the lock when the run ends, however it ends. A directory whose lock is
    held belongs to a live run, whatever its server is doing (``initdb`` starts and stops several backends, each
    leaving a ``postmaster.pid`` of a process that is gone); one without a lock file is left alone too.
    """
    removed = []
    for root in sorted(Path(tempfile.gettempdir()).glob("snapcell-pg-*")):
        try:
            fd = os.open(root / _OWNER_LOCK, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its run is alive
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
        finally:
            os.close(fd)
    return removed


def _claim(root: Path) -> None:
    """Hold ``root``'s owner lock for as long as this process lives or until `_let_go` (see `remove_stale_clusters`)."""
    fd = os.open(root / _OWNER_LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _OWNED[root] = fd


def _let_go(root: Path) -> None:
    """Remove ``root`` and give up its owner lock, in that order (a sweep never sees it unlocked and half-removed)."""
    shutil.rmtree(root, ignore_errors=True)
    fd = _OWNED.pop(root, None)
    if fd is not None:
        os.close(fd)


def start_postgres_server(*, timeout_s: float = _STARTUP_TIMEOUT_S) -> tuple[str, Callable[[], None]]:
    """Create a cluster in a temporary directory, start it on a free loopback port and wait until it answers.

    Returns:
        The URL of the maintenance database (``postgresql://postgres@127.0.0.1:PORT/postgres``) and a function that
        stops the server and removes its directory (idempotent).

    Raises:
        RuntimeError: No PostgreSQL binaries, or the server did not start within ``timeout_s``.
    """
    binaries = find_postgres_binaries()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, postgres, pg_ctl, pg_isready) on this machine")
    as_server = _server_user()
    remove_stale_clusters()
    root = Path(tempfile.mkdtemp(prefix="snapcell-pg-"))
    _claim(root)
    if as_server:
        os.chown(root, as_server["user"], as_server["group"])
    data = root / "data"
    try:
        subprocess.run(
            [binaries / "initdb", "-D", data, "-U", _SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8"]
            + ["--locale=C"],
            cwd=root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=timeout_s,
            **as_server,
        )
    except subprocess.CalledProcessError as exc:
        _let_go(root)
        raise RuntimeError(f"initdb failed: {exc.stderr.decode(errors='replace')}") from None
    for _ in range(3):  # another process may take the free port before the server binds it
        port = _free_port()
        started = _start(binaries, data, port, as_server, timeout_s)
        if started is not None:
            return f"postgresql://{_SUPERUSER}@127.0.0.1:{port}/postgres", started
    log = (root / "server.log").read_text(errors="replace") if (root / "server.log").exists() else ""
    _let_go(root)
    raise RuntimeError(f"PostgreSQL did not start: {log[-2000:]}")


def _start(
    binaries: Path, data: Path, port: int, as_server: dict[str, Any], timeout_s: float
) -> Callable[[], None] | None:
    """Start the server on ``port``; its stop function, or None when it exited at once (the port was taken)."""
    root = data.parent
    with open(root / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [binaries / "postgres", "-D", data, "-p", str(port), "-h", "127.0.0.1"]
            + ["-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "synchronous_commit=off"]
            + ["-c", "full_page_writes=off", "-c", "max_connections=200"],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            start_new_session=True,  # a Ctrl-C of the test run is for pytest; the server stops at teardown
            **as_server,
        )
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        if proc.poll() is None:
            subprocess.run(
                [binaries / "pg_ctl", "stop", "-D", data, "-m", "fast", "-w", "-t", "30"],
                cwd=root,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                **as_server,
            )
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _let_go(root)

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            return None
        ready = subprocess.run(
            [binaries / "pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", _SUPERUSER, "-t", "1"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        if ready.returncode == 0:
            return stop
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"PostgreSQL did not answer on 127.0.0.1:{port} within {timeout_s} s")
        time.sleep(0.05)


# One server per test session, however many modules import the fixture (each import is a fixture of its own to
# pytest, with its own session-scoped value): the first to start it starts it, the last to finish stops it.
_SHARED: dict[str, Any] = {"users": 0}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Yield the URL of the maintenance database of a PostgreSQL server that lives for the whole test session."""
    if "url" not in _SHARED:
        if find_postgres_binaries() is None:
            pytest.skip("no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin or on PATH")
        _SHARED["url"], _SHARED["stop"] = start_postgres_server()
    _SHARED["users"] += 1
    try:
        yield str(_SHARED["url"])
    finally:
        _SHARED["users"] -= 1
        if _SHARED["users"] == 0:
            stop = _SHARED.pop("stop")
            del _SHARED["url"]
            stop()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """Yield the URL of a new, empty database on the session's server; it is dropped after the test."""
    import psycopg

    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.rpartition("/")[0] + f"/{name}"
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
