"""Host memory while loading is bounded by a checkpoint's real data, whatever its manifest or the store claims.

Each case is a checkpoint signed with the real key (a key-holding attacker, or a hostile worker's manifest) that
lies about sizes. Memory is measured with tracemalloc's peak (every bytes object and bytearray the host makes,
transient copies included), and the bound is stated per test.
"""

from __future__ import annotations

import os
import pickle
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from snapcell import CheckpointCorrupt, Limits, Policy, Pool, WorkerLost
from snapcell.checkpoint import BlobRef, Dumped, Keyring, Manifest, VariableInfo
from snapcell.checkpoint._blobs import CHUNK_BYTES, blob_key, encode_blob, hash_buffer, pack_blob_ref
from snapcell.checkpoint._format import Codec, Header, SectionKind, pack_container
from snapcell.storage import LocalStore

from .helpers import KEY, sign_and_store

MIB = 1024 * 1024
BOUND = 64 * MIB  # the stated constant: what the host may hold on top of a checkpoint's real data


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")  # reads make fresh copies, as a real store does


def _refused(error: type[Exception], action: Callable[[], Any]) -> tuple[int, str]:
    """Run ``action``, which must raise ``error``; return the peak traced allocation (bytes) and the message."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        with pytest.raises(error) as caught:
            action()
        return tracemalloc.get_traced_memory()[1] - before, str(caught.value)
    finally:
        tracemalloc.stop()


def _real_blob(store: LocalStore) -> tuple[bytes, BlobRef]:
    """A 4 MiB incompressible chunk stored as a blob in the key's namespace; return its digest and reference."""
    raw = os.urandom(CHUNK_BYTES)
    digest = hash_buffer(raw)
    stored = encode_blob(raw, 1)
    store.put(blob_key(digest, Keyring([KEY]).blob_namespace()), stored)
    return digest, BlobRef(hash=digest.hex(), raw_bytes=len(raw), stored_bytes=len(stored), stamp=0.0)


def _body(blobs: list[BlobRef], extra: list[tuple[SectionKind, Codec, int, bytes]] = ()) -> bytearray:  # type: ignore[assignment]
    stream = pickle.dumps(1, protocol=5)
    manifest = Manifest.model_construct(
        version=1,
        created_at=0.0,
        python="3",
        libraries={},
        variables=[VariableInfo(name="x", type_name="int", size_bytes=len(stream), serializer="cloudpickle")],
        dropped=[],
        setup_cells=[],
        cells=[],
        cell_count=0,
        future_flags=0,
        hash_algorithm="xxh3-128",
        blobs=blobs,
    )
    return pack_container(Header(), manifest, [(SectionKind.STREAM, Codec.RAW, len(stream), stream), *extra])


