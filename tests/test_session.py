"""Session behaviour through the public API: runs, host functions, errors, output, dump/load, keys; sync and async."""

from __future__ import annotations

import asyncio
import functools
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import (
    AsyncPool,
    CheckpointCorrupt,
    ConfigError,
    Policy,
    Pool,
    ScriptError,
    ScriptSyntaxError,
    Session,
    SessionError,
)
from snapcell._support._callables import is_async_callable
from snapcell.storage import MemoryStore

KEY_A = "session-tests-key-A-0123456789abcdef"
# A hang guard for what a test waits on, not a timing bound.
HANG_GUARD_S = 60.0
KEY_B = "session-tests-key-B-0123456789abcdef"


@pytest.fixture(scope="module", params=["inline", "process"])
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    """The session scenarios run in both isolation modes."""
    with Pool("memory://", signing_keys=[KEY_A], isolation=request.param) as pool:
        yield pool


@pytest.fixture
def session(pool: Pool) -> Iterator[Session]:
    with pool.checkout() as session:
        yield session


def _reload(pool: Pool, checkpoint_id: bytes) -> Any:
    """Check out a new session of ``pool`` with the checkpoint loaded (a context manager)."""
    manager = pool.checkout()
    session = manager.__enter__()
    session.load_session(checkpoint_id)
    return manager, session


# ------------------------------------------------------------------------------ values


def test_feed_run_returns_the_trailing_expression(session: Session) -> None:
    assert session.feed_run("x = 20\nx * 2 + 2") == 42


def test_feed_run_returns_none_without_trailing_expression(session: Session) -> None:
    assert session.feed_run("x = 1") is None
    assert session.feed_run("if x:\n    y = 2") is None
    assert session.feed_run("") is None


def test_run_result_reports_the_run(session: Session) -> None:
    result = session.run("print('hi')\n[1, 2]", external_lookup={"tool": lambda: 1})
    assert result.ok and result.value == [1, 2] and result.value_repr == "[1, 2]"
    assert result.stdout == "hi\n" and result.stderr == ""
    assert result.duration_s >= 0 and result.external_calls == ()


# ---------------------------------------------------------------------- host functions


def test_sync_and_async_host_functions(session: Session) -> None:
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x * 10

    tools = {"add": lambda a, b: a + b, "fetch": fetch}
    assert session.feed_run("add(1, 2) + await fetch(4)", external_lookup=tools) == 43
    result = session.run("await fetch(1)", external_lookup=tools)
    assert [c.name for c in result.external_calls] == ["fetch"]


class AllAtOnce:
    """An async host function whose calls each wait until ``count`` of them are in flight, then return ``x * factor``.

    Concurrency is counted, not timed: calls made one after another never finish (the run's wall limit, or the hang
    guard, fails them), and ``peak`` says how many were in flight at once.
    """

    def __init__(self, count: int, factor: int = 1) -> None:
        self.count = count
        self.factor = factor
        self.in_flight = self.peak = 0
        self.everyone = asyncio.Event()

    async def call(self, x: int) -> int:  # a method, not __call__: the host tells async functions by their def
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight == self.count:
            self.everyone.set()
        try:
            await asyncio.wait_for(self.everyone.wait(), HANG_GUARD_S)
        finally:
            self.in_flight -= 1
        return x * self.factor


def test_gather_runs_async_host_functions_concurrently(session: Session) -> None:
    slow = AllAtOnce(3)
    value = session.feed_run(
        "import asyncio\nawait asyncio.gather(*[slow(i) for i in range(3)])", external_lookup={"slow": slow.call}
    )
    assert value == [0, 1, 2]
    assert slow.peak == 3, "the calls did not run concurrently"


class AllAtOnceCallable(AllAtOnce):
    """`AllAtOnce` offered as an object whose class defines ``async def __call__``."""

    async def __call__(self, x: int) -> int:
        return await self.call(x)


