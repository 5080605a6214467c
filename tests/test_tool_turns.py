"""The run_code tool under faults: exactly-once turns, storage deadlines, leases that free themselves, history."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from snapcell import CodeTool, Conflict, Pool, StorageError, SyncCodeTool, TurnOutcomeUnknown
from snapcell.errors import ConversationBusy, InvalidKey, StorageTimeout, StorageUnavailable
from snapcell.heads import Head, MemoryHeads
from snapcell.storage import MemoryStore

KEY = "tool-turns-signing-key-0123456789"
APPEND = "try:\n    entries\nexcept NameError:\n    entries = []\nentries.append(mark({tag!r}))\nentries"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pool(clock: Clock) -> Iterator[Pool]:
    with Pool(MemoryStore("turns", now=clock), isolation="inline", clock=clock, signing_keys=[KEY]) as pool:
        yield pool


class Ran:
    """A host function that records every tag it is called with: what ran, how often."""

    def __init__(self) -> None:
        self.tags: list[str] = []

    def __call__(self, tag: str) -> str:
        self.tags.append(tag)
        return tag


# ------------------------------------------------------------- exactly once


class LostReplies(MemoryHeads):
    """Head writes land, but with ``lose`` set the reply is lost; with ``outage`` set too, reads fail after that."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lose = False
        self.outage = False
        self.down = False

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        version = super().compare_and_set(*args, **kwargs)
        if self.lose:
            self.down = self.outage
            raise StorageUnavailable("connection reset by peer")
        return version

    def get(self, conversation_id: str) -> Head | None:
        if self.down:
            raise StorageUnavailable("connection refused")
        return super().get(conversation_id)


def test_a_lost_reply_to_a_head_write_never_runs_a_turn_twice(pool: Pool) -> None:
    heads, ran = LostReplies(), Ran()
    tool = SyncCodeTool(pool, heads=heads, tools={"mark": ran}, storage_timeout_s=0.3)
    assert tool.run_code("c", APPEND.format(tag="t1"), turn_id="call-1") == "['t1']"
    # The write of turn 2 lands, its reply is lost, and the head cannot be read back: the caller cannot be told.
    heads.lose = heads.outage = True
    with pytest.raises(TurnOutcomeUnknown, match="turn_id='call-2'") as info:
        tool.run_code("c", APPEND.format(tag="t2"), turn_id="call-2")
    assert info.value.turn_id == "call-2" and isinstance(info.value, StorageError)
    heads.lose = heads.outage = heads.down = False
    # The retry with the same turn ID gets the committed answer; the code does not run again.
    assert tool.run_code("c", APPEND.format(tag="t2"), turn_id="call-2") == "['t1', 't2']"
    # A lost reply that can be read back is a success at once.
    heads.lose = True
    assert tool.run_code("c", APPEND.format(tag="t3"), turn_id="call-3") == "['t1', 't2', 't3']"
    heads.lose = False
    assert ran.tags == ["t1", "t2", "t3"]
    head = heads.get("c")
    assert head is not None and len(head.history) == 2 and head.lease_owner is None


def test_a_committed_turn_id_returns_its_answer_without_running(pool: Pool) -> None:
    ran = Ran()
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools={"mark": ran})
    first = tool.run_code("c", APPEND.format(tag="a"), turn_id="toolu_01")
    assert tool.run_code("c", APPEND.format(tag="a"), turn_id="toolu_01") == first == "['a']"
    assert tool.run_code("other", APPEND.format(tag="b"), turn_id="toolu_01") == "['b']"  # IDs are per conversation
    for i in range(10):
        tool.run_code("c", "1", turn_id=f"later-{i}")
    replay = tool.run_code("c", APPEND.format(tag="a"), turn_id="toolu_01")  # remembered, its answer no longer
    assert "already ran" in replay and "not run again" in replay
    assert ran.tags == ["a", "b"]
    with pytest.raises(InvalidKey, match="turn ID"):
        tool.run_code("c", "1", turn_id="no spaces")


# ------------------------------------------------ every head move checks its outcome


