"""What survives a turn: each variable on its own, shared references kept, what is lost named at once."""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from snapcell import Policy, Pool, SyncCodeTool
from snapcell.checkpoint import Keyring
from snapcell.checkpoint._format import SectionKind, parse_container
from snapcell.heads import MemoryHeads
from snapcell.storage import MemoryStore

KEY = "fidelity-tests-signing-key-0123456789"

FRAGILE = """
class Fragile:
    def __init__(self):
        self.n = 1
    def __setstate__(self, state):
        raise ValueError("refuses to come back")
"""

# Values that pickle (or used to be accepted by dump) but cannot come back at load, each with its type's name.
# (asyncio primitives, StringIO and ZoneInfo themselves survive: tests/checkpoint/test_stdvalues.py.)
UNRESTORABLE = {
    "closed-stringio": ("import io\nx = io.StringIO('text')\nx.close()", "StringIO"),
    "queue-of-generators": ("import asyncio\nx = asyncio.Queue()\nx.put_nowait(i for i in range(2))", "Queue"),
    "lock-subclass": ("import asyncio\nclass MyLock(asyncio.Lock):\n    pass\nx = MyLock()", "MyLock"),
    "generator": ("x = (i for i in range(3))", "generator"),
    "fragile-setstate": (FRAGILE + "x = Fragile()", "Fragile"),
}


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pool() -> Iterator[Pool]:
    with Pool(MemoryStore("fidelity"), isolation="inline", signing_keys=[KEY]) as pool:
        yield pool


@pytest.mark.parametrize("case", sorted(UNRESTORABLE))
def test_an_unrestorable_value_is_dropped_alone_and_named_in_the_same_turn(case: str) -> None:
    source, type_name = UNRESTORABLE[case]
    pool = Pool(MemoryStore("fidelity-tool"), isolation="inline", signing_keys=[KEY])
    with pool:
        tool = SyncCodeTool(pool, heads=MemoryHeads())
        answer = tool.run_code("c1", f"before = [1, 2, 3]\n{source}\nafter = {{'k': 'v'}}\n'ok'")
        # The turn that made the value says, in its own answer, that it was not saved: its name and type.
        notes = [line for line in answer.splitlines() if line.startswith("[note]") and "not saved" in line]
        assert notes, answer
        assert "x (" in notes[0] and type_name in notes[0]
        # Everything else is kept, also what was defined after it.
        later = tool.run_code("c1", "before, after, 'x' in dir()")
        assert "([1, 2, 3], {'k': 'v'}, False)" in later, later


