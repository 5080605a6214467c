"""The opcode scanner on its own: no false refusals of plain data, never an exception, bounded by the stream."""

from __future__ import annotations

import argparse
import datetime
import pickle
import pickletools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcell import Policy
from snapcell.checkpoint import HELPERS, global_refusal
from snapcell.checkpoint.scan import _scanplain, scan_pickle
from snapcell.checkpoint.scan._scan import scan_pickle_data
from snapcell.checkpoint.scan._scanplain import _DATA_OPS
from snapcell.interpreter._runner import checkpoint_rule

RULE = checkpoint_rule(Policy())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.complex_numbers(allow_nan=False),
)
data = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=20),
        st.tuples(inner, inner),
        st.tuples(inner, inner, inner, inner),
        st.dictionaries(st.text(max_size=10), inner, max_size=10),
        st.frozensets(st.integers(), max_size=5),
        st.sets(st.text(max_size=5), max_size=5),
    ),
    max_leaves=60,
)


@settings(max_examples=60, deadline=None)
@given(value=data, protocol=st.integers(min_value=3, max_value=5))
def test_plain_data_passes_in_every_protocol(value: object, protocol: int) -> None:
    stream = pickle.dumps(value, protocol=protocol)
    assert scan_pickle(stream, RULE) is None


@settings(max_examples=60, deadline=None)
@given(value=data, cut=st.integers(min_value=1, max_value=400))
def test_cut_or_garbled_streams_are_refused_never_raised(value: object, cut: int) -> None:
    stream = pickle.dumps([value, value], protocol=5)
    if cut < len(stream):
        assert scan_pickle(stream[:-cut], RULE) is not None
    garbled = bytearray(stream)
    garbled[cut % len(garbled)] ^= 0x5A
    scan_pickle(bytes(garbled), RULE)  # refused or accepted, but never an exception


def test_memo_shared_between_pickles_of_one_stream() -> None:
    """Streams hold one pickle per variable sharing a memo: a module name memoized in the first serves the second."""
    first = b"\x80\x05\x8c\x04json\x94\x8c\x05dumps\x94\x93\x94."
    second_ok = b"\x80\x05h\x00\x8c\x05loads\x94\x93."
    second_bad = b"\x80\x05h\x00\x8c\x10_default_decoder\x93."
    assert scan_pickle(first + second_ok, RULE) is None
    refusal = scan_pickle(first + second_bad, RULE)
    assert refusal is not None and refusal.index == 1 and refusal.name == "_default_decoder"


def test_global_opcode_and_inst_follow_the_same_rule() -> None:
    assert scan_pickle(b"cjson\ndumps\n.", RULE) is None
    assert scan_pickle(b"cos\nsystem\n.", RULE) is not None
    assert scan_pickle(b"(S'x'\nios\nsystem\n.", RULE) is not None


def test_every_helper_of_the_table_is_exact() -> None:
    """The table lists exact pairs: a neighbour of a helper is refused (dill._dill._eval_repr, copyreg._inverted)."""
    assert all(global_refusal(module, name, RULE) is None for module, name in HELPERS)
    for module, name in [("dill._dill", "_eval_repr"), ("copyreg", "_inverted_registry"), ("cloudpickle", "os")]:
        assert global_refusal(module, name, RULE) is not None


@pytest.mark.parametrize("value", [b"]", b"N", b"h\x00"], ids=["EMPTY_LIST", "NONE", "BINGET"])
def test_deep_streams_are_refused_not_followed(value: bytes) -> None:
    """Each value on the scanner's stack is 8 bytes of the host's memory for one or two bytes of stream."""
    refusal = scan_pickle(b"\x80\x05N\x94(" + value * (1 << 22 | 1) + b"t.", RULE)
    assert refusal is not None and "too deep" in refusal.reason


def _list_then_global(group: bytes, tail: bytes) -> bytes:
    """A list filled by ``group`` (memo 0 is the list), then ``tail`` pushing one value appended to it."""
    return b"\x80\x05]\x94" + group + tail + b"a."


def test_strings_memoized_inside_fast_groups_are_read_back_exactly() -> None:
    """Big containers are skipped a group at a time; a module name memoized there is still followed by GET."""
    json_group = b"(\x8c\x04json\x94K\x01}\x94(h\x01K\x02ue"
    assert scan_pickle(_list_then_global(json_group, b"h\x01\x8c\x05dumps\x93"), RULE) is None
    os_group = b"(\x8c\x02os\x94K\x01e"
    refusal = scan_pickle(_list_then_global(os_group, b"h\x01\x8c\x06system\x93"), RULE)
    assert refusal is not None and (refusal.module, refusal.name) == ("os", "system")