class LandsThenFails(MemoryHeads):
    """Head writes land; with ``failure`` set, the next one then reports it: its answer was lost on the way back (a
    reset, a timeout), or the client's retry of it was refused (S3's 412 once the first attempt had landed). With
    ``unreadable`` set, reads fail after that write too."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failure: BaseException | None = None
        self.unreadable = False
        self.read_error: Exception = StorageUnavailable("connection refused")
        self._down = False

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        version = super().compare_and_set(*args, **kwargs)
        failure, self.failure = self.failure, None
        if failure is not None:
            self._down = self.unreadable
            raise failure
        return version

    def get(self, conversation_id: str) -> Head | None:
        if self._down and self.unreadable:
            raise self.read_error
        return super().get(conversation_id)


@pytest.fixture(scope="module")
def process_pool() -> Iterator[Pool]:
    with Pool(MemoryStore("moves"), isolation="process", min_warm_workers=0, signing_keys=[KEY]) as pool:
        yield pool


MOVES = {
    "rewind": lambda tool: tool.rewind("c", turn_id="move-1"),
    "fork": lambda tool: tool.fork("c", "c-fork", turn_id="move-1"),
    "put_file": lambda tool: tool.put_file("c", "f.txt", b"data", turn_id="move-1"),
}


FAILURES = pytest.mark.parametrize(
    "failure",
    [
        StorageUnavailable("connection reset by peer"),
        Conflict("another turn moved this conversation's head since it was read; nothing was overwritten"),
        TimeoutError(),
    ],
    ids=["reset", "retry-refused", "timeout"],
)


@FAILURES
@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_head_move_whose_write_landed_reports_success_whatever_its_answer_said(
    move: str, failure: BaseException, request: pytest.FixtureRequest
) -> None:
    """rewind, fork and put_file used to report the failure ("nothing was overwritten"), so a caller retried
    them and rewound twice: a failed write is read back first, as a turn's is."""
    pool: Pool = request.getfixturevalue("process_pool" if move == "put_file" else "pool")
    heads = LandsThenFails()
    tool = SyncCodeTool(pool, heads=heads, storage_timeout_s=5)
    try:
        for n in range(3):
            tool.run_code("c", f"n = {n}")
        before = heads.get("c")
        assert before is not None
        heads.failure = failure
        result = MOVES[move](tool)
        assert heads.failure is None  # the failure was reported, after the write landed
        head = heads.get("c")
        assert head is not None and head.turn("move-1") is not None or move == "fork"
        assert head.lease_owner is None  # the lease went with the write
        assert MOVES[move](tool) == result  # called again with its turn ID: nothing moves again
        assert heads.get("c") == head
        if move == "rewind":
            assert result == before.history[0] == head.checkpoint_id and head.history == before.history[1:]
            assert tool.run_code("c", "n") == "1"  # one turn back, not two
        elif move == "fork":
            forked = heads.get("c-fork")
            assert forked is not None and forked.turn("move-1") is not None
            assert result == before.checkpoint_id == forked.checkpoint_id
        else:
            assert result == head.checkpoint_id and head.history == (before.checkpoint_id, *before.history)
    finally:
        tool.close()


@FAILURES
def test_a_turn_whose_write_landed_answers_whatever_its_write_said(failure: BaseException, pool: Pool) -> None:
    """The turn's own head move, as rewind, fork and put_file's: a write that landed although it reported a
    failure is the turn's success (its answer, its code run once), never a `Conflict` or a `StorageError`."""
    heads, ran = LandsThenFails(), Ran()
    tool = SyncCodeTool(pool, heads=heads, tools={"mark": ran}, storage_timeout_s=5)
    try:
        tool.run_code("c", APPEND.format(tag="t1"), turn_id="call-1")
        before = heads.get("c")
        assert before is not None
        heads.failure = failure
        answer = tool.run_code("c", APPEND.format(tag="t2"), turn_id="call-2")
        assert heads.failure is None and answer == "['t1', 't2']"  # the failure was reported, after the write
        head = heads.get("c")
        assert head is not None and head.turn("call-2") is not None and head.lease_owner is None
        assert head.history == (before.checkpoint_id, *before.history)
        assert tool.run_code("c", APPEND.format(tag="t2"), turn_id="call-2") == answer  # replayed, not run
        assert ran.tags == ["t1", "t2"]
    finally:
        tool.close()


