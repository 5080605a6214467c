"""Plain data in a pickle stream, found at C speed: the patterns and counts of the scanner's (`_scan`) fast paths.

Numbers, strings, memo reads and containers filled by them make up the bulk of big streams. Each of these opcodes
starts one token of one length, so a pattern (or a stride, for a stretch of one opcode) finds where they end without
the scanner's loop, and nothing in them names a global or calls anything.
"""

from __future__ import annotations

import functools
import re

__all__ = ["compile_patterns"]

# Numbers and booleans (fixed-size opcodes), matched a run at a time; one match of the token pattern per value.
_NUMBER_TOKEN = re.compile(rb"K.|M..|J....|G.{8}|\x88|\x89", re.DOTALL)
_NUMBER_RUN = re.compile(rb"(?:K.|M..|J....|G.{8}|\x88|\x89)++", re.DOTALL)
# Flat groups, the bulk of large dicts and lists of records: MARK, then values that neither name a global nor call
# anything (numbers, short strings and bytes, memo reads and MEMOIZE, empty containers, and records: an empty
# container filled by one such group), then APPENDS/SETITEMS/ADDITEMS. Everything above the mark goes into the
# container, so only the memo changes: MEMOIZE is counted at C speed, and the values it stored are read again
# from the stream only if a later GET needs one (`_Scanner._lazy`).


def _length_prefixed() -> bytes:
    """A pattern for one length byte and that many bytes (regular expressions cannot count otherwise)."""
    return b"(?:" + b"|".join(re.escape(bytes([size])) + b".{%d}" % size for size in range(256)) + b")"


def _atoms() -> bytes:
    """The tokens of a flat group (one opcode and its argument each) but MEMOIZE, empty containers, MARK and extends.

    Each starts with its own opcode byte, so their order does not change what matches; the frequent ones come first
    (the engine tries each alternative's first byte in turn).
    """
    sized = _length_prefixed()
    # A memo read that MEMOIZE copies (no pickler writes it) ends a group: only the slow path follows what was read.
    return rb"\x8c" + sized + rb"|h.(?!\x94)|K.|J....|G.{8}|M..|N|\x88|\x89|j....(?!\x94)|C" + sized + rb"|\x95.{8}"


def _other_tokens() -> bytes:
    """The tokens of a flat group (one opcode and its argument each) other than MEMOIZE, MARK and the extends."""
    return _atoms() + rb"|[\]})\x8f]"


@functools.cache
def _group_patterns() -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """The flat-group pattern and the group-token pattern, compiled on first use (~10 ms: not at import, which
    every worker pays before its first run, while only a dump or a load scans)."""
    token = rb"\x94|" + _other_tokens()
    # Possessive repeats: no token starts with an extend opcode, and MARK is none, so giving back a token or a record
    # never lets a group end; a greedy repeat kept a backtracking entry per token (the engine's stack, grown by
    # realloc and copying, was half the scan's work). A record is tried before an empty container's token (both
    # start with one), and after the tokens that start with other bytes (or every token would try it first).
    record = rb"[\]}\x8f]\x94?\((?:" + token + rb")*+[eu\x90]"
    other = rb"\x94|" + _atoms() + rb"|" + record + rb"|[\]})\x8f]"
    flat_group = re.compile(rb"\((?:" + other + rb")*+[eu\x90]", re.DOTALL)
    return flat_group, re.compile(rb"(\x94)|\(|[eu\x90]|" + token, re.DOTALL)


@functools.cache
def _memoize_segments() -> re.Pattern[bytes]:
    """A pattern whose matches cut a flat group (as `_group_patterns` matched it) after each MEMOIZE.

    Each match is the group's other tokens up to and including one MEMOIZE or, last, the tokens after the last one (a
    group ends with APPENDS/SETITEMS/ADDITEMS, never with MEMOIZE): a group holds one MEMOIZE fewer than the matches.
    The tokens are the flat pattern's (each opcode byte starts one token of one length) and each match starts where
    the last ended, so a ``\x94`` byte inside an argument is never taken for MEMOIZE; the possessive repeats never
    backtrack into a token. Half the work of listing every token (`_group_patterns`' second pattern).
    """
    other = _other_tokens() + rb"|\(|[eu\x90]"
    return re.compile(rb"(?:" + other + rb")*+\x94|(?:" + other + rb")++", re.DOTALL)


def compile_patterns() -> None:
    """Compile the scanner's patterns now (~30 ms, once per process), not in the first scan that needs them."""
    _group_patterns()
    _memoize_segments()


def _memoize_count(data: bytes | bytearray | memoryview, start: int, stop: int) -> int:
    """How many MEMOIZE a flat group (``data[start:stop]``, as `_group_patterns` matched it) holds."""
    return _memoize_segments().subn(b"", data[start:stop])[1] - 1


# The opcodes of the slow path that a protocol 5 pickler writes for plain data (the fast path's are all such):
# PROTO, FRAME, STOP, strings, bytes, bytearray, long ints, tuples, frozenset, APPEND, SETITEM, POP, POP_MARK, DUP,
# and the binary memo opcodes. Not globals, calls, BUILD, persistent ids, EXT or buffers, nor the text opcodes.
_DATA_OPS = frozenset(b"\x80\x95.X\x8dCB\x8e\x96\x8a\x8bt\x85\x86\x87)\x91as012hjqr\x94KMJG\x88\x89N}]\x8f(eu\x90")
_FIXED_NUMBER = {ord("K"): 2, ord("M"): 3, ord("J"): 5, ord("G"): 9, 0x88: 1, 0x89: 1}
_STRIDE_TOKENS = 1024  # number tokens looked at per stride
_MIN_STRIDE = 16  # a shorter stretch of one opcode goes to the pattern


def _number_run_end(data: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """Where the run of number opcodes at ``pos`` ends (``pos``: none is whole there), as `_NUMBER_RUN` finds it.

    A stretch of one opcode (a list of sorted ints is a few) is counted by stride: every ``width`` bytes from a token
    of that opcode starts the next token, so the leading copies of the opcode byte in the strided slice are tokens.
    A mixed run goes to the pattern.
    """
    while pos < end:
        code = data[pos]
        width = _FIXED_NUMBER.get(code)
        if width is None:
            return pos
        probe = bytes(data[pos : pos + width * _STRIDE_TOKENS : width])
        same = min(len(probe) - len(probe.lstrip(probe[:1])), (end - pos) // width)  # whole tokens only
        if same < _MIN_STRIDE:
            run = _NUMBER_RUN.match(data, pos)
            return pos if run is None else run.end()
        pos += same * width
    return pos
