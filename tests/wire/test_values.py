"""A run's value crosses from the worker as faithfully as plain data allows, and the host stays safe."""

from __future__ import annotations

import collections
import datetime
import decimal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from snapcell import Limits, Policy, Pool, Session
from snapcell.wire import ScriptValue, _values
from snapcell.wire._values import Tagged
from snapcell.wire._wire import MalformedMessage, decode, encode

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")

DATA = Policy(extra_modules=frozenset({"numpy", "pandas"}))


MODES: dict[int, str] = {}


@pytest.fixture(scope="module", params=["inline", "process"])
def data_pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    with Pool("memory://", isolation=request.param, policy=DATA) as pool:
        MODES[id(pool)] = request.param
        yield pool


def _inline(pool: Pool) -> bool:
    return MODES[id(pool)] == "inline"


@pytest.fixture(scope="module")
def data_session(data_pool: Pool) -> Iterator[Session]:
    """One session per mode for the value checks (a checkout costs a worker start in process mode)."""
    with data_pool.checkout() as session:
        yield session


CASES = [
    ("(1, 'a', (2.5, None))", (1, "a", (2.5, None))),
    ("{1, 2, 3}", {1, 2, 3}),
    ("frozenset({'a', 'b'})", frozenset({"a", "b"})),
    ("[{(1, 2)}, frozenset()]", [{(1, 2)}, frozenset()]),
    ("3 + 4j", 3 + 4j),
    ("range(2, 20, 3)", range(2, 20, 3)),
    ("b'\\x00raw'", b"\x00raw"),
    ("import decimal\ndecimal.Decimal('12.50')", decimal.Decimal("12.50")),
    ("import datetime\ndatetime.date(2024, 2, 29)", datetime.date(2024, 2, 29)),
    ("{1: 'one', (2, 3): 'pair', None: 0}", {1: "one", (2, 3): "pair", None: 0}),
    ("import collections\ncollections.Counter('abracadabra')", dict(collections.Counter("abracadabra"))),
    ("import collections\nP = collections.namedtuple('P', 'x y')\nP(1, 2)", (1, 2)),
    ("import numpy as np\nnp.int64(7)", 7),
    ("import numpy as np\nnp.float32(0.5)", 0.5),
    ("import numpy as np\nnp.bool_(True)", True),
    ("import numpy as np\n{'mean': np.float64(2.5), 'n': np.int32(4)}", {"mean": 2.5, "n": 4}),
    ("{'$t': 1, 'k': {'$set': [1]}}", {"$t": 1, "k": {"$set": [1]}}),
]


@pytest.mark.parametrize(("code", "expected"), CASES, ids=[c for c, _ in CASES])
def test_plain_values_cross_as_themselves(data_pool: Pool, data_session: Session, code: str, expected: object) -> None:
    result = data_session.run(code)
    assert result.error is None
    assert result.value == expected
    if not _inline(data_pool):
        assert type(result.value) is type(expected)


def test_a_zoned_datetime_keeps_its_instant_and_offset(data_session: Session) -> None:
    result = data_session.run(
        "import datetime, zoneinfo\ndatetime.datetime(2024, 7, 1, 9, 30, tzinfo=zoneinfo.ZoneInfo('Europe/Paris'))"
    )
    expected = datetime.datetime(2024, 7, 1, 7, 30, tzinfo=datetime.UTC)
    assert result.value == expected and result.value.utcoffset() == datetime.timedelta(hours=2)


def test_numpy_arrays_are_rebuilt_from_their_buffers(data_session: Session) -> None:
    session = data_session
    session.run("import numpy as np")
    ints = session.run("np.arange(12, dtype='int32').reshape(3, 4)[:, 1:]").value  # not contiguous
    dates = session.run("np.array(['2024-01-01', '2024-03-01'], dtype='datetime64[D]')").value
    text = session.run("np.array(['ab', 'c'])").value
    assert ints.dtype == np.int32 and ints.shape == (3, 3) and ints.tolist() == [[1, 2, 3], [5, 6, 7], [9, 10, 11]]
    ints[0, 0] = 100  # writable, like an array made on the host
    assert dates.dtype == np.dtype("datetime64[D]") and str(dates[1]) == "2024-03-01"
    assert text.tolist() == ["ab", "c"]


def test_dataframes_and_series_are_rebuilt(data_session: Session) -> None:
    session = data_session
    session.run(
        "import pandas as pd\n"
        "df = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0], "
        "'day': pd.to_datetime(['2024-01-01', '2024-01-02'])}, index=['a', 'b'])"
    )
    frame = session.run("df").value
    column = session.run("df['temp']").value
    summary = session.run("df.describe()").value
    pd.testing.assert_frame_equal(
        frame,
        pd.DataFrame(
            {"city": ["Oslo", "Lima"], "temp": [3.5, 19.0], "day": pd.to_datetime(["2024-01-01", "2024-01-02"])},
            index=["a", "b"],
        ),
    )
    pd.testing.assert_series_equal(column, pd.Series([3.5, 19.0], index=["a", "b"], name="temp"))
    assert summary.loc["mean", "temp"] == pytest.approx(11.25)


def test_objects_of_script_classes_come_back_as_script_values(data_pool: Pool, data_session: Session) -> None:
    code = (
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class Point:\n    x: int\n    y: int\n"
        "class Box:\n    def __repr__(self):\n        return 'Box()'\n"
        "{'p': Point(1, 2), 'boxes': [Box()], 'f': len}"
    )
    value = data_session.run(code).value
    if _inline(data_pool):
        assert repr(value["p"]) == "Point(x=1, y=2)" and type(value["p"]).__name__ == "Point"
        return
    assert value == {
        "p": ScriptValue("Point", "Point(x=1, y=2)"),
        "boxes": [ScriptValue("Box", "Box()")],
        "f": ScriptValue("builtin_function_or_method", "<built-in function len>"),
    }
    assert repr(value["p"]) == "Point(x=1, y=2)"


