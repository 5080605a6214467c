"""One rule for the scanner and the loader: no signed stream can call a method the script guard would refuse.

The attack: ``getattr('{0.__init__.__globals__[_os].environ}', 'format')(random.Random)``. ``getattr`` with a public
name passed the rule, its result was foreign, and calling a foreign value was not checked; the loader handed back
the raw ``str.format``, which walks attribute paths (the guard gives scripts a checked one instead). Signed by a
process-mode pool, the stream put the host's environment into a session variable when an inline pool loaded it.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint.scan import scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore

from .helpers import crafted_body, load_signed, refused_dump

RULE = checkpoint_rule(Policy())
TEMPLATE = "{0.__init__.__globals__[_os].environ}"


class _Read:
    """Pickles as ``getattr(owner, name)``: what the ``getattr`` helper gives back."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (self.owner, self.name))

    def __call__(self, *args: object) -> object:  # the pickler wants the callable of a reduce to be callable
        return getattr(self.owner, self.name)(*args)


class _CallOf:
    """Pickles as ``callable(*args)`` for a ``callable`` that is itself a pickled value."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def _stream(value: object) -> bytes:
    return pickle.dumps(value, protocol=5)


FORMAT_ATTACK = _stream(_CallOf(_Read(TEMPLATE, "format"), random.Random))
FORMAT_MAP_ATTACK = _stream(_CallOf(_Read("{x.__init__.__globals__}", "format_map"), {"x": random.Random}))
# Calling any other method a lookup handed back: a bound method of an existing object, run while loading.
METHOD_CALL = _stream(_CallOf(_Read([1, 2], "clear")))


@pytest.mark.parametrize("stream", [FORMAT_ATTACK, FORMAT_MAP_ATTACK, METHOD_CALL], ids=["format", "map", "method"])
def test_the_scanner_refuses_a_call_of_what_getattr_returned(stream: bytes) -> None:
    pickle.loads(stream)  # live for a plain unpickler: the attack works unprotected
    refusal = scan_pickle(stream, RULE)
    assert refusal is not None
    assert "getattr" in refusal.reason or "format" in refusal.reason, refusal


def test_the_host_never_signs_the_format_attack() -> None:
    refusal, stored = refused_dump(crafted_body(FORMAT_ATTACK))
    assert refusal.variable_names == ["x"] and stored == []


def test_the_inline_loader_refuses_the_format_attack_even_when_signed() -> None:
    """The loader's own rule (the one the scan applies) refuses the raw formatter, signed or not."""
    store = MemoryStore("one-rule")
    with Pool(store, isolation="inline", signing_keys=["checkpoint-tests-signing-key-0123456789"]) as pool:
        result = load_signed(pool, store, crafted_body(FORMAT_ATTACK))
    assert result.value is False  # x was not restored
    assert any("x" in note and "format" in note for note in result.notes), result.notes


def test_ordinary_values_that_pickle_through_getattr_still_pass() -> None:
    import re

    assert scan_pickle(_stream(_Read(str, "upper")), RULE) is None  # a method read and kept, not called
    assert scan_pickle(_stream(_Read(re.RegexFlag, "IGNORECASE")), RULE) is None  # an enum member
