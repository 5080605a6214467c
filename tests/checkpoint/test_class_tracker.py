"""Class tracker ids at inline loads: a checkpoint cannot reach another session's live class in the same host.

cloudpickle restores a class under the tracker id its pickle carries and keeps one table of ids per process, so a
second pickle naming an id gets the class the first made, and sets its state. Several conversations share one
host process inline; a checkpoint that names conversation A's tracker id (a leaked checkpoint, the same one loaded
twice) would replace A's methods. The ids below are read from cloudpickle's table by the test, as an attacker
holding A's checkpoint bytes would read them there; the stream passes the host's scan, so it could be signed.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from snapcell import Policy, Pool, Session
from snapcell.checkpoint import Keyring, Manifest, VariableInfo, scan_body
from snapcell.checkpoint._classes import LoadClasses
from snapcell.checkpoint._findglobal import make_find_global
from snapcell.checkpoint._format import Codec, Header, SectionKind, pack_container
from snapcell.checkpoint._rule import NOT_IN_DILL
from snapcell.checkpoint._unpickle import load_namespace
from snapcell.checkpoint.scan import scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore

from .helpers import KEY, crafted_body, sign_and_store
from .test_unpickle_hostile import call, glob, s, stream

_CP = cloudpickle.cloudpickle
MARK = "snapcell-class-tracker-canary"
A_CELL = "class C:\n    def who(self):\n        return 'a'\nc = C()\nbox = [C]\n"


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def pool(store: MemoryStore) -> Iterator[Pool]:
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool:
        yield pool


@pytest.fixture
def checkpoint_a(pool: Pool) -> bytes:
    with pool.checkout() as session:
        session.feed_run(A_CELL)
        return session.dump()


def _tracker_id(session: Session) -> str:
    tracker_id = _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS.get(session.feed_run("C"))
    assert isinstance(tracker_id, str)
    return tracker_id


def _class_under(tracker_id: str) -> bytes:
    """A signed-looking pickle of a class ``C`` whose ``who`` says 'b', carrying ``tracker_id``."""

    class C:
        def who(self) -> str:
            return "b"

    _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS[C] = tracker_id
    try:
        data = cloudpickle.dumps(C, protocol=5)
    finally:
        del _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS[C]
    assert tracker_id.encode() in data
    assert scan_pickle(data, checkpoint_rule(Policy())) is None  # the host's scan would sign it
    return data


def _dill_body(data: bytes) -> bytearray:
    info = VariableInfo(name="x", type_name="type", size_bytes=len(data), serializer="dill")
    manifest = Manifest(created_at=0.0, python="3", libraries={}, variables=[info])
    return pack_container(Header(format_version=3), manifest, [(SectionKind.DILL, Codec.RAW, len(data), data)])


def test_a_checkpoint_naming_another_session_s_tracker_id_leaves_its_class_alone(
    pool: Pool, store: MemoryStore, checkpoint_a: bytes
) -> None:
    with pool.checkout() as a, pool.checkout() as b:
        a.load_session(checkpoint_a)
        crafted = sign_and_store(store, Keyring([KEY]), crafted_body(_class_under(_tracker_id(a))))
        b.load_session(crafted)
        assert b.feed_run("x().who()") == "b"  # B got a class of its own
        assert a.feed_run("c.who(), C().who(), box[0] is C is type(c)") == ("a", "a", True)


def test_a_dill_section_may_not_name_cloudpickle_s_class_makers(
    pool: Pool, store: MemoryStore, checkpoint_a: bytes
) -> None:
    """dill never writes them; through dill's unpickler they skipped every check the cloudpickle path makes."""
    with pool.checkout() as a, pool.checkout() as b:
        a.load_session(checkpoint_a)
        crafted = sign_and_store(store, Keyring([KEY]), _dill_body(_class_under(_tracker_id(a))))
        b.load_session(crafted)
        assert b.feed_run("'x' in dir()") is False
        assert a.feed_run("c.who(), C().who()") == ("a", "a")


def test_a_stream_calling_the_tracker_lookup_gets_no_other_session_s_class(
    pool: Pool, store: MemoryStore, checkpoint_a: bytes
) -> None:
    with pool.checkout() as a, pool.checkout() as b:
        a.load_session(checkpoint_a)
        lookup = call(glob("cloudpickle.cloudpickle", "_lookup_class_or_track"), s(_tracker_id(a)), b"N")
        assert scan_pickle(stream(lookup), checkpoint_rule(Policy())) is None
        crafted = sign_and_store(store, Keyring([KEY]), crafted_body(stream(lookup)))
        b.load_session(crafted)
        assert b.feed_run("x") is None


def test_one_checkpoint_loaded_in_two_sessions_gives_each_its_own_class(pool: Pool, checkpoint_a: bytes) -> None:
    """Before, the second load reset the first session's class, whose methods then read the second's globals."""
    with pool.checkout() as a, pool.checkout() as b:
        a.load_session(checkpoint_a)
        a.feed_run("mark = 'a'\nC.where = lambda self: mark")
        b.load_session(checkpoint_a)
        b.feed_run("mark = 'b'\nC.where = lambda self: mark")
        assert a.feed_run("c.where(), box[0] is C is type(c)") == ("a", True)
        assert b.feed_run("c.where(), box[0] is C is type(c)") == ("b", True)
        assert a.feed_run("C") is not b.feed_run("C")


def test_a_session_s_class_keeps_its_identity_across_frames_and_a_second_dump(pool: Pool, checkpoint_a: bytes) -> None:
    with pool.checkout() as a:
        a.load_session(checkpoint_a)
        assert a.feed_run("type(c) is box[0] is C, c.who()") == (True, "a")
        again = a.dump()
    with pool.checkout() as b:
        b.load_session(again)
        assert b.feed_run("type(c) is box[0] is C, c.who()") == (True, "a")


