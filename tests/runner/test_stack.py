"""A script at its recursion limit leaves the garbage collector's finalizers room (`snapcell.runner._stack`)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from snapcell import Limits
from snapcell.runner._stack import _on_collection

# Host objects in cycles whose finalizer needs 150 frames, collected while an inline script recurses to its limit.
# Without room for them, the collections at the script's deepest frames fail 100 of the 150 finalizers; and one
# that starts while CPython creates the script's RecursionError aborts the host process when a finalizer needs
# more than 50 frames ("Cannot recover from stack overflow"; seen with 60).
HOST = textwrap.dedent(
    """
    import gc, sys
    from snapcell import Limits, Pool

    unraisable, finished = [], []
    sys.unraisablehook = lambda u: unraisable.append(type(u.exc_value).__name__)

    def deep(n):
        return 0 if n == 0 else deep(n - 1)

    class Finalized:
        def __del__(self):
            deep(150)
            finished.append(1)

    SCRIPT = "def f():\\n    try:\\n        f()\\n    except BaseException:\\n        f()\\nf()\\nafter = True"
    with Pool("memory://", isolation="inline") as pool:
        with pool.checkout() as session:
            for trial in range(3):
                gc.collect()
                for i in range(50):
                    garbage = Finalized()
                    garbage.cycle = garbage
                del garbage
                result = session.run(SCRIPT, limits=Limits(wall_time_s=0.3))
                assert type(result.error).__name__ == "TimeLimitExceeded", result.error
    print(len(finished), unraisable)
    """
)


def test_finalizers_collected_at_the_scripts_recursion_limit_get_room_to_run():
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split(None, 1) == ["150", "[]\n"]


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
