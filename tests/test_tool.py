"""The run_code tool: turns, heads, leases across processes, rewind and fork, answers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import (
    AsyncPool,
    CodeTool,
    ConfigError,
    Conflict,
    Pool,
    RunResult,
    ScriptError,
    StorageError,
    SyncCodeTool,
)
from snapcell.errors import InvalidKey, StorageUnavailable
from snapcell.heads import MemoryHeads, S3Heads, SQLiteHeads
from snapcell.ops import cleanup
from snapcell.storage import MemoryStore, S3Config, S3Store
from snapcell.tool import STATE_GONE_NOTE, RunCodeArguments, cut_answer, render_answer, tool_call_arguments
from tests.s3server import TEST_CREDENTIALS, TEST_REGION, s3_server

__all__ = ["s3_server"]

ROOT = Path(__file__).resolve().parents[1]
KEY = "tool-test-signing-key-0123456789"
# A hang guard for events a test waits on, not a timing bound.
HANG_GUARD_S = 60.0
STUBS = '''
def lookup(name: str) -> int:
    """Look a number up by name."""
    ...
async def fetch(n: int) -> list[int]: ...
'''


def lookup(name: str) -> int:
    return len(name)


async def fetch(n: int) -> list[int]:
    return list(range(n))


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
    with Pool(MemoryStore("tool", now=clock), isolation="inline", clock=clock, signing_keys=[KEY]) as pool:
        yield pool


@pytest.fixture
def tool(pool: Pool) -> SyncCodeTool:
    return SyncCodeTool(pool, heads=MemoryHeads(), tools={"lookup": lookup, "fetch": fetch})


def test_a_conversation_keeps_its_variables(tool: SyncCodeTool) -> None:
    assert tool.run_code("c1", "x = lookup('abc')\nprint('hello')\nx * 2") == "hello\n6"
    assert tool.run_code("c1", "import asyncio\nxs = await fetch(x)\nxs") == "[0, 1, 2]"
    head = tool.head("c1")
    assert head is not None and len(head.history) == 1


def test_two_conversations_never_share_variables(tool: SyncCodeTool) -> None:
    tool.run_code("alice", "secret = 'alice-only'\nmine = 1")
    tool.run_code("bob", "mine = 2")
    assert "NameError" in tool.run_code("bob", "secret")
    assert tool.run_code("bob", "mine") == "2"
    assert tool.run_code("alice", "mine, secret") == "(1, 'alice-only')"
    assert "NameError" in tool.run_code("carol", "mine")


def test_failed_and_timed_out_turns_still_move_the_head(pool: Pool) -> None:
    from snapcell import Limits

    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads)
    tool.run_code("c", "a = 1")
    answer = tool.run_code("c", "b = 2\n1/0")
    assert "ZeroDivisionError" in answer and "line 2" in answer
    # A short limit only for the turn meant to hit it (a tool over the same heads: the same conversation).
    answer = SyncCodeTool(pool, heads=heads, limits=Limits(wall_time_s=0.3)).run_code(
        "c", "c = 3\nwhile True:\n    pass"
    )
    assert "wall-time" in answer or "stopped" in answer
    assert tool.run_code("c", "a, b, c") == "(1, 2, 3)"
    head = tool.head("c")
    assert head is not None and len(head.history) == 3


def test_rewind_and_fork(tool: SyncCodeTool) -> None:
    tool.run_code("c", "n = 1")
    first = tool.head("c").checkpoint_id  # type: ignore[union-attr]
    tool.run_code("c", "n = 2")
    tool.run_code("c", "n = 3")
    assert tool.rewind("c", 2) == first
    assert tool.run_code("c", "n") == "1"
    head = tool.head("c")
    assert head is not None and head.history == (first,)
    with pytest.raises(ConfigError, match="cannot go back"):
        tool.rewind("c", 5)
    assert tool.fork("c", "c-fork") == head.checkpoint_id
    tool.run_code("c-fork", "n = 100")
    assert tool.run_code("c", "n") == "1"
    assert tool.run_code("c-fork", "n") == "100"
    with pytest.raises(Conflict):
        tool.fork("c", "c-fork")  # create-only
    with pytest.raises(ConfigError, match="no head"):
        tool.fork("nobody", "x")
    with pytest.raises(ConfigError, match="no head"):
        tool.rewind("nobody")


def test_an_expired_head_continues_with_a_fresh_session(tool: SyncCodeTool, clock: Clock) -> None:
    tool.run_code("c", "kept = 1")
    expired = tool.head("c").checkpoint_id  # type: ignore[union-attr]
    clock.now += 8 * 86400
    answer = tool.run_code("c", "try:\n    kept\nexcept NameError:\n    kept = 'gone'\nkept")
    assert answer == f"'gone'\n[note] {STATE_GONE_NOTE}"
    assert answer.count("\n") == 1
    head = tool.head("c")
    assert head is not None and head.history == (expired,)  # a fresh session, but the history is kept
    assert tool.run_code("c", "kept") == "'gone'"


def test_a_vanished_checkpoint_continues_with_a_fresh_session(pool: Pool, tool: SyncCodeTool) -> None:
    tool.run_code("c", "v = 1")
    head = tool.head("c")
    assert head is not None and head.checkpoint_id is not None
    pool.store.delete(pool._inner.keyring.parse_id(head.checkpoint_id).storage_key)
    assert STATE_GONE_NOTE in tool.run_code("c", "1")


def test_storage_failure_does_not_move_the_head(pool: Pool, tool: SyncCodeTool, monkeypatch) -> None:
    tool.run_code("c", "v = 1")
    before = tool.head("c")

    def broken(*args, **kwargs):
        raise StorageError("disk on fire")

    monkeypatch.setattr(pool.store, "put", broken)
    with pytest.raises(StorageError, match="disk on fire"):
        tool.run_code("c", "v = 2")
    monkeypatch.undo()
    assert tool.head("c") == before
    assert tool.run_code("c", "v") == "1"


def test_a_held_lease_blocks_and_an_expired_one_is_taken_over(pool: Pool) -> None:
    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads, lease_wait_s=0.3)
    assert heads.acquire_lease("c", "other-server", 60)
    with pytest.raises(Conflict, match="another turn of conversation 'c' is running"):
        tool.run_code("c", "1")
    # A lease left behind by a dead process, already past its expiry:
    assert heads.acquire_lease("d", "dead", 5, now=time.time() - 10)
    assert tool.run_code("d", "2") == "2"


def test_a_stale_turn_cannot_overwrite_a_newer_head(pool: Pool) -> None:
    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads, tools={"lookup": lookup})
    tool.run_code("c", "n = 0")

    def sneak(name: str) -> int:
        # While this turn runs, another server whose lease took over moves the head.
        head = heads.get("c")
        assert head is not None
        assert heads.acquire_lease("c", "intruder", 60, now=time.time() + 3600)
        heads.compare_and_set("c", head.version, head.checkpoint_id, owner="intruder", release_lease=True)
        return 1

    tool._inner.tools["lookup"] = sneak
    with pytest.raises(Conflict, match="nothing was overwritten"):
        tool.run_code("c", "n = lookup('x')")
    assert tool.run_code("c", "n") == "0"


def test_turns_of_one_conversation_wait_for_each_other_in_one_process(clock: Clock) -> None:
    async def main() -> list[str]:
        async with AsyncPool(MemoryStore(), isolation="inline", signing_keys=[KEY]) as pool:
            tool = CodeTool(pool, heads=MemoryHeads())
            await tool.run_code("c", "xs = []")
            code = "import asyncio\nn = len(xs)\nawait asyncio.sleep(0.01)\nxs.append(n)"
            await asyncio.gather(*(tool.run_code("c", code) for _ in range(8)))
            return [await tool.run_code("c", "xs")]

    assert asyncio.run(main()) == [str(list(range(8)))]


def test_bad_conversation_id(tool: SyncCodeTool) -> None:
    with pytest.raises(InvalidKey, match="conversation ID"):
        tool.run_code("../etc/passwd", "1")


# -------------------------------------------------------------------- answers


def test_answer_order_and_cut() -> None:
    error = ScriptError("boom", exc_type="ValueError", exc_message="boom", lineno=3)
    result = RunResult(stdout="out\n", stderr="warn\n", value_repr="42", error=error, notes=("n1",))
    assert (
        render_answer(result, ["first"])
        == "out\n[stderr]\nwarn\n42\nValueError: boom (line 3)\n[note] first\n[note] n1"
    )
    assert render_answer(RunResult()) == "(no output)"
    text = "".join(f"line {i}\n" for i in range(5000)) + "THE END"
    cut = cut_answer(text, 1000)
    assert len(cut) == 1000 and cut.endswith("THE END")
    head, _, rest = cut.partition("\n")
    assert head == f"[... {len(text) - len(rest)} characters cut from the start of this answer ...]"


def test_long_output_is_cut_keeping_the_end(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads(), max_answer_chars=500)
    answer = tool.run_code("c", "for i in range(1000):\n    print(i)\n1/0")
    assert len(answer) <= 500 and "characters cut from the start" in answer
    assert answer.rstrip().endswith("ZeroDivisionError: division by zero")


def test_description_and_schema(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools={"lookup": lookup, "fetch": fetch})
    assert "def lookup(name: str) -> int" in tool.description
    assert "async def fetch(n: int) -> list[int]" in tool.description
    schema = tool.json_schema
    assert schema["required"] == ["code"] and schema["properties"]["code"]["type"] == "string"
    assert "description" not in schema  # it goes beside the schema (the API's tool description), not twice
    assert tool_call_arguments('{"code": "1", "setup": true}') == ("1", True)
    with pytest.raises(ConfigError):
        tool_call_arguments("[1]")


def test_stubs_are_listed_and_type_checked(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads(), tools={"lookup": lookup, "fetch": fetch}, stubs=STUBS)
    assert "def lookup(name: str) -> int\n    Look a number up by name." in tool.description
    assert "async def fetch(n: int) -> list[int]" in tool.description
    assert tool.run_code("c", "lookup('abcd')") == "4"
    answer = tool.run_code("c", "lookup(5)")
    assert "invalid-argument-type" in answer


def test_cleanup_keeps_the_current_heads(pool: Pool, clock: Clock) -> None:
    heads = MemoryHeads()
    tool = SyncCodeTool(pool, heads=heads)
    for i in range(3):
        tool.run_code("a", f"x = {i}")
        tool.run_code("b", f"y = {i}")
    keyring = pool._inner.keyring
    report = cleanup(
        pool.store,
        now=clock.now + 7200,
        quota_bytes=0,
        heads=heads,
        key_of=lambda i: keyring.parse_id(i).storage_key,
    )
    assert report.deleted_quota_objects == 0  # every checkpoint is a head or in a history
    tool.rewind("a")
    assert tool.run_code("a", "x") == "1"


# ------------------------------------------------------- several processes


def _driver(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SNAPCELL_SIGNING_KEY": KEY, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.tool_driver", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _two_processes(store_url: str, heads_url: str, *extra: str) -> None:
    children = [_driver(store_url, heads_url, "shared", tag, "20", *extra) for tag in ("A", "B")]
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err


def _entries(tool: SyncCodeTool) -> list[str]:
    answer = tool.run_code("shared", "entries")
    return list(eval(answer))  # a list of 'A'/'B' literals


def test_two_processes_on_sqlite_heads_lose_no_update(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _two_processes(f"file://{store}", f"sqlite://{store}/.heads.sqlite3")
    with Pool(f"file://{store}", create_store=True, isolation="inline", signing_keys=[KEY]) as pool:
        tool = SyncCodeTool(pool)  # the default head store of a local store is the same SQLite file
        entries = _entries(tool)
        head = tool.head("shared")
    assert len(entries) == 40 and entries.count("A") == 20 and entries.count("B") == 20
    assert head is not None and len(head.history) == 40


@pytest.mark.integration
def test_two_processes_on_s3_heads_lose_no_update(s3_server: str) -> None:
    import boto3

    bucket = f"tool-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS).create_bucket(Bucket=bucket)
    _two_processes(f"s3://{bucket}/proj", "s3", s3_server)
    config = S3Config(endpoint_url=s3_server, region_name=TEST_REGION, **TEST_CREDENTIALS)
    store = S3Store(bucket, "proj", config=config)
    with Pool(store, isolation="inline", signing_keys=[KEY]) as pool:
        entries = _entries(SyncCodeTool(pool, heads=S3Heads(store)))
    assert len(entries) == 40 and entries.count("A") == 20 and entries.count("B") == 20


class CountedLeases(SQLiteHeads):
    """SQLite heads that count the lease attempts made through them."""

    def __init__(self, path: Path, clock: Clock) -> None:
        super().__init__(path, clock=clock)
        self.attempts = 0

    def acquire_lease(self, *args: Any, **kwargs: Any) -> bool:
        self.attempts += 1
        return super().acquire_lease(*args, **kwargs)

    def acquire_lease_and_get(self, *args: Any, **kwargs: Any) -> Any:
        self.attempts += 1
        return super().acquire_lease_and_get(*args, **kwargs)


def test_lease_of_a_killed_process_is_taken_over_after_expiry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    heads_path = store / ".heads.sqlite3"
    clock = Clock()  # this process's view of the head store's time; the child renews its lease on the real clock
    heads = CountedLeases(heads_path, clock)
    with Pool(f"file://{store}", create_store=True, isolation="inline", signing_keys=[KEY]) as pool:
        SyncCodeTool(pool, heads=heads).run_code("victim", "before = 1")
        child = _driver(f"file://{store}", f"sqlite://{heads_path}", "victim", "-", "0")
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"  # mid-turn, holding the lease
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        dead = heads.record("victim")
        assert dead is not None and dead.lease_owner is not None  # a killed turn never gives its lease back
        # As of its last renewal the lease is live: another turn is refused, however its wait goes.
        clock.now = dead.lease_renewed_at
        with pytest.raises(Conflict, match="another turn"):
            SyncCodeTool(pool, heads=heads, lease_wait_s=0.2).run_code("victim", "1")
        # Once it has expired, a waiting turn takes it over with its first attempt, not after more waiting.
        clock.now = dead.lease_expires_at + 0.001
        heads.attempts = 0
        patient = SyncCodeTool(pool, heads=heads, lease_wait_s=10)
        assert patient.run_code("victim", "before") == "1"  # the killed turn's changes were never stored
        assert heads.attempts == 1


def test_answer_hides_none_and_mentions_memory_only_when_it_matters() -> None:
    assert render_answer(RunResult(value_repr="None")) == "(no output)"
    small = RunResult(value_repr="3", namespace_summary="2 variables, ~1 KiB", memory_bytes=80 * 2**20)
    assert render_answer(small) == "3"
    big = RunResult(
        value_repr="3",
        namespace_summary="2 variables, ~900 MiB; largest: df (DataFrame, ~899 MiB)",
        memory_bytes=1200 * 2**20,
    )
    answer = render_answer(big)
    assert answer.splitlines()[0] == "3"
    assert "[note] the session uses 1,200 MiB; 2 variables, ~900 MiB; largest: df" in answer


# ------------------------------------------------------------- validation


@pytest.mark.parametrize("tools", [123, [lookup], "lookup"])
def test_tools_must_be_a_mapping(pool: Pool, tools: object) -> None:
    with pytest.raises(ConfigError, match="tools must be a mapping of names to functions"):
        SyncCodeTool(pool, heads=MemoryHeads(), tools=tools)


@pytest.mark.parametrize(
    ("tools", "message"),
    [({"1bad": lookup}, "public identifiers"), ({"_private": lookup}, "public identifiers"), ({"x": 3}, "callable")],
)
def test_tool_names_are_checked_when_the_tool_is_made(pool: Pool, tools: object, message: str) -> None:
    heads = MemoryHeads()
    with pytest.raises(ConfigError, match=message):
        SyncCodeTool(pool, heads=heads, tools=tools)
    assert list(heads.scan()) == []  # no lease, no head: nothing ran


def test_tool_refuses_options_of_the_wrong_type(pool: Pool) -> None:
    with pytest.raises(ConfigError, match="limits must be a snapcell Limits"):
        SyncCodeTool(pool, heads=MemoryHeads(), limits=5)
    with pytest.raises(ConfigError, match="stubs must be Python source text"):
        SyncCodeTool(pool, heads=MemoryHeads(), stubs=5)
    with pytest.raises(ConfigError, match="heads must be a head store"):
        SyncCodeTool(pool, heads="sqlite:///heads.db")
    with pytest.raises(ConfigError, match="pool must be a Pool"):
        SyncCodeTool(pool.aio)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pool must be an AsyncPool"):
        CodeTool(pool)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "setup"),
    [
        ('{"code": "x", "setup": "false"}', False),
        ('{"code": "x", "setup": "False"}', False),
        ('{"code": "x", "setup": "true"}', True),
        ('{"code": "x", "setup": false}', False),
        ('{"code": "x"}', False),
        ({"code": "x", "setup": True}, True),
    ],
)
def test_tool_call_setup_accepts_booleans_and_their_text(arguments: str | dict[str, object], setup: bool) -> None:
    assert tool_call_arguments(arguments) == ("x", setup)


@pytest.mark.parametrize("setup", ['"no"', '"0"', "1", "0", "null", '"yes"', "[]"])
def test_tool_call_setup_refuses_anything_else(setup: str) -> None:
    with pytest.raises(ConfigError, match="'setup' must be true or false"):
        tool_call_arguments(f'{{"code": "x", "setup": {setup}}}')


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("{}", "run_code needs the argument 'code' (Python code to run"),
        ('{"code": 7}', "run_code argument 'code' must be a string, not 7"),
        ("[1]", 'run_code arguments must be a JSON object like {"code": ...}, not [1]'),
        ('{"code": "x", "setup": 1}', "run_code argument 'setup' must be true or false, not 1"),
    ],
)
def test_tool_call_errors_are_plain_words(arguments: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        tool_call_arguments(arguments)
    text = str(caught.value)
    assert text.startswith(message) and "validation error" not in text and "http" not in text


def test_one_model_is_the_schema_and_the_check(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads())
    assert tool.json_schema == RunCodeArguments.input_schema() == RunCodeArguments.model_json_schema()
    assert tool.json_schema["additionalProperties"] is False and "title" not in str(tool.json_schema)
    assert RunCodeArguments.from_call({"code": "x", "setup": "TRUE", "other": 1}) == RunCodeArguments(
        code="x", setup=True
    )


def test_run_turn_says_whether_the_run_failed(pool: Pool) -> None:
    tool = SyncCodeTool(pool, heads=MemoryHeads())
    ok, failed = tool.run_turn("c", "x = 1"), tool.run_turn("c", "x / 0", turn_id="t-1")
    assert ok.text == "(no output)" and not ok.failed and ok.saved and ok.result is not None
    assert failed.failed and failed.saved and "ZeroDivisionError" in failed.text
    assert failed.text == tool.run_code("c", "x / 0", turn_id="t-1")  # the same text as run_code's
    replayed = tool.run_turn("c", "x / 0", turn_id="t-1")
    assert replayed.result is None and replayed.saved and replayed.text == failed.text  # it did not run again


class FailingRenewals(MemoryHeads):
    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    def renew_lease(self, *args: object, **kwargs: object) -> bool:
        self.failed += 1
        raise StorageUnavailable("the head store is briefly unreachable")


def test_a_failed_lease_renewal_does_not_fail_a_finished_turn(pool: Pool) -> None:
    heads = FailingRenewals()
    tool = SyncCodeTool(pool, heads=heads, lease_ttl_s=0.06, tools={"failed": lambda: heads.failed})
    # The turn goes on until two renewals have failed (it awaits, so the renewer runs; a blocking sleep would leave
    # it no turn of the loop, and the test nothing to show).
    code = "import asyncio\nwhile failed() < 2:\n    await asyncio.sleep(0.01)\nx = 1\nx"
    assert tool.run_code("c", code) == "1"
    assert heads.failed >= 2
    head = heads.get("c")
    assert head is not None and head.checkpoint_id is not None and head.lease_owner is None


class AmbiguousUpdates(MemoryHeads):
    """The update lands, but the reply is lost (a retried request on S3)."""

    def compare_and_set(self, *args: Any, **kwargs: Any) -> str:
        super().compare_and_set(*args, **kwargs)
        raise StorageUnavailable("read timeout")


def test_a_head_update_that_landed_despite_an_error_counts_as_done(pool: Pool) -> None:
    heads = AmbiguousUpdates()
    tool = SyncCodeTool(pool, heads=heads)
    assert tool.run_code("c", "n = 41\nn + 1") == "42"
    head = heads.get("c")
    assert head is not None and head.lease_owner is None
    assert tool.run_code("c", "n") == "41"  # the turn was stored once, not twice


class SlowLeases(MemoryHeads):
    """Lease attempts that block until the test lets them go on; what they granted and gave back is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()
        self.tried = threading.Event()
        self.released = threading.Event()
        self.granted: list[bool] = []

    def acquire_lease(self, *args: Any, **kwargs: Any) -> bool:
        self.entered.set()
        self.go.wait(HANG_GUARD_S)
        taken = super().acquire_lease(*args, **kwargs)
        self.granted.append(taken)
        return taken

    def release_lease(self, conversation_id: str, owner: str) -> None:
        record = self.record(conversation_id)
        super().release_lease(conversation_id, owner)
        self.tried.set()
        if record is not None and record.lease_owner == owner:  # not a no-op release before the lease was taken
            self.released.set()


