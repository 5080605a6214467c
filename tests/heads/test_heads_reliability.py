"""Head stores under faults: SQLite locks across head stores, disk full, CAS races across instances and processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from snapcell import Conflict, Pool, StorageError, SyncCodeTool
from snapcell.errors import StorageUnavailable
from snapcell.heads import SQLiteHeads

ROOT = Path(__file__).resolve().parents[2]
KEY = "heads-reliability-signing-key-0123"
A, B, C = b"a" * 40, b"b" * 40, b"c" * 40


def _python(code: str, *args: str, timeout: float = 60) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


_OPEN_AND_CLOSE = (
    "import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1])\ndb.execute('SELECT count(*) FROM heads')\ndb.close()"
)
_READ_HEAD = (
    "import json, sys\nfrom snapcell.heads import SQLiteHeads\nh = SQLiteHeads(sys.argv[1], create=False)\n"
    "head = h.get(sys.argv[2])\n"
    "print(json.dumps(None if head is None else [head.checkpoint_id.hex(), len(head.history)]))"
)


def test_two_head_stores_in_a_process_lose_no_turn_when_another_process_closes_the_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Pool(f"file://{store}", create_store=True, isolation="inline", signing_keys=[KEY]) as pool:
        first = SyncCodeTool(pool)  # default heads: <store>/.heads.sqlite3
        first.run_code("c", "n = 0")
        second = SyncCodeTool(pool)  # a second head store on the same file, in the same process
        heads_path = store / ".heads.sqlite3"
        # Another process opens and closes the database, as an hourly `snapcell cleanup` does.
        _python(_OPEN_AND_CLOSE, str(heads_path))
        for i in range(15):
            first.run_code("c", f"n = {i + 1}")
        head = first.head("c")
        assert head is not None and head.checkpoint_id is not None and len(head.history) == 15
        # Every committed turn is visible to any other process, while this one is still running.
        seen = json.loads(_python(_READ_HEAD, str(heads_path), "c"))
        assert seen == [head.checkpoint_id.hex(), 15]
        _python(_OPEN_AND_CLOSE, str(heads_path))
        second.run_code("c", "n += 1")
        assert first.run_code("c", "n") == "16"
        first.close()
        second.close()
    db = sqlite3.connect(heads_path)  # all 18 turns are in the file after every connection closed
    (history,) = db.execute("SELECT history FROM heads WHERE conversation_id = 'c'").fetchone()
    db.close()
    assert len(json.loads(history)) == 17


def test_sqlite_heads_never_open_the_file_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "h.db"
    opened: list[str] = []
    real_open = os.open

    def spy(file: object, *args: object, **kwargs: object) -> int:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    one = SQLiteHeads(path)
    (tmp_path / "link.db").symlink_to(path)
    two = SQLiteHeads(tmp_path / "link.db")  # another spelling of the same file: the same connection
    monkeypatch.undo()
    # Closing a descriptor of the database file would drop SQLite's POSIX locks; its directory (synced once the new
    # file is made) is another file.
    assert not [name for name in opened if name.startswith(str(tmp_path)) and not Path(name).is_dir()]
    assert str(tmp_path) in opened
    assert one._shared is two._shared and one._shared is not None and one._shared.refs == 2
    assert path.stat().st_mode & 0o777 == 0o600
    version = one.compare_and_set("c", None, A)
    one.close()
    one.close()  # twice is harmless
    assert two.get("c").version == version  # type: ignore[union-attr]
    two.compare_and_set("c", version, B, history=[A])
    two.close()
    with pytest.raises(StorageError, match="closed"):
        two.get("c")
    three = SQLiteHeads(path)  # a new connection once every head store let go
    assert three.get("c").checkpoint_id == B  # type: ignore[union-attr]
    three.close()


@pytest.mark.parametrize(
    ("pragma", "cause"), [("max_page_count = {pages}", "full"), ("query_only = ON", "readonly")], ids=["full", "ro"]
)
def test_sqlite_errors_keep_their_real_cause(tmp_path: Path, pragma: str, cause: str) -> None:
    heads = SQLiteHeads(tmp_path / "h.db")
    version = heads.compare_and_set("c", None, A)
    assert heads._shared is not None
    db = heads._shared.db
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA {pragma.format(pages=pages)}")
    try:
        with pytest.raises(StorageError, match=cause) as info:
            heads.compare_and_set("c", version, B, history=[bytes([i]) * 40 for i in range(50)])
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert "no transaction" not in str(info.value)
        assert heads.get("c").checkpoint_id == A  # type: ignore[union-attr]
    finally:
        db.execute("PRAGMA max_page_count = 1073741823")
        db.execute("PRAGMA query_only = OFF")
    heads.compare_and_set("c", version, B, history=[A])  # the failure left no transaction open
    heads.close()


# ------------------------------------------------------------------ CAS races

# The other instance, in its own process (SQLite's write lock is per process): on each line "VERSION", it tries
# once to move the head from VERSION without waiting for a lock, and prints what happened.
_OTHER_INSTANCE = """
import sys
from snapcell import Conflict
from snapcell.errors import StorageUnavailable
from snapcell.errors import StorageUnavailable
from snapcell.heads import SQLiteHeads
heads = SQLiteHeads(sys.argv[1], busy_timeout_s=0)
print("ready", flush=True)
for line in sys.stdin:
    try:
        heads.compare_and_set("c", line.strip(), b"other" * 8)
        print("ok", flush=True)
    except Conflict:
        print("conflict", flush=True)
    except StorageUnavailable as exc:
        print("locked" if "locked" in str(exc) else f"error {exc}", flush=True)
