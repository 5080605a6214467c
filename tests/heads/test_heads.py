"""Head store conformance over memory, SQLite, S3 (moto) and PostgreSQL (a real server), plus cleanup with heads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Conflict
from snapcell.errors import InvalidKey
from snapcell.heads import (
    HeadStore,
    MemoryHeads,
    PostgresHeads,
    S3Heads,
    SQLiteHeads,
    default_heads,
    open_heads,
    validate_conversation_id,
)
from snapcell.heads._heads import new_lease_owner
from snapcell.ops import cleanup
from snapcell.storage import MemoryStore, S3Store
from tests.pgserver import postgres_server, postgres_url  # noqa: F401 (fixtures)

A, B, C = b"a" * 40, b"b" * 40, b"c" * 40
NOW = 1_700_000_000.0


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("s3", marks=pytest.mark.integration),
        pytest.param("postgres", marks=pytest.mark.integration),
    ]
)
def heads(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HeadStore]:
    made: HeadStore
    if request.param == "memory":
        made = MemoryHeads(max_history=3)
    elif request.param == "sqlite":
        made = SQLiteHeads(tmp_path / "heads.sqlite3", max_history=3)
    elif request.param == "postgres":
        made = PostgresHeads(request.getfixturevalue("postgres_url"), max_history=3)
    else:
        made = S3Heads(request.getfixturevalue("s3_store"), max_history=3)
    yield made
    made.close()


def test_create_get_and_create_only(heads: HeadStore) -> None:
    assert heads.get("conv-1") is None
    version = heads.compare_and_set("conv-1", None, A)
    head = heads.get("conv-1")
    assert head is not None and head.checkpoint_id == A and head.history == () and head.version == version
    with pytest.raises(Conflict, match="already has a head"):
        heads.compare_and_set("conv-1", None, B)
    assert heads.get("conv-1").checkpoint_id == A  # type: ignore[union-attr]


def test_stale_compare_and_set_is_refused(heads: HeadStore) -> None:
    v1 = heads.compare_and_set("c", None, A)
    v2 = heads.compare_and_set("c", v1, B, history=[A])
    assert v2 != v1
    with pytest.raises(Conflict, match="moved"):
        heads.compare_and_set("c", v1, C, history=[A])
    head = heads.get("c")
    assert head is not None and head.checkpoint_id == B and head.history == (A,)


def test_history_is_bounded_and_versions_never_repeat(heads: HeadStore) -> None:
    version = heads.compare_and_set("c", None, A)
    seen = {version}
    for _ in range(3):  # back and forth between the same IDs: every write still gets a new version
        version = heads.compare_and_set("c", version, B, history=[A, C, A, C, A])
        version = heads.compare_and_set("c", version, A, history=[B, A, C, A, C])
        seen |= {version}
    head = heads.get("c")
    assert head is not None and head.history == (B, A, C) and len(seen) == 4


def test_lease_taken_over_only_after_expiry(heads: HeadStore) -> None:
    assert heads.acquire_lease("c", "one", 10, now=NOW)
    assert heads.get("c") is None  # a lease alone is no head
    assert not heads.acquire_lease("c", "two", 10, now=NOW + 9.9)
    assert heads.acquire_lease("c", "one", 10, now=NOW + 5)  # the holder may take it again
    assert not heads.renew_lease("c", "two", 10, now=NOW + 5)
    assert heads.renew_lease("c", "one", 10, now=NOW + 8)  # now held until NOW + 18
    assert not heads.acquire_lease("c", "two", 10, now=NOW + 17)
    assert heads.acquire_lease("c", "two", 10, now=NOW + 18.1)
    assert not heads.renew_lease("c", "one", 10, now=NOW + 19)
    heads.release_lease("c", "one")  # not the holder: nothing happens
    assert not heads.acquire_lease("c", "three", 10, now=NOW + 19)
    heads.release_lease("c", "two")
    assert heads.acquire_lease("c", "three", 10, now=NOW + 19)


def test_head_update_checks_the_lease_owner(heads: HeadStore) -> None:
    version = heads.compare_and_set("c", None, A)
    assert heads.acquire_lease("c", "one", 10, now=NOW)
    assert heads.acquire_lease("c", "two", 10, now=NOW + 11)  # took over
    with pytest.raises(Conflict, match="lease"):
        heads.compare_and_set("c", version, B, history=[A], owner="one")
    v2 = heads.compare_and_set("c", version, B, history=[A], owner="two", release_lease=True)
    head = heads.get("c")
    assert head is not None and head.version == v2 and head.lease_owner is None
    assert heads.acquire_lease("c", "three", 10, now=NOW + 12)


def test_lease_changes_keep_the_version(heads: HeadStore) -> None:
    version = heads.compare_and_set("c", None, A)
    assert heads.acquire_lease("c", "one", 10)
    assert heads.renew_lease("c", "one", 10)
    assert heads.compare_and_set("c", version, B, history=[A], owner="one")


def test_delete_and_scan(heads: HeadStore) -> None:
    v1 = heads.compare_and_set("x", None, A)
    heads.compare_and_set("y", None, B, history=[A])
    assert heads.acquire_lease("lease-only", "o", 10)
    assert dict(heads.scan()).keys() == {"x", "y"}
    assert not heads.delete("x", expected_version="other")
    assert heads.delete("x", expected_version=v1)
    assert not heads.delete("x")
    assert heads.get("x") is None
    assert [cid for cid, _ in heads.scan()] == ["y"]


def test_concurrent_updates_lose_nothing(heads: HeadStore) -> None:
    heads.compare_and_set("c", None, b"0")
    counts = {"ok": 0, "conflict": 0}
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            head = heads.get("c")
            assert head is not None and head.checkpoint_id is not None
            n = int(head.checkpoint_id) + 1
            try:
                heads.compare_and_set("c", head.version, str(n).encode())
                key = "ok"
            except Conflict:
                key = "conflict"
            with lock:
                counts[key] += 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    head = heads.get("c")
    assert head is not None and int(head.checkpoint_id or b"") == counts["ok"]


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "../x", "x" * 129, "sp ace", "ü", "a\n", "a\x00"])
def test_bad_conversation_ids_are_refused(heads: HeadStore, bad: str) -> None:
    with pytest.raises(InvalidKey, match="conversation ID"):
        heads.get(bad)
    with pytest.raises(InvalidKey):
        heads.compare_and_set(bad, None, A)
    with pytest.raises(InvalidKey):
        heads.acquire_lease(bad, "o", 1)


def test_good_conversation_ids() -> None:
    for good in ["a", "user:42:chat-7", "x" * 128, "A.b_c-d"]:
        assert validate_conversation_id(good) == good


def test_sqlite_is_shared_between_instances(tmp_path: Path) -> None:
    one, two = SQLiteHeads(tmp_path / "h.db"), SQLiteHeads(tmp_path / "h.db")
    version = one.compare_and_set("c", None, A)
    assert two.acquire_lease("c", "o", 10)
    assert not one.acquire_lease("c", "p", 10)
    two.compare_and_set("c", version, B, history=[A])
    with pytest.raises(Conflict):
        one.compare_and_set("c", version, C)
    assert (tmp_path / "h.db").stat().st_mode & 0o777 == 0o600
    one.close()
    two.close()


@pytest.mark.integration
def test_s3_head_objects_live_under_the_prefix(s3_store: S3Store) -> None:
    heads = S3Heads(s3_store)
    heads.compare_and_set("conv:1", None, A)
    assert [o.key for o in s3_store.scan("heads/")] == ["heads/conv:1.json"]
    assert "heads" in heads.url


def test_default_and_open_heads(tmp_path: Path) -> None:
    from snapcell.storage import LocalStore

    local = default_heads(LocalStore(tmp_path / "store"))
    assert isinstance(local, SQLiteHeads) and local.path == tmp_path / "store" / ".heads.sqlite3"
    local.close()
    assert isinstance(default_heads(MemoryStore()), MemoryHeads)
    assert isinstance(open_heads(f"sqlite://{tmp_path}/x.db"), SQLiteHeads)
    assert isinstance(open_heads("memory://"), MemoryHeads)


# -------------------------------------------------------------------- cleanup


def test_cleanup_keeps_heads_and_deletes_expired_heads() -> None:
    clock = [NOW]
    store = MemoryStore("c", now=lambda: clock[0])
    heads = MemoryHeads(clock=lambda: clock[0])
    for i in range(6):
        store.put(f"checkpoints/k{i}", b"x" * 100)
        clock[0] += 7200
    key_of = {bytes([i]) * 40: f"checkpoints/k{i}" for i in range(6)}.__getitem__
    heads.compare_and_set("old", None, bytes([0]) * 40)
    heads.compare_and_set("live", None, bytes([3]) * 40, history=[bytes([2]) * 40])
    report = cleanup(store, now=clock[0], quota_bytes=0, heads=heads, key_of=key_of)
    kept = {o.key for o in store.scan()}
    assert kept == {"checkpoints/k0", "checkpoints/k2", "checkpoints/k3"}
    assert report.deleted_heads == 0 and report.over_quota
    # Nine days later everything expired: heads that stood still past the ttl go too.
    clock[0] += 9 * 86400
    report = cleanup(store, now=clock[0], heads=heads, key_of=key_of, dry_run=True)
    assert report.deleted_heads == 2 and len(list(heads.scan())) == 2
    report = cleanup(store, now=clock[0], heads=heads, key_of=key_of)
    assert report.deleted_heads == 2 and list(heads.scan()) == [] and list(store.scan()) == []
    assert "conversation heads" in report.summary()


def test_cleanup_with_heads_needs_key_of() -> None:
    from snapcell import ConfigError

    with pytest.raises(ConfigError, match="key_of"):
        cleanup(MemoryStore(), heads=MemoryHeads())


@pytest.mark.parametrize(
    "history", ["not json", '["zz"]', '{"a": 1}', "[1]"], ids=["bad-json", "bad-hex", "not-a-list", "not-text"]
)
def test_sqlite_corrupt_row_is_a_storage_error(tmp_path: Path, history: str) -> None:
    import sqlite3

    from snapcell import StorageError

    path = tmp_path / "heads.sqlite3"
    heads = SQLiteHeads(path)
    heads.compare_and_set("good", None, A)
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "INSERT INTO heads (conversation_id, checkpoint_id, history, version, updated_at, lease_owner, "
            "lease_expires_at) VALUES ('bad-one', ?, ?, 'v1', 0, NULL, 0)",
            (B, history),
        )
    db.close()
    try:
        with pytest.raises(StorageError, match="'bad-one'"):
            heads.get("bad-one")
        with pytest.raises(StorageError, match="'bad-one'"):
            heads.compare_and_set("bad-one", "v1", C)
        with pytest.raises(StorageError, match="'bad-one'"):
            list(heads.scan())
        assert heads.get("good").checkpoint_id == A  # type: ignore[union-attr]
        heads.compare_and_set("other", None, C)  # the failed update left no transaction open
    finally:
        heads.close()


# --------------------------------------------------------- turns and leases


def test_committed_turns_are_recorded_and_bounded(heads: HeadStore) -> None:
    from snapcell.heads import TurnRecord
    from snapcell.heads._heads import MAX_TURN_ANSWERS, MAX_TURN_IDS

    version = heads.compare_and_set("c", None, A, turn=TurnRecord("t0", "answer 0"))
    for i in range(1, MAX_TURN_IDS + 5):
        version = heads.compare_and_set("c", version, A, turn=TurnRecord(f"t{i}", f"answer {i}"))
    head = heads.get("c")
    assert head is not None and len(head.turns) == MAX_TURN_IDS
    newest = MAX_TURN_IDS + 4
    assert head.turns[0] == TurnRecord(f"t{newest}", f"answer {newest}")
    assert [t.answer is not None for t in head.turns].count(True) == MAX_TURN_ANSWERS
    assert head.turn("t0") is None and head.turn("t10") == TurnRecord("t10")  # remembered without its answer
    with pytest.raises(Conflict, match="already committed"):
        heads.compare_and_set("c", version, B, turn=TurnRecord(f"t{newest}", "again"))
    version = heads.compare_and_set("c", version, B, history=[A])  # no turn (a rewind): the turns stay
    assert heads.get("c").turns == head.turns  # type: ignore[union-attr]
    heads.compare_and_set("fork", None, B)
    assert heads.get("fork").turns == ()  # type: ignore[union-attr]
    with pytest.raises(InvalidKey, match="turn ID"):
        heads.compare_and_set("c", version, C, turn=TurnRecord("bad id", None))


def test_a_holder_takes_over_its_own_lease_at_once(heads: HeadStore) -> None:
    assert heads.acquire_lease("c", "server-1/turn-a", 60, now=NOW)
    assert not heads.acquire_lease("c", "server-2/turn-b", 60, now=NOW + 1)
    assert heads.acquire_lease("c", "server-1/turn-c", 60, now=NOW + 1)  # server-1 again, restarted: no wait
    version = heads.compare_and_set("c", None, A, owner="server-1/turn-c")
    with pytest.raises(Conflict, match="lease"):  # the earlier turn lost its lease: it cannot write
        heads.compare_and_set("c", version, B, owner="server-1/turn-a")
    heads.release_lease("c", "server-1/turn-a")  # a late release of the old turn changes nothing
    assert not heads.acquire_lease("c", "server-2/turn-d", 60, now=NOW + 2)
    assert not heads.acquire_lease("c", "plain-owner", 60, now=NOW + 2)  # no holder part: no take-over


def test_a_late_attempt_of_a_holder_s_earlier_turn_does_not_take_its_later_turn_s_lease(heads: HeadStore) -> None:
    """Turn 1's lease take timed out and landed after turn 2 of the same holder took the lease: it must fail, or
    turn 2's save would be refused (Conflict) although nothing else ran."""
    earlier, later = new_lease_owner("server-1"), new_lease_owner("server-1")
    assert heads.acquire_lease("c", later, 60, now=NOW)
    assert not heads.acquire_lease("c", earlier, 60, now=NOW + 1)
    assert heads.compare_and_set("c", None, A, owner=later, release_lease=True)
    # Free again: the earlier turn's next attempt (a retry) takes it as usual, and a later turn takes it over.
    assert heads.acquire_lease("c", earlier, 60, now=NOW + 2)
    assert heads.acquire_lease("c", new_lease_owner("server-1"), 60, now=NOW + 3)
    # An owner of an older release (no stamp) is taken over, and takes over, as before.
    assert heads.acquire_lease("c", "server-1/0123456789ab", 60, now=NOW + 4)
    assert heads.acquire_lease("c", earlier, 60, now=NOW + 5)