def test_a_rewind_retried_after_an_unknown_outcome_rewinds_once(pool: Pool) -> None:
    heads = LandsThenFails()
    tool = SyncCodeTool(pool, heads=heads, storage_timeout_s=0.3)
    try:
        for n in range(3):
            tool.run_code("c", f"n = {n}")
        # The rewind lands, its answer is lost and the head cannot be read back: the caller cannot be told.
        heads.failure, heads.unreadable = StorageUnavailable("connection reset by peer"), True
        with pytest.raises(TurnOutcomeUnknown, match="turn_id='undo-1'") as info:
            tool.rewind("c", turn_id="undo-1")
        assert info.value.turn_id == "undo-1" and "rewinding conversation 'c'" in str(info.value)
        heads.unreadable = False
        tool.rewind("c", turn_id="undo-1")  # the retry the error asks for
        assert tool.run_code("c", "n") == "1"  # rewound once
    finally:
        tool.close()


class AnotherWriterFirst(MemoryHeads):
    """With ``other`` set, another writer moves the head to that checkpoint just before the next head write."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.other: bytes | None = None

    def compare_and_set(self, conversation_id: str, *args: Any, **kwargs: Any) -> str:
        other, self.other = self.other, None
        if other is not None:
            with self._lock:
                record = self._records[conversation_id]
                self._records[conversation_id] = replace(record, checkpoint_id=other, version="theirs")
        return super().compare_and_set(conversation_id, *args, **kwargs)


def test_a_head_move_that_lost_to_another_writer_is_a_conflict(pool: Pool) -> None:
    heads = AnotherWriterFirst()
    tool = SyncCodeTool(pool, heads=heads)
    try:
        for n in range(3):
            tool.run_code("c", f"n = {n}")
        before = heads.get("c")
        assert before is not None
        heads.other = before.history[1]
        with pytest.raises(Conflict, match="moved"):
            tool.rewind("c")
        head = heads.get("c")
        assert head is not None and head.version == "theirs" and head.checkpoint_id == before.history[1]
    finally:
        tool.close()


# ------------------------------------------------------------ deadlines


class Hanging(MemoryHeads):
    """Calls named in ``hang`` block until ``release`` is set (then go on as usual), like a silent endpoint."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.late_writes: list[str] = []
        self._blocked = 0  # calls that hung and have not returned yet
        self._returned = threading.Condition()

    @contextlib.contextmanager
    def _maybe_hang(self, name: str) -> Iterator[None]:
        if name not in self.hang:
            yield
            return
        with self._returned:
            self._blocked += 1
        try:
            assert self.release.wait(60), "hang guard"
            yield
        finally:
            with self._returned:
                self._blocked -= 1
                self._returned.notify_all()

    def wait_returned(self) -> bool:
        """Wait until every call that hung has returned (its late effect, if any, has landed): False after 60 s."""
        with self._returned:
            return self._returned.wait_for(lambda: self._blocked == 0, 60)

    def get(self, conversation_id: str) -> Head | None:
        with self._maybe_hang("get"):
            return super().get(conversation_id)

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        late = "compare_and_set" in self.hang
        with self._maybe_hang("compare_and_set"):
            try:
                version = super().compare_and_set(*args, **kwargs)
            except Conflict:
                if late:
                    self.late_writes.append("refused")
                raise
            if late:
                self.late_writes.append("landed")
            return version

    def acquire_lease(self, *args: Any, **kwargs: Any) -> bool:
        with self._maybe_hang("acquire_lease"):
            return super().acquire_lease(*args, **kwargs)


