"""A runner compiles a cell's text once: a repeated cell skips parse, check and compile, and behaves the same."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from snapcell.errors import PolicyError
from snapcell.interpreter import _cellcache
from snapcell.interpreter._result import RunResult
from snapcell.interpreter._runner import Runner
from snapcell.limits import Limits
from snapcell.policy._policy import Policy


class _NoHost:
    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NameError(name)


def _runner() -> Runner:
    return Runner(policy=Policy(), limits=Limits(wall_time_s=None))


def _run(runner: Runner, code: str) -> RunResult:
    return asyncio.run(runner.run(code, bridge=_NoHost(), host_names=()))


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the cell cache parsed, in order."""
    seen: list[str] = []
    parse = _cellcache.parse_cell

    def counting(source: str, filename: str) -> Any:
        seen.append(source)
        return parse(source, filename)

    monkeypatch.setattr(_cellcache, "parse_cell", counting)
    return seen


def test_a_repeated_cell_is_parsed_once_and_runs_each_time(parses: list[str]) -> None:
    runner = _runner()
    values = [_run(runner, "n = n + 1 if 'n' in dir() else 1\nn").value for _ in range(3)]
    assert values == [1, 2, 3]
    assert len(parses) == 1


def test_each_run_of_a_cached_cell_reports_errors_under_its_own_cell_name(parses: list[str]) -> None:
    runner = _runner()
    code = "def f():\n    return 1 / 0\nf()"
    first, second = _run(runner, code), _run(runner, code)
    assert len(parses) == 1
    assert first.error is not None and second.error is not None
    assert (first.error.cell, second.error.cell) == ("<cell-1>", "<cell-2>")
    # The function's own frame (a nested code object) is renamed too, and its line is found in linecache.
    assert 'File "<cell-2>", line 2, in f' in second.error.traceback_text
    assert "return 1 / 0" in second.error.traceback_text
    assert "<cell-1>" not in second.error.traceback_text


def test_the_future_flags_in_force_are_part_of_the_key(parses: list[str]) -> None:
    runner = _runner()
    code = "def g(x: NotDefined) -> int:\n    return 1\ng(0)"
    assert _run(runner, code).error is not None  # the annotation is evaluated at definition: NameError
    assert _run(runner, "from __future__ import annotations").error is None
    assert _run(runner, code).value == 1  # compiled again under the new flag, not taken from the cache
    assert parses.count(code) == 2


def test_blocked_cells_are_checked_every_time(parses: list[str]) -> None:
    runner = _runner()
    for _ in range(2):
        assert isinstance(_run(runner, "import os").error, PolicyError)
    assert len(parses) == 2


def test_definitions_of_a_cached_cell_are_still_recorded() -> None:
    runner = _runner()
    _run(runner, "x = 1")
    _run(runner, "def h():\n    return 2")
    _run(runner, "del h")
    _run(runner, "def h():\n    return 2")  # from the cache: still recorded as the definition of h
    assert runner.definitions.sources() == ["def h():\n    return 2"]


def test_the_cache_is_bounded(parses: list[str]) -> None:
    runner = _runner()
    cells = [f"v = {i}" for i in range(_cellcache.MAX_CELLS + 1)]
    for code in cells:
        _run(runner, code)
    _run(runner, cells[-1])  # still cached
    _run(runner, cells[0])  # the oldest went: parsed again
    assert len(parses) == len(cells) + 1
    long_cell = "w = 0" + " " * _cellcache.MAX_CELL_CHARS
    _run(runner, long_cell)
    _run(runner, long_cell)
    assert parses.count(long_cell) == 2  # too long to keep
