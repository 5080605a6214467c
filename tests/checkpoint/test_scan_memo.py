"""The scanner's memo and work bounds against hand-written streams (a compromised worker's dump).

The loader checks every global again, but only the host's scan keeps ``BUILD`` off a global or an object a lookup
returned (a library class patched in place, in the host's process when the load is inline). So the scanner must
follow every memo entry the loader will see, and its work must stay linear in the stream it is handed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcell import Policy
from snapcell.checkpoint.scan import _scan, _scanplain, scan_pickle
from snapcell.interpreter._runner import checkpoint_rule

RULE = checkpoint_rule(Policy())


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


JSON_ENCODER = _s("json") + _s("JSONEncoder") + b"\x93"
# BUILD's state: (None, {'patched': 'yes'}), set with setattr on the target (a class, here).
PATCH = b"N}" + _s("patched") + _s("yes") + b"s\x86b"


def _stream(body: bytes) -> bytes:
    return b"\x80\x05" + body + b"."


def _refuses_build_on_the_class(refusal: Any) -> bool:
    return (
        refusal is not None and (refusal.module, refusal.name) == ("json", "JSONEncoder") and "BUILD" in refusal.reason
    )


def test_build_on_a_global_read_from_the_memo_is_refused() -> None:
    """The baseline the attacks below get around: the global, memoized and read back, is still a global."""
    assert _refuses_build_on_the_class(scan_pickle(_stream(JSON_ENCODER + b"\x940h\x00" + PATCH), RULE))


def test_a_global_memoized_again_inside_a_flat_group_stays_a_global() -> None:
    """``(GET 0, MEMOIZE)`` inside a list's group: the copy at memo 2 is the class, not a new object."""
    body = JSON_ENCODER + b"\x940" + b"]\x94(h\x00\x94e0" + b"h\x02" + PATCH
    assert _refuses_build_on_the_class(scan_pickle(_stream(body), RULE))


def test_a_global_memoized_past_the_memo_limit_is_not_forgotten() -> None:
    """Once the scanner stops keeping memoized strings, a global memoized after them must still be followed."""
    count = 1 << 18
    fill = b"".join(_s(f"k{i}") + b"\x940" for i in range(count))
    body = fill + JSON_ENCODER + b"\x940" + b"j" + count.to_bytes(4, "little") + PATCH
    assert _refuses_build_on_the_class(scan_pickle(_stream(body), RULE))


def test_a_put_cannot_shift_the_indices_memoize_uses() -> None:
    """The unpickler numbers MEMOIZE by its count of entries: after ``PUT 255`` the class lands at 1, not 0."""
    body = b"Nq\xff0" + JSON_ENCODER + b"\x940" + b"h\x01" + PATCH
    refusal = scan_pickle(_stream(body), RULE)
    assert refusal is not None
    # The same shift would show the scanner 'json' where the loader reads 'os'.
    body = b"Nq\xff0" + _s("os") + b"\x940" + _s("json") + b"\x940" + b"h\x01" + _s("system") + b"\x93"
    assert scan_pickle(_stream(body), RULE) is not None


@pytest.mark.parametrize("put", [b"q\x01", b"r" + (1 << 27).to_bytes(4, "little"), b"p5\n"])
def test_a_put_past_the_entries_written_is_refused(put: bytes) -> None:
    """The loader grows its memo table to the index (a 2**27 index is 2 GiB); picklers number entries in order."""
    refusal = scan_pickle(_stream(b"N" + put), RULE)
    assert refusal is not None and "memo index" in refusal.reason
    assert scan_pickle(_stream(b"Nq\x00q\x000Nq\x01"), RULE) is None  # in order, and again at one index: fine


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def spend(self, amount: int = 1) -> None:
        self.used += amount
        if self.used > self.limit:
            raise AssertionError(f"the scanner did more than {self.limit} steps of work")


