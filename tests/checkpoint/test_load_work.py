"""The work a load does stays bounded: no collections while it restores; frames the host scanned, scanned once."""

from __future__ import annotations

import ast
import gc
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint import Keyring, _hostscan, dump_namespace, load_namespace, make_find_global
from snapcell.checkpoint._format import SectionKind, parse_container
from snapcell.checkpoint._hostscan import PassedFrames
from snapcell.errors import CheckpointCorrupt
from snapcell.interpreter._definitions import Definitions
from snapcell.storage import MemoryStore

KEY = "load-work-tests-signing-key-0123456789"
WIDE = Policy().with_modules(["numpy"])
# Two variables large enough to be stored as frame blobs; one names numpy, which the default policy refuses.
SCRIPT = "import numpy as np\nbig = {str(i): i for i in range(5000)}\nnums = [np.int64(i) for i in range(5000)]\n"


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The frame blobs the host decodes and scans (by hash), in order."""
    seen: list[str] = []
    real = _hostscan.scan_frame_blob

    def counting(stored: Any, digest_hex: str, raw_size: int, rule: Any) -> Any:
        seen.append(digest_hex)
        return real(stored, digest_hex, raw_size, rule)

    monkeypatch.setattr(_hostscan, "scan_frame_blob", counting)
    return seen


def _frame_blobs(pool: Pool, checkpoint_id: bytes) -> list[str]:
    keyring = Keyring([KEY])
    cid = keyring.parse_id(checkpoint_id)
    body = keyring.verify(pool.store.get(cid.storage_key), cid)
    return [bytes(s.data).hex() for s in parse_container(body).sections if s.kind is SectionKind.FRAME_BLOB]


@pytest.fixture
def dumped() -> Iterator[tuple[MemoryStore, Pool, bytes]]:
    store = MemoryStore("load-work")
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=WIDE) as pool:
        with pool.checkout() as session:
            result = session.run(SCRIPT)
            assert result.error is None, result.error
            checkpoint_id = session.dump()
        yield store, pool, checkpoint_id


def test_a_load_of_the_pool_s_own_dump_scans_none_of_its_frames_and_the_next_dump_may_refer_to_them(
    dumped: tuple[MemoryStore, Pool, bytes], scans: list[str]
) -> None:
    store, pool, checkpoint_id = dumped
    frames = _frame_blobs(pool, checkpoint_id)
    assert len(frames) >= 2, "the test needs both variables stored as frame blobs"
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session._inner._verifier.frames == set(frames)
        session.run("extra = 1")
        stored_before = len(list(store.scan()))
        session.dump()  # refers to the loaded frames without sending them: the host knows them
    assert scans == []
    assert len(list(store.scan())) == stored_before + 1  # the new checkpoint only, no frame stored again


def test_a_load_in_another_pool_scans_every_frame(dumped: tuple[MemoryStore, Pool, bytes], scans: list[str]) -> None:
    store, pool, checkpoint_id = dumped
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=WIDE) as other, other.checkout() as session:
        session.load_session(checkpoint_id)
        assert session._inner._verifier.frames == set(_frame_blobs(pool, checkpoint_id))
    assert sorted(scans) == sorted(_frame_blobs(pool, checkpoint_id))


def test_a_session_with_a_narrower_policy_scans_the_frames_again_and_keeps_only_those_its_rule_passes(
    dumped: tuple[MemoryStore, Pool, bytes], scans: list[str]
) -> None:
    """What passed the pool's wide policy is not known to a narrower one: numpy's frame is refused by its rule."""
    store, pool, checkpoint_id = dumped
    frames = _frame_blobs(pool, checkpoint_id)
    with pool.checkout(policy=Policy()) as session:
        session.load_session(checkpoint_id)
        kept = session._inner._verifier.frames
    assert sorted(scans) == sorted(frames)
    assert kept and kept < set(frames)
    # The refused frame is numpy's; a dump of this session could not refer to it unscanned.
    with pool.checkout(policy=Policy()) as again:
        again.load_session(checkpoint_id)
        assert again._inner._verifier.frames == kept
    assert len(scans) == 2 * len(frames) - len(kept)  # refused frames are scanned again: a refusal is not remembered


def test_passed_frames_are_kept_per_policy_and_forgotten_past_the_bound() -> None:
    passed = PassedFrames(max_frames=3)
    passed.add(WIDE, {"a", "b"})
    assert passed.known(WIDE, ["a", "b", "c"]) == {"a", "b"}
    passed.add_streams(WIDE, {b"s1", b"s2", b"s3"})  # streams have a bound of their own: no frame is forgotten
    assert b"s1" in passed.streams(WIDE) and b"s1" not in passed.streams(Policy())
    assert passed.known(WIDE, ["a", "b"]) == {"a", "b"}
    passed.add_streams(WIDE, {b"s4"})  # past the bound: every stream is forgotten, and still no frame
    assert b"s1" not in passed.streams(WIDE) and passed.known(WIDE, ["a"]) == {"a"}
    assert passed.known(Policy(), ["a", "b"]) == set()
    assert passed.known(Policy().with_modules(["numpy"]), ["a"]) == {"a"}  # an equal policy is the same policy
    passed.add(Policy(), {"c", "d"})  # past the bound: everything is forgotten
    assert passed.known(WIDE, ["a", "b"]) == set()
    assert passed.known(Policy(), ["c", "d"]) == {"c", "d"}
    passed.add(WIDE, {"1", "2", "3", "4"})  # more than the bound at once: nothing is kept
    assert passed.known(WIDE, ["1"]) == set()


def _collections_during(action: Any) -> int:
    started = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(callback)
    try:
        action()
    finally:
        gc.callbacks.remove(callback)
    return len(started)


def test_a_load_of_many_small_containers_runs_no_garbage_collection_and_turns_it_back_on() -> None:
    rows = [{"id": i, "tags": [i, "x"]} for i in range(20_000)]
    dumped = dump_namespace({"rows": rows}, namespace={}, created_at=0.0)
    body, blobs = dumped.body, dumped.new_blobs
    find_global = make_find_global(lambda m: False)
    assert gc.isenabled()
    # The same objects made outside a load set off dozens of collections (the test's premise); a load's parse of its
    # manifest may set off one.
    assert _collections_during(lambda: pickle.loads(pickle.dumps(rows))) > 20
    loaded = []

    def load() -> None:
        loaded.append(load_namespace(body, namespace={}, find_global=find_global, blobs=blobs))

    assert _collections_during(load) <= 1
    assert loaded[0].variables["rows"] == rows
    assert gc.isenabled()
    with pytest.raises(CheckpointCorrupt):
        load_namespace(body, namespace={}, find_global=find_global)  # its frame blobs are missing
    assert gc.isenabled()


def test_a_cut_list_comes_back_whole_and_in_order() -> None:
    numbers = list(range(300_000))
    dumped = dump_namespace({"numbers": numbers, "small": [1, 2]}, namespace={}, created_at=0.0)
    (frame,) = [f for f in dumped.manifest.frames if f.names == ["numbers"]]
    assert len(frame.buffers) > 1, "the test needs the list cut into parts"
    loaded = load_namespace(
        dumped.body, namespace={}, find_global=make_find_global(lambda m: False), blobs=dumped.new_blobs
    )
    assert loaded.variables["numbers"] == numbers
    assert loaded.variables["small"] == [1, 2]


DEFINITIONS = """import math