def test_lease_owners_of_one_process_are_ordered() -> None:
    owners = [new_lease_owner("h") for _ in range(1000)]
    stamps = [int(owner.rpartition("/")[2].partition(".")[0], 16) for owner in owners]
    assert stamps == sorted(set(stamps)) and all(owner.startswith("h/") for owner in owners)


def test_an_absurd_lease_expiry_is_cut_back_to_one_ttl(heads: HeadStore) -> None:
    year_3000 = 32_503_680_000.0
    assert heads.acquire_lease("c", "gone/turn", 10, now=year_3000 - 10)
    assert not heads.acquire_lease("c", "other/turn", 10, now=NOW)  # not taken, but cut back to NOW + 10
    assert not heads.acquire_lease("c", "other/turn", 10, now=NOW + 9)
    assert heads.acquire_lease("c", "other/turn", 10, now=NOW + 10.1)


def test_a_head_without_a_version_is_an_error_not_a_fresh_start(heads: HeadStore) -> None:
    from snapcell import StorageError
    from snapcell.heads import Head, RecordHeads

    assert isinstance(heads, RecordHeads)
    heads._update("c", lambda record: Head(checkpoint_id=A, history=(B,), version=""))
    with pytest.raises(StorageError, match="no version"):
        heads.get("c")
    with pytest.raises(StorageError, match="no version"):
        heads.compare_and_set("c", None, C)  # not overwritten as if it were empty
    record = heads.record("c")
    assert record is not None and record.checkpoint_id == A and record.history == (B,)


