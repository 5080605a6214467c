"""Namespace <-> checkpoint body: cloudpickle with a dill fallback, out-of-band buffers, restricted loading."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import io
import pickle
import re
import reprlib
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Literal

import cloudpickle
import dill
import zstandard

from snapcell.checkpoint._blobs import (
    BLOB_THRESHOLD_BYTES,
    CHUNK_BYTES,
    HASH_ALGORITHM,
    REFRESH_AFTER_S,
    encode_blob,
    fast_digest,
    hash_buffer,
    pack_blob_ref,
)
from snapcell.checkpoint._format import (
    BlobRef,
    Codec,
    DroppedVariable,
    FrameInfo,
    Header,
    Manifest,
    SectionKind,
    VariableInfo,
    pack_container,
)
from snapcell.checkpoint._frames import (
    CHUNK_ITEMS,
    LARGE_VALUE_BYTES,
    Frame,
    Part,
    chunkable,
    cut,
    group_names,
    items_for_bytes,
    items_per_part,
    overlapping,
    shared_ids,
)
from snapcell.checkpoint._rule import GlobalRule, Refusal
from snapcell.checkpoint._stdvalues import std_reducers
from snapcell.checkpoint.helpers import (
    code_in_cell,
    rebuild_datetime_array,
    rebuild_lru_cache,
    rebuild_recursive_repr,
    rebuild_str_array,
    session_namespace,
)
from snapcell.checkpoint.scan import PLAIN_UNREFUSED_BYTES, compile_patterns, scan_pickle, scan_pickle_data
from snapcell.errors import ConfigError, UnpicklableValue

__all__ = ["FRAME_BLOB_BYTES", "DumpOptions", "Dumped", "TrialLoad", "dump_namespace"]


_PROTOCOL = 5
_NAMESPACE_PID = "namespace"
# Buffers smaller than this stay in the stream: a section per tiny buffer costs more than it saves.
_MIN_OOB_BYTES = 64 * 1024
_SAMPLE_BYTES = 256 * 1024
# A buffer whose sample compresses worse than this is stored raw (random floats barely compress).
_INCOMPRESSIBLE_RATIO = 0.9
_MAX_KEPT_CELLS = 200
_CELL_PREFIX = "<cell-"
# Frame parts at least this large are stored once as content-addressed blobs (unchanged ones cost a reference).
FRAME_BLOB_BYTES = 16 * 1024


def _recursive_repr_codes() -> frozenset[types.CodeType]:
    @dataclasses.dataclass
    class Probe:
        x: int = 0

    def probe_repr(self: object) -> str:
        return ""

    codes = {Probe.__repr__.__code__, reprlib.recursive_repr()(probe_repr).__code__}
    return frozenset(code for code in codes if "user_function" in code.co_freevars)


# The recursion guards around dataclass __repr__ (dataclasses' and reprlib's) call _thread.get_ident; by value they
# would need `_thread` at load, which the policy refuses. They are rebuilt around the wrapped function instead.
_RECURSIVE_REPR_CODES = _recursive_repr_codes()


def _datetime_array_reduce(array: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """numpy pickles datetime64/timedelta64 arrays in band; send their int64 view out of band like other buffers.

    Without this an unchanged datetime column is compressed into every checkpoint again.
    """
    numpy = sys.modules.get("numpy")
    if numpy is None or type(array) is not numpy.ndarray or not array.flags.c_contiguous or array.dtype.itemsize != 8:
        return None
    return rebuild_datetime_array, (pickle.PickleBuffer(array.view(numpy.int64)), array.dtype.str, array.shape)


# Separator of a string array's joined text: a character text rarely holds (an array where one does goes as usual).
_STR_SEPARATOR = "\x00"


def _str_array_reduce(array: Any) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """An object array of exact strings (a pandas text column) as one joined text, split again at load.

    numpy pickles an object array as one pickled object per element: a 100k-row text column is 100k strings in
    the stream, in the pickler's memo (copied for `shared_ids`), in the host's scan and in the trial restore. Joined,
    it is one string. Strings carry no identity a script can rely on (`_frames` counts them as atoms).
    """
    numpy = sys.modules.get("numpy")
    if numpy is None or type(array) is not numpy.ndarray or array.size < 2:
        return None
    fortran = bool(array.flags.f_contiguous and not array.flags.c_contiguous)
    items = array.ravel(order="F" if fortran else "C").tolist()
    if set(map(type, items)) != {str}:
        return None
    joined = _STR_SEPARATOR.join(items)
    if joined.count(_STR_SEPARATOR) != len(items) - 1:
        return None  # an element holds the separator
    return rebuild_str_array, (joined, _STR_SEPARATOR, array.shape, fortran)


class _RefusedGlobal(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"it refers to {refusal.describe()}, which the checkpoint loader refuses")


class _NamespaceToken:
    """Stands for the session namespace in the stream; the loader resolves it to the restored namespace."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Callable[[], dict[str, Any]], tuple[()]]:
        return session_namespace, ()


