"""The work a dump does per variable stays bounded: verdicts per type, not per object; a pickle scanned once."""

from __future__ import annotations

import collections
import datetime
import gc
import pickle
import re
import types
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcell import Policy
from snapcell.checkpoint import (
    DumpOptions,
    _frames,
    _pickle,
    dump_namespace,
    load_namespace,
    make_find_global,
    make_trial_load,
)
from snapcell.checkpoint._pickle import _pickle_part
from snapcell.checkpoint.helpers import rebuild_str_array
from snapcell.checkpoint.scan import _scan, _scanplain
from snapcell.checkpoint.scan._scan import scan_pickle_data
from snapcell.errors import ConfigError
from snapcell.interpreter._runner import checkpoint_rule

RULE = checkpoint_rule(Policy())  # numpy is not allowed: an array's pickle is refused
POLICY = Policy().with_modules(["numpy", "pandas"])
CHECKED = DumpOptions(rule=RULE)


def _frame_names(dumped: Any) -> list[list[str]]:
    return [frame.names for frame in dumped.manifest.frames]


def test_the_identity_pass_takes_one_verdict_per_type_and_reads_no_library_class_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One None keeps the text column pickled string by string (a column of strings alone goes as one joined text).
    names = [f"row-{i}" if i else None for i in range(1000)]
    df = pd.DataFrame({"id": range(1000), "name": names, "v": [i * 0.5 for i in range(1000)]})
    verdicts: list[type] = []
    internals: list[object] = []
    type_matters, add_internals = _frames._type_matters, _frames._add_internals
    monkeypatch.setattr(_frames, "_type_matters", lambda cls: verdicts.append(cls) or type_matters(cls))
    monkeypatch.setattr(_frames, "_add_internals", lambda v, inside: internals.append(v) or add_internals(v, inside))

    part = _pickle_part((df,), {})

    assert len(part.keep) > 1000  # the memo holds every string of the object column
    judged = {type(obj) for obj in part.keep} - _frames._ATOMS - {types.FunctionType}
    assert sorted(map(str, verdicts)) == sorted(map(str, judged))  # once per type, never per string
    assert internals == []  # pandas' classes go by reference: their dicts are not in the memo
    assert id(df) in part.ids


def test_a_script_class_still_keeps_its_own_dict_out_of_the_count() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("class K:\n    tag = []\nk1 = K()\nk2 = K()\n", namespace)
    dumped = dump_namespace({"k1": namespace["k1"], "k2": namespace["k2"]}, namespace=namespace, created_at=0.0)
    assert _frame_names(dumped) == [["k1"], ["k2"]]  # the class's own list does not merge its instances


def test_a_script_function_held_by_two_variables_keeps_them_together() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def f(x):\n    return x\nhandlers = {'h': f}\n", namespace)
    variables = {"f": namespace["f"], "handlers": namespace["handlers"], "other": [1]}
    dumped = dump_namespace(variables, namespace=namespace, created_at=0.0)
    assert _frame_names(dumped) == [["f", "handlers"], ["other"]]


def test_a_library_class_attribute_shared_by_two_variables_keeps_them_together() -> None:
    names = re.RegexFlag._member_names_  # a list in a library class's dict; the class itself goes by reference
    dumped = dump_namespace({"a": (re.RegexFlag, names), "b": names}, namespace={}, created_at=0.0)
    assert _frame_names(dumped) == [["a", "b"]]