def test_sqlite_heads_of_an_earlier_schema_gain_turns(tmp_path: Path) -> None:
    import sqlite3

    from snapcell.heads import TurnRecord

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE heads (conversation_id TEXT PRIMARY KEY, checkpoint_id BLOB, history TEXT NOT NULL, "
        "version TEXT NOT NULL, updated_at REAL NOT NULL, lease_owner TEXT, lease_expires_at REAL NOT NULL)"
    )
    db.execute("INSERT INTO heads VALUES ('c', ?, '[]', 'v1', 0, NULL, 0)", (A,))
    db.commit()
    db.close()
    heads = SQLiteHeads(path)
    head = heads.get("c")
    assert head is not None and head.checkpoint_id == A and head.turns == ()
    heads.compare_and_set("c", "v1", B, history=[A], turn=TurnRecord("t1", "ok"))
    assert heads.get("c").turns == (TurnRecord("t1", "ok"),)  # type: ignore[union-attr]
    version = heads.get("c").version  # type: ignore[union-attr]
    heads.compare_and_set("c", version, C, history=[B], turn=TurnRecord("t2", "ok", checkpoint_id=C, started_from=B))
    assert heads.get("c").turn("t2") == TurnRecord("t2", "ok", checkpoint_id=C, started_from=B)  # type: ignore[union-attr]
    heads.close()


