"""Fixtures for the storage tests: one `store` fixture per backend, and a moto S3 server for the S3 ones."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

try:
    import tests.s3server  # noqa: F401
except ModuleNotFoundError:  # neither installed nor on pythonpath: run from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from snapcell.storage import LocalStore, MemoryStore, S3Config, S3Store, Store
from tests.s3server import TEST_CREDENTIALS, TEST_REGION, s3_server

__all__ = ["s3_server"]


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


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind = request.param
    made: Store
    if kind == "memory":
        made = MemoryStore("test")
    elif kind == "local":
        made = LocalStore(tmp_path / "store")
    else:
        made = request.getfixturevalue("s3_store")
    yield made
    made.close()
