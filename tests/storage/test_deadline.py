"""Storage deadlines: `storage_timeout_s`, `storage_deadline` and `AsyncStore(timeout_s=)`, without a network.

The S3 side under real faults is in tests/faults; here, the settings and the async wrapper's own deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest

from snapcell.errors import ConfigError, StorageTimeout, StorageUnavailable
from snapcell.storage import AsyncStore, LocalStore, MemoryStore, S3Config, S3Store, open_store, storage_deadline
from snapcell.storage._protocol import call_deadline


class StuckStore(MemoryStore):
    """A memory store whose ``get`` blocks until released, like a hung network file system."""

    def __init__(self) -> None:
        super().__init__("stuck")
        self.release = threading.Event()
        self.calls = 0

    def get(self, key: str) -> bytes:
        self.calls += 1
        self.release.wait(60)
        return super().get(key)


def _timeout_of(store: StuckStore, call: Callable[[], Awaitable[object]]) -> StorageTimeout:
    """Await ``call``, expecting `StorageTimeout`; release the store before ``asyncio.run`` joins its threads."""

    async def scenario() -> StorageTimeout:
        try:
            await call()
        except StorageTimeout as exc:
            return exc
        finally:
            store.release.set()
        raise AssertionError("no StorageTimeout")

    store.release.clear()
    return asyncio.run(scenario())


def test_the_async_wrapper_gives_up_on_a_stuck_backend() -> None:
    store = StuckStore()
    store.put("k", b"v")
    error = _timeout_of(store, lambda: AsyncStore(store, timeout_s=0.2).get("k"))
    assert isinstance(error, StorageUnavailable) and isinstance(error, TimeoutError)
    assert error.operation == "get" and error.key == "k" and "memory://stuck" in str(error)
    assert isinstance(error.__cause__, TimeoutError)
    assert store.calls == 1


def test_a_per_call_timeout_and_an_enclosing_deadline_both_bound_the_call() -> None:
    store = StuckStore()
    store.put("k", b"v")
    _timeout_of(store, lambda: AsyncStore(store).get("k", timeout_s=0.1))  # the store itself has no deadline

    async def turn() -> bytes:
        with storage_deadline(0.1):
            return await AsyncStore(store, timeout_s=30).get("k")  # the earlier deadline wins

    _timeout_of(store, turn)
    store.release.set()
    assert asyncio.run(AsyncStore(store).get("k", timeout_s=5)) == b"v"
    assert store.calls == 3


def test_a_call_whose_deadline_has_passed_is_not_started() -> None:
    store = StuckStore()

    async def late() -> None:
        with storage_deadline(0.01):
            await asyncio.sleep(0.05)
            await AsyncStore(store).put("k", b"v")

    with pytest.raises(StorageTimeout, match="not started"):
        asyncio.run(late())
    assert list(store.scan()) == []


def test_deadlines_nest_and_the_earliest_wins() -> None:
    assert call_deadline() is None
    with storage_deadline(5):
        outer = call_deadline()
        assert outer is not None
        with storage_deadline(500):
            assert call_deadline() == outer  # a later inner deadline does not extend the outer one
            assert call_deadline(1000) == outer
        inner = call_deadline(0.5)
        assert inner is not None and inner < outer
    assert call_deadline() is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_bad_timeouts_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError):
        S3Config(storage_timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AsyncStore(MemoryStore(), timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        with storage_deadline(bad):  # type: ignore[arg-type]
            pass


def test_open_store_takes_the_deadline_as_an_option_or_in_an_s3_url(tmp_path) -> None:
    config = S3Config(endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    from_query = open_store("s3://bucket/prefix?storage_timeout_s=2.5", s3=config)
    from_option = open_store("s3://bucket/prefix?storage_timeout_s=2.5", s3=config, storage_timeout_s=4)
    default = open_store("s3://bucket/prefix", s3=config)
    local = open_store(f"file://{tmp_path}", storage_timeout_s=3)
    try:
        assert isinstance(from_query, S3Store) and from_query.timeout_s == 2.5 and from_query.prefix == "prefix"
        assert isinstance(from_option, S3Store) and from_option.timeout_s == 4
        assert isinstance(default, S3Store) and default.timeout_s == 10.0
        assert isinstance(local, LocalStore) and AsyncStore(local).timeout_s == 3  # enforced by the wrapper
        assert AsyncStore(from_query).timeout_s is None  # S3 enforces its own, per request
    finally:
        for store in (from_query, from_option, default, local):
            store.close()
    for url in ["s3://bucket/p?timeout=5", "s3://bucket/p?storage_timeout_s=soon", "s3://bucket/p?storage_timeout_s=0"]:
        with pytest.raises(ConfigError, match="storage_timeout_s"):
            open_store(url, s3=config)
    with pytest.raises(ConfigError, match="storage_timeout_s"):
        open_store("memory://", storage_timeout_s=1)


@pytest.mark.parametrize(("timeout_s", "attempts"), [(10.0, 3), (2.0, 5), (60.0, 1)])
def test_every_attempt_fits_in_the_deadline(timeout_s: float, attempts: int) -> None:
    store = S3Store(
        "bucket",
        config=S3Config(
            endpoint_url="http://127.0.0.1:9",
            region_name="us-east-1",
            storage_timeout_s=timeout_s,
            max_attempts=attempts,
        ),
    )
    try:
        client_config = store.client.meta.config
        per_attempt = client_config.connect_timeout + client_config.read_timeout
        assert per_attempt * attempts <= timeout_s
        assert client_config.read_timeout <= store.config.read_timeout_s
    finally:
        store.close()


@pytest.mark.integration
def test_a_listing_s_deadline_does_not_leak_into_the_caller_between_pages(s3_store: S3Store) -> None:
    for i in range(3):
        s3_store.put(f"checkpoints/{i}", b"x")
    listing = s3_store.scan("checkpoints/")
    assert next(listing).key == "checkpoints/0"
    assert call_deadline() is None  # the caller's own calls are not bound by the listing's deadline
    assert [o.key for o in listing] == ["checkpoints/1", "checkpoints/2"]


def test_a_memory_stores_calls_run_in_the_event_loops_thread_and_a_subclasss_in_a_thread() -> None:
    """No hand-off to a thread for a dict access; a subclass (which may wait, as `StuckStore` does) gets one, and so
    do a large put, whose copy would hold up the loop, and a listing."""
    seen: list[tuple[str, bool]] = []

    class Recording(MemoryStore):
        def put(self, key: str, data: bytes | bytearray, **kwargs: object) -> None:
            seen.append(("put", threading.current_thread() is threading.main_thread()))
            super().put(key, data, **kwargs)  # type: ignore[arg-type]

        def get(self, key: str) -> bytes:
            seen.append(("get", threading.current_thread() is threading.main_thread()))
            return super().get(key)

    async def scenario(store: MemoryStore) -> None:
        wrapped = AsyncStore(store, timeout_s=30)
        await wrapped.put("small", b"v")
        await wrapped.put("large", bytes(2 * 1024 * 1024))
        assert await wrapped.get("small") == b"v"
        await wrapped.touch("small")
        assert [info.key for info in await wrapped.scan()] == ["large", "small"]
        await wrapped.delete("small")
        with pytest.raises(StorageTimeout), storage_deadline(0.001):  # a passed deadline is refused before the call
            await asyncio.sleep(0.01)
            await wrapped.get("large")

    assert MemoryStore().in_memory and not StuckStore().in_memory and not Recording().in_memory
    as_plain = Recording()
    as_plain.in_memory = True  # what a plain MemoryStore says of itself
    asyncio.run(scenario(as_plain))
    assert seen == [("put", True), ("put", False), ("get", True)]
    seen.clear()
    asyncio.run(scenario(Recording()))
    assert seen == [("put", False), ("put", False), ("get", False)]
