"""What the host does to rebuild a run's value is bounded by what it is willing to build, not by what a worker says."""

from __future__ import annotations

import json

import pytest

from snapcell import Pool
from snapcell.wire import MAX_FRAME_COLUMNS, MalformedMessage, ScriptValue, decode

pandas = pytest.importorskip("pandas")


def _forged_frame(columns: int) -> bytes:
    """A run's reply whose value is a one-row frame of ``columns`` columns, as a compromised worker could write it."""
    tag = {"$df": [[f"c{i}" for i in range(columns)], {"$r": [0, 1, 1]}, None, [[i] for i in range(columns)], "df"]}
    return json.dumps({"op": "ran", "value": tag}).encode()


def test_a_forged_frame_of_40000_columns_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    real = pandas.DataFrame

    def counting(data: object = None, *args: object, **kwargs: object) -> object:
        built.append(len(data) if isinstance(data, dict) else 0)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(pandas, "DataFrame", counting)
    with pytest.raises((MalformedMessage, ValueError), match="columns"):
        decode(_forged_frame(40_000))
    assert built == []
    assert list(decode(_forged_frame(3))["value"].columns) == ["c0", "c1", "c2"]  # a small one is still built


def test_an_honest_frame_wider_than_the_bound_comes_back_as_its_repr() -> None:
    wide = MAX_FRAME_COLUMNS + 1
    with Pool("memory://") as pool, pool.checkout() as session:
        value = session.feed_run(f"import pandas as pd\npd.DataFrame({{f'c{{i}}': [i] for i in range({wide})}})")
        narrow = session.feed_run("pd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert isinstance(value, ScriptValue) and value.type_name == "pandas.DataFrame"
    assert isinstance(narrow, pandas.DataFrame) and narrow.shape == (2, 2)