def test_shared_nested_tuples_are_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``t = (t, t, t)`` forty times over is a 130-byte stream whose tree has 3**40 leaves."""
    budget = _Budget(10_000)
    original = _scan._no_helpers

    def counted(values: Any) -> Any:
        budget.spend()
        return original(values)

    monkeypatch.setattr(_scan, "_no_helpers", counted)
    stream = _stream(b"]" + _s("a") + b"22\x87" * 40 + b"a")
    assert scan_pickle(stream, RULE) is None
    assert budget.used <= 200


def test_deeply_nested_tuples_are_scanned_not_raised() -> None:
    stream = _stream(_s("builtins") + _s("len") + b"\x93N" + b"\x85" * 100_000 + b"\x85R")
    assert scan_pickle(stream, RULE) is None


class _CountingTokens:
    """Stands in for the group token pattern and counts the tokens it hands out."""

    def __init__(self, pattern: re.Pattern[bytes], budget: _Budget) -> None:
        self.pattern = pattern
        self.budget = budget

    def finditer(self, *args: Any) -> Iterator[re.Match[bytes]]:
        for match in self.pattern.finditer(*args):
            self.budget.spend()
            yield match

    def findall(self, *args: Any) -> list[Any]:
        found = self.pattern.findall(*args)
        self.budget.spend(len(found))
        return found


def test_reads_into_a_flat_group_read_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of a big group's last entry, again and again: each was a walk of the whole group."""
    budget = _Budget(200_000)
    flat_group, group_tokens = _scan._group_patterns()
    counting = _CountingTokens(group_tokens, budget)
    monkeypatch.setattr(_scan, "_group_patterns", lambda: (flat_group, counting))
    entries, reads = 20_000, 5_000
    group = b"(" + b"\x8c\x01a\x94" * entries + b"e"
    last = b"j" + entries.to_bytes(4, "little") + b"0"  # memo 0 is the list
    assert scan_pickle(b"\x80\x05]\x94" + group + last * reads + b".", RULE) is None
    assert budget.used <= 5 * entries  # counted once, indexed once: two tokens per entry


class _CountingMemo(dict[int, object]):
    budget: _Budget

    def __iter__(self) -> Iterator[int]:
        for key in super().__iter__():
            self.budget.spend()
            yield key


