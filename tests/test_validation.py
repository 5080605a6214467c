"""Bad arguments to the public API raise snapcell errors that say what to do, never raw builtin errors."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator

import pytest

from snapcell import ConfigError, Pool, SessionError
from snapcell.checkpoint import Keyring
from snapcell.limits import Limits
from snapcell.storage import LocalStore, MemoryStore, open_store

KEY = "validation-test-signing-key-0123456789"


@pytest.fixture
def pool() -> Iterator[Pool]:
    with Pool(MemoryStore("validation"), isolation="inline", signing_keys=[KEY]) as pool:
        yield pool


# ------------------------------------------------------------- closed pool


def test_a_closed_pool_refuses_sessions_checkouts_and_with() -> None:
    pool = Pool("memory://", isolation="inline")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pool.checkout() as session:
            assert session.run("1 + 1").value == 2
            pool.close()
            with pytest.raises(SessionError, match="the pool is closed; create a new pool"):
                session.run("2")
        with pytest.raises(SessionError, match="the pool is closed"):
            with pool.checkout():
                pass  # pragma: no cover - never entered
        with pytest.raises(SessionError, match="the pool is closed"):
            with pool:
                pass  # pragma: no cover - never entered
        with pytest.raises(SessionError, match="the pool is closed"):
            pool.isolation_report()
        gc.collect()  # no finalizer of an unfinished coroutine or async generator complains


def test_closing_a_pool_twice_is_a_no_op() -> None:
    pool = Pool("memory://", isolation="inline")
    with pool:
        pass
    pool.close()
    pool.close()
    with pytest.raises(SessionError, match="create a new pool"):
        pool.call(pool.aio.isolation_report())


def test_a_session_of_a_process_pool_closed_inside_its_block() -> None:
    pool = Pool("memory://", isolation="process", min_warm_workers=0, max_workers=1)
    with pytest.raises(SessionError, match="the pool is closed"):
        with pool.checkout() as session:
            assert session.run("40 + 2").value == 42
            pool.close()
            session.dump()
    pool.close()


# ------------------------------------------------------------ signing keys


@pytest.mark.parametrize("key", [123, None, 1.5, ["nested-key-0123456789"]])
def test_keyring_refuses_keys_that_are_not_text_or_bytes(key: object) -> None:
    with pytest.raises(ConfigError, match="each signing key must be str or bytes"):
        Keyring([key])  # type: ignore[list-item]


@pytest.mark.parametrize("keys", ["a-long-signing-key-0123456789", b"a-long-signing-key-0123456789"])
def test_keyring_refuses_one_bare_key_for_the_list(keys: str | bytes) -> None:
    with pytest.raises(ConfigError, match=r"a list of keys, not one key: write \[key\]"):
        Keyring(keys)  # type: ignore[arg-type]


def test_keyring_refuses_a_non_iterable() -> None:
    with pytest.raises(ConfigError, match="must be a list"):
        Keyring(123)  # type: ignore[arg-type]


def test_keyring_accepts_text_bytes_and_bytearray() -> None:
    ring = Keyring([KEY, KEY.encode(), bytearray(KEY.encode())])
    assert ring.parse_id(ring.new_id().raw)


def test_pool_refuses_a_bare_string_as_signing_keys() -> None:
    with pytest.raises(ConfigError, match="not one key"):
        Pool("memory://", isolation="inline", signing_keys=KEY)


# ------------------------------------------------------------- pool options


@pytest.mark.parametrize("store", [123, None, object(), b"memory://"])
def test_pool_refuses_a_store_that_is_neither_a_store_nor_a_url(store: object) -> None:
    with pytest.raises(ConfigError, match="store must be a Store or a store URL"):
        Pool(store, isolation="inline")  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), -1, 0, True, "7d"])
def test_pool_refuses_a_ttl_that_is_not_a_positive_finite_number(ttl: object) -> None:
    with pytest.raises(ConfigError, match="ttl_s must be a positive, finite number"):
        Pool("memory://", isolation="inline", ttl_s=ttl)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf")])
def test_pool_refuses_a_non_finite_checkout_timeout(timeout: float) -> None:
    with pytest.raises(ConfigError, match="checkout_timeout_s"):
        Pool("memory://", isolation="inline", checkout_timeout_s=timeout)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_workers", 0),
        ("max_workers", True),
        ("min_warm_workers", -1),
        ("min_warm_workers", 3),  # more than max_workers
        ("recycle_after", 0),
        ("recycle_after", 1.5),
        ("max_queued_checkouts", -1),
        ("max_queued_checkouts", False),
        ("checkout_timeout_s", 0),
        ("checkout_timeout_s", "30"),
    ],
)
def test_pool_refuses_worker_counts_and_times_out_of_range_by_their_own_name(option: str, value: object) -> None:
    # Checked when the pool is made, inline mode included (it starts no worker, but the settings are wrong).
    with pytest.raises(ConfigError, match=f"^{option} must be"):
        Pool("memory://", isolation="inline", **{"max_workers": 2, option: value})


def test_pool_refuses_limits_and_policy_of_the_wrong_type() -> None:
    with pytest.raises(ConfigError, match="limits must be a snapcell Limits"):
        Pool("memory://", isolation="inline", limits={"wall_time_s": 1})
    with pytest.raises(ConfigError, match="policy must be a snapcell Policy"):
        Pool("memory://", isolation="inline", policy="strict")


def test_checkout_refuses_limits_of_the_wrong_type(pool: Pool) -> None:
    with pytest.raises(ConfigError, match="limits must be a snapcell Limits"):
        with pool.checkout(limits=123):
            pass  # pragma: no cover - never entered
    with pool.checkout(limits=Limits(wall_time_s=5)) as session:
        assert session.run("1").value == 1


def test_checkout_refuses_stubs_that_are_not_text(pool: Pool) -> None:
    with pytest.raises(ConfigError, match="type_check_stubs must be Python source text"):
        with pool.checkout(type_check=True, type_check_stubs=5):
            pass  # pragma: no cover - never entered
    with pytest.raises(ConfigError, match="type_check must be True or False"):
        with pool.checkout(type_check="yes"):
            pass  # pragma: no cover - never entered


# ------------------------------------------------------------ host functions


@pytest.mark.parametrize("lookup", [123, [print], "print", {print}])
def test_external_lookup_must_be_a_mapping(pool: Pool, lookup: object) -> None:
    with pool.checkout() as session:
        with pytest.raises(ConfigError, match="external_lookup must be a mapping of names to functions"):
            session.run("1", external_lookup=lookup)
        with pytest.raises(ConfigError, match="external_lookup must be a mapping"):
            session.feed_run("1", external_lookup=lookup)
        assert session.run("2").value == 2  # the session is still usable


# ------------------------------------------------------------------ stores


@pytest.mark.parametrize("url", ["file://\x00", "file://%00", "file:///tmp/a%00b", "/tmp/x\x00y"])
def test_open_store_refuses_a_nul_byte_in_a_path(url: str) -> None:
    with pytest.raises(ConfigError, match="must not contain a NUL byte"):
        open_store(url)


@pytest.mark.parametrize("root", ["a\x00b", 123, b"/tmp/bytes", ""])
def test_local_store_refuses_an_unusable_root(root: object) -> None:
    with pytest.raises(ConfigError, match="local store root"):
        LocalStore(root)  # type: ignore[arg-type]


def test_local_store_refuses_an_unknown_users_home() -> None:
    with pytest.raises(ConfigError, match="invalid local store root"):
        LocalStore("~no-such-user-snapcell-test/store")


def test_per_run_limits_and_boolean_seconds_are_refused() -> None:
    with pytest.raises(ConfigError):
        Limits(wall_time_s=True)
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        with pytest.raises(ConfigError, match="snapcell.Limits"):
            session.feed_run("1", limits=123)  # type: ignore[arg-type]
        assert session.feed_run("1 + 1") == 2
