"""The cleanup job and the usage report, with an injected clock (never sleeps)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell.errors import CheckpointCorrupt, CheckpointNotFound, ConfigError, StorageUnavailable
from snapcell.heads import MemoryHeads, SQLiteHeads
from snapcell.ops import CleanupReport, cleanup, usage
from snapcell.ops._cleanup import MIN_BLOB_GRACE_S, MIN_GRACE_S
from snapcell.storage import LocalStore, MemoryStore

DAY = 86400.0
HOUR = 3600.0
TTL = 7.5 * DAY  # at day 9 + 2 h: d0 and d1 are expired, d2 (7 days + 2 h old) is not
SIGNING_KEY = "cleanup-test-signing-key-0123456789"


@pytest.fixture
def populated(clock) -> MemoryStore:
    """Ten checkpoints of 100 bytes, one a day for days 0..9, plus a 50-byte head outside the prefix."""
    store = MemoryStore(now=clock)
    for day in range(10):
        clock.now = 1_700_000_000.0 + day * DAY
        store.put(f"checkpoints/d{day}", b"x" * 100)
    store.put("heads/conv", b"h" * 50)
    return store


def keys(store: MemoryStore) -> list[str]:
    return [o.key for o in store.scan()]


def test_deletes_exactly_the_expired(populated: MemoryStore, clock) -> None:
    # At day 9 with a 7-day ttl, days 0 and 1 are past 7 days; day 2 is exactly 7 days old, not past.
    now = 1_700_000_000.0 + 9 * DAY
    report = cleanup(populated, now=now, ttl_s=7 * DAY)
    assert keys(populated) == [f"checkpoints/d{d}" for d in range(2, 10)] + ["heads/conv"]
    assert (report.deleted_expired_objects, report.deleted_expired_bytes) == (2, 200)
    assert report.scanned_objects == 11 and report.scanned_bytes == 1050
    assert report.deleted_quota_objects == 0
    assert report.kept_objects == 9
    assert report.bytes_in_use_after == 850
    assert not report.over_quota and not report.dry_run
    assert report.deleted_keys == ("checkpoints/d0", "checkpoints/d1")


def test_exactly_ttl_old_is_not_expired(populated: MemoryStore) -> None:
    report = cleanup(populated, now=1_700_000_000.0 + 7 * DAY, ttl_s=7 * DAY)
    assert report.deleted_expired_objects == 0


def test_objects_outside_prefix_are_never_deleted(populated: MemoryStore) -> None:
    cleanup(populated, now=1_700_000_000.0 + 100 * DAY)
    assert keys(populated) == ["heads/conv"]


def test_quota_deletes_oldest_unneeded(populated: MemoryStore) -> None:
    now = 1_700_000_000.0 + 9 * DAY + 2 * HOUR
    keep = {"checkpoints/d2", "checkpoints/d4"}
    # Expired: d0, d1 (200 bytes). Left: 800 checkpoint bytes + 50 head = 850; quota 500.
    report = cleanup(populated, now=now, ttl_s=TTL, quota_bytes=500, keep=keep)
    assert report.deleted_expired_objects == 2
    # Oldest first, skipping kept d2 and d4: d3, d5, d6, d7 -> 850 - 400 = 450 <= 500.
    assert report.deleted_keys[2:] == ("checkpoints/d3", "checkpoints/d5", "checkpoints/d6", "checkpoints/d7")
    assert (report.deleted_quota_objects, report.deleted_quota_bytes) == (4, 400)
    assert report.bytes_in_use_after == 450
    assert not report.over_quota
    assert keys(populated) == ["checkpoints/d2", "checkpoints/d4", "checkpoints/d8", "checkpoints/d9", "heads/conv"]


def test_quota_respects_grace(clock) -> None:
    store = MemoryStore(now=clock)
    clock.now = 1000.0
    store.put("checkpoints/old", b"x" * 100)
    clock.now = 1000.0 + 10 * 60
    store.put("checkpoints/young", b"x" * 100)  # ten minutes old at cleanup time
    report = cleanup(store, now=1000.0 + 20 * 60, quota_bytes=0, grace_s=HOUR, ttl_s=60)
    assert report.deleted_keys == ()
    assert report.over_quota
    assert report.protected_objects == 2
    report = cleanup(store, now=1000.0 + 65 * 60, quota_bytes=0, grace_s=HOUR, ttl_s=1e9)
    assert report.deleted_keys == ("checkpoints/old",)
    assert keys(store) == ["checkpoints/young"]


def test_insufficient_quota_reports_and_keeps_needed(populated: MemoryStore) -> None:
    now = 1_700_000_000.0 + 9 * DAY + 2 * HOUR
    keep = {f"checkpoints/d{d}" for d in range(5, 10)}
    report = cleanup(populated, now=now, ttl_s=TTL, quota_bytes=100, keep=keep)
    assert report.over_quota
    assert report.bytes_in_use_after == 550
    assert report.protected_objects == 5
    assert keys(populated) == sorted(keep) + ["heads/conv"]
    assert "OVER QUOTA" in report.summary()


def test_dry_run_deletes_nothing_but_reports(populated: MemoryStore) -> None:
    before = keys(populated)
    now = 1_700_000_000.0 + 9 * DAY + 2 * HOUR
    report = cleanup(populated, now=now, ttl_s=TTL, quota_bytes=500, dry_run=True)
    assert keys(populated) == before
    assert report.dry_run
    assert report.deleted_expired_objects == 2 and report.deleted_quota_objects == 4
    assert report.bytes_in_use_after == 450
    assert "would delete" in report.summary()
    assert report == cleanup(populated, now=now, ttl_s=TTL, quota_bytes=500, dry_run=True)


def test_report_json(populated: MemoryStore) -> None:
    report = cleanup(populated, now=1_700_000_000.0 + 9 * DAY)
    data = json.loads(report.to_json())
    assert data["deleted_expired_objects"] == 2 and "deleted_keys" not in data
    assert json.loads(report.to_json(include_keys=True))["deleted_keys"] == ["checkpoints/d0", "checkpoints/d1"]
    assert isinstance(report, CleanupReport)


def test_progress_is_reported(populated: MemoryStore) -> None:
    calls: list[tuple[int, int]] = []
    cleanup(populated, now=1_700_000_000.0 + 9 * DAY, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 2), (1, 2), (2, 2)]


def test_second_run_is_a_no_op(populated: MemoryStore) -> None:
    now = 1_700_000_000.0 + 9 * DAY + 2 * HOUR
    cleanup(populated, now=now, ttl_s=TTL, quota_bytes=500)
    after = keys(populated)
    report = cleanup(populated, now=now, ttl_s=TTL, quota_bytes=500)
    assert keys(populated) == after
    assert report.deleted_keys == ()


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_concurrent_runs_leave_a_consistent_store(kind: str, tmp_path: Path, clock) -> None:
    store: MemoryStore | LocalStore
    store = MemoryStore(now=clock) if kind == "memory" else LocalStore(tmp_path)
    base = 1_700_000_000.0
    for i in range(300):
        clock.now = base + i * 60
        store.put(f"checkpoints/{i // 100}/k{i:03d}", b"x" * 10)
        if isinstance(store, LocalStore):
            path = tmp_path / f"checkpoints/{i // 100}/k{i:03d}"
            os.utime(path, (clock.now, clock.now))
    now = base + 299 * 60 + 2 * HOUR
    keep = {"checkpoints/0/k000"}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            barrier.wait()
            cleanup(store, now=now, ttl_s=200 * 60, quota_bytes=500, keep=keep)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    left = keys(store) if isinstance(store, MemoryStore) else [o.key for o in store.scan()]
    # ttl 200 min: k000..k099 (older than 200 min) expire; k000 too (keep does not save expired ones).
    # Quota 500 bytes = 50 objects: the 50 newest survive.
    assert left == [f"checkpoints/{i // 100}/k{i:03d}" for i in range(250, 300)]
    assert cleanup(store, now=now, ttl_s=200 * 60, quota_bytes=500).deleted_keys == ()


def test_bad_arguments(populated: MemoryStore) -> None:
    with pytest.raises(ConfigError):
        cleanup(populated, ttl_s=-1)
    with pytest.raises(ConfigError):
        cleanup(populated, quota_bytes=-5)


def test_usage(clock) -> None:
    store = MemoryStore(now=clock)
    base = 1_700_006_400.0  # 2023-11-15 00:00:00 UTC
    for i, hours in enumerate([0, 1, 25, 49, 50]):
        clock.now = base + hours * HOUR
        store.put(f"checkpoints/k{i}", b"x" * (10 * (i + 1)))
    store.put("heads/h", b"h" * 7)
    now = base + 50 * HOUR + 60
    report = usage(store, now=now, ttl_s=2 * DAY)
    assert [(d.date, d.objects, d.bytes) for d in report.days] == [
        ("2023-11-15", 2, 30),
        ("2023-11-16", 1, 30),
        ("2023-11-17", 2, 90),
    ]
    assert (report.total_objects, report.total_bytes) == (5, 150)
    assert (report.store_objects, report.store_bytes) == (6, 157)
    # ttl 2 days: k0 (50 h old) and k1 (49 h) expired; k2 (25 h) expires within 24 h; k3, k4 later.
    assert (report.expired_objects, report.expired_bytes) == (2, 30)
    assert (report.expiring_24h_objects, report.expiring_24h_bytes) == (1, 30)
    assert json.loads(report.to_json())["days"][0] == {"date": "2023-11-15", "objects": 2, "bytes": 30}
    text = report.summary()
    assert "2023-11-17" in text and "expiring in the next 24 h: 1 objects" in text


# ----------------------------------------------------------------- grace floor


@pytest.mark.parametrize(
    "options",
    [{"grace_s": 0}, {"grace_s": MIN_GRACE_S - 1}, {"blob_grace_s": 0, "blob_refs": lambda data: []}],
    ids=["grace-0", "grace-below-floor", "blob-grace-0"],
)
def test_a_grace_below_the_floor_is_refused_without_force(populated: MemoryStore, options: dict) -> None:
    now = 1_700_000_000.0 + 100 * DAY
    with pytest.raises(ConfigError, match="floor") as info:
        cleanup(populated, now=now, quota_bytes=0, **options)
    assert "force" in str(info.value) and "turn" in str(info.value)
    assert len(keys(populated)) == 11  # nothing deleted
    assert cleanup(populated, now=now, quota_bytes=0, dry_run=True, **options).deleted_expired_objects == 10
    report = cleanup(populated, now=now, quota_bytes=0, force=True, **options)
    assert report.deleted_expired_objects == 10 and keys(populated) == ["heads/conv"]


def test_the_floor_itself_is_accepted(populated: MemoryStore) -> None:
    report = cleanup(populated, now=1_700_000_000.0 + 100 * DAY, grace_s=MIN_GRACE_S, blob_grace_s=MIN_BLOB_GRACE_S)
    assert report.deleted_expired_objects == 10


# ----------------------------------------------------------------- corrupt heads


def _heads_with_a_corrupt_row(path: Path) -> SQLiteHeads:
    """Heads of conversations good-1 (d8) and good-2 (d9), and a row another program wrote for 'bad-one'."""
    heads = SQLiteHeads(path)
    heads.compare_and_set("good-1", None, b"d8")
    heads.compare_and_set("good-2", None, b"d9")
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "INSERT INTO heads (conversation_id, checkpoint_id, history, version, updated_at, lease_owner,"
            " lease_expires_at) VALUES ('bad-one', ?, 'not json', 'v1', 0, NULL, 0)",
            (b"d7",),
        )
    db.close()
    return heads


def test_a_corrupt_head_is_skipped_and_reported_and_the_rest_still_runs(populated: MemoryStore, tmp_path: Path) -> None:
    heads = _heads_with_a_corrupt_row(tmp_path / "heads.sqlite3")
    now = 1_700_000_000.0 + 9 * DAY + 2 * HOUR
    try:
        report = cleanup(
            populated,
            now=now,
            ttl_s=TTL,
            quota_bytes=0,
            heads=heads,
            key_of=lambda checkpoint_id: f"checkpoints/{checkpoint_id.decode()}",
        )
    finally:
        heads.close()
    assert len(report.skipped_heads) == 1 and "'bad-one'" in report.skipped_heads[0]
    assert "SKIPPED  1 unreadable conversation heads" in report.summary() and "'bad-one'" in report.summary()
    assert json.loads(report.to_json())["skipped_heads"] == list(report.skipped_heads)
    assert report.deleted_expired_objects == 2  # expiry ran
    assert report.deleted_quota_objects == 6  # and the quota pass, keeping the good heads' checkpoints
    assert keys(populated) == ["checkpoints/d8", "checkpoints/d9", "heads/conv"]


def test_a_head_store_that_fails_stops_cleanup_before_anything_is_deleted(populated: MemoryStore) -> None:
    class Unreachable(MemoryHeads):
        def scan(self, *, corrupt: list | None = None) -> Iterator:
            raise StorageUnavailable("the head store is unreachable")

    with pytest.raises(StorageUnavailable):
        cleanup(populated, now=1_700_000_000.0 + 100 * DAY, quota_bytes=0, heads=Unreachable(), key_of=str)
    assert len(keys(populated)) == 11  # without the heads, the quota pass could delete what conversations need


# ----------------------------------------------------------------- the ttl boundary, load and cleanup agree


def test_at_exactly_the_ttl_a_checkpoint_loads_and_cleanup_keeps_it(clock) -> None:
    from snapcell import CheckpointExpired, Pool

    store = MemoryStore(now=clock)
    with Pool(store, isolation="inline", ttl_s=HOUR, clock=clock, signing_keys=[SIGNING_KEY]) as pool:
        with pool.checkout() as session:
            session.feed_run("x = 41")
            checkpoint_id = session.dump()
        created = clock.now
        clock.now = created + HOUR  # exactly the ttl: not expired yet, for loading and for cleanup alike
        with pool.checkout() as session:
            session.load_session(checkpoint_id)
            assert session.feed_run("x + 1") == 42
        assert cleanup(store, now=clock.now, ttl_s=HOUR).deleted_expired_objects == 0
        assert usage(store, now=clock.now, ttl_s=HOUR).expired_objects == 0
        clock.now = created + HOUR + 0.001  # just past it: refused by both
        with pool.checkout() as session, pytest.raises(CheckpointExpired):
            session.load_session(checkpoint_id)
        assert usage(store, now=clock.now, ttl_s=HOUR).expired_objects == 1
        assert cleanup(store, now=clock.now, ttl_s=HOUR).deleted_expired_objects == 1


# ----------------------------------------------------------------- racing turns


class RacingStore(MemoryStore):
    """Runs a cleanup right after every checkpoint write, before the conversation's head moves to it.

    That is the worst moment for a turn: its new checkpoint is referenced by no head yet. ``turn_s`` is how much
    of the turn's (simulated) time is left at that moment.
    """

    def __init__(self, clock, *, turn_s: float, **cleanup_options: object) -> None:
        super().__init__(now=clock)
        self.clock = clock
        self.turn_s = turn_s
        self.options = cleanup_options
        self.deleted: list[str] = []

    def put(self, key: str, data: bytes | bytearray, *, expires_at: float | None = None, overwrite: bool = False):
        super().put(key, data, expires_at=expires_at, overwrite=overwrite)
        if key.startswith("checkpoints/"):
            self.clock.now += self.turn_s
            report = cleanup(self, now=self.clock.now, quota_bytes=0, **self.options)  # type: ignore[arg-type]
            self.deleted += report.deleted_keys


@pytest.mark.parametrize("at_floor", [True, False], ids=["grace-at-floor", "grace-0-forced"])
def test_cleanup_racing_turns_loses_nothing_at_the_grace_floor(clock, at_floor: bool) -> None:
    pytest.importorskip("numpy")
    from snapcell import Policy, Pool, SyncCodeTool
    from snapcell.checkpoint import Keyring, blob_keys_of

    heads = MemoryHeads(clock=clock, max_history=1)  # so superseded checkpoints become deletable
    grace = {"grace_s": MIN_GRACE_S, "blob_grace_s": MIN_BLOB_GRACE_S} if at_floor else {"grace_s": 0, "force": True}
    keyring = Keyring([SIGNING_KEY])
    store = RacingStore(
        clock,
        turn_s=MIN_GRACE_S / 2,  # a slow turn, yet within the floor
        heads=heads,
        key_of=lambda checkpoint_id: keyring.parse_id(checkpoint_id).storage_key,
        blob_refs=blob_keys_of,
        **grace,
    )
    policy = Policy().with_modules(["numpy"])
    pool = Pool(store, isolation="inline", clock=clock, signing_keys=[SIGNING_KEY], policy=policy)
    conversations = [f"c{i}" for i in range(3)]
    with pool:
        tool = SyncCodeTool(pool, heads=heads)
        try:
            for round_ in range(8):
                for conversation in conversations:
                    setup = "import numpy as np\nn = 0\na = np.arange(50_000)" if round_ == 0 else ""
                    tool.run_code(conversation, f"{setup}\nn += 1\nn")
        finally:
            tool.close()
        lost = []
        for conversation in conversations:
            head = heads.get(conversation)
            assert head is not None and head.checkpoint_id is not None
            with pool.checkout() as session:
                try:
                    session.load_session(head.checkpoint_id)
                    assert session.feed_run("n, int(a[-1])") == (8, 49_999)
                except (CheckpointNotFound, CheckpointCorrupt):
                    lost.append(conversation)
    assert store.deleted  # the cleanups did delete (superseded checkpoints), so they really raced the turns
    if at_floor:
        assert lost == []
    else:
        assert lost  # what the floor prevents: the checkpoint a head was about to point to is gone


@pytest.mark.integration
def test_a_corrupt_s3_head_is_skipped_and_a_good_one_still_protects(s3_store) -> None:
    from snapcell.heads import S3Heads

    heads = S3Heads(s3_store)
    heads.compare_and_set("good", None, b"keep")
    s3_store.put("heads/bad-one.json", b"{not json")
    s3_store.put("checkpoints/keep", b"k" * 10)
    s3_store.put("checkpoints/other", b"o" * 10)
    later = s3_store.scan("checkpoints/")
    now = max(o.created_at for o in later) + DAY
    report = cleanup(
        s3_store,
        now=now,
        quota_bytes=0,
        heads=heads,
        key_of=lambda checkpoint_id: f"checkpoints/{checkpoint_id.decode()}",
    )
    assert len(report.skipped_heads) == 1 and "bad-one" in report.skipped_heads[0]
    assert [o.key for o in s3_store.scan("checkpoints/")] == ["checkpoints/keep"]
