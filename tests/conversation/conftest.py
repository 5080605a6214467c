"""Fixtures for the conversation tests: a `conversation_store` per backend (S3 on the moto server, PostgreSQL on a
real server)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

try:
    import tests.s3server  # noqa: F401
except ModuleNotFoundError:  # run from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from snapcell.conversation import (
    FileConversationStore,
    LogConversationStore,
    MemoryConversationStore,
    PostgresConversationStore,
    S3ConversationStore,
)
from snapcell.storage import S3Config, S3Store
from tests.pgserver import postgres_server, postgres_url
from tests.s3server import TEST_CREDENTIALS, TEST_REGION, s3_server

__all__ = ["postgres_server", "postgres_url", "s3_server"]


@pytest.fixture
def s3_conversations(s3_server: str) -> Iterator[S3ConversationStore]:
    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    bucket = f"conv-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    client.close()
    config = S3Config(endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    store = S3Store(bucket, "proj", config=config)
    yield S3ConversationStore(store)
    store.close()


@pytest.fixture
def postgres_conversations(postgres_url: str) -> Iterator[PostgresConversationStore]:
    store = PostgresConversationStore(postgres_url)
    yield store
    store.close()


@pytest.fixture(
    params=[
        "memory",
        "file",
        pytest.param("s3", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def conversation_store(request: pytest.FixtureRequest, tmp_path: Path) -> LogConversationStore:
    if request.param == "memory":
        return MemoryConversationStore()
    if request.param == "file":
        return FileConversationStore(tmp_path / "conversations")
    store: LogConversationStore = request.getfixturevalue(f"{request.param}_conversations")
    return store