def test_a_hanging_head_store_fails_the_turn_naming_the_call(pool: Pool) -> None:
    heads, ran = Hanging(), Ran()
    tool = SyncCodeTool(pool, heads=heads, tools={"mark": ran}, storage_timeout_s=0.2)
    try:
        tool.run_code("c", APPEND.format(tag="t1"))
        heads.hang = {"acquire_lease"}
        with pytest.raises(StorageUnavailable, match="taking the lease of conversation 'c' timed out"):
            tool.run_code("c", APPEND.format(tag="never"))
        heads.hang = {"get"}
        with pytest.raises(StorageUnavailable, match="reading the head of conversation 'c' timed out"):
            tool.run_code("c", APPEND.format(tag="never"))
        assert ran.tags == ["t1"]
        # The head write hangs: the turn cannot say whether it was saved, and says how to find out.
        heads.hang = {"compare_and_set"}
        with pytest.raises(TurnOutcomeUnknown, match="storage_timeout_s"):
            tool.run_code("c", APPEND.format(tag="t2"), turn_id="slow-write")
        heads.release.set()  # the endpoint answers at last
        # Every hung call lands now, the timed-out lease take of the first turn too: wait for all of them, so that
        # the late write below has landed (a late lease take no longer takes a later turn's lease: see
        # test_a_late_lease_take_of_a_timed_out_turn_does_not_fail_the_next_turn).
        assert heads.wait_returned(), "hang guard: a hung call never returned"
        heads.hang = set()
        # The failed turn gave its lease back first, so its late write is refused and the outcome is settled: the
        # retry runs the turn (its first run's host calls happened, but nothing of it was saved), once.
        assert heads.late_writes == ["refused"]
        assert tool.run_code("c", APPEND.format(tag="t2"), turn_id="slow-write") == "['t1', 't2']"
        assert tool.run_code("c", APPEND.format(tag="t2"), turn_id="slow-write") == "['t1', 't2']"
        assert tool.run_code("c", "entries") == "['t1', 't2']"
        assert ran.tags == ["t1", "t2", "t2"]
    finally:
        heads.release.set()
        tool.close()


def test_an_unknown_outcome_says_what_a_retry_guarantees_and_never_an_empty_cause(pool: Pool) -> None:
    """The retry keeps the state's promise (the turn once), not the host functions' (they run again when the first
    run was not saved); a cause without text (a bare TimeoutError) is named by its type, not shown as "()"."""
    heads, ran = LandsThenFails(), Ran()
    tool = SyncCodeTool(pool, heads=heads, tools={"mark": ran}, storage_timeout_s=0.3)
    try:
        tool.run_code("c", APPEND.format(tag="t1"), turn_id="call-1")
        heads.failure, heads.unreadable, heads.read_error = TimeoutError(), True, TimeoutError()
        with pytest.raises(TurnOutcomeUnknown) as info:
            tool.run_code("c", APPEND.format(tag="t2"), turn_id="call-2")
        message = str(info.value)
        assert "()" not in message and message.count("(TimeoutError)") == 2, message  # the write's, the read's
        assert "run twice" not in message and "will not run" not in message
        assert "its code runs again (and so do the host functions it calls)" in message
        assert "state holds the turn once" in message
        assert "host functions" in (TurnOutcomeUnknown.__doc__ or "") and "run twice" not in str(
            TurnOutcomeUnknown.__doc__
        )
    finally:
        tool.close()


class OwnDeadline(MemoryHeads):
    """A head store that gives up by itself, at its own deadline (an S3 client's), shorter than the tool's."""

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        raise StorageTimeout(
            "storage get of 'heads/c.json' on s3://bucket did not finish within 7 s; retry later",
            operation="get",
            timeout_s=7.0,
        )


def test_a_timeout_names_the_deadline_that_passed(pool: Pool) -> None:
    """A lease take the store gave up after 7 s used to say "timed out after 10 s (storage_timeout_s)"."""
    tool = SyncCodeTool(pool, heads=OwnDeadline(), storage_timeout_s=10)
    with pytest.raises(StorageTimeout, match="taking the lease of conversation 'c' timed out") as info:
        tool.run_code("c", "1")
    assert "within 7 s" in str(info.value) and "10 s" not in str(info.value) and info.value.timeout_s == 7.0
    heads = Hanging()
    tool = SyncCodeTool(pool, heads=heads, storage_timeout_s=0.2)
    try:
        heads.hang = {"get"}
        with pytest.raises(StorageTimeout, match=r"did not answer within 0\.2 s \(storage_timeout_s\)") as info:
            tool.head("c")
        assert info.value.timeout_s == 0.2
    finally:
        heads.release.set()
        tool.close()