def _count_scans(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Record the bytes of every scan a dump makes (of frames, with `scan_pickle_data`; of dill's, `scan_pickle`)."""
    scans: list[bytes] = []
    scan_pickle, scan_pickle_data = _pickle.scan_pickle, _pickle.scan_pickle_data
    monkeypatch.setattr(_pickle, "scan_pickle", lambda data, rule: scans.append(bytes(data)) or scan_pickle(data, rule))
    monkeypatch.setattr(
        _pickle, "scan_pickle_data", lambda data, rule: scans.append(bytes(data)) or scan_pickle_data(data, rule)
    )
    return scans


def test_a_pickle_that_passed_the_rule_is_not_scanned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    numpy = pytest.importorskip("numpy")
    scans = _count_scans(monkeypatch)
    # Dates: plain data (ints, dicts) is not scanned in the dump at all (the pickler says it is plain).
    rows = [{"i": datetime.date(2024, 1, 1 + i % 28), "name": f"row-{i}"} for i in range(200)]
    scanned: set[bytes] = set()

    def dump(n: int) -> Any:
        scans.clear()
        variables = {"rows": rows, "n": datetime.date(2024, 1, n), "arr": numpy.arange(3)}
        return dump_namespace(variables, namespace={}, created_at=0.0, options=CHECKED, scanned=scanned)

    first = dump(1)
    rows_pickle = next(data for data in scans if b"row-199" in data)
    assert len(scans) == 4  # rows, n, arr, and arr again by dill
    second = dump(2)
    assert rows_pickle not in scans  # unchanged: passed before under this rule
    assert len(scans) == 3  # n's new bytes; arr, refused, is scanned (and dropped) every time
    for dumped in (first, second):
        assert [d.name for d in dumped.manifest.dropped] == ["arr"]
        assert sorted(v.name for v in dumped.manifest.variables) == ["n", "rows"]
    dump(2)
    assert len(scans) == 2  # only arr, both ways


def test_without_a_scanned_set_every_pickle_is_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = _count_scans(monkeypatch)
    for _ in range(2):
        variables = {"rows": [datetime.date(2024, 1, 1)] * 100, "n": datetime.date(2024, 1, 2)}
        dump_namespace(variables, namespace={}, created_at=0.0, options=CHECKED)
    assert len(scans) == 4


def test_plain_data_is_not_scanned_in_the_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule refuses nothing in plain data: the dump takes its pickler's word (the host scans it to sign)."""
    scans = _count_scans(monkeypatch)
    rows = [{"id": i, "name": f"n{i}"} for i in range(5000)]  # cut into parts
    dumped = dump_namespace(
        {"rows": rows, "n": 1, "when": datetime.date(2024, 1, 1)}, namespace={}, created_at=0.0, options=CHECKED
    )
    assert len(scans) == 1 and b"datetime" in scans[0]
    assert len(dumped.manifest.variables) == 3


def test_only_frames_of_plain_data_go_without_a_trial_restore() -> None:
    """A frame of lists, dicts, strings and numbers restores (no global, no call); any other is restored to check.

    The trial here fails every frame it is given: what it is given is dropped, what is not given survives.
    """
    trials: list[bytes] = []

    def failing_trial(data: bytes, buffers: list[Any]) -> Any:
        trials.append(bytes(data))
        raise ValueError("would not restore")

    plain = {
        "rows": [{"id": i, "name": f"n{i}", "v": i * 0.5, "ok": i % 2 == 0} for i in range(3000)],
        "nested": ({1, 2}, frozenset({"a"}), b"raw", bytearray(b"ba"), 2**100, -(2**70), None, [[], {}, ()]),
        "text": "x" * 100_000,
    }
    called = {
        "when": datetime.date(2024, 1, 2),
        "flags": re.compile("a+"),
        "mixed": [{"id": i} for i in range(3000)] + [datetime.date(2024, 1, 3)],  # the last part names a class
    }
    dumped = dump_namespace(
        {**plain, **called}, namespace={}, created_at=0.0, options=DumpOptions(rule=RULE, trial=failing_trial)
    )
    assert sorted(v.name for v in dumped.manifest.variables) == sorted(plain)
    assert sorted(d.name for d in dumped.manifest.dropped) == sorted(called)
    assert all("would not restore" in d.reason for d in dumped.manifest.dropped)
    assert len(trials) == len(called)  # one part each: each value's first part that fails


_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**100), max_value=2**100),
        st.floats(),
        st.text(max_size=20),
        st.binary(max_size=20),
        st.sampled_from([1j, datetime.date(2024, 1, 2), len, collections.OrderedDict(a=1), bytearray(b"ba")]),
        st.builds(pickle.PickleBuffer, st.binary(max_size=10)),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=6),
        st.frozensets(st.integers(), max_size=4),
        st.builds(collections.Counter, st.dictionaries(st.text(max_size=3), st.integers(), max_size=3)),
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(value=_values)
def test_what_the_pickler_calls_plain_the_scan_finds_plain(value: object) -> None:
    """The dump takes its pickler's word that a pickle is plain data (no scan, no trial restore): it must hold."""
    part = _pickle_part((value,), {})
    refusal, plain = scan_pickle_data(part.data, lambda module: True)
    assert refusal is None
    if part.plain:
        assert plain


