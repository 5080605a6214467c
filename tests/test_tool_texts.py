"""What the run_code tool tells the model is true: modules, host-function failures, cut counts, restarts."""

from __future__ import annotations

import gc
import logging
import re
import warnings
from collections.abc import Iterator

import pytest

from snapcell import Limits, Policy, Pool, SyncCodeTool, WorkerLost
from snapcell.backends._procbackend import _Died, _lost
from snapcell.heads import MemoryHeads
from snapcell.session import AsyncSession


class Receipt:
    """A host return value that is not plain data (the application's bug)."""


def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    if amount > 100:
        raise ConnectionError("the payment gateway refused the connection")
    return f"charged {amount}"


async def refund(amount: int) -> str:
    raise TimeoutError(f"refund of {amount} timed out upstream")


def receipt() -> Receipt:
    return Receipt()


TOOLS = {"charge_card": charge_card, "refund": refund, "receipt": receipt}


@pytest.fixture(scope="module", params=["inline", "process"])
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    with Pool("memory://", isolation=request.param) as pool:
        yield pool


@pytest.fixture
def tool(pool: Pool) -> SyncCodeTool:
    return SyncCodeTool(pool, heads=MemoryHeads(), tools=TOOLS)


def test_the_description_lists_what_the_policy_allows_and_the_host_functions() -> None:
    with Pool("memory://", isolation="inline", policy=Policy().with_modules(["numpy", "pandas"])) as pool:
        text = SyncCodeTool(pool, heads=MemoryHeads(), tools=TOOLS).description
    assert "Only safe standard-library modules" not in text
    assert re.search(r"can be imported \(with their submodules\): numpy, pandas; and from the standard library: ", text)
    assert "statistics" in text and "no network access" not in text  # pandas and numpy are not known to be offline
    assert "def charge_card(amount: int) -> str\n    Charge the customer's card." in text
    assert "async def refund(amount: int) -> str" in text
    with Pool("memory://", isolation="inline") as pool:
        plain = SyncCodeTool(pool, heads=MemoryHeads()).description
    assert "numpy" not in plain and "from the standard library: abc, array, asyncio" in plain
    assert "no network access" in plain and "Host functions" not in plain
    with Pool("memory://", isolation="inline", policy=Policy.unrestricted()) as pool:
        assert "Any installed module can be imported" in SyncCodeTool(pool, heads=MemoryHeads()).description


@pytest.mark.parametrize(
    ("code", "label"),
    [
        ("charge_card(500)", "the host function charge_card failed: ConnectionError: the payment gateway refused"),
        ("await refund(7)", "the host function refund failed: TimeoutError: refund of 7 timed out upstream"),
    ],
)
def test_a_host_function_failure_is_labelled_and_logged(
    tool: SyncCodeTool, caplog: pytest.LogCaptureFixture, code: str, label: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="snapcell"):
        answer = tool.run_code("c-host", code)
    assert label in answer
    assert "not from a mistake in the code" in answer
    name = label.split()[3]
    records = [r for r in caplog.records if r.name == "snapcell" and f"host function {name} failed" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is not None  # the developer gets the traceback
    assert records[0].exc_info[1] is not None and "line" in logging.Formatter().formatException(records[0].exc_info)


def test_a_script_error_is_not_blamed_on_a_host_function(tool: SyncCodeTool) -> None:
    answer = tool.run_code("c-own", "charge_card(5)\n1 / 0")
    assert "ZeroDivisionError" in answer and "host function" not in answer
    caught = tool.run_code(
        "c-own", "try:\n    charge_card(500)\nexcept ConnectionError:\n    pass\nraise KeyError('k')"
    )
    assert "KeyError" in caught and "host function" not in caught


def test_a_non_plain_host_value_is_logged_as_the_applications_bug(caplog: pytest.LogCaptureFixture) -> None:
    # Only process mode sends host values across a boundary; inline mode hands the object over as it is.
    with Pool("memory://", isolation="process") as pool, caplog.at_level(logging.ERROR, logger="snapcell"):
        answer = SyncCodeTool(pool, heads=MemoryHeads(), tools=TOOLS).run_code("c-bug", "receipt()")
    assert "the host function receipt failed: TypeError" in answer
    messages = [r.getMessage() for r in caplog.records if r.name == "snapcell" and r.levelno >= logging.ERROR]
    assert any("receipt" in m and "bug in the application" in m for m in messages), messages


def test_cut_counts_include_what_earlier_cuts_dropped(tool: SyncCodeTool) -> None:
    answer = tool.run_code("c-cut", "print('x' * 1_000_000)")
    count = int(re.match(r"\[\.\.\. (\d+) characters cut from the start of this answer", answer).group(1))
    shown = answer.count("x")
    assert 1_000_000 - shown <= count <= 1_000_000 - shown + 200  # markers are a few dozen characters
    value = tool.run_code("c-cut", "'y' * 2_000_000")
    count = int(re.match(r"\[\.\.\. (\d+) characters cut", value).group(1))
    assert 2_000_000 - value.count("y") <= count <= 2_000_000 - value.count("y") + 200


def test_the_timeout_is_said_once(pool: Pool) -> None:
    # The short limit only where a run is meant to hit it: elsewhere a slow machine would hit it too.
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools=TOOLS, limits=Limits(wall_time_s=0.5, grace_s=1.0))
    answer = tool.run_code("c-slow", "x = 1\nwhile True:\n    pass")
    assert answer.count("stopped after") == 1, answer
    assert "TimeLimitExceeded" in answer or "stopped after 0.5 s" in answer


