"""Streams that change the host's state at an inline load (a compromised worker's dump, loaded in the host).

Two routes: globals that are the host's own mutable state (a library module's dict or list, the bound methods of
its shared ``random.Random``), which a plain call or an APPEND/SETITEM opcode changes in place; and ``BUILD`` on
what a call returned when that call hands back an existing object (an Enum member, one of its arguments).
"""

from __future__ import annotations

import dataclasses
import datetime
import html.entities
import json.encoder
import keyword
import pickle
import random
import re
from typing import Any

import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint import Keyring
from snapcell.checkpoint._findglobal import make_find_global
from snapcell.checkpoint._hoststate import makes_new_objects
from snapcell.checkpoint.scan import _scan, _scancalls, scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore

from .helpers import KEY, crafted_body, sign_and_store
from .test_unpickle_hostile import call, getattr_, glob, s, stream

RULE = checkpoint_rule(Policy())
MARK = "snapcell-host-state-canary"
# BUILD's state: (None, {MARK: 'yes'}), set with setattr on the target.
PATCH = b"N}" + s(MARK) + s("yes") + b"s\x86b"


def _int(value: int) -> bytes:
    return b"K" + bytes([value])


def _snapshot() -> tuple[Any, ...]:
    return (
        dict(json.encoder.ESCAPE_DCT),
        list(keyword.kwlist),
        dict(html.entities.html5),
        random.getstate(),
        [hasattr(obj, MARK) for obj in (re.IGNORECASE, json.JSONEncoder, re.RegexFlag, dataclasses._FIELD)],
    )


# Module-level state named as a global: changed by a call or by a container opcode.
STATE_STREAMS = {
    "setitem on a module dict": call(glob("operator", "setitem"), glob("json.encoder", "ESCAPE_DCT"), s(MARK), s("x")),
    "APPEND onto a module list": glob("keyword", "kwlist") + s(MARK) + b"a",
    "SETITEM onto a module dict": glob("html.entities", "html5") + s(MARK) + s("x") + b"s",
    "the shared Random's seed": call(glob("random", "seed"), _int(0)),
    "the shared Random's method in a partial": call(glob("functools", "partial"), glob("random", "shuffle")),
}
# BUILD on an existing object a call hands back.
BUILD_STREAMS = {
    "an Enum called with a value": call(glob("re", "RegexFlag"), _int(2)) + PATCH,
    "an Enum's __new__ through NEWOBJ": glob("re", "RegexFlag") + _int(2) + b"\x85\x81" + PATCH,
    "heappop of a list holding a class": (
        call(glob("heapq", "heappop"), b"](" + glob("json", "JSONEncoder") + b"e") + PATCH
    ),
    "a serializer's sentinel": (
        call(glob("cloudpickle.cloudpickle", "_get_dataclass_field_type_sentinel"), s("_FIELD")) + PATCH
    ),
    "a function returning its argument": (
        call(glob("statistics", "mode"), glob("json", "JSONEncoder") + b"\x85") + PATCH
    ),
}


@pytest.mark.parametrize("case", [*STATE_STREAMS, *BUILD_STREAMS])
def test_the_scan_refuses_it(case: str) -> None:
    before = _snapshot()
    refusal = scan_pickle(stream({**STATE_STREAMS, **BUILD_STREAMS}[case]), RULE)
    assert refusal is not None, case
    assert _snapshot() == before


@pytest.mark.parametrize("case", list(STATE_STREAMS))
def test_a_signed_checkpoint_holding_it_leaves_the_host_untouched_inline(case: str) -> None:
    """Signed without the host's scan (a key that signed it elsewhere): the loader's resolver refuses the global."""
    store = MemoryStore()
    before = _snapshot()
    checkpoint = sign_and_store(store, Keyring([KEY]), crafted_body(stream(STATE_STREAMS[case])))
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool, pool.checkout() as session:
        session.load_session(checkpoint)
        result = session.run("'x' in dir()")
    assert result.value is False
    assert _snapshot() == before


@pytest.mark.parametrize(
    ("module", "name"),
    [("json.encoder", "ESCAPE_DCT"), ("keyword", "kwlist"), ("html.entities", "html5"), ("random", "seed")],
)
def test_the_loader_s_resolver_refuses_host_state(module: str, name: str) -> None:
    find_global = make_find_global(RULE)
    with pytest.raises(Exception, match="state"):
        find_global(module, name)


def test_the_loader_s_getattr_refuses_host_state() -> None:
    getattr_ = make_find_global(RULE)("builtins", "getattr")
    with pytest.raises(Exception, match="state"):
        getattr_(keyword, "kwlist")
    with pytest.raises(Exception, match="state"):
        getattr_(random, "choice")


