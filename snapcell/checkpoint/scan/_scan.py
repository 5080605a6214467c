"""A scanner that applies the checkpoint rule (`_rule`) to a pickle stream without unpickling.

One rule serves both sides of the trust boundary: the host runs `scan_pickle` over every pickle stream of a
checkpoint before it signs it, and the loader's ``find_class`` calls `global_refusal` (and the helpers' argument
checks, `call_refusal`) on every global it resolves. A signature therefore means "the host read every global this
checkpoint names and the loader accepts each one".

The scanner is a small abstract stack machine over pickletools' opcode table: string constants are followed through
the stack and the memo, anything else is opaque, and what it cannot prove safe it refuses. Plain data, the bulk of
big streams, goes at C speed: runs of numbers (by stride or one pattern) and flat groups of a container's items (one
pattern), whose MEMOIZEs are counted only when a later memo index needs them (`_Scanner._resolve`).
"""

from __future__ import annotations

import bisect
import pickletools
import re
import struct
from array import array

from snapcell.checkpoint._hoststate import resolved_global, state_refusal
from snapcell.checkpoint._rule import (
    HELPERS,
    NOT_IN_DILL,
    PLAIN,
    TYPE_CALL,
    AllowModule,
    GlobalRule,
    Refusal,
    as_rule,
    current_name,
    global_refusal,
)
from snapcell.checkpoint.scan._scancalls import _Calls
from snapcell.checkpoint.scan._scanplain import (
    _DATA_OPS,
    _NUMBER_TOKEN,
    _group_patterns,
    _memoize_count,
    _number_run_end,
)
from snapcell.checkpoint.scan._scanvalues import (
    _SETSTATE,
    FOREIGN,
    MAX_MEMO_KEPT,
    OPAQUE,
    _arguments,
    _check_target,
    _forgettable,
    _Global,
    _no_helpers,
    _Opaque,
    _Refused,
)

__all__ = ["FOREIGN", "OPAQUE", "PLAIN_UNREFUSED_BYTES", "Refusal", "scan_pickle", "scan_pickle_data"]

# Opcode table, from pickletools: argument length (>= 0 fixed; the negative codes below), values popped (-1: pop to
# the mark), values pushed.
_LINE, _LEN1, _LEN4S, _LEN4U, _LEN8 = -1, -2, -3, -4, -5
_NO_ARG = 0
_OPS: dict[int, tuple[int, int, int]] = {}
for _op in pickletools.opcodes:
    _before = [s.name for s in _op.stack_before]
    _pops = -1 if "mark" in _before else len(_before)
    _OPS[ord(_op.code)] = (_op.arg.n if _op.arg is not None else _NO_ARG, _pops, len(_op.stack_after))
del _op, _before, _pops

_MAX_STACK = 1 << 22  # 4M values (32 MB of references); deeper streams are refused, not followed
# A stream of plain data (`_DATA_OPS`) a pickler wrote is refused only when it is too deep, which takes more values
# on the stack than a stream of this many bytes can push (at least a byte each).
PLAIN_UNREFUSED_BYTES = _MAX_STACK
_MAX_MEMO_STRINGS = 1 << 18  # memoized constants kept; later ones are forgotten (a GET of them is opaque)
# Picklers number the memo one way: PUT with explicit indices (protocols 0-3), each the count of entries so far, or
# MEMOIZE (4 and up), whose index the unpickler takes from that count. A stream that mixes them, or PUTs past the
# count, would make the scanner's indices differ from the loader's (the scanner would follow the wrong value) and
# make the loader grow its memo table to the index.
_MIXED_MEMO = "a pickle stream that numbers its memo both ways (PUT and MEMOIZE), which no pickler writes"
_TOO_MANY = "more memoized globals and lookups than any pickler writes (the scanner keeps each one)"
_MAX_TUPLE = 3
# The checks' work budget: this much per byte of the stream, plus a floor for small streams.
_WORK_PER_BYTE = 4
_WORK_BASE = 1 << 20
_OVER_BUDGET = "a stream whose globals take more work to check than its size allows"
_NEWLINE = re.compile(b"\n")
_MAX_LINE = 65536
_U4 = struct.Struct("<I")
_I4 = struct.Struct("<i")
_U8 = struct.Struct("<Q")

