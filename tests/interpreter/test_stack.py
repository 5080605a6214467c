"""A script at its recursion limit leaves the garbage collector's finalizers room (`snapcell.interpreter._stack`)."""

from __future__ import annotations

import gc
import sys

from snapcell import Limits, Pool
from snapcell.interpreter._stack import _on_collection


class Finalized:
    """Made in cycles; its finalizer needs 150 frames of stack."""

    finished = 0

    def __del__(self) -> None:
        _deep(150)
        Finalized.finished += 1


def _deep(n: int) -> int:
    return 0 if n == 0 else _deep(n - 1)


def test_a_collection_near_the_scripts_recursion_limit_gets_room_for_finalizers():
    # The script recurses to 270 of its 300 frames, then calls a host function (inline: on the script's stack) that
    # drops host objects in cycles and collects them: their finalizers need 150 frames. Without the room, all 50
    # failed with RecursionError. (A collection that starts while CPython creates the script's RecursionError, with
    # a finalizer needing more than 50 frames, aborted the host process: "Cannot recover from stack overflow".)
    def collect() -> int:
        garbage = [Finalized() for _ in range(50)]
        for item in garbage:
            item.cycle = item  # type: ignore[attr-defined]
        del garbage, item
        gc.collect()
        return Finalized.finished

    code = "def f(n):\n    return collect() if n == 0 else f(n - 1)\nf(270)"
    Finalized.finished = 0
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        result = session.run(code, limits=Limits(max_recursion_depth=300), external_lookup={"collect": collect})
    assert result.error is None, result.error
    assert result.value == 50


def test_the_limit_and_the_collector_are_restored_after_a_run(run):
    before = sys.getrecursionlimit()
    result = run("def f(n):\n    return f(n + 1)\nf(0)", limits=Limits(max_recursion_depth=200))
    assert result.error is not None and result.error.exc_type == "RecursionError"
    assert sys.getrecursionlimit() == before
    assert _on_collection not in gc.callbacks


def test_collections_during_the_script_do_not_extend_its_recursion(run):
    # Each frame allocates, so collections start at every depth, the deepest included: the room they get is
    # theirs only, and the script still stops within its limit.
    code = (
        "depth = 0\ndef g(n):\n    global depth\n    depth = n\n    [[] for _ in range(30)]\n    return g(n + 1)\ng(0)"
    )
    result = run(code, limits=Limits(max_recursion_depth=300))
    assert result.error is not None and result.error.exc_type == "RecursionError"
    assert 250 < run("depth").value < 300