def test_the_pickler_calls_plain_only_exact_builtin_data() -> None:
    assert _pickle_part(([{"a": (1, 2.5, None)}, {"s"}, frozenset({b"b"})],), {}).plain
    assert _pickle_part((bytearray(b"x"),), {}).plain  # BYTEARRAY8
    for value in [1j, datetime.date(2024, 1, 2), collections.OrderedDict(), len, _pickle]:
        assert not _pickle_part(([1, {"k": value}],), {}).plain, value


def test_plain_data_too_deep_to_scan_is_still_dropped_alone() -> None:
    """The one refusal plain data can meet is a stack too deep to verify: a stream that long is scanned."""
    # One byte (NONE) per value, all on the stack; the depth is checked at the stream's frames (every 64 KiB).
    deep = (None,) * (_scan.PLAIN_UNREFUSED_BYTES + (1 << 17))
    dumped = dump_namespace({"deep": deep, "n": [1]}, namespace={}, created_at=0.0, options=CHECKED)
    assert [d.name for d in dumped.manifest.dropped] == ["deep"]
    assert [v.name for v in dumped.manifest.variables] == ["n"]


def test_a_dump_with_a_rule_compiles_the_scan_patterns_even_when_it_scans_nothing() -> None:
    """A worker's warm-up dump is plain data (not scanned): it must still build the patterns its first scan needs."""
    _scanplain._group_patterns.cache_clear()
    _scanplain._memoize_segments.cache_clear()
    dump_namespace({"x": [1]}, namespace={}, created_at=0.0, options=CHECKED)
    assert _scanplain._group_patterns.cache_info().currsize == 1
    assert _scanplain._memoize_segments.cache_info().currsize == 1


