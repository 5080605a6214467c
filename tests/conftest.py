"""Shared fixtures: a session-scoped `pool` per isolation mode, a per-test `session`, and `run`; for the storage,
heads and ops tests a settable `clock` and a moto S3 server with a client, a fresh bucket and an `S3Store` on it."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

try:
    import tests.s3server  # noqa: F401
except ModuleNotFoundError:  # neither installed nor on pythonpath: run from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from snapcell import Pool, RunResult, Session
from snapcell.storage import S3Config, S3Store
from tests import otherpythons
from tests.s3server import TEST_CREDENTIALS, TEST_REGION, s3_server

__all__ = ["s3_server"]

# Every scenario runs in each isolation mode listed here.
ISOLATIONS = ["inline", "process"]


@pytest.fixture(scope="session", params=ISOLATIONS)
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    """A pool over a memory store, one per isolation mode."""
    with Pool("memory://", isolation=request.param) as pool:
        yield pool


@pytest.fixture
def session(pool: Pool) -> Iterator[Session]:
    """A fresh session checked out of `pool`."""
    with pool.checkout() as session:
        yield session


@pytest.fixture
def run(session: Session) -> Callable[..., RunResult]:
    """Run code in `session` and return its `RunResult`."""

    def run(code: str, **options: Any) -> RunResult:
        return session.run(code, **options)

    return run


class Clock:
    """A settable clock for `MemoryStore(now=...)`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def s3_config(s3_server: str) -> S3Config:
    return S3Config(endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)


@pytest.fixture
def s3_client(s3_server: str) -> Iterator[object]:
    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    yield client
    client.close()


@pytest.fixture
def s3_bucket(s3_client) -> str:
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_store(s3_bucket: str, s3_config: S3Config) -> Iterator[S3Store]:
    store = S3Store(s3_bucket, "proj", config=s3_config)
    yield store
    store.close()


_CROSS_VERSION = "tests/checkpoint/test_cross_version.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The cross-version tests wait for a venv per other Python, built in the background: run them last.
    items.sort(key=lambda item: item.nodeid.startswith(_CROSS_VERSION))  # stable: the rest keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.nodeid.startswith(_CROSS_VERSION) for item in session.items):
        otherpythons.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    otherpythons.stop()