def area(r):
    return math.pi * r * r


class Box:
    n = 7


def area(r):
    return r
"""


def test_a_load_whose_definitions_all_restored_parses_none_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict[str, Any] = {}
    exec(DEFINITIONS, namespace)
    kept = Definitions()
    kept.record(DEFINITIONS, namespace)
    sources = kept.sources()
    assert len(sources) == 3  # the import, the class, the later area
    parsed: list[str] = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda text, *a, **k: parsed.append(text) or real(text, *a, **k))
    loaded = Definitions(sources)
    assert loaded.for_names({}) == ([], [])
    assert loaded.sources() == sources  # the next dump keeps them as they were
    assert parsed == []
    assert loaded.for_names({"area", "Box"}) == ([sources[1], sources[2]], ["Box", "area"])
    assert len(parsed) == 3
    loaded.record("def area(r):\n    return 0\n", {"area": lambda r: 0})
    assert loaded.sources() == [*sources[:2], "def area(r):\n    return 0\n"]


def test_a_session_s_load_parses_the_checkpoint_s_manifest_once(
    dumped: tuple[MemoryStore, Pool, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host parses the manifest of the body it verified, and the runner restores with that parse (in process
    mode the worker parses its copy once too, and its reply carries none back to be parsed again)."""
    from snapcell.checkpoint import _format

    store, _, checkpoint_id = dumped
    parsed: list[int] = []
    real = _format.parse_manifest
    monkeypatch.setattr(_format, "parse_manifest", lambda raw: parsed.append(len(raw)) or real(raw))
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=WIDE) as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("len(big), len(nums)") == (5000, 5000)
        assert session.manifest is not None and {v.name for v in session.manifest.variables} == {"big", "nums", "np"}
    assert len(parsed) == 1
