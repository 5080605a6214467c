"""Round-trips: dump in this process, restore in a fresh interpreter; plus property-based plain-data round-trips."""

from __future__ import annotations

import keyword
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapcell import Pool
from snapcell.checkpoint import Keyring
from snapcell.checkpoint._format import SectionKind, parse_container
from tests.checkpoint.helpers import DATA_POLICY, KEY, load_in_child

pytest.importorskip("numpy")
pytest.importorskip("pandas")

FRAME_SRC = """pd.DataFrame({
    "i": [1, 2, 3],
    "f": [0.5, float("nan"), 2.5],
    "s": ["a", "b", "c"],
    "t": pd.to_datetime(["2026-01-01", "2026-02-01", "2026-03-01"]),
    "c": pd.Categorical(["x", "y", "x"]),
})"""

TURN_1 = (
    """
import dataclasses
import enum
import functools

BASE = 1
def add_base(x):
    return x + BASE

double = lambda y: y * 2

def make_adder(n):
    def adder(z):
        return z + n
    return adder
add10 = make_adder(10)

class Animal:
    sound = "..."
    def __init__(self, name):
        self.name = name
    def speak(self):
        return f"{self.name} says {self.sound}"

class Dog(Animal):
    sound = "woof"
    def speak(self):
        return super().speak() + "!"
rex = Dog("rex")

@dataclasses.dataclass
class Point:
    x: int
    y: int = 0
    tags: list = dataclasses.field(default_factory=list)
    def norm1(self):
        return abs(self.x) + abs(self.y)
pt = Point(3, -4, ["a"])

class Color(enum.Enum):
    RED = 1
    GREEN = 2
fav = Color.GREEN

@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
fib(20)

shared = [1, 2, 3]
alias = shared
pair = {"left": shared, "right": shared}
loop = [1]
loop.append(loop)
d1 = {"name": "d1"}
d2 = {"name": "d2", "peer": d1}
d1["peer"] = d2

def helper():
    return "old helper"
def call_helper():
    return helper()
def uses_open():
    return open("/etc/hostname").read()
def fails_later(x):
    y = x * 2
    return y / 0

import numpy as np
import pandas as pd
small = np.arange(12, dtype=np.int32).reshape(3, 4)
big = np.random.default_rng(0).random(20_000)
big_sum = float(big.sum())
frame = """
    + FRAME_SRC
    + "\n"
)

CHECKS = (
    """{
    "add_base": add_base(1),
    "lambda": double(21),
    "closure": add10(5),
    "inheritance": [rex.speak(), Dog("fido").speak(), isinstance(rex, Animal), issubclass(Dog, Animal)],
    "dataclass": [pt.x, pt.y, pt.tags, pt.norm1(), repr(pt), pt == Point(3, -4, ["a"]), Point(1).tags],
    "enum": [fav is Color.GREEN, fav.name, fav.value, Color(1).name, [c.name for c in Color]],
    "lru_cache_before": fib.cache_info().currsize,
    "lru_cache_value": fib(30),
    "lru_cache_after": fib.cache_info().currsize,
    "shared": [alias is shared, pair["left"] is pair["right"], pair["left"] is shared],
    "recursive_list": [loop[1] is loop, len(loop)],
    "recursive_dicts": [d1["peer"] is d2, d2["peer"] is d1, d1["peer"]["peer"] is d1],
    "np_small": [small.tolist(), str(small.dtype), list(small.shape), bool(small.flags.writeable)],
    "np_big": [bool(big.flags.writeable), float(big.sum()) == big_sum, list(big.shape), str(big.dtype)],
    "frame": [frame.equals("""
    + FRAME_SRC
    + """), {k: str(v) for k, v in frame.dtypes.items()}],
}"""
)

MUTATE = """
small[0, 0] = 99
big[0] = 5.0
frame.loc[0, "f"] = 9.5
[int(small[0, 0]), float(big[0]), float(frame.loc[0, "f"])]
"""

TRAPS = """
BASE = 100
def helper():
    return "new helper"
[add_base(1), call_helper()]
"""


