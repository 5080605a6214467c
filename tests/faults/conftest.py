"""Fixtures for the fault tests: a moto S3 server behind a `FaultProxy`, and `S3Store`s that go through it.

Clients are slow to make, so the module shares two (one per deadline); each test gets its own stores on them,
under a prefix of its own.
"""

from __future__ import annotations

import dataclasses
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

# Small, so that faults end quickly, yet each attempt's read timeout (4.5 / 3 * 2/3 = 1 s) leaves a loaded moto room.
DEADLINE_S = 4.5
# For the faults that only end at a timeout; set up and check with the other store, a loaded moto may be slower.
QUICK_DEADLINE_S = 1.2
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


@pytest.fixture(scope="module")
def bucket(s3_server: str) -> str:
    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    name = f"faults-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    client.close()
    return name


def _base(bucket: str, proxy: FaultProxy, deadline_s: float) -> Iterator[S3Store]:
    config = S3Config(
        endpoint_url=proxy.url,
        region_name=TEST_REGION,
        max_attempts=MAX_ATTEMPTS,
        storage_timeout_s=deadline_s,
        **TEST_CREDENTIALS,
    )
    store = S3Store(bucket, "base", config=config)
    yield store
    store.close()


@pytest.fixture(scope="module")
def base_store(bucket: str, proxy: FaultProxy) -> Iterator[S3Store]:
    yield from _base(bucket, proxy, DEADLINE_S)


@pytest.fixture(scope="module")
def quick_base_store(bucket: str, proxy: FaultProxy) -> Iterator[S3Store]:
    yield from _base(bucket, proxy, QUICK_DEADLINE_S)


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def attempts() -> Attempts:
    return Attempts()


def _store(base: S3Store, prefix: str, attempts: Attempts, **changes: int) -> Iterator[S3Store]:
    config = dataclasses.replace(base.config, **changes) if changes else base.config
    store = S3Store(base.bucket, prefix, client=base.client, config=config)
    events = store.client.meta.events
    events.register("before-send.s3", attempts, unique_id=f"attempts-{id(attempts)}")
    yield store
    events.unregister("before-send.s3", unique_id=f"attempts-{id(attempts)}")
    store.close()


@pytest.fixture
def faulty_store(base_store: S3Store, proxy: FaultProxy, prefix: str, attempts: Attempts) -> Iterator[S3Store]:
    """An `S3Store` whose every request goes through the proxy; the proxy starts in ``pass`` mode."""
    proxy.set_mode("pass")
    yield from _store(base_store, prefix, attempts)
    proxy.set_mode("pass")


@pytest.fixture
def quick_store(quick_base_store: S3Store, faulty_store: S3Store, attempts: Attempts) -> Iterator[S3Store]:
    """The same objects as `faulty_store`, with a short deadline (1.2 s: a 0.27 s read timeout)."""
    yield from _store(quick_base_store, faulty_store.prefix, attempts)
