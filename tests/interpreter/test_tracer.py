"""The wall-time limit holds while a trace or profile function is installed (coverage, a debugger, a profiler).

Each case runs in a child interpreter with a generous hang guard, because the failure this guards against is a
host that never comes back.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import sys
from snapcell import Limits, Pool, Policy, TimeLimitExceeded

events = []
def tracer(frame, event, arg):
    events.append(event)
    return tracer

def profiler(frame, event, arg):
    events.append(event)

kind, restricted = sys.argv[1], sys.argv[2] == "restricted"
with Pool("memory://", isolation="inline", policy=Policy(restricted=restricted)) as pool, pool.checkout() as session:
    session.run("a = 1")
    if kind == "settrace":
        sys.settrace(tracer)
    elif kind == "setprofile":
        sys.setprofile(profiler)
    else:  # sys.monitoring (3.12+), what coverage uses there
        monitoring = sys.monitoring
        monitoring.use_tool_id(monitoring.DEBUGGER_ID, "test")
        on_line = lambda code, line: events.append(line)
        monitoring.register_callback(monitoring.DEBUGGER_ID, monitoring.events.LINE, on_line)
        monitoring.set_events(monitoring.DEBUGGER_ID, monitoring.events.LINE)
    first = session.run("a = 2\\nwhile True:\\n    pass", limits=Limits(wall_time_s=0.3))
    second = session.run("a += 1\\na")
    still_installed = {"settrace": sys.gettrace, "setprofile": sys.getprofile}.get(kind, lambda: True)() is not None
    sys.settrace(None)
    sys.setprofile(None)
    if kind == "monitoring":
        sys.monitoring.set_events(sys.monitoring.DEBUGGER_ID, 0)
assert isinstance(first.error, TimeLimitExceeded), first.error
assert second.error is None and second.value == 3, second
assert events, "the hook never ran"
print("ok", still_installed)
"""


MONITORING = pytest.param(
    "monitoring",
    marks=pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in Python 3.12"),
)


@pytest.mark.parametrize("kind", ["settrace", "setprofile", MONITORING])
@pytest.mark.parametrize("policy", ["restricted", "unrestricted"])
def test_time_limit_fires_under_a_tracer(kind, policy):
    child = subprocess.run(
        [sys.executable, "-c", CHILD, kind, policy], capture_output=True, text=True, timeout=60, check=False
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["ok", "True"]  # and the hook is still installed
