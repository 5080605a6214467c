"""The optional size-bounded read every built-in backend offers (`BoundedGet`), run against each of them."""

from __future__ import annotations

import asyncio

import pytest

from snapcell.errors import CheckpointNotFound, ObjectTooLarge
from snapcell.storage import AsyncStore, BoundedGet, Store


def test_every_backend_offers_it(store: Store) -> None:
    assert isinstance(store, BoundedGet)


def test_an_object_within_the_limit_is_returned(store: Store) -> None:
    store.put("k", b"x" * 100)
    assert store.get_at_most("k", 100) == b"x" * 100  # type: ignore[attr-defined]


def test_a_larger_object_is_refused_with_its_size(store: Store) -> None:
    store.put("k", b"x" * 101)
    with pytest.raises(ObjectTooLarge) as caught:
        store.get_at_most("k", 100)  # type: ignore[attr-defined]
    assert (caught.value.key, caught.value.size, caught.value.limit) == ("k", 101, 100)


def test_a_missing_object_is_not_found(store: Store) -> None:
    with pytest.raises(CheckpointNotFound):
        store.get_at_most("missing", 100)  # type: ignore[attr-defined]


def test_the_async_face_falls_back_for_a_store_without_it(store: Store) -> None:
    class Plain:
        def __init__(self, inner: Store) -> None:
            self.get = inner.get
            self.url = inner.url

    store.put("k", b"x" * 10)
    plain = AsyncStore(Plain(store))  # type: ignore[arg-type]
    assert asyncio.run(plain.get_at_most("k", 10)) == b"x" * 10
    with pytest.raises(ObjectTooLarge):
        asyncio.run(plain.get_at_most("k", 9))
