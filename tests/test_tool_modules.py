"""Which heavy modules a turn's checkout asks for: those its code and its checkpoint's manifest name."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from snapcell import ConfigError, Pool
from snapcell.checkpoint import Manifest, VariableInfo
from snapcell.tool._modules import ModuleHints
from snapcell.wire import heavy_modules_named


def _manifest(**fields: Any) -> Manifest:
    return Manifest(**{"created_at": 0.0, "python": "3.11", "libraries": {}, "variables": [], **fields})


def test_only_whole_names_of_heavy_modules_count() -> None:
    assert heavy_modules_named(["import pandas as pd", "x = 1"]) == {"pandas"}
    assert heavy_modules_named(["numpy.ndarray", "pandas.core.frame.DataFrame"]) == {"numpy", "pandas"}
    assert heavy_modules_named(["numpyish = 1", "my_pandas_notes = []", ""]) == frozenset()


def test_a_checkpoint_is_hinted_by_what_its_manifest_names_and_the_turns_code() -> None:
    hints = ModuleHints()
    plain = _manifest(variables=[VariableInfo(name="rows", type_name="list", size_bytes=10, serializer="cloudpickle")])
    frame = _manifest(
        variables=[VariableInfo(name="df", type_name="pandas.core.frame.DataFrame", size_bytes=10, serializer="dill")]
    )
    imports = _manifest(definitions=["import numpy as np"])
    for checkpoint_id, manifest in ((b"plain", plain), (b"frame", frame), (b"imports", imports)):
        hints.learn(SimpleNamespace(checkpoint_id=checkpoint_id, manifest=manifest))  # type: ignore[arg-type]
    assert hints.hint(b"plain", "rows.append(1)") == frozenset()
    assert hints.hint(b"plain", "import pandas") == {"pandas"}
    assert hints.hint(b"frame", "df.head()") == {"pandas"}
    assert hints.hint(b"imports", "np.zeros(3)") == {"numpy"}
    assert hints.hint(None, "1 + 1") == frozenset()  # an empty session: only its code counts
    assert hints.hint(b"never seen here", "1 + 1") is None  # unknown: the pool's default worker


def test_the_hints_forget_the_least_recently_used_checkpoints() -> None:
    hints = ModuleHints(max_kept=2)
    for checkpoint_id in (b"a", b"b"):
        hints.learn(SimpleNamespace(checkpoint_id=checkpoint_id, manifest=_manifest()))  # type: ignore[arg-type]
    assert hints.hint(b"a", "") == frozenset()  # used: b is now the oldest
    hints.learn(SimpleNamespace(checkpoint_id=b"c", manifest=_manifest()))  # type: ignore[arg-type]
    assert hints.hint(b"b", "") is None
    assert hints.hint(b"a", "") == hints.hint(b"c", "") == frozenset()


@pytest.mark.parametrize("hint", ["numpy", [1], 3])
def test_a_hint_that_is_not_a_collection_of_names_is_refused(hint: Any) -> None:
    with Pool("memory://", isolation="inline") as pool, pytest.raises(ConfigError, match="modules_hint"):
        with pool.checkout(modules_hint=hint):
            pass