def test_a_put_in_a_stream_that_memoizes_is_refused() -> None:
    """PUT 1 after MEMOIZE: the unpickler numbers MEMOIZE by its count of entries, so the indices would part ways."""
    group = b"(\x8c\x04json\x94K\x01e"
    tail = b"\x8c\x02osq\x010" + b"h\x01\x8c\x06system\x93"  # PUT 1 = 'os', POP, then GET 1
    refusal = scan_pickle(_list_then_global(group, tail), RULE)
    assert refusal is not None and "both ways" in refusal.reason


def test_a_value_memoized_again_inside_a_group_is_followed_exactly() -> None:
    """GET then MEMOIZE never comes from pickle: such a group goes opcode by opcode, so the copy is what was read."""
    json_group = b"(\x8c\x04json\x94h\x01\x94e"
    assert scan_pickle(_list_then_global(json_group, b"h\x02\x8c\x05dumps\x93"), RULE) is None
    os_group = b"(\x8c\x02os\x94h\x01\x94e"
    refusal = scan_pickle(_list_then_global(os_group, b"h\x02\x8c\x06system\x93"), RULE)
    assert refusal is not None and (refusal.module, refusal.name) == ("os", "system")


@settings(max_examples=60, deadline=None)
@given(value=data)
def test_plain_data_is_reported_plain(value: object) -> None:
    """What a protocol 5 pickler writes for lists, dicts, sets, tuples, strings, bytes and real numbers."""
    assert scan_pickle_data(pickle.dumps(value, protocol=5), RULE) == (None, not _holds_complex(value))


def _holds_complex(value: object) -> bool:
    """complex() is a call in a pickle: such a stream is not plain."""
    if isinstance(value, dict):
        return any(map(_holds_complex, value.values()))
    if isinstance(value, list | tuple | set | frozenset):
        return any(map(_holds_complex, value))
    return isinstance(value, complex)


def test_streams_that_name_a_global_call_or_take_a_buffer_are_not_plain() -> None:
    """Each of these could fail to restore (or run something): the dump must restore them to know."""
    rows = [{"id": i} for i in range(2000)]  # a flat-group prefix: what follows must still count
    kinds = {
        "a global": [*rows, len],
        "a call": [*rows, datetime.date(2024, 1, 2)],
        "BUILD": [*rows, argparse.Namespace(x=1)],
        "a complex number": [*rows, 1j],
    }
    for kind, value in kinds.items():
        assert scan_pickle_data(pickle.dumps(value, protocol=5), lambda module: True) == (None, False), kind
    buffered = pickle.dumps(pickle.PickleBuffer(b"x" * 100), protocol=5, buffer_callback=lambda buffer: False)
    assert scan_pickle_data(buffered, RULE) == (None, False)
    assert scan_pickle_data(pickle.dumps({"a": [1.5]}, protocol=0), RULE) == (None, False)  # text opcodes
    refused, plain = scan_pickle_data(b"cos\nsystem\n.", RULE)
    assert refused is not None and not plain


def test_no_opcode_that_resolves_calls_or_takes_a_buffer_counts_as_plain_data() -> None:
    names = {op.name for op in pickletools.opcodes if ord(op.code) in _DATA_OPS}
    resolve_or_call = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"}
    elsewhere = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}
    assert names.isdisjoint(resolve_or_call | elsewhere)
    assert len(names) == len(_DATA_OPS)  # each is an opcode


_NUMBER_TOKENS = [
    b"KK",
    b"JJJJJ",
    b"K\x01",
    b"M\x01\x02",
    b"J\x01\x02\x03\x04",
    b"G" + bytes(range(8)),
    b"\x88",
    b"\x89",
    b"JK",
    b"KJ",
]


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(st.tuples(st.sampled_from(_NUMBER_TOKENS), st.integers(1, 3000)), max_size=5),
    tail=st.sampled_from([b"", b"e", b"K", b"J\x01\x02", b"G\x00", b"N", b"M\x01"]),
    view=st.booleans(),
)
def test_number_runs_end_where_the_pattern_ends_them(runs: list[tuple[bytes, int]], tail: bytes, view: bool) -> None:
    """Stretches of one opcode are counted by stride (a truncated last token is not whole): as the pattern does."""
    data = b"".join(token * count for token, count in runs) + tail
    run = _scanplain._NUMBER_RUN.match(data)
    source: bytes | memoryview = memoryview(data) if view else data
    assert _scanplain._number_run_end(source, 0, len(data)) == (run.end() if run else 0)
