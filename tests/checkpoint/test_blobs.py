"""Incremental checkpoints: large buffers are content-addressed blobs, stored once, kept while needed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import CheckpointCorrupt, Limits, Policy, Pool, WorkerLost
from snapcell.checkpoint import Keyring, blob_keys_of
from snapcell.errors import StorageUnavailable
from snapcell.ops import cleanup, usage
from snapcell.storage import MemoryStore, ObjectInfo

pytest.importorskip("numpy")
pytest.importorskip("pandas")

KEY = "blob-test-signing-key-0123456789"
DAY = 86400.0
HOUR = 3600.0
POLICY = Policy().with_modules(["numpy", "pandas"])
LIMITS = Limits(memory_bytes=8 * 2**30, wall_time_s=120)
GOLDEN = Path(__file__).parent / "golden"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(MemoryStore):
    """A memory store that records every key written."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(now=clock)
        self.writes: list[str] = []

    def put(
        self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False
    ) -> None:
        super().put(key, data, expires_at=expires_at, overwrite=overwrite)
        self.writes.append(key)

    def blob_writes(self) -> list[str]:
        return [k for k in self.writes if k.startswith("blobs/")]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> CountingStore:
    return CountingStore(clock)


def _pool(store: MemoryStore, clock: Clock, isolation: str = "inline") -> Pool:
    return Pool(store, isolation=isolation, policy=POLICY, limits=LIMITS, signing_keys=[KEY], clock=clock)


BIG_SESSION = """\
import numpy as np, pandas as pd
big = np.arange(25_000_000, dtype=np.float64)            # 200 MB
n = 1_000_000
df = pd.DataFrame({
    "id": np.arange(n),
    "amount": np.arange(n) * 0.5,
    "at": pd.date_range("2026-01-01", periods=n, freq="s"),
})
"""


