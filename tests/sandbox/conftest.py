"""Fixtures of the sandbox tests: what the sandbox reports on this machine."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from tests.sandbox.sandbox_helpers import sandboxed


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What the sandbox reports in a fresh interpreter: which layers this machine has."""
    return sandboxed(tmp_path_factory.mktemp("probe"))


@pytest.fixture
def datagram_target() -> Iterator[tuple[socket.socket, str]]:
    """A non-blocking unix datagram socket bound at a path any uid may reach, as /dev/log or sd_notify's socket is."""
    where = tempfile.mkdtemp(prefix="snapcell-dgram-")
    os.chmod(where, 0o755)
    path = os.path.join(where, "log")
    target = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        target.bind(path)
        os.chmod(path, 0o777)
        target.setblocking(False)
        yield target, path
    finally:
        target.close()
        if os.path.lexists(path):
            os.unlink(path)
        os.rmdir(where)