@pytest.fixture(params=["inline", "process"])
def isolation(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _load(store: LocalStore, checkpoint: bytes, isolation: str, limits: Limits | None = None) -> None:
    with Pool(store, signing_keys=[KEY], isolation=isolation, limits=limits or Limits()) as pool:
        with pool.checkout() as session:
            session.load_session(checkpoint)


def test_a_blob_listed_320_times_is_refused_before_anything_is_fetched(store: LocalStore, isolation: str) -> None:
    """Today every later load fetched and held each copy: 320 x 4 MiB = 1.3 GB."""
    _, ref = _real_blob(store)
    checkpoint = sign_and_store(store, Keyring([KEY]), _body([ref] * 320))
    peak, message = _refused(CheckpointCorrupt, lambda: _load(store, checkpoint, isolation))
    assert "more than once" in message
    assert peak < BOUND, f"host peak {peak / MIB:.0f} MiB"


def test_a_manifest_claiming_a_terabyte_blob_is_refused(store: LocalStore, isolation: str) -> None:
    digest, ref = _real_blob(store)
    huge = BlobRef.model_construct(hash=ref.hash, raw_bytes=1 << 40, stored_bytes=1 << 40, stamp=0.0)
    checkpoint = sign_and_store(store, Keyring([KEY]), _body([huge]))
    peak, message = _refused(CheckpointCorrupt, lambda: _load(store, checkpoint, isolation))
    assert "manifest is invalid" in message
    assert peak < BOUND, f"host peak {peak / MIB:.0f} MiB"


def test_buffers_claiming_a_terabyte_of_one_chunk_are_refused_before_allocating(store: LocalStore) -> None:
    """References are 16 bytes per 4 MiB: without a cap, 4 MB of them make the loader allocate a terabyte."""
    digest, ref = _real_blob(store)
    raw_size = 1 << 40
    section = (SectionKind.BLOB, Codec.RAW, raw_size, pack_blob_ref([digest] * (raw_size // CHUNK_BYTES)))
    checkpoint = sign_and_store(store, Keyring([KEY]), _body([ref], [section]))
    unlimited = Limits(memory_bytes=None, wall_time_s=None)
    peak, message = _refused(CheckpointCorrupt, lambda: _load(store, checkpoint, "inline", unlimited))
    assert "declare" in message
    assert peak < BOUND + 2 * CHUNK_BYTES, f"host peak {peak / MIB:.0f} MiB"


def test_a_dump_whose_manifest_claims_a_terabyte_blob_is_refused_before_allocating(store: LocalStore) -> None:
    """A worker's manifest is checked against the blob bytes it actually sent before the host decodes anything."""
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool, pool.checkout() as session:
        blob = encode_blob(b"x" * 1000, 1)
        digest = hash_buffer(b"x" * 1000)
        ref = BlobRef.model_construct(hash=digest.hex(), raw_bytes=1 << 40, stored_bytes=len(blob), stamp=0.0)
        body = _body([ref])

        async def hostile_dump(_request: Any) -> Dumped:
            return Dumped(body, Manifest.model_construct(blobs=[ref]), new_blobs={digest.hex(): blob})

        session._inner._backend.dump = hostile_dump  # type: ignore[method-assign]
        peak, _ = _refused(WorkerLost, session.dump)
    assert peak < BOUND, f"host peak {peak / MIB:.0f} MiB"
    assert [info.key for info in store.scan()] == []


def _garbage(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.truncate(size)  # sparse: costs no disk, reads as zeros


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_250_mb_object_at_a_checkpoint_key_is_refused_without_reading_it(store: LocalStore) -> None:
    """The host refuses it by size before reading: RSS grows by far less than the object (stated bound 32 MiB)."""
    keyring = Keyring([KEY])
    cid = keyring.new_id()
    _garbage(store.root.joinpath(*cid.storage_key.split("/")), 250 * MIB)
    limits = Limits(memory_bytes=128 * MIB)
    with Pool(store, signing_keys=[KEY], isolation="inline", limits=limits) as pool, pool.checkout() as session:
        session.feed_run("warm = 1")
        before = _rss()
        peak, _ = _refused(CheckpointCorrupt, lambda: session.load_session(cid.raw))
        grown = _rss() - before
    assert peak < 32 * MIB and grown < 32 * MIB, f"peak {peak / MIB:.0f} MiB, RSS +{grown / MIB:.0f} MiB"


def test_a_blob_replaced_by_a_huge_object_is_refused_without_reading_it(store: LocalStore) -> None:
    policy = Policy().with_modules(["numpy"])
    with Pool(store, signing_keys=[KEY], isolation="inline", policy=policy) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\ndata = np.arange(300_000)")  # 2.4 MB: stored as a blob
        checkpoint = session.dump()
        refs = session.manifest.blobs  # type: ignore[union-attr]
    assert refs
    namespace = Keyring([KEY]).blob_namespace()
    for ref in refs:
        (store.root / blob_key(bytes.fromhex(ref.hash), namespace)).unlink()
        _garbage(store.root / blob_key(bytes.fromhex(ref.hash), namespace), 250 * MIB)
    with Pool(store, signing_keys=[KEY], isolation="inline", policy=policy) as pool, pool.checkout() as session:
        peak, message = _refused(CheckpointCorrupt, lambda: session.load_session(checkpoint))
    assert "replaced" in message
    assert peak < 32 * MIB, f"peak {peak / MIB:.0f} MiB"