_STR_OPS = frozenset({ord("X"), 0x8D, ord("V")})
# Values that can be popped into a container without a check (helpers that take names are _Global, tuples nest).
_INERT_TYPES = frozenset({_Opaque, str, type(None)})
_EXTEND_CODES = frozenset({ord("e"), ord("u"), 0x90})
_MAX_LAZY = 1 << 20
_MAX_PENDING = 4096
# GET, BINGET, LONG_BINGET, PUT, BINPUT, LONG_BINPUT: they need the true memo count (`_Scanner._resolve`).
_MEMO_OPS = frozenset(map(ord, "ghjpqr"))
_MISSING = object()
_C_OTHER, _C_NUMBER, _C_SHORT_STR, _C_MEMOIZE, _C_BINGET, _C_MARK, _C_EMPTY, _C_EXTEND, _C_NONE = range(9)
_CATEGORY = [_C_OTHER] * 256
for _code in (ord("K"), ord("M"), ord("J"), ord("G"), 0x88, 0x89):
    _CATEGORY[_code] = _C_NUMBER
for _code in (ord("}"), ord("]"), 0x8F):
    _CATEGORY[_code] = _C_EMPTY
for _code in (ord("e"), ord("u"), 0x90):
    _CATEGORY[_code] = _C_EXTEND
_CATEGORY[0x8C] = _C_SHORT_STR
_CATEGORY[0x94] = _C_MEMOIZE
_CATEGORY[ord("h")] = _C_BINGET
_CATEGORY[ord("(")] = _C_MARK
_CATEGORY[ord("N")] = _C_NONE


def scan_pickle(
    data: bytes | bytearray | memoryview, rule: GlobalRule | AllowModule, *, dill: bool = False
) -> Refusal | None:
    """Check every global a pickle stream (one or more pickles back to back) would resolve, without unpickling.

    Walks the opcodes with a small abstract stack machine: string constants are followed through the stack and
    the memo (MEMOIZE/PUT/GET), so ``STACK_GLOBAL`` sees the constant module and name it would be given; operands
    that are not constants, malformed or truncated streams and opcodes the loader never needs (``EXT*``) are
    refused. Helpers that take names as data must be called with constants that pass `call_refusal`; a global
    object may not be the target of ``BUILD`` (that would patch a library class in place).

    Args:
        data: The raw (decompressed) pickle bytes.
        rule: The policy's part of the rule, as the loader uses it (or just its module check).
        dill: The pickle is a dill section, which may not name cloudpickle's makers (`NOT_IN_DILL`).

    Returns:
        None when every global passes the rule, else the first `Refusal`.
    """
    return scan_pickle_data(data, rule, dill=dill)[0]


def scan_pickle_data(
    data: bytes | bytearray | memoryview, rule: GlobalRule | AllowModule, *, dill: bool = False
) -> tuple[Refusal | None, bool]:
    """`scan_pickle`, and whether the stream is plain data: no global, no call, no out-of-band buffer.

    Such a stream builds only lists, dicts, sets, tuples, strings, bytes and numbers (`_DATA_OPS`): what a
    pickler wrote for values of those types unpickles without running or resolving anything, so a dump need not
    restore it to learn that it would.

    Returns:
        The first `Refusal` (None when every global passes), and True when the stream is plain data.
    """
    view = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
    scanner = _Scanner(view, as_rule(rule), dill)
    try:
        scanner.run()
    except _Refused as exc:
        refusal = Refusal(exc.refusal.module, exc.refusal.name, exc.refusal.reason, scanner.op_offset, scanner.index)
        return refusal, False
    except (IndexError, struct.error, ValueError, UnicodeDecodeError) as exc:
        reason = f"a malformed pickle stream ({type(exc).__name__})"
        return Refusal("", "", reason, scanner.op_offset, scanner.index), False
    return None, scanner.plain


