"""A local store's signing-key file is used only when it is the current user's own private file."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from snapcell import Pool
from snapcell.errors import ConfigError
from snapcell.storage import LocalStore

KEY_FILE = ".snapcell-signing-key"


def _plant(root: Path, mode: int) -> bytes:
    """Someone else's key: a file created before the store ever ran, with ``mode``."""
    root.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    path = root / KEY_FILE
    path.write_bytes(key)
    path.chmod(mode)
    return key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_a_key_readable_or_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    _plant(tmp_path, mode)
    with pytest.raises(ConfigError) as caught:
        LocalStore(tmp_path).secret()
    assert "chmod 600" in str(caught.value) and str(tmp_path / KEY_FILE) in str(caught.value)


def test_a_pool_refuses_to_sign_with_a_planted_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    _plant(tmp_path, 0o644)
    with pytest.raises(ConfigError, match="group or others"):
        Pool(f"file://{tmp_path}", isolation="inline")


def test_the_owners_private_key_is_used(tmp_path: Path) -> None:
    key = _plant(tmp_path, 0o600)
    assert LocalStore(tmp_path).secret() == key


def test_a_key_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    _plant(tmp_path, 0o600)
    os.chown(tmp_path / KEY_FILE, 65534, 65534)
    with pytest.raises(ConfigError) as caught:
        LocalStore(tmp_path).secret()
    assert "uid 65534" in str(caught.value) and "chown" in str(caught.value)


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(secrets.token_bytes(32))
    target.chmod(0o600)
    store = tmp_path / "store"
    store.mkdir()
    (store / KEY_FILE).symlink_to(target)
    with pytest.raises((ConfigError, OSError)):
        LocalStore(store).secret()
