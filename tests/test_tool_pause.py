"""The run_code tool's pausing host functions: the paused answer, resume as a turn (once per turn ID), fork, rewind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import Pool, ResumeDiverged, SessionError, SyncCodeTool
from snapcell.heads import MemoryHeads

SCRIPT = """
order = lookup("o-9")
print("asking about", order["id"])
verdict = approve(order["total"])
print("verdict", verdict)
status = "refunded" if verdict else "declined"
status
"""


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="inline") as pool:
        yield pool


@pytest.fixture
def tool(pool: Pool) -> Iterator[tuple[SyncCodeTool, list[Any]]]:
    calls: list[Any] = []

    def lookup(order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        return {"id": order_id, "total": 30}

    def approve(amount: int) -> bool:
        """Ask a person to approve a refund of ``amount``."""
        raise AssertionError("a pausing host function is never called")

    code_tool = SyncCodeTool(
        pool, heads=MemoryHeads(), tools={"lookup": lookup, "approve": approve}, pausing={"approve"}
    )
    yield code_tool, calls
    code_tool.close()


def test_the_answer_says_what_the_script_waits_for_and_resume_runs_once_per_turn_id(
    tool: tuple[SyncCodeTool, list[Any]],
) -> None:
    code_tool, calls = tool
    assert "Pausing host functions: approve()" in code_tool.description
    assert "def approve(amount: int) -> bool" in code_tool.description
    paused = code_tool.run_code("c1", SCRIPT, turn_id="t1")
    assert "asking about o-9" in paused and "[paused] the script is waiting at approve(30)" in paused
    assert "the paused state is kept for 7 days" in paused
    with pytest.raises(SessionError, match="paused at approve"):
        code_tool.run_code("c1", "1 + 1")
    done = code_tool.resume("c1", True, turn_id="t2")
    assert done.count("asking about o-9") == 1 and "verdict True" in done and "'refunded'" in done
    assert code_tool.resume("c1", False, turn_id="t2") == done  # the same turn ID: answered, not run again
    assert code_tool.run_code("c1", "status") == "'refunded'"
    assert calls == ["o-9"]
    with pytest.raises(SessionError, match="nothing to resume"):
        code_tool.resume("c1", True)


def test_fork_a_paused_conversation_and_resume_both_with_other_answers(tool: tuple[SyncCodeTool, list[Any]]) -> None:
    code_tool, calls = tool
    code_tool.run_code("c2", "before = 1")
    code_tool.run_code("c2", SCRIPT)
    code_tool.fork("c2", "c2-fork")
    assert "'refunded'" in code_tool.resume("c2", True)
    assert "'declined'" in code_tool.resume("c2-fork", False)
    assert code_tool.run_code("c2", "status") == "'refunded'"
    assert code_tool.run_code("c2-fork", "status") == "'declined'"
    assert calls == ["o-9"]
    # Rewinding the resumed conversation goes back to its paused state, which resumes again.
    code_tool.rewind("c2", 2)
    assert "'declined'" in code_tool.resume("c2", False)


def test_an_error_answer_and_a_diverged_replay_leave_the_head_paused(tool: tuple[SyncCodeTool, list[Any]]) -> None:
    code_tool, _ = tool
    code_tool.run_code("c3", "try:\n    approve(1)\nexcept PermissionError as exc:\n    print('no:', exc)")
    assert "no: not today" in code_tool.resume("c3", error=PermissionError("not today"))

    code_tool.run_code("c4", "import random\nlookup(str(random.Random().random()))\napprove(2)")
    head = code_tool.head("c4")
    with pytest.raises(ResumeDiverged, match="host call 1"):
        code_tool.resume("c4", True)
    assert code_tool.head("c4") == head


def test_cleanup_keeps_a_paused_head_whole(clock: Any) -> None:
    from snapcell.checkpoint import Keyring, blob_keys_of
    from snapcell.ops import cleanup
    from snapcell.storage import MemoryStore

    key = "cleanup-pause-key-0123456789abcdef0123"
    store = MemoryStore(now=clock)
    heads = MemoryHeads(clock=clock, max_history=1)
    keyring = Keyring([key])
    with Pool(store, isolation="inline", clock=clock, signing_keys=[key]) as pool:
        tool = SyncCodeTool(pool, heads=heads, pausing={"approve"})
        try:
            tool.run_code("c", "data = bytes(range(256)) * 20_000")  # large: a blob of its own
            tool.run_code("c", "n = 1")
            tool.run_code("c", "ok = approve(len(data))")
            clock.now += 3 * 86400
            report = cleanup(
                store,
                now=clock.now,
                quota_bytes=0,
                heads=heads,
                key_of=lambda checkpoint_id: keyring.parse_id(checkpoint_id).storage_key,
                blob_refs=blob_keys_of,
                grace_s=0,
                force=True,
            )
            assert report.deleted_keys  # the first turn's checkpoint: no head needs it
            tool.resume("c", "yes")
            assert tool.run_code("c", "ok, len(data), n").startswith("('yes', 5120000, 1)")
        finally:
            tool.close()
