"""A real S3 API server (moto_server) on loopback, for tests and benchmarks.

Load it as a pytest plugin (``pytest_plugins = ["tests.s3server"]`` in a root conftest, or import the fixture
into a directory's conftest) to get the session-scoped ``s3_server`` fixture, which yields the endpoint URL.
Benchmarks call `start_moto_server` directly. Credentials are never put in ``os.environ``: pass
`TEST_CREDENTIALS` to the S3 client (``S3Config(**TEST_CREDENTIALS, endpoint_url=...)`` for snapcell).

This module does not import snapcell.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

__all__ = ["TEST_CREDENTIALS", "TEST_REGION", "s3_server", "start_moto_server"]

TEST_REGION = "us-east-1"
TEST_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
_STARTUP_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the server's process before it starts: SIGKILL when the process that started it ends, however it ends.

    A run that is killed or ends with ``os._exit`` runs no fixture's clean-up; the server must not outlive it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def start_moto_server(*, timeout_s: float = _STARTUP_TIMEOUT_S) -> tuple[str, Callable[[], None]]:
    """Start ``python -m moto.server`` on a free loopback port and wait until it answers.

    Returns:
        The endpoint URL and a function that stops the server (idempotent).

    Raises:
        RuntimeError: The server exited or did not answer within ``timeout_s``.
    """
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {proc.returncode} before answering on {endpoint}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as response:
                response.read()
            return endpoint, stop
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout_s} s") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Yield the endpoint URL of a moto S3 server that lives for the whole test session."""
    endpoint, stop = start_moto_server()
    try:
        yield endpoint
    finally:
        stop()
