"""The host's checks of a dump, done once: its manifest parsed once, a stream it passed before not scanned again.

A worker's dump reply carries no manifest of its own: the host reads the one in the body it signs. A pickle stream
with the very bytes of one the host passed in the session's previous dump (an unchanged variable) is not scanned
again, nor in the pool's next session with the same policy (the next turn's); any other bytes are, so a stream
changed under the same variable name is judged afresh.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint import Manifest, VariableInfo, _hostscan
from snapcell.checkpoint._format import Codec, FrameInfo, Header, SectionKind, pack_container, parse_container
from snapcell.checkpoint._hostscan import scan_body, stream_key
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import LocalStore

from .helpers import KEY
from .test_unpickle_hostile import call, glob, s, stream

RULE = checkpoint_rule(Policy())
BENIGN = pickle.dumps((1,), protocol=5)
HOSTILE = stream(b"(" + call(glob("os", "system"), s("true")) + b"t")
ROWS = 'rows = [{"id": i, "name": f"row-{i}"} for i in range(100)]\nturns = 0\n'


def _frame_body(data: bytes) -> bytearray:
    """A format-3 body with one frame holding ``x``, its pickle stored raw."""
    manifest = Manifest(
        created_at=0.0,
        python="3",
        libraries={},
        variables=[VariableInfo(name="x", type_name="int", size_bytes=len(data), serializer="cloudpickle")],
        frames=[FrameInfo(names=["x"], buffers=[0])],
    )
    return pack_container(Header(), manifest, [(SectionKind.STREAM, Codec.RAW, len(data), data)])


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the host's stream scans (one entry per `scan_pickle` call from `scan_body`)."""
    calls: list[int] = []
    real = _hostscan.scan_pickle

    def counted(data: Any, rule: Any, **kwargs: Any) -> Any:
        calls.append(len(data))
        return real(data, rule, **kwargs)

    monkeypatch.setattr(_hostscan, "scan_pickle", counted)
    return calls


def test_a_stream_passed_before_is_not_scanned_again_and_other_bytes_are(scans: list[int]) -> None:
    passing: set[bytes] = set()
    assert scan_body(_frame_body(BENIGN), rule=RULE, passing=passing) is None
    assert len(scans) == 1 and len(passing) == 1

    again: set[bytes] = set()
    assert scan_body(_frame_body(BENIGN), rule=RULE, passed=passing, passing=again) is None
    assert len(scans) == 1, "the same bytes were scanned again"
    assert again == passing

    # The same variable with other bytes (a compromised worker's, say): scanned, and refused.
    found = scan_body(_frame_body(HOSTILE), rule=RULE, passed=passing, passing=set())
    assert len(scans) == 2
    assert found is not None and (found[0].module, found[0].name) == ("os", "system")


def test_a_stream_s_key_covers_its_codec_and_declared_size() -> None:
    head = parse_container(_frame_body(BENIGN)).sections[0]
    other_size = type(head)(head.kind, head.codec, head.raw_size + 1, head.data)
    other_codec = type(head)(head.kind, Codec.ZSTD, head.raw_size, head.data)
    assert len({stream_key(head), stream_key(other_size), stream_key(other_codec)}) == 3


def test_a_dump_scans_only_the_streams_that_changed_since_the_session_s_last(scans: list[int], tmp_path: Path) -> None:
    with Pool(LocalStore(tmp_path), signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run(ROWS)
        session.dump()
        first = len(scans)
        assert first >= 2  # rows and turns, each its own frame
        session.feed_run("turns += 1")
        session.dump()
        assert len(scans) - first == 1, "only the stream of turns changed"


def test_the_next_turn_s_session_on_the_pool_skips_the_streams_the_last_turn_passed(
    scans: list[int], tmp_path: Path
) -> None:
    with Pool(LocalStore(tmp_path), signing_keys=[KEY]) as pool:
        with pool.checkout() as session:
            session.feed_run(ROWS)
            checkpoint = session.dump()
        first = len(scans)
        with pool.checkout() as session:  # a cold turn: another session loads it
            session.load_session(checkpoint)
            session.feed_run("turns += 1")
            session.dump()
        assert len(scans) - first == 1, "only the stream of turns changed"
        with pool.checkout(policy=Policy().with_modules(["math"])) as session:  # another policy: its own scans
            session.load_session(checkpoint)
            session.dump()
        assert len(scans) - first == 1 + first


def test_a_worker_s_dump_has_its_manifest_parsed_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    parsed: list[int] = []
    real = Manifest.model_validate_json

    def counted(data: Any, **kwargs: Any) -> Manifest:
        parsed.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(Manifest, "model_validate_json", counted)
    with Pool(LocalStore(tmp_path), signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run(ROWS)
        before = len(parsed)
        session.dump()
        assert len(parsed) - before == 1
