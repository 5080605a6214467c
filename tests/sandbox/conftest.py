"""Fixtures of the sandbox tests: what the sandbox reports on this machine."""

from __future__ import annotations

import pytest

from tests.sandbox.sandbox_helpers import sandboxed


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What the sandbox reports in a fresh interpreter: which layers this machine has."""
    return sandboxed(tmp_path_factory.mktemp("probe"))
