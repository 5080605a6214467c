"""One conformance suite every backend passes: memory, local directory and S3 (moto server)."""

from __future__ import annotations

import asyncio

import pytest

from snapcell.errors import CheckpointNotFound, InvalidKey, ObjectExists, StorageError
from snapcell.storage import AsyncStore, MemoryStore, ObjectInfo, S3Store, Store, open_store

BAD_KEYS = ["../x", "/abs", "a//b", "a/../b", ".hidden", "a/.hidden", "a\\b", "", "x" * 600, "a/", "a b", "a\nb", "é"]


def test_url_reopens_the_same_store(store: Store) -> None:
    store.put("checkpoints/x", b"value")
    options = {"s3": store.config} if isinstance(store, S3Store) else {}  # the endpoint is not part of the URL
    reopened = open_store(store.url, **options)
    try:
        assert type(reopened) is type(store) and reopened.url == store.url
        if isinstance(store, MemoryStore):
            assert list(reopened.scan()) == []  # each memory store is its own: the URL names a new, empty one
        else:
            assert reopened.get("checkpoints/x") == b"value"
            reopened.put("checkpoints/y", b"other")
            assert store.get("checkpoints/y") == b"other"
    finally:
        reopened.close()


def test_put_get_round_trip(store: Store) -> None:
    store.put("checkpoints/2024-01-01/abc", b"hello")
    store.put("empty", b"")
    assert store.get("checkpoints/2024-01-01/abc") == b"hello"
    assert store.get("empty") == b""


def test_binary_data_is_preserved(store: Store) -> None:
    data = bytes(range(256)) * 40
    store.put("bin", data, expires_at=1e10)
    assert store.get("bin") == data


def test_bytearray_data_is_accepted(store: Store) -> None:
    store.put("ba", bytearray(b"mutable"))
    assert store.get("ba") == b"mutable"
    assert isinstance(store.get("ba"), bytes)


def test_create_only_refuses_and_keeps_original(store: Store) -> None:
    store.put("k", b"original")
    with pytest.raises(ObjectExists) as info:
        store.put("k", b"replacement")
    assert isinstance(info.value, FileExistsError)
    assert isinstance(info.value, StorageError)
    assert store.get("k") == b"original"
    assert [o.key for o in store.scan()] == ["k"]


def test_overwrite_replaces(store: Store) -> None:
    store.put("k", b"one")
    store.put("k", b"two!", overwrite=True)
    assert store.get("k") == b"two!"
    assert [(o.key, o.size) for o in store.scan()] == [("k", 4)]


def test_overwrite_creates_when_absent(store: Store) -> None:
    store.put("fresh", b"x", overwrite=True)
    assert store.get("fresh") == b"x"


def test_get_missing_raises_not_found(store: Store) -> None:
    with pytest.raises(CheckpointNotFound) as info:
        store.get("nope/nothing")
    assert isinstance(info.value, KeyError)
    assert info.value.key == "nope/nothing"
    assert "nope/nothing" in str(info.value)


def test_get_of_a_prefix_is_not_found(store: Store) -> None:
    store.put("dir/child", b"x")
    with pytest.raises(CheckpointNotFound):
        store.get("dir")


def test_delete(store: Store) -> None:
    store.put("a/b", b"x")
    store.delete("a/b")
    with pytest.raises(CheckpointNotFound):
        store.get("a/b")
    assert list(store.scan()) == []
    store.put("a/b", b"again")  # the key is free again
    assert store.get("a/b") == b"again"


def test_delete_missing_is_ok(store: Store) -> None:
    store.delete("never/was")
    store.delete("never/was")


def test_scan_lists_sorted_with_sizes_and_times(store: Store) -> None:
    keys = ["b", "a-c", "a/x", "a/y/z", "a.b", "a0", "c/d"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * i)
    infos = list(store.scan())
    assert [o.key for o in infos] == sorted(keys)
    assert all(isinstance(o, ObjectInfo) for o in infos)
    assert {o.key: o.size for o in infos} == {k: i for i, k in enumerate(keys)}
    assert all(o.created_at > 0 for o in infos)


def test_scan_with_prefix(store: Store) -> None:
    for key in ["checkpoints/2024-01-01/a", "checkpoints/2024-01-02/b", "checkpoints-old/c", "heads/x", "check"]:
        store.put(key, b"1")
    assert [o.key for o in store.scan("checkpoints/")] == ["checkpoints/2024-01-01/a", "checkpoints/2024-01-02/b"]
    assert [o.key for o in store.scan("checkpoints/2024-01-0")] == [
        "checkpoints/2024-01-01/a",
        "checkpoints/2024-01-02/b",
    ]
    assert [o.key for o in store.scan("checkpoints")] == [
        "checkpoints-old/c",
        "checkpoints/2024-01-01/a",
        "checkpoints/2024-01-02/b",
    ]
    assert [o.key for o in store.scan("heads/")] == ["heads/x"]
    assert list(store.scan("missing/")) == []


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k[:12]))
def test_invalid_keys_are_rejected_and_nothing_written(store: Store, key: str) -> None:
    with pytest.raises(InvalidKey) as info:
        store.put(key, b"x")
    assert isinstance(info.value, ValueError)
    assert str(info.value)
    with pytest.raises(InvalidKey):
        store.put(key, b"x", overwrite=True)
    with pytest.raises(InvalidKey):
        store.get(key)
    with pytest.raises(InvalidKey):
        store.delete(key)
    assert list(store.scan()) == []


@pytest.mark.parametrize("prefix", ["../", "/abs", "a//", ".x", "a/../"])
def test_invalid_scan_prefix_is_rejected(store: Store, prefix: str) -> None:
    with pytest.raises(InvalidKey):
        store.scan(prefix)


def test_longest_valid_key(store: Store) -> None:
    key = "/".join(["k" * 99] * 5) + "/" + "z" * 12
    assert len(key) == 512
    store.put(key, b"x")
    assert store.get(key) == b"x"


def test_async_store_round_trip(store: Store) -> None:
    async def main() -> None:
        astore = AsyncStore(store)
        assert astore.sync is store
        assert astore.url == store.url
        await astore.put("x/1", b"one")
        await astore.put("x/2", b"two", expires_at=1e10)
        with pytest.raises(ObjectExists):
            await astore.put("x/1", b"again")
        assert await astore.get("x/1") == b"one"
        assert [o.key for o in await astore.scan("x/")] == ["x/1", "x/2"]
        await astore.delete("x/1")
        with pytest.raises(CheckpointNotFound):
            await astore.get("x/1")

    asyncio.run(main())


def test_open_store_memory_is_fresh_each_time() -> None:
    first = open_store("memory://")
    first.put("a", b"1")
    assert list(open_store("memory://").scan()) == []
    assert open_store("memory://named").url == "memory://named"