class StopsAtItsWrite(Hanging):
    """With ``stopping`` set, the store stops answering at the next head write: that write and every read after."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stopping = False

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        if self.stopping:
            self.hang = {"compare_and_set", "get"}
        return super().compare_and_set(*args, **kwargs)


def test_a_turn_whose_head_store_stops_answering_fails_within_the_documented_bound(pool: Pool) -> None:
    """Counted in deadlines, not timed: the write, its read-back, the wait for the lease's release."""
    timeout_s = 0.2
    heads = StopsAtItsWrite()
    tool = SyncCodeTool(pool, heads=heads, storage_timeout_s=timeout_s)
    leases = tool.inner._leases
    expired: list[float] = []
    bounded = leases.bounded

    async def counted(call: Any, limit: float | None = None) -> Any:
        try:
            return await bounded(call, limit)
        except StorageTimeout as exc:
            expired.append(exc.timeout_s)
            raise

    leases.bounded = counted  # type: ignore[method-assign]
    try:
        tool.run_code("c", "x = 1")
        heads.stopping = True  # the store stops answering as the turn writes its head
        with pytest.raises(TurnOutcomeUnknown):
            tool.run_code("c", "x = 2")
        assert len(expired) == 2  # the write, then the read-back (its retries share one deadline)
        waited_at_most = sum(expired) + leases.release_wait_s
        assert waited_at_most <= 2 * timeout_s + min(2.0, timeout_s)
        documented = "2 x ``storage_timeout_s`` + 2 s"
        assert documented in " ".join((CodeTool.__doc__ or "").split())
        assert "2 × `storage_timeout_s` + 2 s" in (Path(__file__).parents[1] / "docs" / "tool.md").read_text()
    finally:
        heads.release.set()
        tool.close()


class ReadBackFailsThenHangs(Hanging):
    """With ``failing`` set, the next head write fails without landing; the first read after it fails at once, and
    every read after that hangs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failing = False
        self._fail_reads = 0

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        if self.failing:
            self.failing, self._fail_reads = False, 1
            raise StorageUnavailable("connection reset by peer")
        return super().compare_and_set(*args, **kwargs)

    def get(self, conversation_id: str) -> Head | None:
        if self._fail_reads:
            self._fail_reads, self.hang = 0, {"get"}
            raise StorageUnavailable("connection refused")
        return super().get(conversation_id)


def test_a_read_back_retried_after_a_failure_keeps_to_one_storage_deadline(pool: Pool) -> None:
    """The read-back's attempts share one ``storage_timeout_s``: one made after a failed attempt and a pause gets
    what is left of it, not a whole one (else the documented bound of a failed turn would not hold)."""
    timeout_s = 1.0  # room for the failed read and the pause before the second one on a busy machine
    heads = ReadBackFailsThenHangs()
    tool = SyncCodeTool(pool, heads=heads, storage_timeout_s=timeout_s)
    leases = tool.inner._leases
    expired: list[float] = []
    bounded = leases.bounded

    async def counted(call: Any, limit: float | None = None) -> Any:
        try:
            return await bounded(call, limit)
        except StorageTimeout as exc:
            expired.append(exc.timeout_s)
            raise

    leases.bounded = counted  # type: ignore[method-assign]
    try:
        tool.run_code("c", "x = 1")
        heads.failing = True
        with pytest.raises(TurnOutcomeUnknown, match="reading the head back failed too"):
            tool.run_code("c", "x = 2")
        assert len(expired) == 1 and expired[0] < timeout_s, expired  # the second read: what was left
    finally:
        heads.release.set()
        tool.close()


def test_a_late_lease_take_of_a_timed_out_turn_does_not_fail_the_next_turn(pool: Pool) -> None:
    """The timed-out take lands while the tool's next turn runs: it must not take that turn's lease over (same
    holder), or the turn's save is refused with Conflict although no other turn ran."""
    heads = Hanging()

    def land_late() -> None:
        heads.release.set()
        assert heads.wait_returned(), "hang guard: the hung lease take never returned"

    tool = SyncCodeTool(pool, heads=heads, tools={"land_late": land_late}, storage_timeout_s=0.2)
    try:
        tool.run_code("c", "x = 1")
        heads.hang = {"acquire_lease"}
        with pytest.raises(StorageUnavailable, match="taking the lease"):
            tool.run_code("c", "x += 100")
        heads.hang = set()  # the next turn's calls answer; the first turn's take is still hung
        assert tool.run_code("c", "land_late()\nx += 1\nx") == "2"
        assert tool.run_code("c", "x") == "2"
    finally:
        heads.release.set()
        tool.close()


