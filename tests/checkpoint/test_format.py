"""The container: tampering, truncation, versions, zstd bombs, unsafe keys, dropped variables, the manifest."""

from __future__ import annotations

import json
import pickle
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zstandard

import snapcell.checkpoint._unpickle as pickle_module
from snapcell import CheckpointCorrupt, CheckpointVersionError, Limits, Policy, Pool
from snapcell.checkpoint import Keyring, Manifest, VariableInfo
from snapcell.checkpoint._format import Codec, Header, SectionKind, pack_container
from snapcell.errors import InvalidKey, UnpicklableValue
from snapcell.session._verify import HMAC_THREAD_BYTES
from snapcell.storage import LocalStore, MemoryStore
from tests.checkpoint import helpers
from tests.checkpoint.helpers import KEY, crafted_body, sign_and_store

KEYRING = Keyring([KEY])


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def trusting_pool(store: MemoryStore) -> Iterator[Pool]:
    """An unrestricted pool: its loader would import tests.checkpoint.helpers and run the canary."""
    with Pool(store, signing_keys=[KEY], isolation="inline", policy=Policy.unrestricted()) as pool:
        yield pool


@pytest.fixture
def pool(store: MemoryStore) -> Iterator[Pool]:
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool:
        yield pool


@pytest.fixture(autouse=True)
def _reset_canary() -> Iterator[None]:
    helpers.CANARY.clear()
    yield
    helpers.CANARY.clear()


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything is decompressed or unpickled."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("bytes that failed verification reached the decompressor or an unpickler")

    monkeypatch.setattr(pickle_module._RestrictedUnpickler, "load", forbidden)
    monkeypatch.setattr(pickle_module._RestrictedDillUnpickler, "load", forbidden)
    monkeypatch.setattr(pickle_module, "_decompress", forbidden)


def _load(pool: Pool, checkpoint_id: bytes) -> Any:
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        return session.feed_run("x")


def _regions(blob: bytes) -> dict[str, int]:
    """An offset in each part of a signed checkpoint."""
    header_len = len(Header().pack())
    (manifest_len,) = __import__("struct").unpack_from(">I", blob, header_len)
    payload = header_len + 4 + manifest_len + 4 + 18  # past the one-entry section table
    return {
        "magic": 0,
        "header": header_len - 1,
        "manifest": header_len + 4 + manifest_len // 2,
        "table": header_len + 4 + manifest_len + 6,
        "payload": payload + 2,
        "mac": len(blob) - 1,
    }


def test_crafted_checkpoint_runs_the_canary_when_intact(trusting_pool: Pool, store: MemoryStore) -> None:
    # Control: with a valid seal the stream does reach the unpickler, so the tests below are meaningful.
    checkpoint_id = sign_and_store(store, KEYRING, crafted_body())
    assert _load(trusting_pool, checkpoint_id) == "unpickled"
    assert helpers.CANARY == ["unpickled"]


@pytest.mark.parametrize("region", ["magic", "header", "manifest", "table", "payload", "mac"])
def test_flipped_byte_is_corrupt_and_nothing_is_unpickled(
    trusting_pool: Pool, store: MemoryStore, region: str, no_unpickling: None
) -> None:
    checkpoint_id = sign_and_store(store, KEYRING, crafted_body())
    key = KEYRING.parse_id(checkpoint_id).storage_key
    blob = bytearray(store.get(key))
    blob[_regions(bytes(blob))[region]] ^= 0x01
    store.put(key, bytes(blob), overwrite=True)
    with pytest.raises(CheckpointCorrupt):
        _load(trusting_pool, checkpoint_id)
    assert helpers.CANARY == []


def test_every_flipped_byte_of_a_real_checkpoint_is_corrupt(pool: Pool, store: MemoryStore) -> None:
    with pool.checkout() as session:
        session.feed_run("x = {'a': [1, 2.5, 'three'], 'b': b'four'}\ndef f(y):\n    return y + 1")
        checkpoint_id = session.dump()
    key = KEYRING.parse_id(checkpoint_id).storage_key
    original = store.get(key)
    with pool.checkout() as session:
        for position in range(len(original)):
            blob = bytearray(original)
            blob[position] ^= 0x04
            store.put(key, bytes(blob), overwrite=True)
            with pytest.raises(CheckpointCorrupt):
                session.load_session(checkpoint_id)
        store.put(key, original, overwrite=True)
        session.load_session(checkpoint_id)
        assert session.feed_run("f(x['a'][0])") == 2


def _padded_body(size: int) -> bytearray:
    """A crafted body (the canary's stream) padded to ``size`` bytes or more, kept raw so its size is the body's."""
    stream = pickle.dumps((b"\x00" * size, helpers._Trap()), protocol=5)
    return crafted_body(stream)


