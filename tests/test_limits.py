"""Limits: wall time keeps the session, output and value caps keep the tail, recursion, host calls, tasks."""

from __future__ import annotations

import time

import pytest

from snapcell import Limits, Policy, Pool
from snapcell.errors import ConfigError, LimitExceeded, ScriptError, TimeLimitExceeded

FAST = Limits(wall_time_s=0.3)


def test_pure_python_loop_is_interrupted_and_session_survives(run):
    result = run("a = 1\nb = [1, 2]\nwhile True:\n    a += 1", limits=FAST)
    assert isinstance(result.error, TimeLimitExceeded) and result.error.timed_out
    assert result.error.limit == "wall_time_s" and result.error.value == 0.3
    assert result.notes == ("stopped after 0.3 s (the wall-time limit); earlier variables are still defined",)
    assert "still defined" in result.error.for_model()
    after = run("(a > 1, b)")
    assert after.error is None and after.value == (True, [1, 2])
    assert after.notes == ()  # a timeout is not a restart


def test_interrupt_inside_earlier_function_and_comprehension(run):
    run("def spin():\n    return [i for i in iter(int, 1)]")
    result = run("x = 5\nspin()", limits=FAST)
    assert isinstance(result.error, TimeLimitExceeded)
    assert run("x").value == 5


def test_next_run_has_its_full_time(run):
    # The second run's sleep ends after the first run's start plus the limit, so a deadline that leaked from the
    # first run (or was counted from its start) stops it; its own deadline leaves it 0.8 s of slack, not 0.1 s.
    second = Limits(wall_time_s=1.0)
    assert isinstance(run("while True:\n    pass", limits=second).error, TimeLimitExceeded)
    result = run("import time\ntime.sleep(0.2)\n'done'", limits=second)
    assert result.error is None and result.value == "done"


def test_many_short_runs_do_not_leak_deadlines(run):
    # Each short run leaves a deadline in the watchdog's heap that is never reached (so the heap is compacted),
    # and none of them may fire on a later run; the last run's own short deadline still fires.
    for _ in range(200):
        assert run("1", limits=Limits(wall_time_s=30.0)).value == 1
    assert isinstance(run("while True:\n    pass", limits=FAST).error, TimeLimitExceeded)


def test_output_cap_keeps_the_tail_and_says_what_was_dropped(run):
    result = run("for i in range(100):\n    print(f'line {i}')", limits=Limits(max_output_bytes=50))
    assert result.stdout.startswith("[... ")
    assert "dropped ...]" in result.stdout  # a short note: the long one would not fit in half of a 50-character cap
    assert result.stdout.endswith("line 99\n")
    assert len(result.stdout) == 50  # the note is inside the cap


def test_stderr_is_capped_too(run):
    result = run(
        "import traceback\nfor i in range(50):\n    try:\n        1 / 0\n    except ZeroDivisionError:\n"
        "        traceback.print_exc()",
        limits=Limits(max_output_bytes=100),
    )
    assert "dropped" in result.stderr and result.stderr.endswith("division by zero\n")


def test_value_repr_is_capped(run):
    result = run("'x' * 10_000 + 'END'", limits=Limits(max_value_repr_bytes=100))
    assert result.value_repr is not None and len(result.value_repr) < 200
    assert "characters cut" in result.value_repr and result.value_repr.endswith("END'")


def test_deep_recursion_is_a_clean_script_error(run):
    result = run("def f(n):\n    return f(n + 1)\nf(0)", limits=Limits(max_recursion_depth=200))
    assert type(result.error) is ScriptError and result.error.exc_type == "RecursionError"
    assert "snapcell" not in result.error.for_model()
    # The host is fine afterwards: normal depth works again.
    assert run("def g(n):\n    return 0 if n == 0 else 1 + g(n - 1)\ng(150)").value == 150


def test_host_call_limit(run):
    lookup = {"ping": lambda: "pong"}
    result = run(
        "n = 0\nfor _ in range(10):\n    ping()\n    n += 1", external_lookup=lookup, limits=Limits(max_host_calls=3)
    )
    assert isinstance(result.error, LimitExceeded) and result.error.limit == "max_host_calls"
    assert result.error.lineno == 3
    assert "ping()" in result.error.for_model()
    assert run("n").value == 3
    ok = run("[ping() for _ in range(50)][-1]", external_lookup=lookup, limits=Limits(max_host_calls=None))
    assert ok.error is None and ok.value == "pong"


@pytest.mark.parametrize("cell", ["sync", "async"])
def test_tasks_do_not_outlive_their_run(run, cell):
    run(
        "import asyncio\nticks = []\nasync def forever():\n    while True:\n        ticks.append(1)\n"
        "        await asyncio.sleep(0.01)"
    )
    code = "t = asyncio.ensure_future(forever())" + ("\nawait asyncio.sleep(0.05)" if cell == "async" else "")
    assert run(code).error is None
    seen = run("len(ticks)").value
    time.sleep(0.1)
    assert run("await asyncio.sleep(0.05)\n(len(ticks), t.done())").value == (seen, True)


def test_task_that_swallows_cancellation_is_still_stopped(run):
    code = (
        "import asyncio\nticks = []\nasync def stubborn():\n    while True:\n        try:\n"
        "            ticks.append(1)\n            await asyncio.sleep(0.01)\n        except BaseException:\n"
        "            pass\nt = asyncio.ensure_future(stubborn())\nawait asyncio.sleep(0.03)"
    )
    assert run(code).error is None
    seen = run("len(ticks)").value
    assert run("await asyncio.sleep(0.05)\n(len(ticks), t.done())").value == (seen, True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"wall_time_s": 0},
        {"wall_time_s": float("inf")},
        {"max_output_bytes": 0},
        {"max_recursion_depth": 10},
        {"max_host_calls": -1},
        {"max_host_calls": True},
    ],
)
def test_limits_are_validated(kwargs):
    with pytest.raises(ConfigError):
        Limits(**kwargs)


def test_inline_c_level_work_runs_to_completion_and_the_interrupt_lands_right_after():
    """What `Limits` documents for inline mode: C-level work is not cut short, and the script stops after it."""
    with Pool("memory://", isolation="inline", policy=Policy(restricted=False)) as pool, pool.checkout() as session:
        # One C-level call (list.extend over map) that sleeps 3 x 0.2 s with the real time.sleep, well past the
        # 0.1 s limit, with no bytecode in between where an interrupt could land.
        code = "import time\nslept = []\nslept.extend(map(time.sleep, [0.2, 0.2, 0.2]))\nafter = 1"
        result = session.run(code, limits=Limits(wall_time_s=0.1, grace_s=0))
        assert isinstance(result.error, TimeLimitExceeded)
        assert session.run("len(slept), 'after' in dir()").value == (3, False)