def test_a_turn_cancelled_while_taking_the_lease_gives_it_back() -> None:
    async def scenario() -> None:
        heads = SlowLeases()
        async with AsyncPool("memory://", isolation="inline") as pool:
            tool = CodeTool(pool, heads=heads, lease_wait_s=0.1)
            turn = asyncio.ensure_future(tool.run_code("c", "1"))
            assert await asyncio.to_thread(heads.entered.wait, HANG_GUARD_S)  # its attempt is in the head store
            turn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await turn
            # The turn's own cleanup tries to give back a lease not yet taken (a no-op); only then does the attempt, in
            # a thread nobody can stop, take the lease after all...
            assert await asyncio.to_thread(heads.tried.wait, HANG_GUARD_S)
            heads.go.set()
            assert await asyncio.to_thread(heads.released.wait, HANG_GUARD_S)  # ...and it is given back
            assert heads.granted == [True]
            record = heads.record("c")
            assert record is None or record.lease_owner is None
            assert await tool.run_code("c", "2") == "2"  # at once: a lease left behind would refuse it (0.1 s wait)

    asyncio.run(scenario())


def test_hostile_tool_arguments_and_tiny_limits_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        tool_call_arguments("[" * 100_000)
    with pytest.raises(ConfigError):
        cut_answer("x" * 1000, 10)