"""


def test_sqlite_cas_race_between_read_and_write(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    heads = SQLiteHeads(path)
    version = heads.compare_and_set("c", None, A)
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_INSTANCE, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdin is not None and other.stdout is not None
    outcomes: list[str] = []

    def other_writes(conversation_id: str, record: object) -> None:
        assert other.stdin is not None and other.stdout is not None
        other.stdin.write(version + "\n")
        other.stdin.flush()
        outcomes.append(other.stdout.readline().strip())

    try:
        assert other.stdout.readline().strip() == "ready"
        heads._after_read = other_writes  # the other instance writes after this one read the head
        mine = "ok"
        try:
            heads.compare_and_set("c", version, B, history=[A])
        except Conflict:
            mine = "conflict"
        heads._after_read = None
        other_writes("c", None)  # and once more after this write, from the version both read
    finally:
        other.stdin.close()
        other.wait(timeout=60)
        other.stdout.close()
    # Between this instance's read and write the head was locked: the other write could not land, this one did,
    # and the other one, from the version both had read, is refused as stale.
    assert (mine, outcomes) == ("ok", ["locked", "conflict"])
    head = heads.get("c")
    assert head is not None and head.checkpoint_id == B and head.history == (A,)
    heads.close()


@pytest.mark.integration
def test_s3_cas_race_between_read_and_write(s3_store: object) -> None:
    from snapcell.heads import S3Heads
    from snapcell.storage import S3Store

    assert isinstance(s3_store, S3Store)
    mine, other = S3Heads(s3_store), S3Heads(s3_store)
    version = mine.compare_and_set("c", None, A)
    raced: list[str] = []

    def other_writes(conversation_id: str, record: object) -> None:
        if not raced:  # once: the other instance moves the head after this one read it
            raced.append(other.compare_and_set("c", version, C, history=[A]))

    mine._after_read = other_writes
    with pytest.raises(Conflict, match="moved"):
        mine.compare_and_set("c", version, B, history=[A])
    head = mine.get("c")
    assert head is not None and head.checkpoint_id == C and head.version == raced[0]


class LandsThenRefused:
    """A client whose next conditional write lands, then answers 412 PreconditionFailed: what the client's retry of
    a write whose first answer was lost gets. ``kinds`` are the write methods that do so, once each."""

    def __init__(self, client: object, kinds: set[str]) -> None:
        self._client = client
        self.kinds = kinds
        self.refused: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def _lands_then_refused(self, name: str, **kwargs: object) -> object:
        from botocore.exceptions import ClientError

        answer = getattr(self._client, name)(**kwargs)
        if name not in self.kinds:
            return answer
        self.kinds.discard(name)
        self.refused.append(name)
        error = {
            "Code": "PreconditionFailed",
            "Message": "At least one of the pre-conditions you specified did not hold",
        }
        raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 412}}, name)

    def put_object(self, **kwargs: object) -> object:
        return self._lands_then_refused("put_object", **kwargs)

    def delete_object(self, **kwargs: object) -> object:
        return self._lands_then_refused("delete_object", **kwargs)


@pytest.mark.integration
def test_s3_a_write_whose_retry_is_refused_because_it_landed_is_a_success(s3_store: object) -> None:
    """The client retried a write whose answer was lost, and the retry got 412: the first attempt had landed. That
    is this write's success, not another writer's win (a rewind told Conflict would be retried: rewound twice)."""
    from snapcell.heads import S3Heads, TurnRecord
    from snapcell.storage import S3Store

    assert isinstance(s3_store, S3Store)
    lossy = LandsThenRefused(s3_store.client, {"put_object"})
    heads = S3Heads(bucket=s3_store.bucket, prefix=s3_store.prefix, client=lossy)
    created = heads.compare_and_set("c", None, A)  # a create: If-None-Match
    assert lossy.refused == ["put_object"]
    head = heads.get("c")
    assert head is not None and head.checkpoint_id == A and head.version == created
    lossy.kinds = {"put_object"}
    moved = heads.compare_and_set("c", created, B, history=[A], turn=TurnRecord("rewind-1", "rewound"))  # If-Match
    head = heads.get("c")
    assert head is not None and head.version == moved and head.checkpoint_id == B and head.history == (A,)
    assert [t.turn_id for t in head.turns] == ["rewind-1"]
    # Another writer's 412 is still a lost race: the head it wrote stays.
    with pytest.raises(Conflict, match="moved"):
        heads.compare_and_set("c", created, C, history=[A])
    lossy.kinds = {"delete_object"}
    assert heads.delete("c", expected_version=moved)  # a delete that landed, its retry refused: deleted
    assert heads.get("c") is None


_HAMMER = """
import sys
from snapcell import Conflict
from snapcell.heads import S3Heads, SQLiteHeads
kind, where, increments = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "sqlite":
    heads = SQLiteHeads(where)