# ----------------------------------------------------------------- leases


class FailingReleases(MemoryHeads):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failing = False

    def release_lease(self, conversation_id: str, owner: str) -> None:
        if self.failing:
            raise StorageUnavailable("connection refused")
        super().release_lease(conversation_id, owner)


def test_a_storage_fault_does_not_lock_the_conversation(pool: Pool, clock: Clock, monkeypatch) -> None:
    heads = FailingReleases(clock=clock)
    tool = SyncCodeTool(pool, heads=heads, lease_wait_s=0.2, lease_ttl_s=60, storage_timeout_s=0.5)
    tool.run_code("c", "v = 1")

    def broken(*args: object, **kwargs: object) -> None:
        raise StorageUnavailable("connection refused")

    # The store fails mid-turn, and so does giving the lease back.
    heads.failing = True
    monkeypatch.setattr(pool.store, "put", broken)
    with pytest.raises(StorageError, match="connection refused"):
        tool.run_code("c", "v = 2")
    monkeypatch.undo()
    record = heads.record("c")
    assert record is not None and record.lease_held(clock.now)  # the lease is still there
    # This tool's next turn takes its own lease over at once, instead of waiting for it to expire.
    assert tool.run_code("c", "v") == "1"
    heads.failing = False
    tool.close()


class RenewalWatch(MemoryHeads):
    """Counts lease renewals, and notes each one that came after the lease had expired (on the store's clock)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.renewals = 0
        self.late: list[float] = []

    def renew_lease(self, conversation_id: str, owner: str, ttl_s: float, *, now: float | None = None) -> bool:
        at = self.clock() if now is None else now
        record = self.record(conversation_id)
        if record is not None and record.lease_owner == owner and record.lease_expires_at <= at:
            self.late.append(at - record.lease_expires_at)
        renewed = super().renew_lease(conversation_id, owner, ttl_s, now=now)
        self.renewals += 1
        return renewed


def test_a_turn_longer_than_its_lease_ttl_keeps_its_lease(pool: Pool) -> None:
    """Renewals come every third of the ttl: a turn that runs for several ttls never lets its lease lapse, and no
    other server takes the conversation meanwhile. Renewing more slowly than the ttl fails this test."""
    ttl_s = 3.0
    heads = RenewalWatch()

    async def until_renewed(times: int) -> bool:
        deadline = time.monotonic() + 60  # a hang guard
        while heads.renewals < times and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Another server tries to take the conversation: True would mean the lease had lapsed.
        return heads.acquire_lease("c", "server-2/turn", ttl_s)

    tool = SyncCodeTool(pool, heads=heads, tools={"until_renewed": until_renewed}, lease_ttl_s=ttl_s)
    try:
        code = "taken = [await until_renewed(1), await until_renewed(2)]\ntaken"
        assert tool.run_code("c", code) == "[False, False]"
        assert heads.renewals >= 2 and heads.late == []
        head = heads.get("c")
        assert head is not None and head.lease_owner is None  # the turn saved, and gave the lease back
    finally:
        tool.close()


def test_a_dead_holders_lease_is_stale_then_free_after_one_ttl(pool: Pool, clock: Clock) -> None:
    heads = MemoryHeads(clock=clock)
    assert heads.acquire_lease("c", "server-1/turn-a", 60)  # server-1 is killed mid-turn
    other = SyncCodeTool(pool, heads=heads, lease_wait_s=0.1, holder_id="server-2")
    with pytest.raises(ConversationBusy, match="is running") as busy:
        other.run_code("c", "1")
    assert busy.value.stale is False and busy.value.holder == "server-1/turn-a"
    clock.now += 30  # no renewal for half the ttl: its holder is gone
    with pytest.raises(ConversationBusy, match="stale lease") as busy:
        other.run_code("c", "1")
    assert busy.value.stale is True and "in 30 s" in str(busy)
    clock.now += 30.1
    assert other.run_code("c", "2") == "2"  # free after one ttl


def test_a_restarted_holder_takes_its_lease_back_at_once(pool: Pool) -> None:
    heads = MemoryHeads()
    assert heads.acquire_lease("c", "server-1/turn-a", 60)  # left by server-1 before it restarted
    with pytest.raises(ConversationBusy):
        SyncCodeTool(pool, heads=heads, lease_wait_s=0.1, holder_id="server-2").run_code("c", "1")
    assert SyncCodeTool(pool, heads=heads, lease_wait_s=0.1, holder_id="server-1").run_code("c", "2") == "2"


def test_a_lease_expiring_in_the_year_3000_is_cut_back_to_one_ttl(pool: Pool, clock: Clock) -> None:
    heads = MemoryHeads(clock=clock)
    assert heads.acquire_lease("c", "ghost/turn", 10, now=32_503_680_000.0 - 10)
    tool = SyncCodeTool(pool, heads=heads, lease_wait_s=0.1, lease_ttl_s=60)
    with pytest.raises(ConversationBusy, match="stale"):
        tool.run_code("c", "1")
    clock.now += 60.1
    assert tool.run_code("c", "2") == "2"


# ---------------------------------------------------------------- history


def test_a_missing_checkpoint_falls_back_to_the_newest_that_loads(pool: Pool) -> None:
    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads)
    ids = []
    for i in range(4):
        tool.run_code("c", f"n = {i}")
        ids.append(tool.head("c").checkpoint_id)  # type: ignore[union-attr]
    for gone in ids[-2:]:  # the last two checkpoints vanish
        pool.store.delete(pool._inner.keyring.parse_id(gone).storage_key)
    answer = tool.run_code("c", "n")
    assert answer.startswith(
        "1\n[note] the state of the last 2 turns of this conversation is gone (checkpoint deleted)"
    )
    head = tool.head("c")
    assert head is not None and head.history[:4] == tuple(reversed(ids))  # nothing was dropped from the history
    assert tool.run_code("c", "n") == "1"


def test_a_head_without_a_version_is_not_silently_restarted(pool: Pool) -> None:
    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads)
    tool.run_code("c", "n = 1")
    head = heads.get("c")
    assert head is not None
    heads._update("c", lambda record: Head(checkpoint_id=head.checkpoint_id, version=""))
    with pytest.raises(StorageError, match="no version"):
        tool.run_code("c", "n")
    assert heads.record("c").checkpoint_id == head.checkpoint_id  # type: ignore[union-attr]


class Counting(MemoryHeads):
    """Counts the store's reads and transactions (its get and acquire_lease are the store's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = self.updates = 0

    def _read(self, conversation_id: str) -> Head | None:
        self.reads += 1
        return super()._read(conversation_id)

    def _update(self, conversation_id: str, transition: Any) -> Head | None:
        self.updates += 1
        return super()._update(conversation_id, transition)


