"""A pausable run's clocks and random sources: recorded on the first run, the same on a run with that record."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from snapcell.interpreter import LocalBridge, Runner
from snapcell.limits import Limits
from snapcell.policy import Policy

CELL = """
import random, secrets, time, uuid
values = [random.random(), secrets.token_hex(4), str(uuid.uuid4()), time.time(), time.time_ns()]
values
"""


def _run(code: str, inputs: dict[str, Any] | None, policy: Policy | None = None) -> Any:
    runner = Runner(policy=policy or Policy(), limits=Limits(wall_time_s=None))
    return asyncio.run(runner.run(code, bridge=LocalBridge({}, max_calls=None), host_names=(), inputs=inputs))


def test_a_run_with_the_record_reads_what_the_first_run_read() -> None:
    first = _run(CELL, {})
    assert first.error is None and first.inputs is not None
    assert first.inputs["seed"] > 0 and len(first.inputs["urandom"]) >= 2  # secrets, then uuid4 (and imports)
    again = _run(CELL, first.inputs)
    assert again.value == first.value
    assert _run(CELL, None).value != first.value  # a run that cannot pause reads the live sources
    # Past the record, the sources are live again (and recorded).
    longer = _run(CELL + "\nvalues + [secrets.token_hex(4)]", first.inputs)
    assert longer.value[:5] == first.value and len(longer.inputs["urandom"]) == len(first.inputs["urandom"]) + 1


def test_the_host_processes_random_state_is_put_back_after_the_run() -> None:
    random.seed(7)
    expected = [random.random() for _ in range(2)]
    random.seed(7)
    _run("import random\nrandom.random()", {})
    assert [random.random() for _ in range(2)] == expected


def test_numpy_imported_before_the_cell_is_seeded_too() -> None:
    pytest.importorskip("numpy")
    import numpy  # noqa: F401  (imported before the cell, as an earlier cell would)

    policy = Policy().with_modules(["numpy"])
    code = "import numpy as np\n[float(v) for v in np.random.rand(3)]"
    first = _run(code, {}, policy)
    assert first.error is None
    assert _run(code, first.inputs, policy).value == first.value


def test_the_urandom_record_is_bounded() -> None:
    big = "import secrets\n[secrets.token_bytes(40_000) for _ in range(3)]"
    first = _run(big, {})
    # The second one would take the record past its bound: it and the third are live.
    assert [len(b) for b in first.inputs["urandom"]].count(40_000) == 1
    again = _run(big, first.inputs).value
    assert again[0] == first.value[0] and again[1:] != first.value[1:]


CLOCKS = """
import datetime, time
from datetime import date, datetime as DT, timezone
now = datetime.datetime.now
values = [
    str(now()), str(DT.now(timezone.utc)), str(DT.today()), str(date.today()), str(getattr(DT, "now")()),
    time.monotonic(), time.monotonic_ns(), time.perf_counter(), time.perf_counter_ns(),
]
values
"""


def test_datetime_and_the_monotonic_clocks_are_replayed() -> None:
    first = _run(CLOCKS, {})
    assert first.error is None, first.error
    again = _run("import time\ntime.sleep(0.002)\n" + CLOCKS, first.inputs)
    assert again.value == first.value
    assert _run(CLOCKS, None).value != first.value  # live outside a pausable run


def test_a_clock_of_a_class_that_is_not_datetimes_own_is_left_alone() -> None:
    code = """
class Clock:
    @staticmethod
    def now():
        return "mine"
    today = "a value"
[Clock.now(), Clock.today]
"""
    assert _run(code, {}).value == ["mine", "a value"]


def test_numpy_imported_during_the_cell_is_seeded_as_if_it_had_been_imported_before() -> None:
    pytest.importorskip("numpy")
    # The first run in a process that has not imported numpy (a worker whose zygote did not preload it); the
    # resume in one that has (this one, or a zygote that preloads it).
    script = (
        "import asyncio, json, sys\n"
        "from snapcell.interpreter import LocalBridge, Runner\n"
        "from snapcell.limits import Limits\n"
        "from snapcell.policy import Policy\n"
        "assert 'numpy' not in sys.modules\n"
        "runner = Runner(policy=Policy().with_modules(['numpy']), limits=Limits(wall_time_s=None))\n"
        "code = 'import numpy as np\\n[float(v) for v in np.random.rand(3)]'\n"
        "r = asyncio.run(runner.run(code, bridge=LocalBridge({}, max_calls=None), host_names=(), inputs={}))\n"
        "assert r.error is None, r.error\n"
        "print(json.dumps({'value': r.value, 'seed': r.inputs['seed']}))\n"
    )
    import json
    import subprocess
    import sys

    import numpy  # noqa: F401

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    first = json.loads(out)
    policy = Policy().with_modules(["numpy"])
    code = "import numpy as np\n[float(v) for v in np.random.rand(3)]"
    assert _run(code, {"seed": first["seed"]}, policy).value == first["value"]