else:
    import boto3
    endpoint, bucket = where.split("|")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    heads = S3Heads(bucket=bucket, prefix="proj", client=client)
# Yield the CPU between reading the record and writing it: any gap in the atomicity of an update becomes a lost
# increment instead of a microsecond window that the scheduler almost never hits.
import time
heads._after_read = lambda conversation_id, record: time.sleep(0.002)
print("ready", flush=True)
sys.stdin.readline()
head = heads.get("counter")
print("read", flush=True)  # every child reads the same first version before any of them writes
sys.stdin.readline()
done = conflicts = 0
while done < increments:
    try:
        heads.compare_and_set("counter", head.version, str(int(head.checkpoint_id) + 1).encode())
        done += 1
    except Conflict:
        conflicts += 1
    head = heads.get("counter")
print(conflicts, flush=True)
"""


def _hammer(kind: str, where: str, heads: object, processes: int, increments: int) -> int:
    from snapcell.heads import HeadStore

    assert isinstance(heads, HeadStore)
    heads.compare_and_set("counter", None, b"0")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, kind, where, str(increments)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for step in ("ready", "read"):
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == step
        for child in children:  # all at once, so that the increments interleave
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
    conflicts = 0
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        conflicts += int(out)
    head = heads.get("counter")
    assert head is not None and head.checkpoint_id == str(processes * increments).encode()
    # They really raced, counted rather than timed: all first writes name the version every child read before any
    # wrote, so all but one of them are refused.
    assert conflicts >= processes - 1
    return conflicts


def test_sqlite_cas_hammer_from_many_processes_loses_no_increment(tmp_path: Path) -> None:
    heads = SQLiteHeads(tmp_path / "h.db")
    _hammer("sqlite", str(tmp_path / "h.db"), heads, processes=4, increments=25)
    heads.close()


@pytest.mark.integration
def test_s3_cas_hammer_from_many_processes_loses_no_increment(s3_server: str, s3_bucket: str) -> None:
    import boto3

    from snapcell.heads import S3Heads
    from tests.s3server import TEST_CREDENTIALS, TEST_REGION

    client = boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    heads = S3Heads(bucket=s3_bucket, prefix="proj", client=client)
    _hammer("s3", f"{s3_server}|{s3_bucket}", heads, processes=3, increments=10)
    client.close()


def test_a_store_directory_the_process_may_not_enter_is_a_storage_error_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root nothing is refused for permissions, so the refusal is injected where the kernel would give it.
    from snapcell.heads import _sqlite

    locked = tmp_path / "locked"
    locked.mkdir()
    real_stat, real_access = os.stat, os.access

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).startswith(str(locked)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_sqlite.os, "stat", stat)
    monkeypatch.setattr(_sqlite.os, "access", lambda p, mode: False if str(p) == str(locked) else real_access(p, mode))
    with pytest.raises(StorageUnavailable, match="may not enter or write .*locked"):
        SQLiteHeads(locked / "heads.sqlite3")


def test_a_head_store_on_a_read_only_file_system_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.heads import _sqlite

    def refuse(*args: object, **kwargs: object) -> object:
        raise sqlite3.OperationalError("unable to open database file")

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(_sqlite.sqlite3, "connect", refuse)
    monkeypatch.setattr(_sqlite.os, "statvfs", lambda path: ReadOnly())
    with pytest.raises(StorageUnavailable, match="read-only file system"):
        SQLiteHeads(tmp_path / "heads.sqlite3")
