"""A dump may refer only to blobs its session loaded or wrote: blob names are capabilities, not guesses.

A compromised worker that knows (or guesses: a PIN, a short key) the content of another conversation's file could
list that blob in its dump; the host signed it, and the next load fetched the other conversation's bytes from the
pool's shared blob namespace (a wrong guess read as "blob missing": an oracle on any guessable content).
"""

from __future__ import annotations

from typing import Any

import pytest

from snapcell import Policy, Pool, WorkerLost
from snapcell.backends import InlineBackend
from snapcell.checkpoint import Dumped, pack_container, parse_container
from snapcell.storage import MemoryStore

KEY = "blob-capability-tests-signing-key-0123"


def _with_extra_refs(dumped: Dumped, refs: list[Any]) -> Dumped:
    container = parse_container(dumped.body)
    manifest = dumped.manifest.model_copy(update={"blobs": [*dumped.manifest.blobs, *refs]})
    sections = [(s.kind, s.codec, s.raw_size, s.data) for s in container.sections]
    body = pack_container(container.header, manifest, sections)
    return Dumped(body=body, manifest=manifest, new_blobs=dumped.new_blobs, refresh=dumped.refresh)


def test_a_dump_naming_another_sessions_blob_is_refused_before_signing(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore("capabilities")
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=Policy().with_modules(["numpy"])) as pool:
        with pool.checkout() as other:  # another conversation's secret, stored as a blob
            other.feed_run("import numpy as np\nsecret = np.full(100_000, 7)")
            other.dump()
            assert other.manifest is not None and other.manifest.blobs
            stolen = list(other.manifest.blobs)
        real_dump = InlineBackend.dump

        async def naming_a_stolen_blob(self: InlineBackend, request: Any) -> Dumped:
            return _with_extra_refs(await real_dump(self, request), stolen)

        with pool.checkout() as session:
            session.feed_run("mine = 1")
            session.dump()  # the session's own checkpoint: what a lost worker is restored from
            before = sorted(info.key for info in store.scan())
            monkeypatch.setattr(InlineBackend, "dump", naming_a_stolen_blob)
            with pytest.raises(WorkerLost, match="never loaded or wrote"):
                session.dump()
            monkeypatch.undo()
            assert sorted(info.key for info in store.scan()) == before  # nothing stored or signed
            assert session.feed_run("mine") == 1  # the session goes on, from its checkpoint
            session.dump()  # an honest dump still works


def test_a_session_may_refer_to_the_blobs_it_loaded() -> None:
    store = MemoryStore("capabilities-own")
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=Policy().with_modules(["numpy"])) as pool:
        with pool.checkout() as session:
            session.feed_run("import numpy as np\ndata = np.arange(200_000)")
            first = session.dump()
        with pool.checkout() as session:
            session.load_session(first)
            session.feed_run("n = 1")
            second = session.dump()  # refers to the loaded array's blobs without sending them
            assert session.manifest is not None and session.manifest.blobs
        with pool.checkout() as session:
            session.load_session(second)
            assert session.feed_run("int(data[-1]) + n") == 200_000


def test_new_blobs_are_named_by_sha256_and_an_xxh3_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A content address crosses sessions, so it must be collision-resistant: xxh3-128 names are for old data."""
    import hashlib

    import xxhash

    from snapcell.checkpoint import encode_blob

    store = MemoryStore("sha256-names")
    policy = Policy().with_modules(["numpy"])
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=policy) as pool, pool.checkout() as session:
        session.feed_run("import numpy as np\ndata = np.arange(100_000)")
        session.dump()
        assert session.manifest is not None and session.manifest.blobs
        assert all(len(ref.hash) == 64 for ref in session.manifest.blobs)
        raw = session.feed_run("data.tobytes()")
        assert any(ref.hash == hashlib.sha256(raw[: 4 * 1024 * 1024]).hexdigest() for ref in session.manifest.blobs)
        real_dump = InlineBackend.dump

        async def an_xxh3_name(self: InlineBackend, request: Any) -> Dumped:
            dumped = await real_dump(self, request)
            payload = b"planted under a name one can collide"
            name = xxhash.xxh3_128_hexdigest(payload)
            ref = dumped.manifest.blobs[0].model_copy(update={"hash": name, "raw_bytes": len(payload)})
            forged = _with_extra_refs(dumped, [ref])
            forged.new_blobs[name] = encode_blob(payload, 1)
            return forged

        monkeypatch.setattr(InlineBackend, "dump", an_xxh3_name)
        session.feed_run("more = 1")
        with pytest.raises(WorkerLost, match="SHA-256"):
            session.dump()
