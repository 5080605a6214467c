"""Fixtures for the fault tests: a moto S3 server behind a `FaultProxy`, and an `S3Store` that goes through it."""

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

from snapcell.storage import S3Config, S3Store
from tests.faults.proxy import FaultProxy
from tests.s3server import TEST_CREDENTIALS, TEST_REGION, s3_server

__all__ = ["s3_server"]

# Small, so that faults end quickly, yet each attempt's read timeout (4.5 / 3 = 1.5 s) leaves a loaded moto room.
DEADLINE_S = 4.5
MAX_ATTEMPTS = 3


class Attempts:
    """Counts the HTTP requests a botocore client sends (``before-send``), retries included."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, request: object, **_: object) -> None:
        self.sent.append(f"{getattr(request, 'method', '?')} {getattr(request, 'url', '?')}")

    def clear(self) -> None:
        self.sent.clear()


@pytest.fixture(scope="module")
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server) as running:
        yield running


@pytest.fixture
def bucket(s3_server: str, proxy: FaultProxy) -> str:
    proxy.set_mode("pass")
    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    name = f"faults-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    client.close()
    return name


@pytest.fixture
def attempts() -> Attempts:
    return Attempts()


@pytest.fixture
def faulty_store(bucket: str, proxy: FaultProxy, attempts: Attempts) -> Iterator[S3Store]:
    """An `S3Store` whose every request goes through the proxy; the proxy starts in ``pass`` mode."""
    config = S3Config(
        endpoint_url=proxy.url,
        region_name=TEST_REGION,
        max_attempts=MAX_ATTEMPTS,
        storage_timeout_s=DEADLINE_S,
        **TEST_CREDENTIALS,
    )
    store = S3Store(bucket, "proj", config=config)
    store.client.meta.events.register("before-send.s3", attempts)
    yield store
    proxy.set_mode("pass")
    store.close()