def test_ordinary_globals_still_resolve() -> None:
    find_global = make_find_global(RULE)
    assert find_global("json", "dumps") is json.dumps
    assert find_global("re", "RegexFlag") is re.RegexFlag
    assert find_global("random", "Random") is random.Random
    assert find_global("math", "sqrt") is __import__("math").sqrt
    assert find_global("builtins", "dict") is dict


def _module(name: str) -> bytes:
    return call(glob("cloudpickle.cloudpickle", "subimport"), s(name))


# Routes to the same state through what a call returned (the scan cannot name the object, so it refuses the use).
THROUGH_CALLS = {
    "an attrgetter called while loading": call(
        glob("operator", "setitem"),
        call(call(glob("operator", "attrgetter"), s("encoder.ESCAPE_DCT")), _module("json")),
        s(MARK),
        s("x"),
    ),
    "the guarded getattr called while loading": call(
        glob("snapcell.policy._guard", "guarded_getattr"), _module("keyword"), s("kwlist")
    )
    + s(MARK)
    + b"a",
    "the shared Random's seed read through getattr": call(getattr_(_module("random"), "seed"), _int(0)),
    "getattr of a module's list": getattr_(_module("keyword"), "kwlist") + s(MARK) + b"a",
    # ``min(([],))`` is the stream's own list, but the scan cannot tell it from a library's (an unimported module's
    # list through getattr): each container opcode path refuses it.
    "APPEND onto a looked-up list": call(glob("builtins", "min"), b"]\x85") + s(MARK) + b"a",
    "APPENDS of strings onto a looked-up list": call(glob("builtins", "min"), b"]\x85") + b"(" + s(MARK) + b"e",
    "APPENDS of numbers onto a looked-up list": call(glob("builtins", "min"), b"]\x85") + b"(K\x01K\x02e",
    "APPENDS of tuples onto a looked-up list": call(glob("builtins", "min"), b"]\x85") + b"(" + s(MARK) + b"\x85e",
    "BUILD on a looked-up value read back from the memo": call(glob("re", "RegexFlag"), _int(2))
    + b"\x940h\x00"
    + PATCH,
    "BUILD on a looked-up value read back through PUT": call(glob("re", "RegexFlag"), _int(2)) + b"q\x000h\x00" + PATCH,
    "copyreg's __newobj__ of an Enum": call(glob("copyreg", "__newobj__"), glob("re", "RegexFlag"), _int(2)) + PATCH,
}


@pytest.mark.parametrize("case", list(THROUGH_CALLS))
def test_the_scan_refuses_what_reaches_host_state_through_a_call(case: str) -> None:
    assert scan_pickle(stream(THROUGH_CALLS[case]), RULE) is not None, case


def test_foreign_values_in_the_memo_cost_a_bit_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dates are foreign (``date``'s own ``__new__``): memoized, each is one bit, not one of the memo's kept entries."""
    monkeypatch.setattr(_scan, "MAX_MEMO_KEPT", 4)
    monkeypatch.setattr(_scan, "_MAX_MEMO_STRINGS", 0)  # constants and argument tuples forgotten, as past the limit
    dates = [datetime.date(2026, 1, 1 + day) for day in range(20)]
    assert scan_pickle(pickle.dumps(dates, protocol=5), RULE) is None


class _Once(type):
    def __call__(cls, *_args: Any) -> Any:
        return SHARED


class _Shared(metaclass=_Once):
    pass


SHARED = object()


def test_only_builtin_new_and_type_s_call_make_new_objects() -> None:
    assert makes_new_objects(dict, called=True) and makes_new_objects(random.Random, called=True)
    assert makes_new_objects(_Shared, called=False)  # object.__new__
    assert not makes_new_objects(_Shared, called=True)  # its metaclass's call hands back a shared object
    assert not makes_new_objects(re.RegexFlag, called=False)
    assert not makes_new_objects(json.dumps, called=True)


def test_a_scan_tries_a_bounded_number_of_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each missing module a stream names would cost a search of the import path: a scan tries a few, no more."""
    attempts: list[str] = []
    real_import = _scancalls.importlib.import_module

    def counting_import(name: str) -> Any:
        attempts.append(name)
        return real_import(name)

    monkeypatch.setattr(_scancalls.importlib, "import_module", counting_import)
    body = b"".join(call(glob(f"json.missing{i}", "Thing"), _int(1)) + b"0" for i in range(1000))
    assert scan_pickle(stream(body + b"N"), RULE) is None
    assert 0 < len(attempts) <= _scancalls._MAX_IMPORTS
