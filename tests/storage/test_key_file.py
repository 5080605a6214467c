"""A local store's signing-key file is used only when it is the current user's own private file."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

import pytest

from snapcell import Pool
from snapcell.checkpoint import Keyring
from snapcell.errors import CheckpointCorrupt, ConfigError
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


def test_a_configured_signing_key_keeps_the_stores_own_checkpoints_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    url = f"file://{tmp_path}"
    with Pool(url, isolation="inline") as pool, pool.checkout() as session:
        session.run("x = 41\nbig = bytes(range(256)) * 8192")  # 2 MiB: stored as a blob, in the key's namespace
        old = session.dump()
    file_key = (tmp_path / KEY_FILE).read_bytes()

    configured = "a-configured-signing-key-0123456789"
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", configured)
    with Pool(url, isolation="inline") as pool:
        with pool.checkout() as session:
            session.load_session(old)  # signed by the store's key file: still verifies
            assert session.feed_run("x + 1, len(big)") == (42, 2 * 1024 * 1024)
            new = session.dump()
        with pool.checkout() as session:
            session.load_session(new)
            assert session.feed_run("x") == 41
        Keyring([configured]).parse_id(new)  # new checkpoints are signed with the configured key
        with pytest.raises(CheckpointCorrupt):
            Keyring([file_key]).parse_id(new)

        foreign = Keyring(["somebody-else's-key-0123456789"]).new_id().raw
        with pool.checkout() as session, pytest.raises(CheckpointCorrupt) as info:
            session.load_session(foreign)
    message = str(info.value)
    # Which keys were tried, by key ID and where each came from; never the key material.
    assert Keyring([configured]).key_id(0) in message and Keyring([file_key]).key_id(0) in message
    assert "SNAPCELL_SIGNING_KEY" in message and KEY_FILE in message
    assert configured not in message and file_key.hex() not in message


def test_a_configured_key_does_not_trust_a_planted_key_file_to_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    planted = _plant(tmp_path, 0o644)
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", "a-configured-signing-key-0123456789")
    with caplog.at_level(logging.WARNING, logger="snapcell"), Pool(f"file://{tmp_path}", isolation="inline") as pool:
        assert "not verifying with the key file" in caplog.text
        with pytest.raises(CheckpointCorrupt, match="matches none"):
            pool.aio.keyring.parse_id(Keyring([planted]).new_id().raw)  # the planted key verifies nothing