def test_a_load_tells_cloudpickle_the_id_for_later_dumps_but_never_looks_ids_up_in_the_process() -> None:
    tracker_id = uuid.uuid4().hex
    classes = LoadClasses()
    first = type("First", (), {})
    assert classes.made(tracker_id, first) is first
    assert classes.made(tracker_id, type("Again", (), {})) is first  # the same load: the same class
    assert _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS[first] == tracker_id  # a later dump writes the same id
    other = type("Other", (), {})
    assert LoadClasses().made(tracker_id, other) is other  # another load: its own class
    assert tracker_id not in _CP._DYNAMIC_CLASS_TRACKER_BY_ID
    trial = type("Trial", (), {})
    assert LoadClasses(register=False).made(uuid.uuid4().hex, trial) is trial
    assert trial not in _CP._DYNAMIC_CLASS_TRACKER_BY_CLASS


def test_inline_turns_keep_a_class_s_tracker_id(pool: Pool, checkpoint_a: bytes) -> None:
    """A frame holding the class keeps its bytes from turn to turn (stored once), though the last class lives."""
    ids = []
    checkpoint = checkpoint_a
    for _turn in range(3):
        with pool.checkout() as session:
            session.load_session(checkpoint)
            ids.append(_tracker_id(session))
            checkpoint = session.dump()
    assert len(set(ids)) == 1


RECORDER = """
seen = []
class Rec:
    def __setstate__(self, state):
        seen.append(state)
        self.__dict__.update(state)
r = Rec()
r.n = 1
"""


def test_a_dump_s_check_that_frames_restore_runs_no_live_session_s_code(pool: Pool) -> None:
    """The check made the live class under the tracker id, possibly another inline session's, and ran its methods."""
    with pool.checkout() as a:
        a.feed_run(RECORDER)
        checkpoint = a.dump()
        assert a.feed_run("seen") == []
        with pool.checkout() as b:
            b.load_session(checkpoint)
            assert b.feed_run("seen, r.n") == ([{"n": 1}], 1)  # the load ran B's own copy
            b.feed_run("r.n = 2")
            b.dump()
            assert b.feed_run("len(seen)") == 1
        assert a.feed_run("seen") == []


@pytest.mark.parametrize("name", sorted(name for _module, name in NOT_IN_DILL))
def test_the_host_s_scan_and_the_loader_refuse_cloudpickle_s_makers_in_a_dill_section(name: str) -> None:
    data = stream(glob("cloudpickle.cloudpickle", name))
    rule = checkpoint_rule(Policy())
    assert scan_pickle(data, rule) is None  # a cloudpickle section may name it
    refusal = scan_body(_dill_body(data), rule=rule)
    assert refusal is not None and refusal[0].name == name
    loaded = load_namespace(_dill_body(data), namespace={}, find_global=make_find_global(rule))
    assert "x" not in loaded.variables and "not allowed" in loaded.failed["x"]


def test_a_library_class_tracked_by_the_stream_does_not_become_one_it_made(store: MemoryStore) -> None:
    """``_lookup_class_or_track(id, JSONEncoder)`` then a skeleton class under that id handed back the library class
    as one the load made, and ``_class_setstate`` patched it in the host; the host's scan passes the stream."""
    cp, tracker_id = "cloudpickle.cloudpickle", uuid.uuid4().hex
    body = (
        call(glob(cp, "_lookup_class_or_track"), s(tracker_id), glob("json", "JSONEncoder"))
        + b"0"
        + call(glob(cp, "_make_skeleton_class"), glob("builtins", "type"), s("C"), b")", b"}", s(tracker_id), b"N")
        + b"\x940"
        + call(glob(cp, "_class_setstate"), b"h\x00", b"}" + s(MARK) + s("yes") + b"s}\x86")
    )
    assert scan_pickle(stream(body), checkpoint_rule(Policy())) is None
    checkpoint = sign_and_store(store, Keyring([KEY]), crafted_body(stream(body)))
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("x.__name__") == "C"
    assert not hasattr(json.JSONEncoder, MARK)


def _namedtuple(name: str, module: str) -> bytes:
    return call(glob("dill._dill", "_create_namedtuple"), s(name), b"]" + s("a") + b"a", s(module))


@pytest.mark.parametrize("body", [crafted_body, _dill_body], ids=["cloudpickle", "dill"])
def test_dill_s_namedtuple_maker_hands_back_only_a_class_the_checkpoint_may_name(store: MemoryStore, body: Any) -> None:
    """dill's own imported the module and handed back any class of that name (``subprocess.Popen``), past the rule."""
    data = stream(
        call(
            glob("builtins", "tuple"),
            b"(" + _namedtuple("Popen", "subprocess") + _namedtuple("Match", "difflib") + b"t",
        )
    )
    assert scan_pickle(data, checkpoint_rule(Policy())) is None
    checkpoint = sign_and_store(store, Keyring([KEY]), body(data))
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint)
        made, named = session.feed_run("x")
    assert made is not subprocess.Popen and made._fields == ("a",)
    assert named is difflib.Match  # a namedtuple the checkpoint may name is the library's own


def test_the_scan_refuses_build_on_what_the_namedtuple_maker_hands_back() -> None:
    patch = b"N}" + s(MARK) + s("yes") + b"s\x86b"
    refusal = scan_pickle(stream(_namedtuple("Match", "difflib") + patch), checkpoint_rule(Policy()))
    assert refusal is not None and "BUILD" in refusal.reason