def test_object_arrays_and_fractions_are_script_values_in_process_mode(data_pool: Pool, data_session: Session) -> None:
    objects = data_session.run("import numpy as np\nnp.array([{'a': 1}, None], dtype=object)").value
    fraction = data_session.run("import fractions\nfractions.Fraction(1, 3)").value
    if _inline(data_pool):  # the objects themselves
        assert objects.dtype == object and objects[0] == {"a": 1} and fraction == __import__("fractions").Fraction(1, 3)
        return
    assert objects == ScriptValue("numpy.ndarray", "array([{'a': 1}, None], dtype=object)")
    assert fraction == ScriptValue("fractions.Fraction", "Fraction(1, 3)")


def test_the_value_budget_holds_for_arrays(data_pool: Pool, data_session: Session) -> None:
    limits = Limits(max_value_bytes=64 * 1024)
    big = data_session.run("import numpy as np\nnp.zeros(100_000)", limits=limits)
    small = data_session.run("np.zeros(100)", limits=limits)
    if _inline(data_pool):  # no boundary, no budget: the array itself
        assert big.value.shape == (100_000,)
        return
    assert big.value is None and any("max_value_bytes" in note for note in big.notes)
    assert big.value_repr is not None and big.value_repr.startswith("array(")
    assert small.value.tolist() == [0.0] * 100


# ------------------------------------------------------------- host safety


def _message(value: object) -> bytes:
    return encode({"op": "ran", "value": value})


@pytest.mark.parametrize(
    "payload",
    [
        ["|O8", [1], b"\x00" * 8, ""],  # object dtype: would unpickle nothing, but is never built
        ["<i8", [2], b"\x00" * 8, ""],  # shape says 16 bytes, data has 8
        ["<i8,<i8", [1], b"\x00" * 16, ""],  # structured dtype string
        ["<i8", [-1], b"\x00" * 8, ""],
        ["<i8", [1] * 40, b"\x00" * 8, ""],  # too many dimensions
    ],
)
def test_the_host_refuses_arrays_it_cannot_check(payload: list[object]) -> None:
    with pytest.raises(MalformedMessage):
        decode(_message(Tagged(("$nd", payload))))


def test_colliding_set_members_are_refused_before_the_set_is_built() -> None:
    # Multiples of 2**61 - 1 all hash to 0: a set of them costs quadratic time to build.
    colliding = [k * (2**61 - 1) for k in range(1, 500)]
    assert len({hash(k) for k in colliding}) == 1
    with pytest.raises(MalformedMessage, match="share a hash"):
        decode(_message(Tagged(("$set", colliding))))
    with pytest.raises(MalformedMessage, match="share a hash"):
        decode(_message(Tagged(("$kv", [[k, 0] for k in colliding]))))
    assert decode(_message(Tagged(("$set", list(range(500))))))["value"] == set(range(500))


def test_script_values_never_run_script_code_on_the_host(data_pool: Pool, data_session: Session) -> None:
    code = (
        "class Loud:\n"
        "    def __repr__(self):\n        return 'Loud()'\n"
        "    def __eq__(self, other):\n        raise SystemExit('ran on the host')\n"
        "    __hash__ = object.__hash__\n"
        "[Loud(), {Loud()}]"
    )
    value = data_session.run(code).value
    if _inline(data_pool):  # the objects themselves (comparing them would run their __eq__)
        assert repr(value[0]) == "Loud()" and type(value[0]).__name__ == "Loud"
        return
    assert value == [ScriptValue("Loud", "Loud()"), {ScriptValue("Loud", "Loud()")}]
    assert all(type(v) in (ScriptValue, set) for v in value)


def test_a_host_that_cannot_import_pandas_gets_script_values(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = Tagged(("$df", [["a"], Tagged(("$r", [0, 1, 1])), None, [[1]], "   a\n0  1"]))
    array = Tagged(("$nd", ["<i8", [1], b"\x01" + b"\x00" * 7, "array([1])"]))
    monkeypatch.setattr(_values, "_unavailable", set())
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an import of a module that is not installed meets
    monkeypatch.setitem(sys.modules, "numpy", None)
    value = decode(_message([frame, array]))["value"]
    assert value == [ScriptValue("pandas.DataFrame", "   a\n0  1"), ScriptValue("numpy.ndarray", "array([1])")]


# A host process that never imported numpy or pandas: they are imported when a value of theirs arrives, not before.
FRESH_HOST = """
import sys
from snapcell.wire._values import Tagged, imports_library
from snapcell.wire._wire import decode, encode

plain = decode(encode({"op": "ran", "value": [1, "a", (2.5,)]}))["value"]
before = sorted(m for m in ("numpy", "pandas") if m in sys.modules)
frame = Tagged(("$df", [["a"], Tagged(("$r", [0, 2, 1])), None, [[1, 2]], "df"]))
array = Tagged(("$nd", ["<i8", [2], bytes(16), "array"]))
message = encode({"op": "ran", "value": [frame, array]})
first = imports_library(message)  # the host decodes such a message off its event loop
value = decode(message)["value"]
print(before, first, imports_library(message), [type(v).__name__ for v in value], value[0]["a"].tolist())
"""


def test_a_host_that_has_not_imported_numpy_or_pandas_rebuilds_their_values() -> None:
    done = subprocess.run([sys.executable, "-c", FRESH_HOST], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == "[] True False ['DataFrame', 'ndarray'] [1, 2]".split()
