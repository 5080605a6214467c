"""`SQLiteHeads.without_waiting`: head-store calls an event loop makes at once, and the ones it hands to a thread."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from snapcell.errors import StorageError
from snapcell.heads import AsyncHeads, SQLiteHeads
from snapcell.heads._async import call_head_store
from snapcell.heads._sqlite import _NO_WAIT_RUN, WouldWait

A, B = b"a" * 40, b"b" * 40

# Holds the database's write lock from "BEGIN IMMEDIATE" until it reads a line, then commits.
_HOLD_WRITE_LOCK = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN IMMEDIATE')\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
    "db.execute('COMMIT')\n"
)


@pytest.fixture
def heads(tmp_path: Path) -> Any:
    store = SQLiteHeads(tmp_path / "heads.sqlite3")
    yield store
    store.close()


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The calls handed to a worker thread by `call_head_store`."""
    handed: list[object] = []
    real = asyncio.to_thread

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    return handed


def _autocheckpoint(heads: SQLiteHeads) -> int:
    shared = heads._shared
    assert shared is not None
    value: int = shared.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    return value


def test_leases_and_reads_run_on_the_loop_and_head_writes_in_a_thread(
    heads: SQLiteHeads, threads: list[object]
) -> None:
    async def turn() -> None:
        aheads = AsyncHeads(heads)
        version = await aheads.compare_and_set("c", None, A)
        assert await aheads.acquire_lease("c", "me", 30.0)
        assert await aheads.renew_lease("c", "me", 30.0)
        assert (await aheads.get("c")) is not None
        await aheads.compare_and_set("c", version, B, history=[A], owner="me", release_lease=True)
        assert await aheads.acquire_lease("c", "you", 30.0)
        await aheads.release_lease("c", "you")
        head = await aheads.get("c")
        assert head is not None and head.checkpoint_id == B and head.lease_owner is None

    asyncio.run(turn())
    assert len(threads) == 2  # the two head writes, each synced at its commit; the rest at once
    assert _autocheckpoint(heads) == 0  # none of those on the loop checkpointed the WAL


def test_a_head_write_is_synced_at_its_commit_and_a_lease_is_not(heads: SQLiteHeads) -> None:
    shared = heads._shared
    assert shared is not None
    levels: list[int] = []
    heads._after_read = lambda _cid, _record: levels.append(shared.db.execute("PRAGMA synchronous").fetchone()[0])
    version = heads.compare_and_set("c", None, A)
    heads.acquire_lease("c", "me", 30.0)
    heads.compare_and_set("c", version, B, history=[A], owner="me", release_lease=True)
    heads.acquire_lease("c", "me", 30.0)
    heads.release_lease("c", "me")
    assert levels == [2, 1, 2, 1, 1]  # FULL for the head writes, NORMAL for the leases


def test_another_process_holding_the_write_lock_sends_the_call_to_a_thread_and_the_loop_runs_on(
    heads: SQLiteHeads, threads: list[object]
) -> None:
    heads.compare_and_set("c", None, A)  # the file and its table exist before the other process opens it
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_WRITE_LOCK, str(heads.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"held\n"

        async def contended() -> tuple[int, bool]:
            write = asyncio.ensure_future(AsyncHeads(heads).acquire_lease("c", "me", 30.0))
            ticks = 0
            for _ in range(20):  # the loop goes on while the call waits in its thread for the lock
                await asyncio.sleep(0)
                ticks += 1
            waiting = not write.done()
            holder.stdin.write(b"go\n")
            holder.stdin.flush()
            assert await write
            return ticks, waiting

        ticks, waiting = asyncio.run(contended())
    finally:
        holder.kill()
        holder.communicate()  # and closes its pipes
    assert ticks == 20 and waiting
    assert len(threads) == 1  # tried at once, refused (nothing changed), then waited for in a thread
    assert heads.get("c").lease_owner == "me"  # type: ignore[union-attr]


def test_a_lease_on_the_loop_after_a_head_write_commits_without_a_sync(heads: SQLiteHeads) -> None:
    shared = heads._shared
    assert shared is not None
    heads.compare_and_set("c", None, A)  # a head write, in a thread: it leaves the connection synced at each commit
    assert shared.db.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert heads.without_waiting(lambda: heads.acquire_lease("c", "me", 30.0))
    assert shared.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # the lease's commit synced nothing


def test_a_connection_in_use_by_another_thread_is_not_waited_for(heads: SQLiteHeads) -> None:
    shared = heads._shared
    assert shared is not None
    with shared.lock, pytest.raises(WouldWait):
        heads.without_waiting(lambda: heads.get("c"))
    assert heads.without_waiting(lambda: heads.get("c")) is None


def test_every_64th_call_goes_to_a_thread_where_sqlite_may_checkpoint(heads: SQLiteHeads) -> None:
    refused = []
    for n in range(3 * _NO_WAIT_RUN + 3):
        try:
            heads.without_waiting(lambda: heads.acquire_lease("c", "me", 30.0))
        except WouldWait:
            refused.append(n)
            assert _autocheckpoint(heads) == 0
            heads.acquire_lease("c", "me", 30.0)  # what the thread runs
            assert _autocheckpoint(heads) == 1000  # SQLite's own checkpoint is back on for it
    assert refused == [_NO_WAIT_RUN, 2 * _NO_WAIT_RUN + 1, 3 * _NO_WAIT_RUN + 2]


def test_a_closed_store_is_left_to_the_thread_which_says_so(heads: SQLiteHeads, threads: list[object]) -> None:
    heads.close()
    with pytest.raises(StorageError, match="closed"):
        asyncio.run(call_head_store(heads, lambda: heads.get("c")))
    assert len(threads) == 1


def test_a_subclass_is_always_called_in_a_thread(tmp_path: Path, threads: list[object]) -> None:
    class Slow(SQLiteHeads):
        pass

    slow = Slow(tmp_path / "heads.sqlite3")
    try:
        assert asyncio.run(AsyncHeads(slow).get("c")) is None
    finally:
        slow.close()
    assert len(threads) == 1


def test_a_turn_hands_a_thread_only_its_checkpoint_read_and_its_two_synced_writes(
    tmp_path: Path, threads: list[object]
) -> None:
    from snapcell import AsyncPool, CodeTool
    from snapcell.storage import LocalStore

    async def two_turns() -> None:
        pool = AsyncPool(LocalStore(tmp_path / "store"), isolation="inline", signing_keys=["k" * 32])
        async with pool:
            tool = CodeTool(pool, heads=SQLiteHeads(tmp_path / "heads.sqlite3"))
            await tool.run_code("c", "x = 1")
            threads.clear()
            assert "2" in await tool.run_code("c", "x + 1")
            await tool.aclose()

    asyncio.run(two_turns())
    # The lease take with the head read, on the loop; the checkpoint read, its write and the head write, in threads
    # (inline mode also loads and dumps in a thread: not storage).
    names = [getattr(func, "__qualname__", "") for func in threads]
    storage = sorted(name.split(".<locals>")[0] for name in names if not name.startswith("Runner."))
    assert storage == ["AsyncHeads.compare_and_set", "AsyncStore.get_at_most", "AsyncStore.put"], names
