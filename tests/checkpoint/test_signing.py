"""Signed IDs and sealed checkpoint bytes: every way an ID or its bytes can be wrong."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from snapcell import CheckpointCorrupt, CheckpointExpired, CheckpointNotFound, ConfigError, Pool, SessionError
from snapcell.checkpoint import Keyring
from snapcell.storage import MemoryStore
from tests.checkpoint.helpers import KEY, OTHER_KEY, sign_and_store

T0 = 1_800_000_000.0


class Clock:
    """An injected clock: tests move time by assigning ``now``."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def pool(store: MemoryStore, clock: Clock) -> Iterator[Pool]:
    with Pool(store, signing_keys=[KEY], isolation="inline", ttl_s=3600, clock=clock) as pool:
        yield pool


@pytest.fixture
def checkpoint_id(pool: Pool) -> bytes:
    with pool.checkout() as session:
        session.feed_run("x = [1, 2, 3]\nlabel = 'kept'")
        return session.dump()


def _load(pool: Pool, checkpoint_id: bytes | str) -> object:
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        return session.feed_run("x")


def _key_of(checkpoint_id: bytes) -> str:
    return Keyring([KEY]).parse_id(checkpoint_id).storage_key


def test_id_round_trips_through_hex(pool: Pool, checkpoint_id: bytes) -> None:
    assert isinstance(checkpoint_id, bytes)
    assert _load(pool, bytes.fromhex(checkpoint_id.hex())) == [1, 2, 3]
    assert _load(pool, checkpoint_id.hex()) == [1, 2, 3]


def test_id_carries_its_creation_time(checkpoint_id: bytes) -> None:
    assert Keyring([KEY]).parse_id(checkpoint_id).created_at == pytest.approx(T0, abs=0.001)


@pytest.mark.parametrize("position", range(41))
def test_altered_id_byte_is_corrupt(pool: Pool, checkpoint_id: bytes, position: int) -> None:
    forged = bytearray(checkpoint_id)
    forged[position] ^= 0x01
    with pytest.raises(CheckpointCorrupt):
        _load(pool, bytes(forged))


@pytest.mark.parametrize(
    "forged",
    [os.urandom(41), os.urandom(16), b"", b"\x01" * 200, "not hex at all", "abc", "zz" * 41],
    ids=["random", "short", "empty", "long", "text", "odd-hex", "bad-hex"],
)
def test_forged_id_is_corrupt(pool: Pool, forged: bytes | str) -> None:
    with pytest.raises(CheckpointCorrupt) as info:
        _load(pool, forged)
    assert "checkpoint ID" in str(info.value)


def test_id_of_another_key_is_corrupt(store: MemoryStore, checkpoint_id: bytes, clock: Clock) -> None:
    with Pool(store, signing_keys=[OTHER_KEY], isolation="inline", clock=clock) as other:
        with pytest.raises(CheckpointCorrupt, match="another key"):
            _load(other, checkpoint_id)


def test_bytes_sealed_with_another_key_are_corrupt(pool: Pool, store: MemoryStore, checkpoint_id: bytes) -> None:
    mine, theirs = Keyring([KEY]), Keyring([OTHER_KEY])
    cid = mine.parse_id(checkpoint_id)
    body = mine.verify(store.get(cid.storage_key), cid)
    new_id = mine.new_id(T0)
    store.put(new_id.storage_key, bytes(theirs.sign(bytes(body), new_id)))
    with pytest.raises(CheckpointCorrupt, match="failed verification"):
        _load(pool, new_id.raw)


def test_bytes_moved_under_another_id_are_corrupt(pool: Pool, store: MemoryStore, checkpoint_id: bytes) -> None:
    other = Keyring([KEY]).new_id(T0)
    store.put(other.storage_key, store.get(_key_of(checkpoint_id)))
    with pytest.raises(CheckpointCorrupt, match="failed verification"):
        _load(pool, other.raw)


@pytest.mark.parametrize("position", [-1, -16, -32])
def test_altered_mac_is_corrupt(pool: Pool, store: MemoryStore, checkpoint_id: bytes, position: int) -> None:
    key = _key_of(checkpoint_id)
    blob = bytearray(store.get(key))
    blob[position] ^= 0x80
    store.put(key, bytes(blob), overwrite=True)
    with pytest.raises(CheckpointCorrupt):
        _load(pool, checkpoint_id)


def test_expired_id_is_refused_even_though_bytes_remain(
    pool: Pool, store: MemoryStore, checkpoint_id: bytes, clock: Clock
) -> None:
    clock.now = T0 + 3599
    assert _load(pool, checkpoint_id) == [1, 2, 3]
    clock.now = T0 + 3601
    with pytest.raises(CheckpointExpired) as info:
        _load(pool, checkpoint_id)
    assert store.get(_key_of(checkpoint_id))  # still stored: expiry is the ID's, not the store's
    assert info.value.checkpoint_id == checkpoint_id
    assert info.value.expired_at == pytest.approx(T0 + 3600, abs=0.001)
    assert "expired" in str(info.value) and "fresh session" in str(info.value)


def test_unknown_id_is_not_found(pool: Pool) -> None:
    unknown = Keyring([KEY]).new_id(T0)
    with pytest.raises(CheckpointNotFound) as info:
        _load(pool, unknown.raw)
    assert isinstance(info.value, KeyError)
    assert info.value.checkpoint_id == unknown.raw
    assert "no checkpoint is stored" in str(info.value)


def test_failed_load_leaves_the_session_usable(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("kept = 41")
        with pytest.raises(CheckpointCorrupt):
            session.load_session(os.urandom(41))
        with pytest.raises(CheckpointNotFound):
            session.load_session(Keyring([KEY]).new_id(T0).raw)
        assert session.feed_run("kept + 1") == 42


def test_checked_in_session_cannot_load(pool: Pool, checkpoint_id: bytes) -> None:
    with pool.checkout() as session:
        pass
    with pytest.raises(SessionError):
        session.load_session(checkpoint_id)


# ------------------------------------------------------------------------------ future-dated IDs


@pytest.mark.parametrize(
    ("ahead_s", "max_skew_s", "refused"),
    [(365 * 86400, 300.0, True), (3600, 300.0, True), (301, 300.0, True), (60, 300.0, False), (60, 10.0, True)],
)
def test_ids_dated_beyond_the_clock_skew_tolerance_are_refused(
    ahead_s: float, max_skew_s: float, refused: bool
) -> None:
    now = 1_700_000_000.0
    store = MemoryStore()
    with Pool(store, signing_keys=[KEY], isolation="inline", clock=lambda: now, max_clock_skew_s=max_skew_s) as pool:
        with pool.checkout() as session:
            session.feed_run("x = 1")
            body = session._inner._backend.runner.dump(created_at=now).body  # an honest body, signed for the future
        future = sign_and_store(store, Keyring([KEY]), body, now=now + ahead_s)
        with pool.checkout() as session:
            if refused:
                with pytest.raises(CheckpointCorrupt, match="in the future"):
                    session.load_session(future)
                with pytest.raises(CheckpointCorrupt, match="clock-skew"):
                    session._inner.parse_id(future)
            else:
                session.load_session(future)
                assert session.feed_run("x") == 1


def test_the_clock_skew_tolerance_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_clock_skew_s"):
        Pool("memory://", isolation="inline", max_clock_skew_s=-1)
