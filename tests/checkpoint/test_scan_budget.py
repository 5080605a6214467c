"""The host's checks of a pickle stream do work bounded by its size: the scan is no lever on the host's CPU.

A stream that memoizes a long dotted name once and names it again with a four-byte STACK_GLOBAL walked the path
twice each time (0.4 s a repeat for 20,000 parts, with the GIL held: every conversation on the host slowed). The
work is now counted in the calls the checks make, never in seconds.
"""

from __future__ import annotations

import io
import pickle
import struct

import pytest

from snapcell import Policy
from snapcell.checkpoint import _rule
from snapcell.checkpoint.scan import _scan, scan_pickle
from snapcell.interpreter._runner import checkpoint_rule

RULE = checkpoint_rule(Policy())


def _short_unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def _repeated_global(module: str, name: str, repeats: int) -> bytes:
    """PROTO 4, the two strings memoized once, then ``repeats`` STACK_GLOBALs of them (memo reads), each popped."""
    body = b"\x80\x04" + _short_unicode(module) + b"\x94" + _short_unicode(name) + b"\x94" + b"00"  # memoize, pop
    each = b"h\x00h\x01\x93" + b"0"  # BINGET 0, BINGET 1, STACK_GLOBAL, POP
    return body + each * repeats + b"N."


def test_a_long_dotted_name_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[str] = []
    real = _rule.inspect.getattr_static

    def counting(obj: object, attr: str, *default: object) -> object:
        walks.append(attr)
        return real(obj, attr, *default)

    monkeypatch.setattr(_rule.inspect, "getattr_static", counting)
    # datetime.datetime.max is a datetime, whose class attribute max is one again: every part of the path exists.
    stream = _repeated_global("datetime", "datetime" + ".max" * 20_000, 1000)
    refusal = scan_pickle(stream, RULE)
    assert refusal is not None and "long" in refusal.reason, refusal
    assert len(walks) <= 16


def test_a_global_named_again_and_again_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[tuple[str, str]] = []
    real = _scan.global_refusal

    def counting(module: object, name: object, rule: object) -> object:
        checks.append((str(module), str(name)))
        return real(module, name, rule)  # type: ignore[arg-type]

    monkeypatch.setattr(_scan, "global_refusal", counting)
    stream = _repeated_global("collections", "OrderedDict", 100_000)
    assert pickle.loads(stream) is None  # a well-formed stream
    assert scan_pickle(stream, RULE) is None
    assert checks.count(("collections", "OrderedDict")) == 1


def test_a_text_global_finds_its_line_without_copying_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Protocol 0's GLOBAL reads a line: looking for its end copied 64 KiB for each opcode."""
    copies: list[int] = []

    class Counting(bytes):
        def __getitem__(self, key: object) -> object:  # type: ignore[override]
            value = super().__getitem__(key)  # type: ignore[index]
            if isinstance(key, slice):
                copies.append(len(value))
            return value

    stream = b"ccollections\nOrderedDict\n0" * 10_000 + b"N."
    assert scan_pickle(Counting(stream), RULE) is None
    assert sum(copies) < 64 * len(stream), sum(copies)


def test_past_its_work_budget_the_scan_refuses_and_the_session_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the budget the stream is refused, not checked on. The cap and the verdict cache keep every stream the
    tests can build under the real budget, so the budget is lowered here to show that the bound is enforced."""
    from snapcell import Pool
    from snapcell.errors import CheckpointRefused
    from snapcell.storage import MemoryStore

    names = [("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "deque")]
    stream = b"\x80\x04" + b"".join(_short_unicode(m) + _short_unicode(n) + b"\x930" for m, n in names) + b"N."
    assert scan_pickle(stream, RULE) is None  # under the real budget: passed
    work = sum(len(m) + len(n) for m, n in names)
    monkeypatch.setattr(_scan, "_WORK_PER_BYTE", 0)
    monkeypatch.setattr(_scan, "_WORK_BASE", work - 1)
    refusal = scan_pickle(stream, RULE)
    assert refusal is not None and "more work to check than its size allows" in refusal.reason, refusal
    monkeypatch.setattr(_scan, "_WORK_BASE", work)
    assert scan_pickle(stream, RULE) is None  # the budget counts what the checks did, no more
    # End to end: a dump whose stream is over the host's budget is refused before signing, and the session goes on.
    # Process mode: the worker's own check of its frames (unpatched there) passes them, as a compromised one would.
    monkeypatch.setattr(_scan, "_WORK_BASE", 0)
    store = MemoryStore("scan-budget")
    key = "scan-budget-signing-key-0123456789"
    with Pool(store, isolation="process", signing_keys=[key], min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.feed_run("import collections\nd = collections.OrderedDict(a=1)")
            with pytest.raises(CheckpointRefused, match="more work to check than its size allows"):
                session.dump()
            assert list(store.scan()) == []
            monkeypatch.undo()
            assert session.feed_run("d['a']") == 1
            session.dump()


def test_the_loader_resolves_a_global_named_again_and_again_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader (the only check of a stream an inline load meets) asks the rule once per distinct global too."""
    from snapcell.checkpoint import _findglobal, make_find_global

    checks: list[tuple[str, str]] = []
    real = _findglobal.global_refusal

    def counting(module: object, name: object, rule: object) -> object:
        checks.append((str(module), str(name)))
        return real(module, name, rule)  # type: ignore[arg-type]

    monkeypatch.setattr(_findglobal, "global_refusal", counting)
    find_global = make_find_global(RULE)

    class Loader(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            return find_global(module, name)

    stream = _repeated_global("collections", "OrderedDict", 100_000)
    assert Loader(io.BytesIO(stream)).load() is None
    assert checks.count(("collections", "OrderedDict")) == 1


def test_the_loader_refuses_a_long_dotted_name_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.checkpoint import make_find_global

    walks: list[str] = []
    real = _rule.inspect.getattr_static

    def counting(obj: object, attr: str, *default: object) -> object:
        walks.append(attr)
        return real(obj, attr, *default)

    monkeypatch.setattr(_rule.inspect, "getattr_static", counting)
    find_global = make_find_global(RULE)
    with pytest.raises(pickle.UnpicklingError, match="too long"):
        find_global("datetime", "datetime" + ".max" * 20_000)
    assert len(walks) <= 16
