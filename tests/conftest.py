"""Shared fixtures: a session-scoped `pool` per isolation mode, a per-test `session`, and `run`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from snapcell import Pool, RunResult, Session

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
