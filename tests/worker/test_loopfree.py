"""A worker's first cells run without the event loop (nothing imports asyncio) only when nothing could tell."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Generator
from typing import Any

import pytest

from snapcell import Limits, Policy, Pool
from snapcell.interpreter._runner import Runner
from snapcell.worker._loopfree import finish_without_loop, runs_without_loop


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Runner:
    monkeypatch.delitem(sys.modules, "asyncio")  # as in a fresh worker: the rule reads sys.modules only
    return Runner(policy=Policy(), limits=Limits())


def test_a_cell_that_cannot_import_nor_wait_runs_without_the_loop(runner: Runner) -> None:
    assert runs_without_loop(runner, "x = 1 + 1\nx")
    assert runs_without_loop(runner, "def f(n):\n    return n * 2\nf(3)")


@pytest.mark.parametrize(
    "code",
    [
        "import math",
        "from math import pi",
        "m = __import__('math')",
        "s = 'importlib'",  # a false match only costs the loop
        "await f()",
        "async def f():\n    pass",
        b"1 + 1",  # not text: the runner answers it with an error, in the loop
    ],
)
def test_a_cell_that_could_import_or_wait_uses_the_loop(runner: Runner, code: Any) -> None:
    assert not runs_without_loop(runner, code)


def test_setup_cells_definitions_and_a_loaded_namespace_use_the_loop(runner: Runner) -> None:
    runner.pending_setup.append("x = 1")
    assert not runs_without_loop(runner, "1 + 1")
    runner.pending_setup.clear()
    runner.pending_definitions.append("def f():\n    import asyncio")
    assert not runs_without_loop(runner, "1 + 1")
    runner.pending_definitions.clear()
    runner.loaded = True  # its functions come from cells never run here
    assert not runs_without_loop(runner, "1 + 1")


def test_once_asyncio_is_imported_every_cell_uses_the_loop(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncio", asyncio)
    assert not runs_without_loop(runner, "1 + 1")


def test_a_run_that_waits_after_all_is_closed_and_said() -> None:
    closed: list[bool] = []

    @types.coroutine
    def waits() -> Generator[str, None, Any]:
        try:
            yield "a future"
        finally:
            closed.append(True)

    async def run() -> Any:
        return await waits()

    with pytest.raises(RuntimeError, match="waited for str"):
        finish_without_loop(run())
    assert closed == [True]


def test_first_run_dump_coroutine_cell_and_load_through_a_fresh_zygote() -> None:
    # A pool of its own: its zygote forks this session's worker before the deferred modules are preloaded.
    with Pool("memory://", isolation="process", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
        with pool.checkout() as session:
            worker = session._inner._backend.worker
            assert worker is not None and worker.forked is not None and worker.pid is not None  # forked by a zygote
            assert session.feed_run("x = 1 + 1\nx") == 2
            with open(f"/proc/{worker.pid}/maps") as maps:
                mapped = maps.read()
            assert "_asyncio." not in mapped and "_pydantic_core." not in mapped  # the first run needed neither
            first = session.dump()
            assert session.feed_run("import asyncio\nawait asyncio.sleep(0)\nx + 1") == 3
            assert session.feed_run("import asyncio\nasyncio.get_running_loop() is not None") is True
        with pool.checkout() as session:
            session.load_session(first)
            assert session.feed_run("x * 10") == 20


def test_a_scripts_temporary_files_go_to_the_sessions_scratch_in_every_child() -> None:
    # The worker sets tempfile's directory rather than leave it to tempfile's own search (which probes candidates by
    # writing files): in the first child of a zygote (tempfile not imported before its fork) and in later ones.
    from snapcell.workspace._setup import TMP_DIR

    code = (
        "import tempfile\nset_by_worker = tempfile.tempdir\n"
        "with tempfile.NamedTemporaryFile() as f:\n    name = f.name\nset_by_worker, name"
    )
    with Pool("memory://", isolation="process", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
        for _ in range(2):
            with pool.checkout() as session:
                worker = session._inner._backend.worker
                assert worker is not None and worker.scratch_dir is not None
                where, name = session.feed_run(code)
                assert where == f"{worker.scratch_dir}/{TMP_DIR}" and name.startswith(where + "/")
