"""Ordinary values the checkpoint rule used to refuse: each survives a dump and a load in a fresh process.

A compiled pattern (``re._compile`` before), ``functools.partial`` of a builtin, the ``copy`` module and its
functions, a str-mixin Enum (``enum.Enum.__format__``), ``dataclasses.replace`` and a function annotated with
``typing.Optional`` (``_operator.getitem``). Dumped by one worker and loaded by a fresh one (process mode), and
loaded in a fresh interpreter (inline mode); each check must give what plain CPython gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from snapcell import Pool
from tests.checkpoint.helpers import KEY, load_in_child

TURN = r"""
import copy, dataclasses, enum, functools, re
from dataclasses import replace
from typing import Optional

EMAIL = re.compile(r'[\w.]+@([\w.]+)', re.IGNORECASE)
WORDS = re.compile(rb'\w+')
pow2 = functools.partial(pow, 2)
biggest = functools.partial(max, key=len)
deep = copy.deepcopy

class Color(str, enum.Enum):
    RED = 'red'
    BLUE = 'blue'

@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 0

def find(items: list[str], key: str) -> Optional[int]:
    return items.index(key) if key in items else None
"""

CHECKS = {
    "regex": "(EMAIL.search('Mail A.B@X.ORG now').group(1), EMAIL.flags == re.compile('', re.I).flags,"
    " WORDS.findall(b'a bc'))",
    "partial_of_builtin": "(pow2(10), pow2.func is pow, pow2.args, biggest(['a', 'abc', 'ab']))",
    "copy_module": "(copy.deepcopy({'a': [1]}), deep([1, [2]]), copy.copy([3]))",
    "str_enum": "(Color('red').name, Color.BLUE.value.upper(), Color.RED == 'red', f'{Color.RED}', str(Color.BLUE),"
    " repr(Color.RED))",
    "dataclass_replace": "(replace(Point(1), y=5) == Point(1, 5), repr(replace(Point(2, 3), x=0)))",
    "optional_annotation": "(find(['a', 'b'], 'b'), find([], 'z'), find.__annotations__['return'] == Optional[int],"
    " sorted(find.__annotations__))",
}


def _in_cpython() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(TURN, "<turn>", "exec", dont_inherit=True), namespace)  # not this module's __future__ annotations
    return {
        name: eval(compile(check, "<check>", "eval", dont_inherit=True), namespace) for name, check in CHECKS.items()
    }


def _json_like(value: Any) -> Any:
    """What a value looks like after the child's JSON (tuples become lists, bytes their repr)."""
    if isinstance(value, tuple | list):
        return [_json_like(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_like(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return repr(value)
    return value


@pytest.fixture(scope="module")
def restored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Dump TURN in one worker; load it in a fresh worker, and in a fresh interpreter; run every check in both."""
    root: Path = tmp_path_factory.mktemp("widened")
    store = f"file://{root}"
    with Pool(store, signing_keys=[KEY], isolation="process") as pool:
        with pool.checkout() as first:
            first.feed_run(TURN)
            checkpoint_id = first.dump()
            manifest = first.manifest
        assert manifest is not None and manifest.dropped == [], manifest
        with pool.checkout() as second:
            second.load_session(checkpoint_id)
            process = {}
            for name, check in CHECKS.items():
                result = second.run(check)
                assert result.error is None and not result.notes, (name, result.error, result.notes)
                process[name] = result.value
    child = load_in_child(store, checkpoint_id, list(CHECKS.values()), modules=())
    inline = {}
    for name, result in zip(CHECKS, child, strict=True):
        assert result["error"] is None and not result["notes"], (name, result)
        inline[name] = result["value"]
    return {"process": process, "inline": inline}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_value_survives_a_fresh_worker(restored: dict[str, dict[str, Any]], name: str) -> None:
    assert restored["process"][name] == _in_cpython()[name]


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_value_survives_a_fresh_interpreter(restored: dict[str, dict[str, Any]], name: str) -> None:
    assert restored["inline"][name] == _json_like(_in_cpython()[name])