def test_unchanged_data_is_never_stored_twice(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run(BIG_SESSION)
        session.dump()
        first_blobs = store.blob_writes()
        assert len(first_blobs) >= 4 + 48  # chunks of big (200 MB / 4 MiB) and of the three columns
        first_size = session.checkpoint_bytes
        assert first_size is not None and first_size < 1_000_000  # the data lives in blobs

        store.writes.clear()
        session.dump()
        assert store.blob_writes() == []
        assert session.checkpoint_bytes is not None and session.checkpoint_bytes < 1_000_000

        store.writes.clear()
        session.feed_run("df['amount'] = df['amount'] + 1")
        session.dump()
        changed = {key.rsplit("/", 1)[1] for key in store.blob_writes()}
        assert changed and not changed & {key.rsplit("/", 1)[1] for key in first_blobs}
        assert session.manifest is not None
        written = sum(ref.raw_bytes for ref in session.manifest.blobs if ref.hash in changed)
        assert written == 8 * 1_000_000  # the new column's chunks, nothing else

        store.writes.clear()
        session.feed_run("big[:1000] = -1.0")  # a few bytes of a 200 MB array: one 4 MiB chunk
        session.dump()
        assert len(store.blob_writes()) == 1


def test_blobs_restore_equal_and_writable_across_isolation_modes(store: CountingStore, clock: Clock) -> None:
    code = (
        "import numpy as np, pandas as pd\na = np.arange(200_000)\n"
        "t = pd.Series(pd.date_range('2026-01-01', periods=100_000, freq='min'))"
    )
    with _pool(store, clock, "process") as pool:
        with pool.checkout() as session:
            session.feed_run(code)
            checkpoint = session.dump()
        assert len(store.blob_writes()) == 2
        with pool.checkout() as session:
            session.load_session(checkpoint)
            value = session.feed_run("a[0] = 7\nint(a.sum()), str(t.dtype), str(t.iloc[-1])")
    assert value == (sum(range(200_000)) + 7, "datetime64[us]", "2026-03-11 10:39:00")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("np.random.default_rng(0).random(100_000)", "does not match its hash"),  # stored raw
        ("np.arange(100_000)", "does not (decompress|match its hash)"),  # stored compressed
    ],
    ids=["raw", "compressed"],
)
def test_a_tampered_blob_is_rejected(store: CountingStore, clock: Clock, make: str, message: str) -> None:
    with _pool(store, clock) as pool:
        with pool.checkout() as session:
            session.feed_run(f"import numpy as np\na = {make}")
            checkpoint = session.dump()
        (key,) = store.blob_writes()
        data = bytearray(store.get(key))
        data[len(data) // 2] ^= 0x01
        store.put(key, bytes(data), overwrite=True)
        with pool.checkout() as session:
            with pytest.raises(CheckpointCorrupt, match=message):
                session.load_session(checkpoint)
            assert session.feed_run("1 + 1") == 2


def test_a_missing_blob_is_a_clear_error(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool:
        with pool.checkout() as session:
            session.feed_run("import numpy as np\na = np.arange(100_000)")
            checkpoint = session.dump()
        (key,) = store.blob_writes()
        store.delete(key)
        with pool.checkout() as session, pytest.raises(CheckpointCorrupt, match="missing from the store"):
            session.load_session(checkpoint)


def test_a_dump_after_a_blob_vanished_writes_it_again(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        session.dump()
        (key,) = store.blob_writes()
        clock.now += 2 * DAY  # the next dump must refresh the blob, and finds it gone
        store.delete(key)
        checkpoint = session.dump()
        assert key in store.blob_writes()[1:]
        session.load_session(checkpoint)


def test_reused_blobs_are_refreshed_after_six_hours(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        session.dump()
        (key,) = store.blob_writes()
        clock.now += 3 * HOUR
        session.dump()
        assert _info(store, key).created_at == clock.now - 3 * HOUR  # not refreshed: younger than 6 hours
        clock.now += 4 * HOUR
        session.dump()
        assert _info(store, key).created_at == clock.now
        assert store.blob_writes() == [key]  # refreshed in place, never uploaded again


def test_cleanup_keeps_referenced_blobs_and_deletes_orphans(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool:
        with pool.checkout() as session:
            session.feed_run("import numpy as np\nold = np.arange(100_000)")
            session.dump()
            session.feed_run("del old\nnew = np.arange(200_000)")
            session.dump()
        old_blob, new_blob = store.blob_writes()
        clock.now += 8 * DAY  # everything expired except what the next turn writes
        with pool.checkout() as session:
            session.feed_run("import numpy as np\nnew = np.arange(200_000)")  # same content as new_blob
            live = session.dump()
        report = cleanup(store, now=clock.now, blob_refs=blob_keys_of)
        keys = {o.key for o in store.scan()}
        assert old_blob not in keys
        assert new_blob in keys  # stored again by reference (refreshed), needed by the live checkpoint
        assert report.deleted_blob_objects == 1
        assert "deleted  1 unreferenced blobs" in report.summary()
        shown = usage(store, now=clock.now)
        assert shown.blob_objects == 1 and shown.blob_bytes == _info(store, new_blob).size
        assert "blobs (large data, shared): 1 objects" in shown.summary()
        with pool.checkout() as session:
            session.load_session(live)
            assert session.feed_run("int(new[-1])") == 199_999


def test_cleanup_keeps_young_unreferenced_blobs(store: CountingStore, clock: Clock) -> None:
    """A dump writes its blobs before its checkpoint: cleanup in between must not take them."""
    store.put("blobs/ab/" + "ab" * 16, b"\x00data")
    report = cleanup(store, now=clock.now + 3600, blob_refs=blob_keys_of)
    assert report.deleted_blob_objects == 0
    report = cleanup(store, now=clock.now + 2 * DAY, blob_refs=blob_keys_of)
    assert report.deleted_blob_objects == 1


class DelegatingStore(MemoryStore):
    """A store that passes everything to ``inner``; subclasses change one method to stage a situation."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def url(self) -> str:
        return self._inner.url

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._inner.scan(prefix)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def delete(self, key: str) -> None:
        self._inner.delete(key)


class InterleavingStore(DelegatingStore):
    """Runs ``between`` once, right after cleanup's first full listing: a dump racing the cleanup."""

    def __init__(self, inner: MemoryStore, between: Callable[[], Any]) -> None:
        super().__init__(inner)
        self._between: Callable[[], Any] | None = between

    def scan(self, prefix: str = "") -> Iterator[ObjectInfo]:
        listing = list(self._inner.scan(prefix))
        if prefix == "" and self._between is not None:
            between, self._between = self._between, None
            between()
        return iter(listing)


def test_cleanup_racing_a_dump_that_reuses_an_old_blob(store: CountingStore, clock: Clock) -> None:
    """The checkpoint that referred to the blob expires; a session that loaded it earlier dumps during cleanup."""
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        first = session.dump()
        (blob,) = store.blob_writes()
        clock.now += 6 * DAY
        session.load_session(first)  # still within the ttl
        clock.now += 2 * DAY  # now the first checkpoint has expired
        dumped: list[bytes] = []
        racing = InterleavingStore(store, lambda: dumped.append(session.dump()))
        cleanup(racing, now=clock.now, blob_refs=blob_keys_of)
        assert blob in {o.key for o in store.scan()}
        session.load_session(dumped[0])
        assert session.feed_run("int(a[-1])") == 99_999


def test_cleanup_racing_a_dump_that_writes_new_blobs(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        dumped: list[bytes] = []
        racing = InterleavingStore(store, lambda: dumped.append(session.dump()))
        cleanup(racing, now=clock.now, blob_refs=blob_keys_of, blob_grace_s=0, force=True)
        session.load_session(dumped[0])
        assert session.feed_run("int(a[-1])") == 99_999


def test_checkpoints_of_format_version_1_still_load(clock: Clock) -> None:
    folder = GOLDEN / "v1-py311"
    if not folder.exists():
        pytest.skip("no golden checkpoint for this Python version")
    meta = json.loads((folder / "meta.json").read_text())
    store = MemoryStore(now=clock)
    store.put(meta["storage_key"], (folder / "checkpoint.bin").read_bytes())
    created = Keyring([meta["key"]]).parse_id(bytes.fromhex(meta["id"])).created_at
    clock.now = created + 60
    with Pool(store, isolation="inline", policy=POLICY, signing_keys=[meta["key"]], clock=clock) as pool:
        with pool.checkout() as session:
            session.load_session(bytes.fromhex(meta["id"]))
            value = session.feed_run("total, round(area(1), 5), boxes is same, [b.n for b in boxes], int(big.sum())")
    assert value == (42, 3.14159, True, [1, 2], sum(range(100_000)))


def _info(store: MemoryStore, key: str) -> ObjectInfo:
    (info,) = [o for o in store.scan() if o.key == key]
    return info


def test_a_forged_blob_from_the_runner_is_never_stored(
    store: CountingStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compromised worker could name garbage after data others store: the host checks every new blob."""
    from snapcell.backends import InlineBackend

    real_dump = InlineBackend.dump

    async def forging_dump(self: InlineBackend, request: Any) -> Any:
        dumped = await real_dump(self, request)
        for name in dumped.new_blobs:
            dumped.new_blobs[name] = b"\x00" + bytes(len(dumped.new_blobs[name]) - 1)  # raw codec, wrong bytes
        return dumped

    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        monkeypatch.setattr(InlineBackend, "dump", forging_dump)
        with pytest.raises(WorkerLost, match="does not match its name"):
            session.dump()
        assert store.writes == []  # neither the blob nor a checkpoint
        monkeypatch.setattr(InlineBackend, "dump", real_dump)
        assert session.feed_run("1 + 1") == 2  # restored (empty: nothing was dumped before) and usable


def test_a_blob_of_the_right_size_and_wrong_content_is_never_stored(
    store: CountingStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the host's hash of the bytes tells such a blob from the one its name promises; no size check can."""
    from snapcell.backends import InlineBackend
    from snapcell.checkpoint import blob_raw_size, decode_blob, encode_blob

    real_dump = InlineBackend.dump

    async def same_size_other_bytes(self: InlineBackend, request: Any) -> Any:
        dumped = await real_dump(self, request)
        for name, data in dumped.new_blobs.items():
            raw = bytearray(blob_raw_size(data))
            decode_blob(data, digest=bytes.fromhex(name), into=memoryview(raw))
            raw[len(raw) // 2] ^= 0x01
            dumped.new_blobs[name] = encode_blob(raw, 1)
            assert blob_raw_size(dumped.new_blobs[name]) == len(raw)
        return dumped

    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        monkeypatch.setattr(InlineBackend, "dump", same_size_other_bytes)
        with pytest.raises(WorkerLost, match="does not match its hash"):
            session.dump()
        assert store.writes == []  # neither the blob nor a checkpoint
        monkeypatch.setattr(InlineBackend, "dump", real_dump)
        assert session.feed_run("1 + 1") == 2


def test_each_signing_key_has_its_own_blob_namespace(store: CountingStore, clock: Clock) -> None:
    code = "import numpy as np\na = np.arange(100_000)"
    other = "another-tenant-signing-key-0123456789"
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run(code)
        mine = session.dump()
    with Pool(store, isolation="inline", policy=POLICY, signing_keys=[other], clock=clock) as theirs:
        with theirs.checkout() as session:
            session.feed_run(code)
            session.dump()
    first, second = store.blob_writes()
    assert first.rsplit("/", 1)[1] == second.rsplit("/", 1)[1]  # same content...
    assert first != second  # ...stored once per tenant, never shared
    # After a rotation the old key still verifies, and its namespace is still read.
    fresh = "rotated-in-signing-key-0123456789"
    with Pool(store, isolation="inline", policy=POLICY, signing_keys=[fresh, KEY], clock=clock) as rotated:
        with rotated.checkout() as session:
            session.load_session(mine)
            assert session.feed_run("int(a[-1])") == 99_999
            store.writes.clear()
            session.dump()
            assert len(store.blob_writes()) == 1  # rewritten into the new key's namespace


class FlakyStore(DelegatingStore):
    """Fails reads of checkpoints the way an overloaded S3 endpoint does."""

    def get(self, key: str) -> bytes:
        if key.startswith("checkpoints/"):
            raise StorageUnavailable("slow down")
        return self._inner.get(key)


def test_cleanup_deletes_no_blob_when_it_cannot_read_a_checkpoint(store: CountingStore, clock: Clock) -> None:
    with _pool(store, clock) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\na = np.arange(100_000)")
        live = session.dump()
    with pytest.raises(StorageUnavailable):
        cleanup(FlakyStore(store), now=clock.now + 2 * DAY, blob_refs=blob_keys_of)
    with _pool(store, clock) as pool, pool.checkout() as session:
        clock.now += 2 * DAY
        session.load_session(live)
        assert session.feed_run("int(a[-1])") == 99_999