def test_many_groups_after_a_full_memo_do_not_walk_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flat group that memoizes looked through the whole memo (2**18 strings) for entries to overwrite."""
    budget = _Budget(1_000_000)
    _CountingMemo.budget = budget
    original = _scan._Scanner.__init__

    def init(self: Any, *args: Any) -> None:
        original(self, *args)
        self.memo = _CountingMemo()

    monkeypatch.setattr(_scan._Scanner, "__init__", init)
    fill = b"".join(_s(f"{i % 1000:03}") + b"\x940" for i in range(1 << 18))
    assert scan_pickle(_stream(fill + b"](\x8c\x01a\x94e0" * 200 + b"N"), RULE) is None
    assert budget.used == 0


def test_the_globals_and_lookups_kept_in_the_memo_are_bounded() -> None:
    """Kept past the limit for constants, each costs the host a memo entry: four stream bytes may not buy 100."""
    copies = b"h\x00\x940" * ((1 << 20) + 1)  # GET the class, MEMOIZE it again, POP
    refusal = scan_pickle(_stream(JSON_ENCODER + b"\x94" + copies), RULE)
    assert refusal is not None and "memoized globals" in refusal.reason
    assert scan_pickle(_stream(JSON_ENCODER + b"\x94" + b"h\x00\x940" * 1000), RULE) is None


# One token of each kind a flat group holds, each with a 0x94 byte in its argument (which is not MEMOIZE).
_ARGUMENTS_WITH_0X94 = {
    "BININT1": b"K\x94",
    "BININT2": b"M\x94\x00",
    "BININT": b"J\x00\x94\x00\x00",
    "BINFLOAT": b"G\x94" + bytes(7),
    "BINGET": b"h\x94",
    "LONG_BINGET": b"j\x94\x00\x00\x00",
    "SHORT_BINUNICODE": _s("a\u0514"),  # U+0514 is d4 94 in UTF-8
    "SHORT_BINBYTES": b"C\x02\x94\x94",
    "FRAME": b"\x95\x94" + bytes(7),
}


@pytest.mark.parametrize("token", list(_ARGUMENTS_WITH_0X94.values()), ids=list(_ARGUMENTS_WITH_0X94))
def test_memo_indices_after_a_group_count_only_its_memoize_opcodes(token: bytes) -> None:
    """A flat group's MEMOIZEs are counted when a later index needs them: a 0x94 argument byte is not one.

    Memo 0 is the list, the group memoizes 'os' and 'system' (1, 2), then 'json' and 'dumps' are memoized outside
    any group (3, 4), which makes the scanner count the group. Counted one too many or too few, the scanner's
    indices part from the loader's: ``GET 3, GET 4`` (json.dumps) is then refused, or worse, a read of 1 and 2
    (os.system) is taken for another pair.
    """
    group = b"(" + token + _s("os") + b"\x94" + _s("system") + b"\x94" + b"e"
    constants = _s("json") + b"\x94" + _s("dumps") + b"\x94" + b"00"
    head = b"]\x94" + group + constants
    assert _scan._group_patterns()[0].match(group) is not None  # the group is taken whole, not opcode by opcode
    assert scan_pickle(_stream(head + b"h\x03h\x04\x93a"), RULE) is None
    refusal = scan_pickle(_stream(head + b"h\x01h\x02\x93a"), RULE)
    assert refusal is not None and (refusal.module, refusal.name) == ("os", "system")


def test_a_constant_memoized_after_groups_gets_the_loaders_index() -> None:
    """The group count is put off; a string memoized after it must still land where the loader puts it.

    Were the count skipped, 'json' (memo 3) would sit at 1 in the scanner, where the loader has 'os'.
    """
    group = b"(" + _s("os") + b"\x94" + _s("system") + b"\x94" + b"e"
    body = b"]\x94" + group + _s("json") + b"\x940" + b"h\x01" + _s("system") + b"\x93a"
    refusal = scan_pickle(_stream(body), RULE)
    assert refusal is not None and (refusal.module, refusal.name) == ("os", "system")


def test_plain_data_streams_are_never_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list of records reads its memo only inside groups: its MEMOIZEs are never counted (the fast path)."""
    import pickle

    counted: list[int] = []
    original = _scan._memoize_count

    def counting(data: Any, start: int, stop: int) -> int:
        counted.append(stop - start)
        return original(data, start, stop)

    monkeypatch.setattr(_scan, "_memoize_count", counting)
    rows = [{"id": i, "name": f"n{i}", "v": i * 0.5} for i in range(5000)]
    assert scan_pickle(pickle.dumps(rows, protocol=5), RULE) is None
    assert counted == []
    # A read outside a group after them (a second pickle of the stream reads the first's key) counts them all once.
    stream = pickle.dumps(rows, protocol=5)[:-1] + b"0h\x01."
    assert scan_pickle(stream, RULE) is None
    assert len(counted) == 5


def test_groups_counted_together_keep_their_own_first_index() -> None:
    """Three groups wait to be counted at once: each starts where the ones before it end (memo 0 is the list)."""
    groups = b"(" + _s("a") + b"\x94e" + b"(e" + b"(" + _s("json") + b"\x94" + _s("dumps") + b"\x94e"
    assert scan_pickle(_stream(b"]\x94" + groups + b"h\x02h\x03\x93a"), RULE) is None
    os_groups = b"(" + _s("os") + b"\x94e" + b"(" + _s("json") + b"\x94" + _s("system") + b"\x94e"
    refusal = scan_pickle(_stream(b"]\x94" + os_groups + b"h\x01h\x03\x93a"), RULE)
    assert refusal is not None and (refusal.module, refusal.name) == ("os", "system")


