"""Head stores under faults: SQLite locks across head stores, disk full, CAS races across instances and processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from snapcell import Pool, StorageError, SyncCodeTool
from snapcell.storage import SQLiteHeads

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
    "import json, sys\nfrom snapcell.storage import SQLiteHeads\nh = SQLiteHeads(sys.argv[1], create=False)\n"
    "head = h.get(sys.argv[2])\n"
    "print(json.dumps(None if head is None else [head.checkpoint_id.hex(), len(head.history)]))"
)


def test_two_head_stores_in_a_process_lose_no_turn_when_another_process_closes_the_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Pool(f"file://{store}", isolation="inline", signing_keys=[KEY]) as pool:
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
    assert not [name for name in opened if name.startswith(str(tmp_path))]
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