def test_the_lost_worker_note_is_short_and_names_no_setting(
    tool: SyncCodeTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def lose(*args: object, **kwargs: object) -> None:
        raise _lost(_Died("timeout", ""), "run", 3.5, "wall_time_s")  # the message the application gets

    assert "grace_s" in str(_lost(_Died("timeout", ""), "run", 3.5, "wall_time_s"))
    monkeypatch.setattr(AsyncSession, "run", lose)
    answer = tool.run_code("c-lost", "10**10**8")
    assert "grace_s" not in answer and "wall-time" not in answer
    assert "restarted" in answer and "changes are lost" in answer
    assert len(answer) < 220 and answer.count("\n") == 0
    assert isinstance(_lost(_Died("crash", ""), "run", None, "wall_time_s"), WorkerLost)


def test_plain_host_values_still_arrive(tool: SyncCodeTool) -> None:
    assert tool.run_code("c-ok", "charge_card(12)") == "'charged 12'"


@pytest.mark.parametrize("keep_warm_s", [0.0, 60.0])
def test_a_dropped_variable_is_named_once_unless_assigned_again(pool: Pool, keep_warm_s: float) -> None:
    """The turn that makes an unsaveable value says so; later turns repeat it only for a new such value."""
    tool = SyncCodeTool(pool, heads=MemoryHeads(), keep_warm_s=keep_warm_s)
    try:
        first = tool.run_code("c", "g = (i for i in range(3))\nkept = 1")
        assert "not saved in the checkpoint" in first and "g (generator)" in first
        assert "not saved" not in tool.run_code("c", "kept + 1")
        assert "not saved" not in tool.run_code("c", "other = 2")
        again = tool.run_code("c", "g = (i for i in range(2))")
        assert "g (generator)" in again
        inside = tool.run_code("c", "box = [kept, (i for i in range(2))]")  # a new drop, though not a new name
        assert "box (list)" in inside and "g (generator)" not in inside
        assert "not saved" not in tool.run_code("c", "kept")
    finally:
        tool.close()


async def list_customers() -> list[dict[str, str]]:
    """List the customers."""
    return [{"id": "c-1", "name": "Acme"}]


def test_a_coroutine_left_without_await_is_named_and_closed_quietly(pool: Pool) -> None:
    tools = {**TOOLS, "list_customers": list_customers}
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools=tools, keep_warm_s=60.0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = tool.run_code("c-await", "list_customers()")
            assert "did you forget `await`?" in value and "await list_customers(...)" in value, value
            assert "WorkerBridge" not in value and "_call_async" not in value
            # A host function left unawaited did not run: its failure is not reported.
            kept = tool.run_code("c-await", "pending = refund(3)\nprint('ran')")
            assert "ran" in kept and "await refund(...)" in kept and "timed out" not in kept, kept
            own = tool.run_code("c-await", "async def f():\n    return 1\nf()")
            assert "did you forget `await`?" in own and "f()" in own, own
            later = tool.run_code("c-await", "pending = 1\nawait list_customers()")
            assert "RuntimeWarning" not in later and "never awaited" not in later, later
            assert "Acme" in later and "forget" not in later
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    finally:
        tool.close()


def test_the_description_shows_the_fields_of_stub_classes() -> None:
    stubs = (
        "from typing import NotRequired, TypedDict\n"
        "class Customer(TypedDict):\n"
        '    """A customer record."""\n'
        "    id: str\n"
        "    churned_at: NotRequired[str | None]\n"
        "    def helper(self) -> None: ...\n"
        "def list_customers() -> list[Customer]:\n"
        '    """List the customers."""\n'
    )
    with Pool("memory://", isolation="inline") as pool:
        text = SyncCodeTool(pool, heads=MemoryHeads(), stubs=stubs).description
    functions, types = text.split("Host functions")[1].split("not defined in the session)")
    assert "def list_customers() -> list[Customer]\n    List the customers." in functions
    assert (
        "class Customer(TypedDict)\n    A customer record.\n    id: str\n    churned_at: NotRequired[str | None]\n"
        in types
    )
    assert "def helper(self) -> None" in types and "Customer" not in functions.replace("list[Customer]", "")


def test_the_module_list_names_what_imports(tool: SyncCodeTool, pool: Pool) -> None:
    listed = re.search(r"can be imported \(with their submodules\): (.*?)\. Other imports fail", tool.description)
    assert listed is not None, tool.description
    names = re.findall(r"[\w.]+", listed.group(1).replace("from the standard library", ""))
    names = [name for name in names if name != "and"]
    assert ("pathlib" in names) == (pool._inner.isolation == "process")
    answer = tool.run_code("c-modules", "".join(f"import {name}\n" for name in names) + "'imported'")
    assert answer == "'imported'", answer
    with Pool("memory://", isolation="inline", policy=Policy().with_modules(["snapcell_no_such_module"])) as other:
        assert "snapcell_no_such_module" not in SyncCodeTool(other, heads=MemoryHeads()).description


def test_an_absolute_workspace_path_gets_a_hint() -> None:
    with Pool("memory://", isolation="process") as pool:
        tool = SyncCodeTool(pool, heads=MemoryHeads())
        for code in (
            "open('/workspace/notes.txt').read()",
            "import pathlib\npathlib.Path('/workspace/a.txt').write_text('x')",
        ):
            answer = tool.run_code("c-path", code)
            assert "Error" in answer and "working directory is the workspace" in answer, answer
            assert "'notes.txt'" in answer or "'a.txt'" in answer
        relative = tool.run_code("c-path", "open('notes.txt').read()")
        assert "FileNotFoundError" in relative and "working directory is the workspace" not in relative


def test_the_model_can_ask_for_its_sessions_memory(tool: SyncCodeTool, pool: Pool) -> None:
    process = pool._inner.isolation == "process"
    assert ("memory()" in tool.description) == process
    used = tool.run_code("c-mem", "m = memory()\nm['resident_bytes'], m['peak_resident_bytes'], m['limit_bytes']")
    if not process:  # the session shares the application's process: its memory is unknown
        assert used == "(None, None, None)", used
        return
    resident, peak, limit = (int(n) for n in re.findall(r"\d+", used))
    assert 10 * 2**20 < resident <= peak and limit == Limits().memory_bytes, used
    classic = 'int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])'
    assert 10_000 < int(tool.run_code("c-mem", classic)) < 10 * 2**20
    # Only memory lines are served, read-only; the rest of /proc stays closed.
    assert tool.run_code("c-mem", "'Uid:' in open('/proc/self/status').read()") == "False"
    assert tool.run_code("c-mem", "'VmHWM:' in open('/proc/self/status', 'rb').read().decode()") == "True"
    assert "Error" in tool.run_code("c-mem", "open('/proc/self/status', 'w')")
    assert "PermissionError" in tool.run_code("c-mem", "open('/proc/self/environ').read()")
