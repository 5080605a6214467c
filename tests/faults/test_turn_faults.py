"""A turn whose head write meets an S3 fault ends committed exactly once when it is retried with the same turn_id.

The fault proxy switches to a fault between the head write's read and its conditional write, and stays faulted for
the read-back, so the tool cannot tell whether the turn was saved: `TurnOutcomeUnknown`. Once the fault clears, the
caller retries with the same ``turn_id``, as documented: a write that landed (its reply cut off) is answered from
the head without running the code again; one that did not (503s, a hang) runs it again; either way the namespace
holds the turn once. Bounds are on calls and state, never on time; the 60 s guard only stops a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import Pool, SyncCodeTool, TurnOutcomeUnknown
from snapcell.heads import Head, S3Heads
from snapcell.storage import S3Store
from tests.faults.proxy import FaultProxy
from tests.faults.test_s3_faults import guarded

pytestmark = pytest.mark.integration

KEY = "turn-faults-signing-key-0123456789"
CODE = "try:\n    log\nexcept NameError:\n    log = []\nlog.append(mark({turn}))\nlog"


class Marks:
    """The host function the turns call: which turns ran, how often."""

    def __init__(self) -> None:
        self.turns: list[int] = []

    def __call__(self, turn: int) -> int:
        self.turns.append(turn)
        return turn


class FaultAtHeadWrite(S3Heads):
    """Switch the proxy to ``fault`` once the next head write has read the head, just before it writes."""

    def __init__(self, store: S3Store, proxy: FaultProxy) -> None:
        super().__init__(store)
        self.proxy = proxy
        self.fault: tuple[str, dict[str, Any]] | None = None
        self.write_done = threading.Event()
        self._writing = threading.local()
        self._after_read = self._arm

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        self._writing.on = True
        try:
            return super().compare_and_set(*args, **kwargs)
        finally:
            self._writing.on = False
            self.write_done.set()

    def _arm(self, conversation_id: str, head: Head | None) -> None:
        if getattr(self._writing, "on", False) and self.fault is not None:
            mode, options = self.fault
            self.fault = None
            self.write_done.clear()
            self.proxy.set_mode(mode, **options)


@pytest.fixture
def tool(faulty_store: S3Store, proxy: FaultProxy) -> Iterator[tuple[SyncCodeTool, FaultAtHeadWrite, Marks]]:
    marks = Marks()
    heads = FaultAtHeadWrite(faulty_store, proxy)
    with Pool(faulty_store, isolation="inline", signing_keys=[KEY]) as pool:
        tool = SyncCodeTool(pool, heads=heads, tools={"mark": marks}, storage_timeout_s=1.5)
        yield tool, heads, marks
        proxy.set_mode("pass")
        tool.close()


@pytest.mark.parametrize(
    ("mode", "options", "may_land"),
    [
        ("cut", {"cut_after_bytes": 10}, True),  # S3 applied the write; every answer is cut off
        ("slowdown", {}, False),  # 503 SlowDown: nothing reaches S3
        ("hang", {}, False),  # S3 never answers; the write times out
    ],
)
def test_a_head_write_fault_then_a_retry_commits_the_turn_exactly_once(
    tool: tuple[SyncCodeTool, FaultAtHeadWrite, Marks],
    faulty_store: S3Store,
    proxy: FaultProxy,
    mode: str,
    options: dict[str, Any],
    may_land: bool,
) -> None:
    code_tool, heads, marks = tool
    assert code_tool.run_code("conv", CODE.format(turn=1), turn_id="t1") == "[1]"
    heads.fault = (mode, options)
    with pytest.raises(TurnOutcomeUnknown) as info:
        guarded(lambda: code_tool.run_code("conv", CODE.format(turn=2), turn_id="t2"))
    assert info.value.turn_id == "t2" and "turn_id='t2'" in str(info.value)
    assert heads.fault is None and marks.turns == [1, 2]  # the fault hit this turn's head write
    # A write stuck in its thread could still land after the fault clears; let it finish first, so the case is
    # the one named (a hang that never reached S3), not a race.
    assert heads.write_done.wait(60)
    proxy.set_mode("pass")
    before = code_tool.head("conv")
    assert before is not None
    saved = before.turn("t2") is not None
    if not may_land:
        assert not saved  # a 503 or a hang never reaches S3
    # A cut answer usually means S3 applied the write and only the reply was lost, but after the kill tests (a
    # loaded moto) the write sometimes did not land (cause not pinned down): read the head, then hold the retry to
    # what it shows; either way the turn must end committed once.

    answer = code_tool.run_code("conv", CODE.format(turn=2), turn_id="t2")

    assert answer == "[1, 2]"
    assert marks.turns == ([1, 2] if saved else [1, 2, 2])  # a saved turn was not run again
    head = code_tool.head("conv")
    assert head is not None and head.checkpoint_id is not None
    assert head.turn("t2") is not None and head.turn("t1") is not None and len(head.history) == 1
    with Pool(faulty_store, isolation="inline", signing_keys=[KEY]) as pool:
        for checkpoint_id, log in [(head.checkpoint_id, [1, 2]), (head.history[0], [1])]:
            with pool.checkout() as session:
                session.load_session(checkpoint_id)
                assert session.feed_run("log") == log
    assert code_tool.run_code("conv", CODE.format(turn=2), turn_id="t2") == "[1, 2]"  # and again: still once
    assert marks.turns == ([1, 2] if saved else [1, 2, 2])


@pytest.mark.parametrize("move", ["rewind", "fork"])
def test_a_head_move_whose_answer_is_cut_once_moves_the_head_once_and_says_so(
    tool: tuple[SyncCodeTool, FaultAtHeadWrite, Marks], proxy: FaultProxy, move: str
) -> None:
    """S3 applies the write and the answer is cut; the client retries, and the retry is refused (412) because the
    first attempt landed. That is the move's success: it used to be reported as `Conflict`, "nothing was
    overwritten", and a caller that retried the rewind rewound twice."""
    code_tool, heads, _ = tool
    for turn in (1, 2, 3):
        code_tool.run_code("conv", CODE.format(turn=turn), turn_id=f"t{turn}")
    before = code_tool.head("conv")
    assert before is not None
    heads.fault = ("cut", {"cut_after_bytes": 10, "times": 1})  # the write's first attempt only
    if move == "rewind":
        result = guarded(lambda: code_tool.rewind("conv", turn_id="undo"))
        assert result == before.history[0]
        head = code_tool.head("conv")
        assert head is not None and head.checkpoint_id == before.history[0] and head.history == before.history[1:]
        assert code_tool.run_code("conv", "log") == "[1, 2]"  # one turn back, not two
    else:
        result = guarded(lambda: code_tool.fork("conv", "conv-fork", turn_id="branch"))
        forked = code_tool.head("conv-fork")
        assert result == before.checkpoint_id and forked is not None and forked.checkpoint_id == result
        assert code_tool.run_code("conv-fork", "log") == "[1, 2, 3]"
    assert heads.fault is None  # the fault hit this move's head write