class _Scanner:
    def __init__(self, data: bytes | bytearray | memoryview, rule: GlobalRule, dill: bool = False) -> None:
        self.data = data
        self.rule = rule
        self.dill = dill
        self.op_offset = 0
        self.index = 0
        self.flat_ok = True
        self.stop_end = 0  # where the last complete pickle ends
        # Memo ranges written by flat groups: first index, count, and where the group is in the stream.
        self.lazy_starts: list[int] = []
        self.lazy: list[tuple[int, int, int, int]] = []
        # Per flat group read back: where the short string it memoized at each index starts (-1: not a string).
        self.lazy_index: dict[int, array[int]] = {}
        self.memo: dict[int, object] = {}
        # Memo indices holding a foreign value (one bit each: a list of a million dates is a million of them).
        self.foreign = bytearray()
        self.calls = _Calls(self.rule)  # which calls the loader may make, and what each gives back
        self.puts = 0  # memo entries PUT so far (their indices are 0 .. puts - 1)
        # Flat groups whose MEMOIZEs are not counted yet (`_resolve`): the memo count before each (not counting
        # earlier pending groups), and where the group is.
        self.pending: list[tuple[int, int, int]] = []
        self.plain = True  # only opcodes of plain data so far (`scan_pickle_data`)
        self.globals: dict[tuple[str, str], _Global] = {}  # verdicts of the globals passed so far
        # Work the checks may do for this stream (characters of distinct global names checked): linear in its size.
        self.work = 0
        self.budget = _WORK_PER_BYTE * len(data) + _WORK_BASE

    def _resolve(self, memo_next: int) -> int:
        """Count the MEMOIZEs of the pending flat groups; returns the true number of memo entries so far.

        Counting is put off until an index is needed (a memo read outside a group of an entry from the first waiting
        group on, a memo write of a value the scanner follows, a PUT): a stream of plain data, whose reads are all
        inside groups, is never counted; entries made before the first waiting group are where the loader has them.
        """
        offset = 0
        for before, start, stop in self.pending:
            count = _memoize_count(self.data, start, stop)
            if count:
                self._add_lazy(before + offset, count, start, stop)
                offset += count
        self.pending.clear()
        return memo_next + offset

    def _add_lazy(self, first: int, count: int, start: int, stop: int) -> None:
        # Indices from `first` on are new: MEMOIZE never reuses one, and PUT is refused in a stream that memoizes.
        if len(self.lazy) >= _MAX_LAZY:
            self.flat_ok = False  # enough: later groups go the slow way, entries here stay readable
        self.lazy_starts.append(first)
        self.lazy.append((first, count, start, stop))

    def _set_foreign(self, key: int, foreign: bool) -> None:
        byte, bit = key >> 3, 1 << (key & 7)
        if byte >= len(self.foreign):
            if not foreign:
                return
            self.foreign.extend(bytes(byte + 1 - len(self.foreign) + len(self.foreign) // 2))
        self.foreign[byte] = self.foreign[byte] | bit if foreign else self.foreign[byte] & ~bit

    def _lazy(self, key: int) -> object:
        """The value a flat group memoized at ``key``: only a string constant counts, anything else is opaque.

        A group is read once, on the first GET into it (each later GET is one lookup, however many there are).
        Memo entries that hold a foreign value are kept in a bitmap, not in the memo.
        """
        byte = key >> 3
        if byte < len(self.foreign) and self.foreign[byte] >> (key & 7) & 1:
            return FOREIGN
        at = bisect.bisect_right(self.lazy_starts, key) - 1
        if at < 0:
            return OPAQUE
        first, count, start, stop = self.lazy[at]
        if key >= first + count:
            return OPAQUE
        offsets = self.lazy_index.get(at)
        if offsets is None:
            offsets = self.lazy_index[at] = self._index_group(start, stop)
        where = offsets[key - first]
        if where < 0:
            return OPAQUE
        return str(self.data[where + 2 : where + 2 + self.data[where + 1]], "utf-8", "surrogatepass")

    def _index_group(self, start: int, stop: int) -> array[int]:
        offsets = array("q")
        last = -1
        for token in _group_patterns()[1].finditer(self.data, start, stop):
            code = self.data[token.start()]
            if code == 0x94:
                offsets.append(last)
                last = -1  # memoizing again never happens in pickles; treated as unknown
            else:
                # Numbers, bytes and containers are new objects; a memo read never precedes MEMOIZE here (`_TOKEN`).
                last = token.start() if code == 0x8C else -1
        return offsets

    def _global(self, module: object, name: object) -> _Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _Refused(str(module), str(name), "STACK_GLOBAL operands that are not constant strings")
        # One verdict per distinct global: a stream names a memoized global again for four bytes, and the checks
        # walk the name. A refusal ends the scan, so only passes are kept.
        known = self.globals.get((module, name))
        if known is not None:
            return known
        self.work += len(module) + len(name)
        if self.work > self.budget:
            raise _Refused(module[:100], name[:100], _OVER_BUDGET)
        checked = self.globals[(module, name)] = self._check_global(module, name)
        return checked

    def _check_global(self, module: str, name: str) -> _Global:
        problem = global_refusal(module, name, self.rule)
        if problem is not None:
            raise _Refused(module, name, problem)
        if self.dill and (module, name) in NOT_IN_DILL:
            raise _Refused(module, name, "a cloudpickle helper in a dill section")
        module, name = current_name(module, name)  # the loader resolves the same helper or public twin
        kind = HELPERS.get((module, name), PLAIN)
        if kind == PLAIN and (module, name) not in HELPERS:
            # The host's own state (checked on what the host has imported; the loader checks what it resolves).
            problem = state_refusal(resolved_global(module, name))
            if problem is not None:
                raise _Refused(module, name, problem)
        return _Global(module, name, kind)

    def run(self) -> None:
        data = self.data
        end = len(data)
        category = _CATEGORY
        opaque = OPAQUE
        stack: list[object] = []
        marks: list[int] = []
        memo = self.memo
        limit = _MAX_STACK
        pos = self._loop(data, end, category, opaque, stack, marks, memo, limit)
        if pos != end or self.stop_end != end:
            raise ValueError("truncated")
        if stack or marks:
            raise ValueError("the stream ends inside a pickle")

    def _loop(  # noqa: C901 - one dispatch loop, kept flat for speed
        self,
        data: bytes | bytearray | memoryview,
        end: int,
        category: list[int],
        opaque: _Opaque,
        stack: list[object],
        marks: list[int],
        memo: dict[int, object],
        limit: int,
    ) -> int:
        memo_next = 0
        pos = 0
        op = 0
        number_token = _NUMBER_TOKEN
        flat_group = _group_patterns()[0].match
        pending = self.pending
        memo_byte = data.find if isinstance(data, bytes | bytearray) else bytes(data).find
        missing = _MISSING
        try:
            while pos < end:
                op = pos
                code = data[pos]
                kind = category[code]
                # The frequent opcodes first: numbers, short strings, memo, marks and containers make up big streams.
                if kind == _C_NUMBER:
                    # Runs of numbers are the bulk of large lists: found and counted at C speed.
                    stop = _number_run_end(data, pos, end)
                    if stop == pos:
                        raise ValueError("truncated number")
                    if stop < end and data[stop] in _EXTEND_CODES and marks and marks[-1] == len(stack) > 0:
                        # MARK, numbers, APPENDS/SETITEMS: the values go straight into the container below.
                        if stack[-1] is not opaque:
                            _check_target(stack[-1], "APPENDS/SETITEMS")
                        marks.pop()
                        pos = stop + 1
                        continue
                    stack.extend([opaque] * number_token.subn(b"", data[pos:stop])[1])
                    pos = stop
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
                elif kind == _C_SHORT_STR:
                    size = data[pos + 1]
                    stack.append(str(data[pos + 2 : pos + 2 + size], "utf-8", "surrogatepass"))
                    pos += 2 + size
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
                elif kind == _C_MEMOIZE:
                    if self.puts:
                        raise _Refused("", "", _MIXED_MEMO)
                    value = stack[-1]
                    if value is not opaque and pending:
                        memo_next = self._resolve(memo_next)  # the index is kept: it must be the loader's
                    # Past the limit only constants are forgotten (a GET of one is opaque, which every check for
                    # a constant refuses); a global or a lookup's result is kept, or a GET would make it opaque.
                    if value is FOREIGN:
                        self._set_foreign(memo_next, True)
                    elif value is not opaque and (len(memo) < _MAX_MEMO_STRINGS or not _forgettable(value)):
                        if len(memo) >= MAX_MEMO_KEPT:
                            raise _Refused("", "", _TOO_MANY)
                        memo[memo_next] = value
                        if type(value) is _Global and value.kind not in (PLAIN, TYPE_CALL):
                            self.flat_ok = False  # a helper in the memo: memo reads in groups need checking
                    memo_next += 1
                    pos += 1
                elif kind == _C_BINGET:
                    if pending and data[pos + 1] >= pending[0][0]:
                        memo_next = self._resolve(memo_next)  # a read of an entry a waiting group may have made
                    value = memo.get(data[pos + 1], missing)
                    stack.append(self._lazy(data[pos + 1]) if value is missing else value)
                    pos += 2
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
                elif kind == _C_MARK:
                    # A MARK before a run of numbers is left to the number path (its own fast case).
                    group = (
                        flat_group(data, pos)
                        if self.flat_ok and stack and pos + 1 < end and category[data[pos + 1]] != _C_NUMBER
                        else None
                    )
                    if group is None:
                        marks.append(len(stack))
                        pos += 1
                    else:
                        if stack[-1] is not opaque:
                            _check_target(stack[-1], "APPENDS/SETITEMS")
                        stop = group.end()
                        if memo_byte(b"\x94", pos, stop) >= 0:
                            if self.puts and _memoize_count(data, pos, stop):
                                raise _Refused("", "", _MIXED_MEMO)
                            # Counted when an index is needed (`_resolve`); a bounded number wait at a time.
                            pending.append((memo_next, pos, stop))
                            if len(pending) >= _MAX_PENDING:
                                memo_next = self._resolve(memo_next)
                        pos = stop
                elif kind == _C_EMPTY:
                    stack.append(opaque)
                    pos += 1
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
                elif kind == _C_EXTEND:  # APPENDS, SETITEMS, ADDITEMS: pop to the mark, keep the container
                    base = marks.pop()
                    if base < 1:
                        raise IndexError("no container below the mark")
                    if stack[base - 1] is not opaque:
                        _check_target(stack[base - 1], "APPENDS/SETITEMS/ADDITEMS")
                    popped = stack[base:]
                    if not _INERT_TYPES.issuperset(map(type, popped)):
                        _no_helpers(popped)
                    del stack[base:]
                    pos += 1
                elif kind == _C_NONE:
                    stack.append(None)
                    pos += 1
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
                else:
                    if pending and code in _MEMO_OPS and not _reads_before(code, data, pos, pending[0][0]):
                        memo_next = self._resolve(memo_next)
                    pos, memo_next = self._slow(code, pos, stack, marks, memo, memo_next)
                    if len(stack) > limit:
                        raise _Refused("", "", "a pickle stack too deep to verify")
        except BaseException:
            self.op_offset = op
            raise
        return pos

    def _slow(  # noqa: C901 - the rest of the opcode table
        self, code: int, pos: int, stack: list[object], marks: list[int], memo: dict[int, object], memo_next: int
    ) -> tuple[int, int]:
        data = self.data
        end = len(data)
        opaque = OPAQUE
        spec = _OPS.get(code)
        if spec is None:
            raise _Refused("", "", f"unknown opcode {code:#x}")
        if code not in _DATA_OPS:
            self.plain = False
        arglen, pops, pushes = spec
        pos += 1
        arg_start = pos
        if arglen > 0:
            pos += arglen
        elif arglen == _LEN1:
            pos += 1 + data[pos]
            arg_start += 1
        elif arglen in (_LEN4U, _LEN4S):
            size = _U4.unpack_from(data, pos)[0] if arglen == _LEN4U else _I4.unpack_from(data, pos)[0]
            if size < 0:
                raise ValueError("negative length")
            pos += 4 + size
            arg_start += 4
        elif arglen == _LEN8:
            pos += 8 + _U8.unpack_from(data, pos)[0]
            arg_start += 8
        elif arglen == _LINE:
            for _ in range(2 if code in (ord("c"), ord("i")) else 1):
                newline = _NEWLINE.search(data, pos, pos + _MAX_LINE)  # in place: no copy of the stream
                if newline is None:
                    raise ValueError("unterminated line")
                pos = newline.end()
        if pos > end:
            raise ValueError("truncated")
        if code in _STR_OPS:
            if code == ord("V"):
                stack.append(bytes(data[arg_start : pos - 1]).decode("raw-unicode-escape"))
            else:
                stack.append(str(data[arg_start:pos], "utf-8", "surrogatepass"))
        elif code in (ord("j"), ord("g")):  # LONG_BINGET, GET
            key = _memo_key(code, data, arg_start, pos)
            value = memo.get(key, _MISSING)
            stack.append(self._lazy(key) if value is _MISSING else value)
        elif code in (ord("q"), ord("r"), ord("p")):  # BINPUT, LONG_BINPUT, PUT
            key = _memo_key(code, data, arg_start, pos)
            if memo_next:
                raise _Refused("", "", _MIXED_MEMO)
            if key > self.puts:
                raise _Refused("", "", "a memo index past the entries written so far (no pickler skips one)")
            self.puts += key == self.puts
            value = stack[-1]
            self._set_foreign(key, value is FOREIGN)
            if value is FOREIGN:
                memo.pop(key, None)
            elif value is not opaque and (len(memo) < _MAX_MEMO_STRINGS or not _forgettable(value)):
                if len(memo) >= MAX_MEMO_KEPT:
                    raise _Refused("", "", _TOO_MANY)
                memo[key] = value
            else:
                memo.pop(key, None)  # this index held something else before
            if type(value) is _Global and value.kind not in (PLAIN, TYPE_CALL):
                self.flat_ok = False
        elif code == 0x93:  # STACK_GLOBAL
            name = stack.pop()
            module = stack.pop()
            stack.append(self._global(module, name))
        elif code == ord("c"):  # GLOBAL
            module, name, _ = str(data[arg_start:pos], "utf-8").split("\n")
            stack.append(self._global(module, name))
        elif code == ord("R"):  # REDUCE
            args = stack.pop()
            func = stack.pop()
            self.calls.check(func, args, "call")
            _no_helpers(args if isinstance(args, tuple) else ())
            if isinstance(func, _Global) and (func.module, func.name) in _SETSTATE:
                _check_target(args[0] if isinstance(args, tuple) and args else FOREIGN, "its state setter")
            stack.append(self.calls.result(func, args))
        elif code in (0x81, 0x92):  # NEWOBJ, NEWOBJ_EX: cls.__new__(cls, *args)
            popped = [stack.pop() for _ in range(3 if code == 0x92 else 2)]
            _no_helpers(popped[:-1])
            self.calls.check(popped[-1], None, "__new__")
            stack.append(self.calls.instance_of(popped[-1], False))
        elif code == ord("b"):  # BUILD
            _no_helpers([stack.pop()])
            target = stack.pop()
            _check_target(target, "BUILD")
            stack.append(opaque)
        elif code in (ord("i"), ord("o")):  # INST, OBJ: call a class with the values above the mark
            base = marks.pop()
            items = stack[base:]
            del stack[base:]
            if code == ord("i"):
                module, name, _ = str(data[arg_start:pos], "utf-8").split("\n")
                callee: object = self._global(module, name)
            else:
                callee, items = items[0], items[1:]
            self.calls.check(callee, tuple(items), "call")
            _no_helpers(items)
            stack.append(self.calls.result(callee, tuple(items)))
        elif code in (0x85, 0x86, 0x87):  # TUPLE1-3: kept, they are call arguments
            count = code - 0x84
            items = stack[-count:]
            if len(items) != count:
                raise IndexError("stack underflow")
            del stack[-count:]
            stack.append(_arguments(items))
        elif code == ord("t"):  # TUPLE
            base = marks.pop()
            items = stack[base:]
            del stack[base:]
            stack.append(_arguments(items) if len(items) <= _MAX_TUPLE else _no_helpers(items))
        elif code == ord(")"):
            stack.append(())
        elif code == ord("2"):  # DUP
            stack.append(stack[-1])
        elif code in (0x82, 0x83, 0x84):
            raise _Refused("copyreg", "extension", "EXT opcodes (the copyreg extension registry)")
        elif code == ord("Q"):  # BINPERSID: only the namespace token of old checkpoints
            if stack.pop() != "namespace":
                raise _Refused("", "persistent_load", "a persistent reference other than the namespace")
            stack.append(opaque)
        elif code == ord("P"):
            if bytes(data[arg_start : pos - 1]) != b"namespace":
                raise _Refused("", "persistent_load", "a persistent reference other than the namespace")
            stack.append(opaque)
        elif code == ord("."):  # STOP: one pickle (one variable) ends; the memo carries on
            stack.pop()
            if stack or marks:
                raise ValueError("values left on the stack")
            self.index += 1
            self.stop_end = pos
        elif code == 0x94:
            raise AssertionError("unreachable")
        else:  # everything else: pop what it consumes, push an opaque result
            if pops == -1:
                base = marks.pop()
                _no_helpers(stack[base:])
                del stack[base:]
            elif pops:
                keep = code in (ord("a"), ord("s"))  # APPEND, SETITEM keep their container below the values
                count = pops - 1 if keep else pops
                popped = stack[-count:]
                if len(popped) != count or len(stack) < pops:
                    raise IndexError("stack underflow")
                _no_helpers(popped)
                del stack[-count:]
                if keep:
                    _check_target(stack[-1], "APPEND/SETITEM")
                    return pos, memo_next
            stack.extend([opaque] * pushes)
        return pos, memo_next


def _reads_before(code: int, data: bytes | bytearray | memoryview, pos: int, first: int) -> bool:
    """True for a LONG_BINGET of an entry made before index ``first`` (the first waiting group needs no count)."""
    return code == ord("j") and pos + 5 <= len(data) and _U4.unpack_from(data, pos + 1)[0] < first


def _memo_key(code: int, data: bytes | bytearray | memoryview, start: int, end: int) -> int:
    if code in (ord("h"), ord("q")):
        return data[start]
    if code in (ord("j"), ord("r")):
        return int(_U4.unpack_from(data, start)[0])
    return int(bytes(data[start : end - 1]))