def test_the_memo_is_read_without_the_collector_which_is_back_on_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo's copy makes two objects per entry; collections they set off walked the whole namespace."""
    enabled: list[bool] = []
    original = _pickle.shared_ids

    def recording(*args: Any) -> Any:
        enabled.append(gc.isenabled())
        return original(*args)

    monkeypatch.setattr(_pickle, "shared_ids", recording)
    assert gc.isenabled()
    dump_namespace({"rows": [{"i": i} for i in range(3000)], "n": 1}, namespace={}, created_at=0.0)
    assert enabled and not any(enabled)
    assert gc.isenabled()

    def failing(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(_pickle, "shared_ids", failing)
    dumped = dump_namespace({"n": 1}, namespace={}, created_at=0.0)
    assert [v.serializer for v in dumped.manifest.variables] == ["dill"]  # the frame failed: dill's fallback
    assert gc.isenabled()


@pytest.mark.parametrize("length", [0, 1, 63, 64, 65, 1000])
def test_a_list_is_cut_into_slices_of_the_part_size_in_order(length: int) -> None:
    value = list(range(length))
    layout, parts = _frames.cut(value, 64)
    assert layout == "list" and [len(part) for part in parts] == [64] * (length // 64) + [length % 64] * (
        length % 64 > 0
    )
    assert [item for part in parts for item in part] == value
    layout, parts = _frames.cut(dict.fromkeys(value), 64)
    assert layout == "dict" and [key for part in parts for key, _ in part] == value


@pytest.mark.parametrize(
    "options", [{"on_unpicklable": "drop"}, {"blob_threshold_bytes": -1}, {"frame_blob_threshold_bytes": -1}]
)
def test_dump_options_are_checked_when_made(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        DumpOptions(**options)


def test_a_text_column_is_one_joined_text_not_a_pickle_and_memo_entry_per_row() -> None:
    """An object array of strings (a pandas text column) goes as one string: the memo, scan and restore stay small."""
    np = pytest.importorskip("numpy")
    df = pd.DataFrame({"name": [f"item-{i % 50}" for i in range(20_000)], "v": range(20_000)})
    grid = np.array([["a", "b\u00e9", "\ud800"], ["", "c", "dd"]], dtype=object)
    arrays = {
        "df": df,
        "grid": grid,
        "fortran": np.asfortranarray(grid),
        "held_nul": np.array(["a\x00b", "c"], dtype=object),  # holds the separator: pickled item by item
        "mixed": np.array(["a", 1, None], dtype=object),
    }
    part = _pickle_part((df,), {})
    assert len(part.keep) < 1000 and b"item-0\x00item-1\x00item-2" in part.data  # 20k rows, one text
    dumped = dump_namespace(arrays, namespace={}, created_at=0.0, options=DumpOptions(rule=checkpoint_rule(POLICY)))
    assert not dumped.manifest.dropped
    loaded = load_namespace(
        dumped.body,
        namespace={"__builtins__": {}},
        find_global=make_find_global(checkpoint_rule(POLICY), POLICY.find_global_overrides()),
        blobs=dumped.new_blobs,
    )
    assert not loaded.failed
    restored = loaded.variables
    pd.testing.assert_frame_equal(restored["df"], df)
    for name in ("grid", "fortran", "held_nul", "mixed"):
        value = restored[name]
        assert value.dtype == object and value.shape == arrays[name].shape and value.tolist() == arrays[name].tolist()
        assert value.flags.writeable and value.flags.f_contiguous == arrays[name].flags.f_contiguous
    assert scan_pickle_data(part.data, checkpoint_rule(POLICY))[0] is None


def test_variables_framed_together_are_scanned_together_not_each_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each variable is pickled alone to find what it shares; only the frames kept are scanned."""
    scans = _count_scans(monkeypatch)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def f(x):\n    return x\nhandlers = {'h': f}\nclass K:\n    pass\nk = K()\n", namespace)
    variables = {name: namespace[name] for name in ("f", "handlers", "K", "k")}
    dumped = dump_namespace(variables, namespace=namespace, created_at=0.0, options=CHECKED)
    assert _frame_names(dumped) == [["f", "handlers"], ["K"], ["k"]]
    assert len(scans) == 3  # the joint frame once, not f and handlers each as well


def test_a_refused_variable_of_a_group_is_dropped_alone_and_the_others_stay_together() -> None:
    np = pytest.importorskip("numpy")  # not allowed by RULE: a frame holding an array is refused
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def f(x):\n    return x\n", namespace)
    f = namespace["f"]
    shared: list[Any] = [f]
    variables = {"f": f, "handlers": {"h": f}, "with_array": (f, np.arange(3)), "log": shared, "again": shared}
    dumped = dump_namespace(variables, namespace=namespace, created_at=0.0, options=CHECKED)
    assert [d.name for d in dumped.manifest.dropped] == ["with_array"]
    assert "refuses" in dumped.manifest.dropped[0].reason
    assert _frame_names(dumped) == [["f", "handlers", "log", "again"]]


def test_the_trial_checks_a_string_array_as_the_load_does_without_making_its_strings() -> None:
    np = pytest.importorskip("numpy")
    trial = make_trial_load(make_find_global(checkpoint_rule(POLICY), POLICY.find_global_overrides()), {})
    part = _pickle_part((np.array(["a", "b", "c"], dtype=object),), {})
    (value,) = trial(part.data, [])
    assert value.shape == (3,) and value.dtype == object and value.tolist() == [None, None, None]
    two_strings = part.data.replace(b"a\x00b\x00c", b"a\x00b\x01c")  # same length: only the count is wrong
    with pytest.raises(ValueError):
        trial(two_strings, [])
    with pytest.raises(ValueError):
        rebuild_str_array("a\x00b\x01c", "\x00", (3,), False)  # the load refuses it alike