# The host verifies a checkpoint of more than HMAC_THREAD_BYTES in a thread: a tampered one at each size the
# verification path branches on must be refused, not only the small ones the other tests craft.
@pytest.mark.parametrize("size", [HMAC_THREAD_BYTES // 2, HMAC_THREAD_BYTES + 1, 3 * HMAC_THREAD_BYTES // 2])
@pytest.mark.parametrize("region", ["payload", "mac"])
def test_a_tampered_checkpoint_is_corrupt_at_every_size(
    trusting_pool: Pool, store: MemoryStore, size: int, region: str
) -> None:
    checkpoint_id = sign_and_store(store, KEYRING, _padded_body(size))
    key = KEYRING.parse_id(checkpoint_id).storage_key
    original = store.get(key)
    assert len(original) > size
    blob = bytearray(original)
    blob[_regions(original)[region]] ^= 0x01
    store.put(key, bytes(blob), overwrite=True)
    with pytest.raises(CheckpointCorrupt, match="failed verification"):
        _load(trusting_pool, checkpoint_id)
    assert helpers.CANARY == []
    store.put(key, original, overwrite=True)  # control: intact, the same bytes reach the unpickler
    _load(trusting_pool, checkpoint_id)
    assert helpers.CANARY == ["unpickled"]


@pytest.mark.parametrize("keep", [0, 1, 8, 40, "half", -32, -1])
def test_truncated_checkpoint_is_corrupt(
    trusting_pool: Pool, store: MemoryStore, keep: int | str, no_unpickling: None
) -> None:
    checkpoint_id = sign_and_store(store, KEYRING, crafted_body())
    key = KEYRING.parse_id(checkpoint_id).storage_key
    blob = store.get(key)
    cut = blob[: len(blob) // 2] if keep == "half" else blob[:keep]
    store.put(key, cut, overwrite=True)
    with pytest.raises(CheckpointCorrupt):
        _load(trusting_pool, checkpoint_id)
    assert helpers.CANARY == []


def _resign_with_header_bytes(store: MemoryStore, checkpoint_id: bytes, offset: int, value: bytes) -> bytes:
    cid = KEYRING.parse_id(checkpoint_id)
    body = bytearray(KEYRING.verify(store.get(cid.storage_key), cid))
    body[offset : offset + len(value)] = value
    return sign_and_store(store, KEYRING, body)


@pytest.mark.parametrize(
    ("offset", "value", "match"),
    [(8, b"\x00\x04", "format version 4"), (8, b"\xff\xff", "format version 65535")],
    ids=["next-format", "far-format"],
)
def test_version_mismatch_is_refused_before_unpickling(
    trusting_pool: Pool, store: MemoryStore, offset: int, value: bytes, match: str, no_unpickling: None
) -> None:
    original = sign_and_store(store, KEYRING, crafted_body())
    checkpoint_id = _resign_with_header_bytes(store, original, offset, value)
    with pytest.raises(CheckpointVersionError, match=match):
        _load(trusting_pool, checkpoint_id)
    assert helpers.CANARY == []


def test_header_round_trips() -> None:
    header = Header(compression_level=3)
    unpacked, end = Header.unpack(header.pack())
    assert unpacked == header and end == len(header.pack())


def _zstd_body(declared: int, frame: bytes) -> bytearray:
    manifest = Manifest(
        created_at=0.0,
        python="3",
        libraries={},
        variables=[VariableInfo(name="x", type_name="bytes", size_bytes=declared, serializer="cloudpickle")],
    )
    return pack_container(Header(format_version=2), manifest, [(SectionKind.STREAM, Codec.ZSTD, declared, frame)])


@pytest.mark.parametrize("memory_bytes", [Limits().memory_bytes, None], ids=["default-cap", "no-cap"])
def test_section_declaring_a_huge_size_is_corrupt_not_memory_error(
    store: MemoryStore, memory_bytes: int | None
) -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(pickle.dumps(b"small"))
    checkpoint_id = sign_and_store(store, KEYRING, _zstd_body(10**15, frame))
    with Pool(store, signing_keys=[KEY], isolation="inline", limits=Limits(memory_bytes=memory_bytes)) as pool:
        with pytest.raises(CheckpointCorrupt):
            _load(pool, checkpoint_id)


@pytest.mark.parametrize("content_size", [True, False], ids=["frame-declares-size", "frame-without-size"])
def test_section_decompressing_past_its_declared_size_is_corrupt(
    pool: Pool, store: MemoryStore, content_size: bool
) -> None:
    bomb = zstandard.ZstdCompressor(write_content_size=content_size).compress(b"\0" * (64 * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    checkpoint_id = sign_and_store(store, KEYRING, _zstd_body(1000, bomb))
    with pytest.raises(CheckpointCorrupt, match="size"):
        _load(pool, checkpoint_id)


def test_section_that_is_not_zstd_is_corrupt(pool: Pool, store: MemoryStore) -> None:
    checkpoint_id = sign_and_store(store, KEYRING, _zstd_body(10, b"definitely not zstd"))
    with pytest.raises(CheckpointCorrupt):
        _load(pool, checkpoint_id)


def test_restricted_loader_refuses_modules_the_policy_does_not_allow(pool: Pool, store: MemoryStore) -> None:
    # A stream naming an arbitrary importable module is refused by find_class, even with a valid seal.
    checkpoint_id = sign_and_store(store, KEYRING, crafted_body())
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        result = session.run("x")
    assert helpers.CANARY == []
    assert result.error is not None and result.error.exc_type == "NameError"
    assert any("could not be restored: x" in note and "does not allow" in note for note in result.notes)


@pytest.mark.parametrize("key", ["../escape", "checkpoints/../../etc/passwd", "/absolute", "a//b", ".hidden", "a\\b"])
@pytest.mark.parametrize("backend", ["memory", "local"])
def test_unsafe_keys_are_refused_by_the_store(tmp_path: Any, key: str, backend: str) -> None:
    store = MemoryStore() if backend == "memory" else LocalStore(tmp_path / "store")
    with pytest.raises(InvalidKey):
        store.put(key, b"data")
    with pytest.raises(InvalidKey):
        store.get(key)
    with pytest.raises(InvalidKey):
        store.delete(key)
    assert not (tmp_path / "escape").exists()


# ------------------------------------------------------------------- unserializable variables


def _make_lock() -> threading.Lock:
    return threading.Lock()


def _make_socket() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


HOST = {"make_lock": _make_lock, "make_socket": _make_socket}
SCRIPT = """
numbers = [1, 2, 3]
g = (i for i in range(3))
lock = make_lock()
sock = make_socket()
total = sum(numbers)
"""


def test_unserializable_variables_are_dropped_alone_and_named(pool: Pool, store: MemoryStore) -> None:
    with pool.checkout() as session:
        session.feed_run(SCRIPT, external_lookup=HOST)
        checkpoint_id = session.dump()
        manifest = session.manifest
        next_run = session.run("total")
        session.feed_run("sock.close()")
    assert manifest is not None
    dropped = {d.name: d for d in manifest.dropped}
    assert sorted(dropped) == ["g", "sock"]
    assert dropped["g"].type_name == "generator"
    assert dropped["sock"].type_name == "socket.socket"
    assert "generator" in dropped["g"].reason and "dill" in dropped["g"].reason
    stored = {v.name: v.serializer for v in manifest.variables}
    assert stored == {"numbers": "cloudpickle", "total": "cloudpickle", "lock": "dill"}
    # The next run says so, in one line naming both.
    (note,) = [n for n in next_run.notes if "g (generator)" in n]
    assert "sock (socket.socket)" in note and "\n" not in note
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        result = restored.run("[numbers, total, type(lock).__name__, lock.acquire(), 'g' in dir(), 'sock' in dir()]")
    assert result.error is None, result.error
    assert result.value == [[1, 2, 3], 6, "lock", True, False, False]
    assert any("g (generator)" in n and "sock (socket.socket)" in n for n in result.notes)


def test_on_unpicklable_fail_raises_and_stores_nothing(pool: Pool, store: MemoryStore) -> None:
    with pool.checkout() as session:
        session.feed_run("numbers = [1, 2]\ng = (i for i in range(3))")
        before = list(store.scan())
        with pytest.raises(UnpicklableValue) as info:
            session.dump(on_unpicklable="fail")
        assert info.value.variable_names == ["g"]
        assert "g" in str(info.value)
        assert list(store.scan()) == before
        assert session.checkpoint_id is None
        session.feed_run("del g")
        assert session.dump(on_unpicklable="fail")


def test_script_reduce_that_raises_drops_only_that_variable(pool: Pool) -> None:
    code = """
class Stubborn:
    def __reduce__(self):
        raise ValueError("no pickling today")
ok = {"a": 1}
bad = Stubborn()
after = [ok]
"""
    with pool.checkout() as session:
        session.feed_run(code)
        checkpoint_id = session.dump()
        assert [d.name for d in session.manifest.dropped] == ["bad"]  # type: ignore[union-attr]
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("after[0] is ok, ok") == (True, {"a": 1})


# ------------------------------------------------------------------------------ manifest


def test_manifest_json_is_stable(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("import math\nx = [1, 2]\ndef f():\n    return math.pi")
        session.dump()
        first = session.manifest
        session.dump()
        second = session.manifest
    assert first is not None and second is not None
    one, two = json.loads(first.to_json()), json.loads(second.to_json())
    assert one.pop("created_at") <= two.pop("created_at")
    assert one == two
    assert list(json.loads(first.to_json())) == list(json.loads(second.to_json()))  # same field order
    assert one["version"] == 1
    assert Manifest.model_validate_json(first.to_json()) == first
    assert [v["name"] for v in one["variables"]] == ["math", "x", "f"]
