"""The work a dump does per variable stays bounded: verdicts per type, not per object; a pickle scanned once."""

from __future__ import annotations

import datetime
import re
import types
from typing import Any

import pandas as pd
import pytest

from snapcell import Policy
from snapcell.checkpoint import _frames, _pickle, dump_namespace
from snapcell.checkpoint._pickle import _pickle_part
from snapcell.runner._runner import checkpoint_rule

RULE = checkpoint_rule(Policy())  # numpy is not allowed: an array's pickle is refused


def _frame_names(dumped: Any) -> list[list[str]]:
    return [frame.names for frame in dumped.manifest.frames]


def test_the_identity_pass_takes_one_verdict_per_type_and_reads_no_library_class_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    df = pd.DataFrame(
        {"id": range(1000), "name": [f"row-{i}" for i in range(1000)], "v": [i * 0.5 for i in range(1000)]}
    )
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
    rows = [{"i": i, "name": f"row-{i}"} for i in range(200)]
    scanned: set[bytes] = set()

    def dump(n: int) -> Any:
        scans.clear()
        variables = {"rows": rows, "n": n, "arr": numpy.arange(3)}
        return dump_namespace(variables, namespace={}, created_at=0.0, rule=RULE, scanned=scanned)

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
        dump_namespace({"rows": list(range(100)), "n": 1}, namespace={}, created_at=0.0, rule=RULE)
    assert len(scans) == 4


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
    dumped = dump_namespace({**plain, **called}, namespace={}, created_at=0.0, rule=RULE, trial=failing_trial)
    assert sorted(v.name for v in dumped.manifest.variables) == sorted(plain)
    assert sorted(d.name for d in dumped.manifest.dropped) == sorted(called)
    assert all("would not restore" in d.reason for d in dumped.manifest.dropped)
    assert len(trials) == len(called)  # one part each: each value's first part that fails
