"""The namespace summary's size of a DataFrame: pandas' own figure, without the Series pandas builds for it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from snapcell.interpreter._summary import _frame_size, summarize_namespace

FRAMES = {
    "mixed": lambda: pd.DataFrame(
        {"id": range(1000), "name": [f"row-{i}" for i in range(1000)], "v": [i * 0.5 for i in range(1000)]}
    ),
    "one block": lambda: pd.DataFrame(np.zeros((50, 4))),
    "multi-index": lambda: pd.DataFrame(
        {"a": [1, 2, 3], "b": [1.0, 2.0, 3.0]}, index=pd.MultiIndex.from_tuples([(1, "a"), (2, "b"), (3, "c")])
    ),
    "extension": lambda: pd.DataFrame(
        {
            "c": pd.Categorical(["x", "y", "x"]),
            "t": pd.to_datetime(["2020-01-01"] * 3).tz_localize("UTC"),
            "s": pd.array(["a", None, "c"], dtype="string"),
            "i": pd.array([1, None, 3], dtype="Int64"),
            "sparse": pd.arrays.SparseArray([0, 0, 1]),
        }
    ),
    "empty": lambda: pd.DataFrame(),
    "transposed": lambda: pd.DataFrame({"x": [1, 2], "y": ["a", "b"]}).T,
}


@pytest.mark.parametrize("make", FRAMES.values(), ids=list(FRAMES))
def test_frame_size_is_pandas_memory_usage(make: Any) -> None:
    frame = make()
    assert _frame_size(frame) == int(frame.memory_usage(index=True, deep=False).sum())


def test_summary_does_not_call_memory_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = FRAMES["mixed"]()
    expected = int(frame.memory_usage(index=True, deep=False).sum())

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("memory_usage called")

    monkeypatch.setattr(pd.DataFrame, "memory_usage", refuse)
    assert summarize_namespace({"df": frame}) == f"1 variable, {expected / 1024:.1f} KiB"


def test_frame_without_a_block_manager_is_measured_by_pandas() -> None:
    class Odd(pd.DataFrame):
        calls = 0

        def memory_usage(self, index: bool = True, deep: bool = False) -> pd.Series:
            Odd.calls += 1
            return pd.Series([7, 5])

    frame = Odd({"a": [1, 2]})
    object.__setattr__(frame, "_mgr", None)
    assert _frame_size(frame) == 12
    assert Odd.calls == 1