def test_a_turn_reads_its_head_with_the_lease(pool: Pool) -> None:
    heads = Counting()
    tool = SyncCodeTool(pool, heads=heads)
    try:
        assert tool.run_code("c", "x = 1") == "(no output)"
        heads.reads = heads.updates = 0
        assert tool.run_code("c", "x += 1\nx") == "2"
        # The head is read in the lease's transaction, the lease given back with the head write: two in all.
        assert (heads.reads, heads.updates) == (0, 2)
        assert tool.run_code("c", "x += 1\nx", turn_id="t") == "3"
        assert tool.run_code("c", "x += 1\nx", turn_id="t") == "3"  # the head read with the lease replays it
    finally:
        tool.close()


def test_the_turns_page_says_what_every_error_of_a_turn_or_head_move_leaves_behind() -> None:
    """Each error the turn methods document is a row of the outcome tables (the state, the host functions)."""
    page = (Path(__file__).parents[1] / "docs" / "tool.md").read_text()
    tables = page.split("## Turns: retries, leases and failures", 1)[1].split("**Leases.**", 1)[0]
    for method in (CodeTool.run_code, CodeTool.resume, CodeTool.rewind, CodeTool.fork, CodeTool.put_file):
        raises = (inspect.getdoc(method) or "").split("Raises:", 1)[1]
        for name in re.findall(r"^    (\w+):", raises, re.MULTILINE):
            rows = [line for line in tables.splitlines() if line.startswith("| ") and f"`{name}`" in line]
            assert rows, f"{method.__name__} raises {name}, which the outcome tables of docs/tool.md do not list"