_NAMESPACE_TOKEN = _NamespaceToken()


class _NamespacePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle that keeps script functions bound to the live namespace."""

    def __init__(self, file: io.BytesIO, namespace: dict[str, Any], buffer_callback: Callable[[Any], Any]) -> None:
        super().__init__(file, protocol=_PROTOCOL, buffer_callback=buffer_callback)
        self._namespace = namespace
        # cloudpickle gives every function whose globals are `namespace` this object as its globals; a token that
        # loads as the restored namespace makes restored functions share it. (Not persistent_id: the pickler would
        # call it for every object, which triples the time to dump a list of a million ints.)
        self.globals_ref[id(namespace)] = _NAMESPACE_TOKEN
        self._std_reducers = std_reducers()
        # No object so far went through `reducer_override`, which the pickler calls for every object but None,
        # bools and exact ints, floats, strings, bytes, dicts, sets, frozensets, lists and tuples (and buffers, which
        # are out of band here or plain bytes): then the stream holds only opcodes of plain data.
        self.plain = True

    def reducer_override(self, obj: object) -> Any:
        self.plain = False
        if isinstance(obj, re.Pattern):
            # The stdlib's copyreg reducer names the private ``re._compile``, which the checkpoint rule refuses;
            # ``re.compile`` is public API of an allowed module, given plain data.
            return re.compile, (obj.pattern, obj.flags)
        std = self._std_reducers.get(type(obj))
        if std is not None:
            return std(obj)
        if isinstance(obj, functools._lru_cache_wrapper):
            params = obj.cache_parameters()
            return rebuild_lru_cache, (obj.__wrapped__, params["maxsize"], params["typed"])
        if isinstance(obj, types.CodeType) and obj.co_filename.startswith(_CELL_PREFIX):
            # cloudpickle renames every code object <dynamic-code>; the cell name keeps restored tracebacks readable.
            constructor, args = cloudpickle.cloudpickle._code_reduce(obj)
            return code_in_cell, (constructor, args, obj.co_filename)
        if type(obj).__name__ == "ndarray" and getattr(obj, "dtype", None) is not None and obj.dtype.kind in "mMO":  # type: ignore[attr-defined]
            kind = obj.dtype.kind  # type: ignore[attr-defined]
            reduced = _str_array_reduce(obj) if kind == "O" else _datetime_array_reduce(obj)
            if reduced is not None:
                return reduced
        if isinstance(obj, types.FunctionType) and obj.__code__ in _RECURSIVE_REPR_CODES and obj.__closure__:
            user_function = obj.__closure__[obj.__code__.co_freevars.index("user_function")].cell_contents
            return rebuild_recursive_repr, (user_function,)
        return super().reducer_override(obj)


def _pickle_part(obj: object, namespace: dict[str, Any]) -> Part:
    """Pickle one object with a fresh pickler (its own memo): an independent pickle, plus the ids it shares."""
    out = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < _MIN_OOB_BYTES:
            return True  # true means "serialize in band"
        buffers.append(buf)
        return False

    pickler = _NamespacePickler(out, namespace, keep_out_of_band)
    pickler.dump(obj)
    with _no_collection():
        ids, keep = shared_ids(pickler.memo.copy(), namespace, _NAMESPACE_TOKEN)
    return Part(out.getvalue(), buffers, ids, keep, plain=pickler.plain and not buffers)


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """Hold off the cyclic garbage collector while the memo is copied and read, or while a checkpoint restores.

    The copy makes two objects per memo entry (a list of 100k dicts: 200k entries), which set off collections that
    walk every object of the namespace: three quarters of the copy's time. They all die right after (no cycle).
    A restore makes only objects that live on (or die with the load's unpicklers), so collections during it walk
    the growing namespace for nothing. The collector is back on after, also on error.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _part_bytes(part: Part) -> int:
    return len(part.data) + sum(buf.raw().nbytes for buf in part.buffers)


def _compress(data: bytes | memoryview, level: int) -> tuple[Codec, bytes | memoryview]:
    if len(data) > 2 * _SAMPLE_BYTES:
        middle = len(data) // 2
        sample = data[middle : middle + _SAMPLE_BYTES]
        if len(zstandard.ZstdCompressor(level=level).compress(sample)) > _INCOMPRESSIBLE_RATIO * len(sample):
            return Codec.RAW, data
    compressed = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)
    if len(compressed) > _INCOMPRESSIBLE_RATIO * len(data):
        return Codec.RAW, data
    return Codec.ZSTD, compressed