def test_a_turn_record_keeps_where_its_turn_started_and_what_it_made(heads: HeadStore) -> None:
    from snapcell.heads import TurnRecord
    from snapcell.heads._heads import MAX_TURN_ANSWERS

    first = TurnRecord("t0", "answer 0", checkpoint_id=A, started_from=None)
    version = heads.compare_and_set("c", None, A, turn=first)
    for i in range(1, MAX_TURN_ANSWERS + 2):
        turn = TurnRecord(f"t{i}", f"answer {i}", checkpoint_id=B, started_from=A)
        version = heads.compare_and_set("c", version, B, history=[A], turn=turn)
    heads.compare_and_set("c", version, C, history=[B], turn=TurnRecord("old", "an earlier snapcell's record"))
    head = heads.get("c")
    assert head is not None
    assert head.turn("t0") == TurnRecord("t0", None, checkpoint_id=A, started_from=None)  # its answer went, not this
    assert head.turn("t1") == TurnRecord("t1", None, checkpoint_id=B, started_from=A)
    assert head.turn("t5") == TurnRecord("t5", "answer 5", checkpoint_id=B, started_from=A)
    assert head.turn("old") == TurnRecord("old", "an earlier snapcell's record") and not head.turns[0].states_known


def test_turn_states_are_stored_apart_where_an_earlier_snapcell_ignores_them() -> None:
    from snapcell.heads import TurnRecord
    from snapcell.heads._heads import turn_states_to_json, turns_from_json, turns_to_json

    turns = (TurnRecord("t2", "two", checkpoint_id=B, started_from=A), TurnRecord("t1", None))
    pairs, states = turns_to_json(turns), turn_states_to_json(turns)
    assert pairs == [["t2", "two"], ["t1", None]]  # what an earlier snapcell reads, and all it reads
    assert turns_from_json(pairs, states) == turns
    assert turns_from_json(pairs) == (TurnRecord("t2", "two"), TurnRecord("t1"))  # a head an earlier one rewrote
    with pytest.raises(TypeError):
        turns_from_json(pairs, {"t2": [A.hex()]})


def test_acquire_lease_and_get_reads_the_head_with_the_lease(heads: HeadStore) -> None:
    from snapcell import StorageError
    from snapcell.heads import Head, RecordHeads

    assert isinstance(heads, RecordHeads)
    assert heads.acquire_lease_and_get("c", "s/t1", 60) == (True, None)  # no head yet: taken, nothing to read
    version = heads.compare_and_set("c", None, A, owner="s/t1", release_lease=True)
    taken, head = heads.acquire_lease_and_get("c", "s/t2", 60)
    assert taken and head == heads.get("c")
    assert head is not None and head.checkpoint_id == A and head.version == version and head.lease_owner == "s/t2"
    assert heads.acquire_lease_and_get("c", "other/t3", 60) == (False, None)  # held: not taken, not read
    heads._update("d", lambda record: Head(checkpoint_id=A, version=""))
    with pytest.raises(StorageError, match="no version"):  # malformed, as get says
        heads.acquire_lease_and_get("d", "s/t4", 60)