def test_a_value_whose_restore_fails_is_dropped_at_dump_with_the_reason(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run(FRAGILE + "a = [1]\nbad = Fragile()\nz = 'kept'")
        checkpoint_id = session.dump()
        manifest = session.manifest
    assert manifest is not None
    (dropped,) = manifest.dropped
    assert dropped.name == "bad" and dropped.type_name == "Fragile"
    assert "ValueError" in dropped.reason and "refuses to come back" in dropped.reason
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        assert restored.feed_run("a, z, 'bad' in dir()") == ([1], "kept", False)


def test_shared_references_across_variables_survive(pool: Pool) -> None:
    script = (
        "shared = [1, 2]\nholder = {'ref': shared}\nalias = shared\n"
        "def grow():\n    shared.append(len(shared) + 1)\n"
        "unrelated = {'x': 1}\nalso = [3]\n"
    )
    with pool.checkout() as session:
        session.feed_run(script)
        checkpoint_id = session.dump()
        manifest = session.manifest
    assert manifest is not None
    groups = {tuple(sorted(f.names)) for f in manifest.frames}
    # Variables sharing objects travel together; the others each have a frame of their own.
    assert ("alias", "grow", "holder", "shared") in groups
    assert ("unrelated",) in groups and ("also",) in groups
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        value = restored.feed_run("grow()\n(holder['ref'] is shared, alias is shared, shared, unrelated, also)")
    assert value == (True, True, [1, 2, 3], {"x": 1}, [3])


def test_instances_of_one_class_in_two_variables_stay_independent(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\np = P(1)\nq = P(2)")
        checkpoint_id = session.dump()
        manifest = session.manifest
    assert manifest is not None
    assert {tuple(f.names) for f in manifest.frames} >= {("p",), ("q",)}
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        assert restored.feed_run("type(p) is type(q) is P, p.x + q.x, P(3)") == (True, 3, _Any())


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


def test_a_policy_narrowed_between_turns_keeps_unrelated_variables() -> None:
    store = MemoryStore("narrowed")
    wide = Policy().with_modules(["numpy"])
    with Pool(store, isolation="inline", signing_keys=[KEY], policy=wide) as pool, pool.checkout() as session:
        session.feed_run(
            "import numpy as np\narr = np.arange(5)\ntitle = 'plain text'\nrows = [{'id': 1}]\n"
            "def double(v):\n    return v * 2\n"
        )
        checkpoint_id = session.dump()
    with Pool(store, isolation="inline", signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        result = session.run("title, rows, double(21), 'arr' in dir()")
    assert result.error is None, result.error
    assert result.value == ("plain text", [{"id": 1}], 42, False)
    lost = [n for n in result.notes if "could not be restored" in n]
    assert lost and "arr (" in lost[0] and "numpy" in lost[0], result.notes
    assert "title" not in lost[0] and "rows" not in lost[0]


def test_definitions_are_re_created_from_source_when_their_bytecode_fails(pool: Pool) -> None:
    """A function whose saved form cannot be restored (here: made unreadable on purpose) is defined again."""
    with pool.checkout() as session:
        session.feed_run(
            "import math\ndef area(r):\n    return round(math.pi * r * r, 2)\nclass Box:\n    n = 7\nk = 1"
        )
        manifest_id = session.dump()
        manifest = session.manifest
    assert manifest is not None
    assert any("def area" in d for d in manifest.definitions) and any("class Box" in d for d in manifest.definitions)
    import snapcell.checkpoint._unpickle as unpickle

    real = unpickle._make_function

    def broken(*args: Any) -> Any:
        raise TypeError("code() argument 13 must be str, not int")  # what another Python minor says

    unpickle._make_function = broken
    try:
        with pool.checkout() as restored:
            restored.load_session(manifest_id)
            result = restored.run("area(1), Box.n, k")
    finally:
        unpickle._make_function = real
    assert result.error is None, result.error
    assert result.value == (3.14, 7, 1)
    assert any("re-created from their source" in n and "area" in n for n in result.notes), result.notes


def test_a_frame_blob_the_host_never_scanned_is_refused(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker may not pass off a stored blob (say, an array's bytes) as an already-scanned pickle."""
    from snapcell import WorkerLost
    from snapcell.backends import InlineBackend

    real_dump = InlineBackend.dump

    async def hiding_dump(self: InlineBackend, request: Any) -> Any:
        dumped = await real_dump(self, request)
        frames = [
            bytes(s.data).hex() for s in parse_container(dumped.body).sections if s.kind is SectionKind.FRAME_BLOB
        ]
        assert frames, "the test needs a frame stored as a blob"
        for digest in frames:
            dumped.new_blobs.pop(digest, None)  # "the store has it already"
        return dumped

    with pool.checkout() as session:
        session.feed_run("big = {str(i): i for i in range(5000)}")
        monkeypatch.setattr(InlineBackend, "dump", hiding_dump)
        with pytest.raises(WorkerLost, match="never scanned"):
            session.dump()


def _stored_bytes(store: MemoryStore) -> int:
    return sum(info.size for info in store.scan())


def test_a_growing_dict_is_stored_about_once() -> None:
    """100 turns each adding 100 keys to one dict: the store holds about the final dict plus a small cost per turn.

    The old scheme stored the whole dict again every turn (13 MB here, against 1.7 MB now).
    """
    store = MemoryStore("growth")
    turns, per_turn = 100, 100
    with Pool(store, isolation="inline", signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run("import hashlib\ndata = {}")
        for turn in range(turns):
            start, stop = turn * per_turn, (turn + 1) * per_turn
            new = f"(f'k{{i:06d}}', hashlib.sha1(str(i).encode()).hexdigest()) for i in range({start}, {stop})"
            session.feed_run(f"data.update({new})")
            session.dump()
    total = _stored_bytes(store)
    final = {f"k{i:06d}": hashlib.sha1(str(i).encode()).hexdigest() for i in range(turns * per_turn)}
    once = len(zstandard.compress(pickle.dumps(final, protocol=5), 1))
    assert total < 2 * once + turns * 16 * 1024, (total, once)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_few_large_items_appended_turn_by_turn_are_stored_about_once(kind: str) -> None:
    """30 turns each adding one 200 KB item: a value of few but large items is cut by bytes, not only by count.

    Under 1,024 items a value was one pickle, stored again whole every turn: about 94 MB for a 6 MB namespace.
    """
    store = MemoryStore("few-large")
    turns, item = 30, 200_000
    add = "data.append(random.randbytes(%d))" if kind == "list" else "data[len(data)] = random.randbytes(%d)"
    with Pool(store, isolation="inline", signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run("import random\ndata = " + ("[]" if kind == "list" else "{}"))
        for _ in range(turns):
            session.feed_run(add % item)
            session.dump()
        assert session.feed_run(
            "len(data), sum(len(v) for v in (data if isinstance(data, list) else data.values()))"
        ) == (
            turns,
            turns * item,
        )
    total = _stored_bytes(store)
    assert total < 2 * turns * item + turns * 64 * 1024, (total, turns * item)


def test_the_format_3_golden_checkpoint_still_loads() -> None:
    folder = Path(__file__).parent / "golden" / "v3-py311"
    meta = json.loads((folder / "meta.json").read_text())
    store = MemoryStore("golden-v3")
    for key, name in meta["objects"].items():
        store.put(key, (folder / name).read_bytes())
    clock = Clock()
    clock.now = Keyring([meta["key"]]).parse_id(bytes.fromhex(meta["id"])).created_at + 60
    policy = Policy().with_modules(["numpy"])
    with Pool(store, isolation="inline", policy=policy, signing_keys=[meta["key"]], clock=clock) as pool:
        with pool.checkout() as session:
            session.load_session(bytes.fromhex(meta["id"]))
            value = session.feed_run(
                "total, round(area(1), 5), boxes is same, [b.n for b in boxes], int(big.sum()), len(table), table[2999]"
            )
            manifest = session.manifest
    assert manifest is not None and any(f.layout == "dict" for f in manifest.frames)
    assert value == (42, 3.14159, True, [1, 2], sum(range(20_000)), 3000, "2999")


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_the_golden_checkpoint_of_snapcells_pickled_helpers_still_loads(isolation: str) -> None:
    """Written before the package layout moved: its pickles name helpers by their old module paths."""
    folder = Path(__file__).parent / "golden" / "helpers-v3-py311"
    meta = json.loads((folder / "meta.json").read_text())
    store = MemoryStore("golden-helpers")
    for key, name in meta["objects"].items():
        store.put(key, (folder / name).read_bytes())
    clock = Clock()
    clock.now = Keyring([meta["key"]]).parse_id(bytes.fromhex(meta["id"])).created_at + 60
    policy = Policy().with_modules(["numpy"])
    tools = {"list_customers": lambda: ["ada", "grace"]}
    with Pool(store, isolation=isolation, policy=policy, signing_keys=[meta["key"]], clock=clock) as pool:
        with pool.checkout() as session:
            session.load_session(bytes.fromhex(meta["id"]))
            value = session.feed_run(
                "(buf.read(), raw.getvalue(), queue.qsize(), queue.get_nowait(), str(zone), square(4), getter(3),"
                " caller('a'), nap(0), lookup(), str(stamps[1]), Color.RED.value, point == Point(1, 0))",
                external_lookup=tools,
            )
            assert session.manifest is not None and not session.manifest.dropped
    assert value == ("llo", b"abc", 2, 1, "UTC", 16, 3, "A", None, ["ada", "grace"], "2024-06-30", 1, True)


CONTEXT_MANAGERS = """
import contextlib

@contextlib.contextmanager
def doubled(x):
    yield x * 2

@contextlib.asynccontextmanager
async def tripled(x):
    yield x * 3

with doubled(3) as v:
    pass
"""


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_decorated_definition_the_rule_refuses_is_re_created_from_its_source(isolation: str) -> None:
    """A value the checkpoint cannot keep, whose source it keeps, comes back defined again, decorators included."""
    with Pool(MemoryStore("fidelity-cm"), isolation=isolation, signing_keys=[KEY]) as pool:
        with pool.checkout() as session:
            first = session.run(CONTEXT_MANAGERS)
            assert first.error is None, first.error
            checkpoint_id = session.dump()
            after_dump = session.run("v")
        assert not any("gone next turn" in n for n in after_dump.notes), after_dump.notes
        with pool.checkout() as restored:
            restored.load_session(checkpoint_id)
            result = restored.run("with doubled(4) as a:\n    pass\nasync with tripled(2) as b:\n    pass\n(a, b, v)")
    assert result.error is None, result.error
    assert result.value == (8, 6, 6)
    recreated = [n for n in result.notes if "re-created from their source" in n]
    assert recreated and "doubled" in recreated[0] and "tripled" in recreated[0], result.notes
    assert not any("not saved" in n or "could not be restored" in n for n in result.notes), result.notes


def test_a_rebound_name_is_not_re_created_from_an_older_definition(pool: Pool) -> None:
    """A name whose definition was replaced by another (unsavable) value is dropped, not brought back as the def."""
    with pool.checkout() as session:
        session.run("def gen():\n    yield 1\ngen = gen()")
        checkpoint_id = session.dump()
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        result = restored.run("'gen' in dir()")
    assert result.value is False, result.notes
    assert not any("re-created" in n for n in result.notes), result.notes


def test_a_value_later_statements_registered_into_is_not_re_created_without_them(pool: Pool) -> None:
    """Re-running only ``def show`` would lose ``@show.register``: such a value stays dropped, and named as gone."""
    with pool.checkout() as session:
        session.run(
            "import functools\n@functools.singledispatch\ndef show(x):\n    return 'obj'\n"
            "@show.register\ndef _(x: int):\n    return 'int'\n"
        )
        checkpoint_id = session.dump()
    with pool.checkout() as restored:
        restored.load_session(checkpoint_id)
        result = restored.run("'show' in dir()")
    assert result.value is False
    assert any("gone next turn" in n and "show" in n for n in result.notes), result.notes