def _type_name(value: object) -> str:
    if isinstance(value, types.ModuleType):
        return "module"  # scripts hold guarded views of modules; their class name is an implementation detail
    cls = type(value)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _describe(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


@dataclass(slots=True)
class Dumped:
    """A serialized namespace, ready to sign and store.

    Attributes:
        body: The unsigned checkpoint body (a bytearray, so signing can append in place).
        manifest: Its manifest.
        new_blobs: Blobs (hash hex to stored bytes) the store may not have yet; store them before the body.
        refresh: Hashes of known blobs whose expiry must be pushed back (last written over a day ago).
        manifest_from_body: ``manifest`` is the host's own parse of ``body``'s manifest (a worker's dump, see
            `ProcessBackend`): the host's parse of the whole body takes it rather than parsing it again.
    """

    body: bytearray
    manifest: Manifest
    new_blobs: dict[str, bytes] = field(default_factory=dict)
    refresh: list[str] = field(default_factory=list)
    manifest_from_body: bool = False


def _blob_sections(
    buffers: list[pickle.PickleBuffer],
    *,
    level: int,
    created_at: float,
    known: Mapping[str, BlobRef],
    threshold: int | None,
    refs: dict[str, BlobRef],
    out: Dumped,
) -> list[tuple[SectionKind, Codec, int, bytes | memoryview]]:
    """Turn out-of-band buffers into sections: large ones become references to chunks stored once as blobs."""
    sections: list[tuple[SectionKind, Codec, int, bytes | memoryview]] = []
    for buf in buffers:
        raw = buf.raw()
        if threshold is None or raw.nbytes < threshold:
            codec, payload = _compress(raw, level)
            sections.append((SectionKind.BUFFER, codec, raw.nbytes, payload))
            continue
        digests = []
        for start in range(0, raw.nbytes, CHUNK_BYTES):
            chunk = raw[start : start + CHUNK_BYTES]
            digest = hash_buffer(chunk)
            digests.append(digest)
            _add_blob(digest.hex(), chunk, refs, out, known=known, level=level, created_at=created_at)
        sections.append((SectionKind.BLOB, Codec.RAW, raw.nbytes, pack_blob_ref(digests)))
    return sections


def _add_blob(
    key: str,
    chunk: memoryview,
    refs: dict[str, BlobRef],
    out: Dumped,
    *,
    known: Mapping[str, BlobRef],
    level: int,
    created_at: float,
) -> None:
    if key in refs:
        return
    previous = known.get(key)
    if previous is not None and previous.raw_bytes == chunk.nbytes:
        stamp = previous.stamp
        if created_at - stamp > REFRESH_AFTER_S:
            out.refresh.append(key)
            stamp = created_at
        refs[key] = BlobRef(hash=key, raw_bytes=chunk.nbytes, stored_bytes=previous.stored_bytes, stamp=stamp)
    else:
        stored = encode_blob(chunk, level)
        out.new_blobs[key] = stored
        refs[key] = BlobRef(hash=key, raw_bytes=chunk.nbytes, stored_bytes=len(stored), stamp=created_at)


TrialLoad = Callable[[bytes, list[Any]], Any]


@dataclass(slots=True)
class _Builder:
    """Pickles variables into frames, dropping (by name, with the reason) what cannot be pickled or restored."""

    namespace: dict[str, Any]
    rule: GlobalRule | Callable[[str], bool] | None
    trial: TrialLoad | None
    restored: set[bytes] | None
    scanned: set[bytes] | None = None
    failed: dict[str, Exception] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    passed: set[str] = field(default_factory=set)  # variables whose alone frame passed the rule

    def single(self, name: str, value: object) -> Frame | None:
        """``value`` alone as a frame (cut into item parts when large), or None when it cannot be pickled."""
        try:
            if isinstance(value, dict | list) and chunkable(value):
                first = value[:CHUNK_ITEMS] if isinstance(value, list) else list(islice(value.items(), CHUNK_ITEMS))
                layout, chunks = cut(value, items_per_part(len(_pickle_part(first, self.namespace).data)))
                parts = [_pickle_part(chunk, self.namespace) for chunk in chunks]
                if overlapping(parts):
                    parts, layout = [_pickle_part((value,), self.namespace)], "values"
            else:
                parts, layout = [_pickle_part((value,), self.namespace)], "values"
                large = isinstance(value, dict | list) and type(value) in (dict, list) and len(value) > 1
                if large and _part_bytes(parts[0]) > LARGE_VALUE_BYTES:
                    parts, layout = self._by_bytes(value, parts, layout)  # type: ignore[arg-type]
        except Exception as exc:  # __reduce__ of script objects may raise anything
            self.failed[name] = exc
            return None
        self.sizes[name] = sum(_part_bytes(part) for part in parts)
        return Frame([name], layout, parts)

    def refusal(self, frame: Frame) -> Refusal | None:
        """The rule's first refusal in the frame's parts (None: all pass), scanning only the frames a dump keeps.

        A variable that shares objects with others is pickled alone first, only to find what it shares, and then
        again with them: its alone pickle is scanned only when their joint one is refused (`frames`).
        """
        if self.rule is None:
            return None
        for part in frame.parts:
            if part.plain and len(part.data) <= PLAIN_UNREFUSED_BYTES:
                continue  # the rule refuses nothing in plain data (the host scans it before signing)
            refusal, part.plain = self.scan(part.data, self.rule)
            if refusal is not None:
                return refusal
        return None

    def passes(self, name: str, frame: Frame) -> bool:
        """Whether a variable's alone frame passes the rule; one that does not is dropped (named, with why)."""
        if name in self.failed or name in self.passed:
            return name in self.passed
        refusal = self.refusal(frame)
        if refusal is not None:
            self.failed[name] = _RefusedGlobal(refusal)
            self.sizes.pop(name, None)
            return False
        self.passed.add(name)
        return True

    def _by_bytes(self, value: dict[Any, Any] | list[Any], whole: list[Part], layout: str) -> tuple[list[Part], str]:
        """A large value of few items as parts of about `PART_BYTES` (``whole`` when its items share objects)."""
        cut_layout, chunks = cut(value, items_for_bytes(len(value), _part_bytes(whole[0])))
        parts = [_pickle_part(chunk, self.namespace) for chunk in chunks]
        return (whole, layout) if overlapping(parts) else (parts, cut_layout)

    def scan(self, data: bytes, rule: GlobalRule | Callable[[str], bool]) -> tuple[Refusal | None, bool]:
        """`scan_pickle_data`, skipped for bytes that passed it before (``scanned``: one rule, so one verdict per
        bytes); then whether they are plain data is not known (False)."""
        # The content address: the host's passed frames (blob names) join this set.
        digest = hash_buffer(data) if self.scanned is not None else None
        if digest is not None and self.scanned is not None and digest in self.scanned:
            return None, False
        refusal, plain = scan_pickle_data(data, rule)
        if refusal is None and digest is not None and self.scanned is not None:
            if len(self.scanned) > _MAX_RESTORED:
                self.scanned.clear()
            self.scanned.add(digest)
        return refusal, plain

    def together(self, names: list[str], variables: Mapping[str, object]) -> Frame | None:
        """Variables that share objects, pickled as one tuple; None when that fails (then each goes alone)."""
        try:
            part = _pickle_part(tuple(variables[n] for n in names), self.namespace)
        except Exception:  # as in `single`: each variable alone then says which one fails
            return None
        return Frame(names, "values", [part])

    def restores(self, frame: Frame) -> Exception | None:
        """Restore each part with the loader's own unpickler (the worker's, right after pickling); None if all do."""
        if self.trial is None:
            return None
        for part in frame.parts:
            if part.plain and not part.buffers:
                continue  # plain data, as this process's pickler just wrote it: it restores (`_DATA_OPS`)
            digest = fast_digest(part.data) if not part.buffers else None
            if digest is not None and self.restored is not None and digest in self.restored:
                continue  # the same bytes restored before in this worker
            try:
                self.trial(part.data, [buf.raw() for buf in part.buffers])
            except Exception as exc:  # restoring runs reducers of script objects
                return exc
            if digest is not None and self.restored is not None:
                if len(self.restored) > _MAX_RESTORED:
                    self.restored.clear()
                self.restored.add(digest)
        return None

    def frames(self, variables: Mapping[str, object]) -> list[Frame]:
        alone: dict[str, Frame] = {}
        for name, value in variables.items():
            frame = self.single(name, value)
            if frame is not None:
                alone[name] = frame
        frames = self._framed(list(alone), alone, variables)
        for frame in frames:  # the memo objects were kept alive only for grouping
            for part in frame.parts:
                part.keep = []
        return frames

    def _framed(self, names: list[str], alone: dict[str, Frame], variables: Mapping[str, object]) -> list[Frame]:
        """The frames of ``names``: one per group of variables that share objects, each scanned and restored."""
        groups = group_names(names, {n: [p.ids for p in alone[n].parts] for n in names})
        frames: list[Frame] = []
        for group in groups:
            if len(group) > 1:
                joint = self.together(group, variables)
                if joint is not None and self.refusal(joint) is not None:
                    # Which variable holds the refused global: it is dropped alone and the others grouped again.
                    passing = [name for name in group if self.passes(name, alone[name])]
                    if len(passing) < len(group):
                        frames += self._framed(passing, alone, variables)
                        continue
                elif joint is not None and self.restores(joint) is None:
                    frames.append(joint)
                    continue
            for name in group:  # apart, so one value that does not restore costs only itself
                if not self.passes(name, alone[name]):
                    continue
                problem = self.restores(alone[name])
                if problem is None:
                    frames.append(alone[name])
                else:
                    self.failed[name] = _Unrestorable(problem)
                    self.sizes.pop(name, None)
        return frames


_MAX_RESTORED = 100_000


class _Unrestorable(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(f"it would not restore at load ({_describe(cause)})")


@dataclass(frozen=True, slots=True, kw_only=True)
class DumpOptions:
    """How `dump_namespace` serializes a namespace: the settings, fixed for a session or a dump, not its data.

    Attributes:
        level: zstd compression level (the pool checks the one it is given).
        on_unpicklable: ``"skip"`` drops and names a variable that cannot be serialized; ``"fail"`` raises.
        blob_threshold_bytes: Smallest buffer stored as a blob; None keeps every buffer inside the body.
        frame_blob_threshold_bytes: Smallest frame part stored once as a content-addressed blob; None keeps every
            frame inside the body.
        rule: The policy's part of the loader's rule; when given, a variable whose pickle names a global
            the loader would refuse (`snapcell.checkpoint.scan._scan`) is dropped and named, as the host would refuse
            the whole checkpoint before signing it. A pickle of plain data (lists, dicts, sets, tuples, strings,
            bytes and numbers only, as the pickler saw) names none and is not scanned here; the host scans it.
        trial: The loader's restricted unpickler (pickle bytes and buffers to a value, raising when it would
            fail at load); each new frame is restored by it right after pickling, and a variable whose frame
            fails is dropped and named. A frame of plain data cannot fail to restore and is not restored.

    Raises:
        ConfigError: An ``on_unpicklable`` other than ``"skip"`` or ``"fail"``, or a negative threshold.
    """

    level: int = 1
    on_unpicklable: Literal["skip", "fail"] = "skip"
    blob_threshold_bytes: int | None = BLOB_THRESHOLD_BYTES
    frame_blob_threshold_bytes: int | None = FRAME_BLOB_BYTES
    rule: GlobalRule | Callable[[str], bool] | None = None
    trial: TrialLoad | None = None

    def __post_init__(self) -> None:
        if self.on_unpicklable not in ("skip", "fail"):
            raise ConfigError(f'on_unpicklable must be "skip" or "fail", not {self.on_unpicklable!r}')
        for name in ("blob_threshold_bytes", "frame_blob_threshold_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must be at least 0 or None, not {value!r}")


_DEFAULT_OPTIONS = DumpOptions()


def dump_namespace(
    variables: Mapping[str, object],
    *,
    namespace: dict[str, Any],
    created_at: float,
    options: DumpOptions | None = None,
    setup_cells: Iterable[str] = (),
    cells: Iterable[str] = (),
    cell_count: int = 0,
    future_flags: int = 0,
    definitions: Iterable[str] = (),
    static_types: Mapping[str, str] | None = None,
    known_blobs: Mapping[str, BlobRef] | None = None,
    restored: set[bytes] | None = None,
    scanned: set[bytes] | None = None,
) -> Dumped:
    """Serialize variables into an unsigned checkpoint body.

    Each variable goes into its own frame (an independent pickle), except that variables sharing objects go into
    one frame together, so shared references survive (`snapcell.checkpoint._frames`). A variable cloudpickle
    cannot serialize is pickled alone by dill; one neither can, or whose pickle would not restore at load, is
    dropped and named in the manifest (or, with ``on_unpicklable="fail"``, nothing is written).

    Args:
        variables: Name to value, in the order to store them.
        namespace: The globals dict of the script's functions; restored functions get the new namespace.
        created_at: Creation time recorded in the manifest (seconds since the epoch).
        options: The settings (compression, unpicklable variables, blob thresholds, the rule and the trial
            restore); the defaults of `DumpOptions` when None.
        setup_cells: Setup cell sources, in order.
        cells: Cell sources; the most recent ones are kept so restored tracebacks show their lines.
        cell_count: Cells run so far, so new cell names stay unique after a load.
        future_flags: ``__future__`` flags in force.
        definitions: Top-level def/class/import statements of the cells, re-run at load when a function or
            class cannot be restored.
        static_types: Static types of variables the type checker gave them; kept for the variables saved.
        known_blobs: Blobs the store already has (from this session's earlier dumps and loads), by hash.
            Buffers of at least ``options.blob_threshold_bytes`` become blobs; only unknown ones are encoded.
        restored: Hashes of frames that ``options.trial`` restored before (kept by the caller across dumps).
        scanned: Hashes of pickles that passed ``options.rule`` before; their scan is skipped (the scan is a
            function of the bytes and the rule), and pickles that pass are added. Kept by the caller across dumps
            made with one ``rule`` only: a set filled under another rule would let a refused global through.

    Returns:
        The body, its manifest, the blobs to store first, and the blobs to refresh.

    Raises:
        UnpicklableValue: With ``on_unpicklable="fail"``, when a variable cannot be serialized.
    """
    options = options or _DEFAULT_OPTIONS
    level, rule = options.level, options.rule
    if rule is not None:
        # Here rather than in the first scan: a worker's warm-up dump (plain data, so not scanned) builds them.
        compile_patterns()
    builder = _Builder(namespace, rule, options.trial, restored, scanned)
    frames = builder.frames(variables)
    failed = builder.failed
    dill_sections: list[tuple[str, bytes]] = []
    dropped: list[DroppedVariable] = []
    for name, cause in failed.items():
        value = variables[name]
        try:
            if isinstance(cause, _Unrestorable):
                raise cause
            data = dill.dumps(value, protocol=_PROTOCOL, recurse=True)
            refusal = scan_pickle(data, rule) if rule is not None else None
            if refusal is not None:
                raise _RefusedGlobal(refusal)
            dill_sections.append((name, data))
        except _Unrestorable as exc:
            reason = f"cannot be saved: {exc}"
            dropped.append(DroppedVariable(name=name, type_name=_type_name(value), reason=reason))
        except Exception as exc:  # same boundary as above
            reason = f"cannot be serialized ({_describe(cause)}; dill: {_describe(exc)})"
            dropped.append(DroppedVariable(name=name, type_name=_type_name(value), reason=reason))
    if dropped and options.on_unpicklable == "fail":
        names = [d.name for d in dropped]
        raise UnpicklableValue(
            f"cannot serialize {', '.join(names)}; delete them or recreate them in a setup cell",
            variable_names=names,
        )
    in_frames = {n for frame in frames for n in frame.names}
    infos = [
        VariableInfo(name=n, type_name=_type_name(v), size_bytes=builder.sizes.get(n, 0), serializer="cloudpickle")
        for n, v in variables.items()
        if n in in_frames
    ]
    infos += [
        VariableInfo(name=n, type_name=_type_name(variables[n]), size_bytes=len(data), serializer="dill")
        for n, data in dill_sections
    ]
    sections: list[tuple[SectionKind, Codec, int, bytes | memoryview]] = []
    refs: dict[str, BlobRef] = {}
    dumped = Dumped(bytearray(), None)  # type: ignore[arg-type]
    known = known_blobs or {}
    frame_infos: list[FrameInfo] = []
    for frame in frames:
        counts = []
        for part in frame.parts:
            size = len(part.data)
            frame_blob_threshold = options.frame_blob_threshold_bytes
            if frame_blob_threshold is not None and frame_blob_threshold <= size <= CHUNK_BYTES:
                digest = hash_buffer(part.data)
                view = memoryview(part.data)
                _add_blob(digest.hex(), view, refs, dumped, known=known, level=level, created_at=created_at)
                sections.append((SectionKind.FRAME_BLOB, Codec.RAW, size, digest))
            else:
                codec, payload = _compress(part.data, level)
                sections.append((SectionKind.STREAM, codec, size, payload))
            buffer_sections = _blob_sections(
                part.buffers,
                level=level,
                created_at=created_at,
                known=known,
                threshold=options.blob_threshold_bytes,
                refs=refs,
                out=dumped,
            )
            sections += buffer_sections
            counts.append(len(buffer_sections))
        frame_infos.append(FrameInfo(names=frame.names, layout=frame.layout, buffers=counts))
    for _name, data in dill_sections:
        codec, payload = _compress(data, level)
        sections.append((SectionKind.DILL, codec, len(data), payload))
    kept_cells = list(cells)[-_MAX_KEPT_CELLS:]
    manifest = Manifest(
        created_at=created_at,
        python=sys.version.split()[0],
        libraries={
            "cloudpickle": cloudpickle.__version__,
            "dill": dill.__version__,
            "zstandard": zstandard.__version__,
        },
        variables=infos,
        dropped=dropped,
        setup_cells=list(setup_cells),
        cells=kept_cells,
        cell_count=cell_count,
        future_flags=future_flags,
        hash_algorithm=HASH_ALGORITHM if refs else None,
        blobs=list(refs.values()),
        frames=frame_infos,
        definitions=list(definitions),
        types={info.name: static_types[info.name] for info in infos if static_types and info.name in static_types},
    )
    dumped.body = pack_container(Header(compression_level=level), manifest, sections)
    dumped.manifest = manifest
    return dumped