def test_memo_opcodes_of_the_slow_path_count_the_groups_first() -> None:
    """LONG_BINGET and GET read into a group; a PUT after a group that memoized is two numberings at once.

    The list here is not memoized, so the group's MEMOIZEs are the stream's first: uncounted, a PUT would pass.
    """
    group = b"(" + _s("json") + b"\x94" + _s("dumps") + b"\x94e"
    reads = [b"j\x00\x00\x00\x00j\x01\x00\x00\x00", b"g0\ng1\n"]
    for read in reads:
        assert scan_pickle(_stream(b"]" + group + read + b"\x93a"), RULE) is None
    refusal = scan_pickle(_stream(b"]" + group + _s("os") + b"q\x000"), RULE)
    assert refusal is not None and "both ways" in refusal.reason


def test_reads_of_entries_made_before_the_groups_do_not_count_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataFrame's pickle reads its dtype classes again after its columns' groups: those need no count."""
    counted: list[int] = []
    original = _scan._memoize_count
    monkeypatch.setattr(_scan, "_memoize_count", lambda *args: counted.append(1) or original(*args))
    group = b"(" + _s("a") + b"\x94" + _s("b") + b"\x94e"
    head = JSON_ENCODER + b"\x940" + b"]\x94" + group + b"0"  # the class is memo 0, the list 1, the group 2 and 3
    for read in (b"h\x00", b"j\x00\x00\x00\x00"):
        assert scan_pickle(_stream(head + read), RULE) is None
    assert counted == []
    assert _refuses_build_on_the_class(scan_pickle(_stream(head + b"h\x00" + PATCH), RULE))
    assert scan_pickle(_stream(head + b"h\x02"), RULE) is None  # a read into the group counts it
    assert counted == [1]


_PIECES = [
    b"(", b"e", b"u", b"\x90", b"}", b"]", b"\x8f", b")", b"\x94", b"N", b"\x88", b"K\x01", b"K\x94", b"M\x01\x02",
    b"J\x01\x02\x03\x04", b"G" + bytes(8), b"h\x02", b"j\x02\x00\x00\x00", b"\x8c\x02ab", b"C\x01e", b"\x95" + bytes(8),
    b"0", b"t", b"\x93", b"e(",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=40))
def test_the_possessive_patterns_match_what_greedy_ones_match(pieces: list[bytes]) -> None:
    """The scanner's repeats do not give back tokens (no backtracking stack), and its tokens are in another order: the
    spans must be the same."""
    data = b"(" + b"".join(pieces)
    flat_group = _scan._group_patterns()[0]
    patterns = [(flat_group, data), (_scanplain._NUMBER_RUN, b"".join(pieces))]
    for possessive, text in patterns:
        greedy = re.compile(possessive.pattern.replace(b")*+", b")*").replace(b")++", b")+"), re.DOTALL)
        assert greedy.pattern != possessive.pattern
        found, expected = possessive.match(text), greedy.match(text)
        assert (found and found.span()) == (expected and expected.span())
    found, expected = flat_group.match(data), _FIRST_FLAT_GROUP.match(data)
    assert (found and found.span()) == (expected and expected.span())


def _first_flat_group() -> re.Pattern[bytes]:
    """The flat-group pattern as first written (greedy, record first, tokens in opcode order)."""
    sized = _scanplain._length_prefixed()
    read = rb"h.(?!\x94)|j....(?!\x94)"
    token = (
        rb"K.|M..|J....|G.{8}|\x88|\x89|N|" + read + rb"|\x94|\x8c" + sized + rb"|C" + sized + rb"|[\]})\x8f]|\x95.{8}"
    )
    record = rb"(?:\]|\}|\x8f)\x94?\((?:" + token + rb")*[eu\x90]"
    return re.compile(rb"\((?:" + record + rb"|" + token + rb")*[eu\x90]", re.DOTALL)


_FIRST_FLAT_GROUP = _first_flat_group()