@pytest.fixture(scope="module")
def restored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Dump TURN_1 here, then restore it in a child interpreter and run the checks, mutations and traps there."""
    root = tmp_path_factory.mktemp("roundtrip")
    store = f"file://{root}"
    with Pool(store, signing_keys=[KEY], policy=DATA_POLICY, isolation="inline") as pool, pool.checkout() as session:
        session.feed_run(TURN_1)
        checkpoint_id = session.dump()
        manifest = session.manifest
        blob = pool.store.get(Keyring([KEY]).parse_id(checkpoint_id).storage_key)
    results = load_in_child(store, checkpoint_id, [CHECKS, MUTATE, TRAPS, "uses_open()", "fails_later(1)"])
    for result in results[:3]:
        assert result["error"] is None, result
    body = Keyring([KEY]).verify(blob, Keyring([KEY]).parse_id(checkpoint_id))
    return {
        "checks": results[0]["value"],
        "mutate": results[1]["value"],
        "traps": results[2]["value"],
        "open": results[3],
        "traceback": results[4],
        "manifest": manifest,
        "container": parse_container(body),
    }


def test_functions_lambdas_and_closures(restored: dict[str, Any]) -> None:
    checks = restored["checks"]
    assert (checks["add_base"], checks["lambda"], checks["closure"]) == (2, 42, 15)


def test_classes_with_inheritance_and_instances(restored: dict[str, Any]) -> None:
    assert restored["checks"]["inheritance"] == ["rex says woof!", "fido says woof!", True, True]


def test_dataclasses(restored: dict[str, Any]) -> None:
    assert restored["checks"]["dataclass"] == [3, -4, ["a"], 7, "Point(x=3, y=-4, tags=['a'])", True, []]


def test_enums_keep_identity(restored: dict[str, Any]) -> None:
    assert restored["checks"]["enum"] == [True, "GREEN", 2, "RED", ["RED", "GREEN"]]


def test_lru_cache_functions_work_with_an_empty_cache(restored: dict[str, Any]) -> None:
    checks = restored["checks"]
    assert checks["lru_cache_before"] == 0
    assert checks["lru_cache_value"] == 832040
    assert checks["lru_cache_after"] == 31


def test_shared_references_survive(restored: dict[str, Any]) -> None:
    assert restored["checks"]["shared"] == [True, True, True]


def test_recursive_structures(restored: dict[str, Any]) -> None:
    assert restored["checks"]["recursive_list"] == [True, 2]
    assert restored["checks"]["recursive_dicts"] == [True, True, True]


def test_numpy_arrays_come_back_equal_and_writable(restored: dict[str, Any]) -> None:
    checks = restored["checks"]
    assert checks["np_small"] == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], "int32", [3, 4], True]
    assert checks["np_big"] == [True, True, [20_000], "float64"]
    assert restored["mutate"] == [99, 5.0, 9.5]


def test_large_numpy_buffer_goes_out_of_band(restored: dict[str, Any]) -> None:
    container = restored["container"]
    buffers = [s for s in container.sections if s.kind is SectionKind.BUFFER]
    pickles = [s for s in container.sections if s.kind in (SectionKind.STREAM, SectionKind.FRAME_BLOB)]
    assert any(s.raw_size == 20_000 * 8 for s in buffers)
    assert pickles and all(s.raw_size < 20_000 * 8 for s in pickles)


def test_pandas_dataframe(restored: dict[str, Any]) -> None:
    equal, dtypes = restored["checks"]["frame"]
    assert equal is True
    assert dtypes["i"] == "int64" and dtypes["f"] == "float64" and dtypes["c"] == "category"
    assert dtypes["t"].startswith("datetime64")


def test_turn_one_functions_see_turn_two_globals_and_helpers(restored: dict[str, Any]) -> None:
    assert restored["traps"] == [101, "new helper"]


def test_restored_functions_use_the_policy_builtins(restored: dict[str, Any]) -> None:
    # The policy's stand-in answers, not the host's real open().
    assert restored["open"]["error"] == "PolicyError"
    assert "open() is not allowed" in restored["open"]["message"]


def test_restored_tracebacks_show_lines_of_earlier_cells(restored: dict[str, Any]) -> None:
    result = restored["traceback"]
    assert result["error"] == "ZeroDivisionError"
    assert "return y / 0" in result["traceback"]
    assert "snapcell" not in result["traceback"]


def test_manifest_lists_variables_with_types(restored: dict[str, Any]) -> None:
    infos = {v.name: v for v in restored["manifest"].variables}
    assert infos["rex"].type_name == "Dog"
    assert infos["small"].type_name == "numpy.ndarray"
    assert infos["big"].size_bytes >= 20_000 * 8
    assert restored["manifest"].dropped == []


# ------------------------------------------------------------- property-based plain data

_scalars = (
    st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.none()
    | st.booleans()
)
_hashables = st.integers() | st.text(max_size=10) | st.booleans() | st.none() | st.binary(max_size=10)
_values = st.recursive(
    _scalars | st.sets(_hashables, max_size=5) | st.frozensets(_hashables, max_size=5),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5) | st.tuples(inner, inner)
    ),
    max_leaves=20,
)
_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n != "get_value"
)


def _same(a: Any, b: Any) -> bool:
    """Structural equality where NaN equals NaN and types must match."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.fixture(scope="module")
def plain_pool() -> Any:
    with Pool("memory://", signing_keys=[KEY], isolation="inline") as pool:
        yield pool


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(namespace=st.dictionaries(_names, _values, max_size=8))
def test_plain_data_namespaces_round_trip(plain_pool: Pool, namespace: dict[str, Any]) -> None:
    names = sorted(namespace)
    with plain_pool.checkout() as first:
        # Values reach the script through a host function, so they never go through source text.
        for name, value in namespace.items():
            first.feed_run(f"{name} = get_value()", external_lookup={"get_value": lambda value=value: value})
        checkpoint_id = first.dump()
    with plain_pool.checkout() as second:
        second.load_session(checkpoint_id)
        restored = second.feed_run("(" + "".join(f"{name}, " for name in names) + ")")
        assert [v.name for v in second.manifest.variables] == list(namespace)
    for name, value in zip(names, restored, strict=True):
        assert _same(value, namespace[name]), name
