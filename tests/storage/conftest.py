"""Fixtures for the storage tests: one `store` fixture per backend (its S3 fixtures are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell.storage import LocalStore, MemoryStore, Store


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