def test_gather_runs_async_callable_objects_concurrently(session: Session) -> None:
    # Told apart by the class's __call__: before, the host took such an object for a sync function (its calls ran
    # one after another in process mode) and said "def slow(...)" in the tool text.
    slow = AllAtOnceCallable(3)
    value = session.feed_run(
        "import asyncio\nawait asyncio.gather(*[slow(i) for i in range(3)])", external_lookup={"slow": slow}
    )
    assert value == [0, 1, 2]
    assert slow.peak == 3, "the calls did not run concurrently"


def test_is_async_callable() -> None:
    async def coro(x: int) -> int:
        return x

    class SyncCall:
        def __call__(self) -> None:
            pass

    assert is_async_callable(coro) and is_async_callable(functools.partial(coro, 1))
    assert is_async_callable(AllAtOnceCallable(1)) and is_async_callable(AllAtOnce(1).call)
    assert not any(map(is_async_callable, [len, lambda: 1, SyncCall(), AllAtOnceCallable, AllAtOnce]))


def test_host_functions_are_rebound_by_name_after_load(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run(
            "f = list_customers\ndef names():\n    return [c for c in list_customers()]",
            external_lookup={"list_customers": lambda: ["old"]},
        )
        checkpoint_id = session.dump()
        manifest = session.manifest
    assert manifest is not None
    assert [v.name for v in manifest.variables] == ["f", "names"]
    manager, session = _reload(pool, checkpoint_id)
    try:
        value = session.feed_run(
            "[list_customers(), f(), names()]", external_lookup={"list_customers": lambda: ["new"]}
        )
        assert value == [["new"], ["new"], ["new"]]
        result = session.run("list_customers()")  # not offered this run
        assert result.error is not None and result.error.exc_type == "NameError"
    finally:
        manager.__exit__(None, None, None)


def test_host_function_code_is_never_in_the_checkpoint(pool: Pool) -> None:
    marker = "host-secret-marker-5b1f"

    def secret_tool() -> str:
        return marker

    with pool.checkout() as session:
        session.feed_run("alias = secret_tool\nvalue = 1", external_lookup={"secret_tool": secret_tool})
        checkpoint_id = session.dump()
    blob = pool.store.get(pool.aio.keyring.parse_id(checkpoint_id).storage_key)
    assert marker.encode() not in blob and b"secret_tool" in blob  # by name only
    assert b"test_session" not in blob
    manager, session = _reload(pool, checkpoint_id)
    try:
        assert session.feed_run("alias()", external_lookup={"secret_tool": lambda: "current"}) == "current"
    finally:
        manager.__exit__(None, None, None)


# ------------------------------------------------------------------------------ errors


def test_script_error_carries_type_message_traceback_and_line(session: Session) -> None:
    with pytest.raises(ScriptError) as info:
        session.feed_run("a = 1\nb = 2\nraise ValueError('bad value')\nc = 3")
    error = info.value
    assert error.exc_type == "ValueError"
    assert error.exc_message == "bad value"
    assert error.lineno == 3
    assert "raise ValueError('bad value')" in error.traceback_text
    assert "snapcell" not in error.traceback_text
    assert 'File "<cell-1>", line 3' in error.traceback_text


def test_syntax_error_is_a_script_error(session: Session) -> None:
    with pytest.raises(ScriptSyntaxError) as info:
        session.feed_run("x = (")
    assert isinstance(info.value, ScriptError) and info.value.lineno == 1


def test_variables_assigned_before_an_error_are_kept(session: Session) -> None:
    with pytest.raises(ScriptError):
        session.feed_run("before = [1]\n1 / 0\nafter = 2")
    assert session.feed_run("before") == [1]
    assert session.run("after").error.exc_type == "NameError"  # type: ignore[union-attr]


def test_dump_after_a_failed_run_keeps_that_state(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("x = 1")
        with pytest.raises(ScriptError):
            session.feed_run("x = 2\ny = {'k': x}\nraise KeyError('k')")
        checkpoint_id = session.dump()
    manager, session = _reload(pool, checkpoint_id)
    try:
        assert session.feed_run("x, y") == (2, {"k": 2})
    finally:
        manager.__exit__(None, None, None)


def test_tracebacks_show_lines_of_functions_from_earlier_turns(session: Session) -> None:
    session.feed_run("def inner(v):\n    return v['missing']\n")
    session.feed_run("def outer():\n    return inner({})\n")
    error = session.run("outer()").error
    assert error is not None
    text = error.traceback_text
    assert "<cell-3>" in text and "<cell-2>" in text and "<cell-1>" in text
    assert "return inner({})" in text and "return v['missing']" in text
    assert "snapcell" not in text


TRACEBACK_CHILD = """
import json, sys
from snapcell import Pool
with Pool(sys.argv[1], signing_keys=[sys.argv[2]], isolation="inline") as pool, pool.checkout() as session:
    session.load_session(sys.argv[3])
    error = session.run("outer()").error
    print(json.dumps(error.traceback_text))
"""


def test_tracebacks_of_restored_functions_show_their_lines_in_a_fresh_process(tmp_path: Path) -> None:
    store = f"file://{tmp_path}"
    with Pool(store, signing_keys=[KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("def inner(v):\n    return v['missing']\n")
        session.feed_run("def outer():\n    return inner({})\n")
        checkpoint_id = session.dump()
    child = subprocess.run(
        [sys.executable, "-c", TRACEBACK_CHILD, store, KEY_A, checkpoint_id.hex()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    text = child.stdout.strip()
    assert "return inner({})" in text and "return v['missing']" in text and "<cell-3>" in text


# ---------------------------------------------------------------------- compile state


def test_future_flags_carry_over_between_runs(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("from __future__ import annotations")
        session.feed_run("def f(x: UndefinedName) -> AlsoUndefined:\n    return x")
        assert session.feed_run("f(3)") == 3
        checkpoint_id = session.dump()
    manager, session = _reload(pool, checkpoint_id)
    try:
        # Without the flag, the annotation would be evaluated and raise NameError.
        assert session.feed_run("def g(y: NotDefinedEither):\n    return y\ng(4)") == 4
    finally:
        manager.__exit__(None, None, None)


def test_output_is_captured_per_run_and_never_reaches_real_stdout(
    session: Session, capfd: pytest.CaptureFixture[str]
) -> None:
    first = session.run("print('one')\nprint('more', end='!')")
    second = session.run("print('two')")
    failed = session.run("print('before the error')\n1 / 0")
    assert (first.stdout, first.stderr) == ("one\nmore!", "")
    assert second.stdout == "two\n"
    assert failed.stdout == "before the error\n" and failed.error is not None
    with Pool("memory://", isolation="inline", policy=Policy.unrestricted()) as trusted, trusted.checkout() as raw:
        errors = raw.run("import sys\nprint('err-one', file=sys.stderr)\nsys.stdout.write('out-one')")
    assert (errors.stdout, errors.stderr) == ("out-one", "err-one\n")
    out, err = capfd.readouterr()
    assert "one" not in out and "two" not in out and "before" not in out and "err-one" not in err


# ------------------------------------------------------------------------- session use


def test_sync_pool_inside_a_running_event_loop_is_an_error(pool: Pool) -> None:
    async def misuse() -> None:
        with pool.checkout():
            pass

    with pytest.raises(SessionError, match="AsyncPool"):
        asyncio.run(misuse())


def test_checked_in_session_is_an_error(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("x = 1")
    with pytest.raises(SessionError, match="checked in"):
        session.feed_run("x")
    with pytest.raises(SessionError):
        session.dump()


def test_async_pool_basic_flow() -> None:
    slow = AllAtOnce(3, factor=2)

    async def scenario() -> tuple[Any, ...]:
        async with AsyncPool("memory://", signing_keys=[KEY_A], isolation="inline") as pool:
            async with pool.checkout() as session:
                first = await session.feed_run("data = [1, 2, 3]\nlen(data)")
                checkpoint_id = await session.dump()
            async with pool.checkout() as session:
                await session.load_session(checkpoint_id)
                gathered = await session.feed_run(
                    "import asyncio\nawait asyncio.gather(*[slow(x) for x in data])",
                    external_lookup={"slow": slow.call},
                )
                result = await session.run("missing_name")
                with pytest.raises(ScriptError):
                    await session.feed_run("1 / 0")
                return first, gathered, result.error.exc_type if result.error else None

    first, gathered, error = asyncio.run(scenario())
    assert first == 3 and gathered == [2, 4, 6] and error == "NameError"
    assert slow.peak == 3  # the gathered calls ran concurrently


def test_async_session_refuses_overlapping_requests() -> None:
    async def scenario() -> None:
        async with AsyncPool("memory://", signing_keys=[KEY_A], isolation="inline") as pool:
            async with pool.checkout() as session:
                first = asyncio.ensure_future(session.feed_run("import asyncio\nawait asyncio.sleep(0.1)"))
                await asyncio.sleep(0.01)
                with pytest.raises(SessionError, match="already running"):
                    await session.feed_run("1")
                await first
            with pytest.raises(SessionError):
                await session.feed_run("1")

    asyncio.run(scenario())


# ------------------------------------------------------------------------- signing keys


def test_signing_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", KEY_A)
    with Pool(store, isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("x = 5")
        checkpoint_id = session.dump()
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY")
    with Pool(store, signing_keys=[KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("x") == 5
    with Pool(store, signing_keys=[KEY_B], isolation="inline") as pool, pool.checkout() as session:
        with pytest.raises(CheckpointCorrupt):
            session.load_session(checkpoint_id)


def test_environment_holds_several_keys_for_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    with Pool(store, signing_keys=[KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("x = 'old key'")
        checkpoint_id = session.dump()
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", f"{KEY_B}, {KEY_A}")
    with Pool(store, isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("x") == "old key"


def test_key_rotation(tmp_path: Path) -> None:
    store = f"file://{tmp_path}"
    with Pool(store, signing_keys=[KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("x = 'signed with A'")
        old_id = session.dump()
    with Pool(store, signing_keys=[KEY_B, KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.load_session(old_id)
        assert session.feed_run("x") == "signed with A"
        new_id = session.dump()  # signed with B, the first key
    with Pool(store, signing_keys=[KEY_B], isolation="inline") as pool, pool.checkout() as session:
        with pytest.raises(CheckpointCorrupt):
            session.load_session(old_id)
        session.load_session(new_id)
        assert session.feed_run("x") == "signed with A"


def test_local_store_generates_an_owner_only_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    root = tmp_path / "store"
    with Pool(f"file://{root}", create_store=True, isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("x = 1")
        checkpoint_id = session.dump()
    key_file = root / ".snapcell-signing-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_bytes()
    assert len(key) >= 16
    with Pool(f"file://{root}", create_store=True, isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("x") == 1
    assert key_file.read_bytes() == key
    assert [p.name for p in root.iterdir() if p.name.startswith(".snapcell-")] == [key_file.name]


class _NoDefaultStore:
    """Stands in for any store without a default key (S3, or an application's own): neither local nor memory."""

    url = "custom://nowhere"

    def put(self, key: str, data: bytes, *, expires_at: float | None = None, overwrite: bool = False) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def scan(self, prefix: str = "") -> Iterator[Any]:
        return iter(())

    def close(self) -> None:
        pass


def test_other_stores_need_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    with pytest.raises(ConfigError, match="SNAPCELL_SIGNING_KEY"):
        Pool(_NoDefaultStore(), isolation="inline")  # type: ignore[arg-type]


def test_short_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        Pool("memory://", signing_keys=["short"], isolation="inline")


def test_memory_store_without_a_key_works_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    store = MemoryStore()
    with Pool(store, isolation="inline") as pool, pool.checkout() as session:
        session.feed_run("x = 3")
        checkpoint_id = session.dump()
    with Pool(store, isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.feed_run("x") == 3
    assert os.environ.get("SNAPCELL_SIGNING_KEY") is None


def test_setup_cells_rebuild_variables_that_could_not_be_saved(pool: Pool) -> None:
    with pool.checkout() as session:
        session.feed_run("squares = (i * i for i in range(5))\nlabel = 'sq'", setup=True)
        session.feed_run("next(squares)")  # advanced; the rebuilt one starts over
        checkpoint_id = session.dump()
        assert session.manifest is not None
        assert [d.name for d in session.manifest.dropped] == ["squares"]
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        result = session.run("list(squares), label")
    assert result.value == ([0, 1, 4, 9, 16], "sq")
    assert any("setup cells that assign them" in note for note in result.notes)
    assert any("1 setup cell was run again" in note for note in result.notes)


def test_the_next_run_names_a_dropped_variable_once(session: Session) -> None:
    """A live session dumped each turn names an unsaveable variable after the dump that dropped it, not later."""

    def dropped_notes(code: str) -> list[str]:
        notes = [note for note in session.run(code).notes if note.startswith("not saved in the checkpoint")]
        session.dump()
        return notes

    assert dropped_notes("g = (i for i in range(3))") == []
    assert ["g (generator)" in note for note in dropped_notes("x = 1")] == [True]
    assert dropped_notes("x + 1") == []  # g is still there, unchanged, and still not saved
    assert dropped_notes("g = (i for i in range(2))") == []
    assert ["g (generator)" in note for note in dropped_notes("x")] == [True]  # a new value: named again
    assert dropped_notes("x") == []


def test_guarded_stand_ins_survive_a_checkpoint(pool: Pool) -> None:
    """Stand-ins the policy hands scripts (attrgetter, Formatter) pickle by reference and load back, not dropped."""
    with pool.checkout() as first:
        first.run("import operator, string\ng = operator.attrgetter('real')\nf = string.Formatter()\nx = 5")
        checkpoint = first.dump()
        assert first.manifest is not None and first.manifest.dropped == []
    with pool.checkout() as second:
        second.load_session(checkpoint)
        assert second.feed_run("(g(3), f.format('{0}!', 1), x)") == (3, "1!", 5)


def test_the_host_scans_a_small_dump_on_its_loop_and_a_large_one_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread hand-off costs more than scanning a few pickles; a dump declaring much data still leaves the loop.

    The large case is a few compressed bytes that declare 400 kB of pickle: its size on the wire alone would keep
    it on the loop.
    """
    from snapcell.session import Verifier

    threads: list[bool] = []
    original = Verifier._check

    def recorded(self: Verifier, *args: Any) -> Any:
        threads.append(asyncio._get_running_loop() is not None)  # on the event loop, or in a worker thread
        return original(self, *args)

    monkeypatch.setattr(Verifier, "_check", recorded)
    with Pool("memory://", signing_keys=[KEY_A], isolation="inline") as pool, pool.checkout() as session:
        session.run("small = [1, 2, 3]")
        small_id = session.dump()
        session.run("large = ['a' * 400_000]")
        session.dump()
        session.load_session(small_id)
    assert threads == [True, False]


def test_a_dump_after_a_load_does_not_trial_restore_the_frames_that_load_restored() -> None:
    """Restorability is checked at dump by restoring each new frame; a frame the load just restored is known good."""
    with Pool("memory://", signing_keys=[KEY_A], isolation="inline") as pool:
        with pool.checkout() as first:
            # Dates: a frame of plain data (ints, dicts) is never trial restored (`scan_pickle_data`).
            first.run(
                "import datetime\n"
                "rows = [{'i': datetime.date(2024, 1, 1 + i % 28)} for i in range(50)]\n"
                "n = datetime.date(2024, 1, 3)"
            )
            checkpoint_id = first.dump()
        with pool.checkout() as session:  # a new runner, as a new worker would be
            session.load_session(checkpoint_id)
            runner = session._inner._backend.runner  # type: ignore[attr-defined]
            trials: list[bytes] = []
            original = runner._trial

            def counted(data: bytes, buffers: list[Any]) -> Any:
                trials.append(bytes(data))
                return original(data, buffers)

            runner._trial = counted
            session.run("n = datetime.date(2024, 1, 4)")
            session.dump()
            assert session.feed_run("len(rows), n.day") == (50, 4)
    assert len(trials) == 1  # n's new frame; rows' frame is the one the load restored
