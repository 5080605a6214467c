"""`RunResult.status` and `RunResult.assigned`, in both isolation modes."""

from __future__ import annotations

from collections.abc import Callable

from snapcell import Limits, RunResult


def test_status_follows_how_the_run_ended(run: Callable[..., RunResult]) -> None:
    assert run("x = 1").status == "ok"
    assert run("1 / 0").status == "error"
    assert run("import socket").status == "error"  # refused by the policy
    timed_out = run("while True:\n    pass", limits=Limits(wall_time_s=0.3, grace_s=0.5))
    assert timed_out.status == "timeout"
    assert not timed_out.restarted


def test_assigned_names_what_the_run_bound_before_it_stopped(run: Callable[..., RunResult]) -> None:
    run("same = [1]\nold = 1")
    result = run("import math\nfresh = 2\nold = 'rebound'\nsame = same\ndef f(): pass\nraise ValueError\nlater = 3")
    assert result.status == "error"
    assert sorted(result.assigned) == ["f", "fresh", "math", "old"]
