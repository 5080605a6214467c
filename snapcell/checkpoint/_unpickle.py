"""Checkpoint body -> namespace: restricted unpickling, decompression, and blobs put back in place.

Every global a checkpoint names goes through `make_find_global`, so loading never imports an
arbitrary module. Pickles name snapcell's own helpers by one stable path (`snapcell.checkpoint.helpers`); older
paths are aliases of it (`snapcell.checkpoint._rule`).
"""

from __future__ import annotations

import functools
import io
import itertools
import pickle
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import dill
import zstandard

from snapcell.checkpoint._blobs import (
    CHUNK_BYTES,
    blob_raw_size,
    decode_blob,
    fast_digest,
    unpack_blob_ref,
)
from snapcell.checkpoint._classes import (
    LoadClasses,
    make_skeleton_class,
    make_skeleton_enum,
    make_typevar,
)
from snapcell.checkpoint._findglobal import FindGlobal, checked, make_find_global
from snapcell.checkpoint._format import (
    Codec,
    Container,
    Manifest,
    Section,
    SectionKind,
    VariableInfo,
    parse_container,
)
from snapcell.checkpoint._pickle import (
    _NAMESPACE_PID,
    _describe,
    _no_collection,
)
from snapcell.checkpoint._rule import (
    HELPERS,
    NOT_IN_DILL,
    current_name,
)
from snapcell.checkpoint.helpers import MODULE as HELPERS_MODULE
from snapcell.errors import CheckpointCorrupt

__all__ = [
    "FindGlobal",
    "LoadedNamespace",
    "frame_parts",
    "load_namespace",
    "make_find_global",
]


@dataclass(slots=True)
class LoadedNamespace:
    """Variables restored from a checkpoint.

    Attributes:
        variables: Name to restored value.
        failed: Name to the reason a stored variable could not be restored.
        manifest: The checkpoint's manifest.
    """

    variables: dict[str, Any]
    manifest: Manifest
    failed: dict[str, str] = field(default_factory=dict)
    # Hashes of the frame parts (without out-of-band buffers) that restored: a dump in the same interpreter need
    # not restore the same bytes again to know they load.
    restored: set[bytes] = field(default_factory=set)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(
        self,
        file: io.BytesIO,
        *,
        find_global: FindGlobal,
        namespace: dict[str, Any],
        buffers: list[Any],
        classes: LoadClasses,
    ) -> None:
        super().__init__(file, buffers=buffers)
        self._find_global = find_global
        self._namespace = namespace
        # What class tracker ids stand for: the load's own classes (`_classes`), shared by the frames of one load.
        self._classes = classes
        # Functions and classes this load made: only they may get state from cloudpickle's setstate helpers, so a
        # checkpoint cannot patch a library class or function that it merely names.
        self._made: dict[int, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if current_name(module, name) == (HELPERS_MODULE, "session_namespace"):
            return lambda: self._namespace
        if module != "cloudpickle.cloudpickle" or name not in _TRACKED:
            return self._find_global(module, name)
        helper = self._find_global(module, name)  # the rule still applies
        # Restored functions always get the session's builtins, even when their globals dict has none (the
        # interpreter would hand such a function the real builtins of the frame that made it).
        builtins_table = self._namespace.get("__builtins__", {})
        if name == "_make_function":
            helper = functools.partial(_make_function, builtins_table)
        elif name == "_function_setstate":
            return functools.partial(self._set_state, functools.partial(_function_setstate, builtins_table))
        elif name == "_class_setstate":
            return functools.partial(self._set_state, helper)
        elif name == "_lookup_class_or_track":
            return self._classes.lookup
        elif name == "_make_typevar":
            return functools.partial(make_typevar, self._classes)
        elif name in _CLASS_MAKERS:
            helper = functools.partial(_CLASS_MAKERS[name], self._classes)
        return functools.partial(self._make, helper)

    def _make(self, helper: Callable[..., Any], *args: Any) -> Any:
        made = helper(*args)
        self._made[id(made)] = made
        return made

    def _set_state(self, helper: Callable[..., Any], obj: Any, state: Any) -> Any:
        if self._made.get(id(obj)) is not obj:
            raise pickle.UnpicklingError("the checkpoint sets the state of a function or class it did not create")
        return helper(obj, state)

    def persistent_load(self, pid: Any) -> Any:
        if pid == _NAMESPACE_PID:  # checkpoints written before the namespace token
            return self._namespace
        raise pickle.UnpicklingError(f"unknown persistent reference {pid!r}")


_CLASS_MAKERS: dict[str, Callable[..., Any]] = {
    "_make_skeleton_class": make_skeleton_class,
    "_make_skeleton_enum": make_skeleton_enum,
}
_TRACKED = frozenset(
    {
        "_make_function",
        "_function_setstate",
        "_class_setstate",
        "_lookup_class_or_track",
        "_make_typevar",
        *_CLASS_MAKERS,
    }
)


def _make_function(
    builtins_table: Any, code: types.CodeType, globals: dict[str, Any], name: str, argdefs: Any, closure: Any
) -> types.FunctionType:
    # cloudpickle's own helper installs the real builtins, which a function keeps for life; the session's go in.
    globals["__builtins__"] = builtins_table
    return types.FunctionType(code, globals, name, argdefs, closure)


def _function_setstate(builtins_table: Any, obj: Any, state: Any) -> None:
    # cloudpickle's own setstate puts the real builtins back into the function's globals.
    cloudpickle.cloudpickle._function_setstate(obj, state)
    obj.__globals__["__builtins__"] = builtins_table


def _dill_create_function(builtins_table: Any, fcode: types.CodeType, fglobals: Any, *args: Any) -> Any:
    fglobals = fglobals if fglobals is not None else {}
    fglobals["__builtins__"] = builtins_table  # as in _make_function
    return dill._dill._create_function(fcode, fglobals, *args)


class _RestrictedDillUnpickler(dill.Unpickler):  # type: ignore[misc]
    def __init__(self, file: io.BytesIO, *, find_global: FindGlobal, builtins_table: Any) -> None:
        super().__init__(file)
        self._find_global = find_global
        self._builtins = builtins_table

    def find_class(self, module: str, name: str) -> Any:
        if module == "dill._dill":
            # Only dill's helpers in the table; the ones that import a module or read an attribute by name go
            # through the same guarded functions as cloudpickle's.
            if (module, name) not in HELPERS:
                raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, which is not allowed")
            if name == "_import_module":
                return lambda import_name, safe=False: self._find_global("cloudpickle.cloudpickle", "subimport")(
                    import_name
                )
            if name == "_get_attr":
                return self._find_global("builtins", "getattr")
            if name == "_create_function":
                builtins_table = self._builtins if self._builtins is not None else {}
                return functools.partial(_dill_create_function, builtins_table)
            if name in ("_load_type", "_create_code", "_create_namedtuple"):
                return self._find_global(module, name)
            return checked(HELPERS[(module, name)], getattr(dill._dill, name), lambda _m: False)
        if (module, name) in NOT_IN_DILL:
            # dill never writes cloudpickle's makers and setstate helpers; through this unpickler they would skip the
            # checks above (only a class the load made gets state, the session's builtins, the load's own classes).
            raise pickle.UnpicklingError(
                f"the checkpoint's dill section refers to {module}.{name}, which is not allowed"
            )
        return self._find_global(module, name)


def _decompress(codec: Codec, data: memoryview, raw_size: int, *, writable: bool) -> bytes | bytearray | memoryview:
    if codec is Codec.RAW:
        return bytearray(data) if writable and data.readonly else data
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CheckpointCorrupt(f"a checkpoint section is not a zstd frame: {exc}") from exc
    if declared != raw_size:
        # Checked before allocating: a section table that lies about sizes must not cost memory.
        raise CheckpointCorrupt("a checkpoint section's zstd frame declares a different size than its table entry")
    out = bytearray(raw_size)
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            filled = 0
            view = memoryview(out)
            while filled < raw_size:
                n = reader.readinto(view[filled:])
                if not n:
                    break
                filled += n
            extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise CheckpointCorrupt(f"a checkpoint section does not decompress: {exc}") from exc
    if filled != raw_size or extra:
        raise CheckpointCorrupt("a checkpoint section decompresses to a different size than declared")
    return out


def load_namespace(
    body: bytes | bytearray | memoryview,
    *,
    namespace: dict[str, Any],
    find_global: FindGlobal,
    max_raw_bytes: int | None = None,
    blobs: Mapping[str, bytes | bytearray | memoryview] | None = None,
    manifest: Manifest | None = None,
) -> LoadedNamespace:
    """Restore variables from a verified checkpoint body.

    Only call this with a body whose signature was verified. Functions come back with ``namespace``
    as their globals. A variable that cannot be restored is reported in ``failed`` with the reason. In format 3
    each frame (variables that share objects) restores on its own, so a failure costs only that frame's
    variables; in formats 1 and 2 one stream shares one memo, so the stream variables after it fail too.

    Args:
        body: The verified body.
        namespace: The dict restored functions will use as globals (the session namespace).
        find_global: Resolves every global the pickles name; see `make_find_global`.
        max_raw_bytes: Refuse checkpoints that would decompress to more than this.
        blobs: The stored bytes of the blobs the checkpoint refers to, by hash hex (see ``manifest.blobs``).
        manifest: The manifest already parsed from these very bytes: not parsed again.

    Raises:
        CheckpointCorrupt: Malformed bytes, or a blob that is missing or does not match its hash.
        CheckpointVersionError: A checkpoint format this snapcell cannot read (another Python version is not one).
    """
    container = parse_container(body, max_raw_bytes=max_raw_bytes, manifest=manifest)
    _check_blob_total(container.sections, blobs or {})
    manifest = container.manifest
    dill_data = [s for s in container.sections if s.kind is SectionKind.DILL]
    dill_vars = [v for v in manifest.variables if v.serializer == "dill"]
    if len(dill_vars) != len(dill_data):
        raise CheckpointCorrupt("the checkpoint manifest does not match its sections")
    result = LoadedNamespace({}, manifest)
    if container.header.python != sys.version_info[:2]:
        find_global = _without_code(find_global, container.header.python)
    with _no_collection():
        _load_all(container, result, namespace, find_global, blobs or {}, list(zip(dill_vars, dill_data, strict=True)))
    return result


def _load_all(
    container: Container,
    result: LoadedNamespace,
    namespace: dict[str, Any],
    find_global: FindGlobal,
    blobs: Mapping[str, bytes | bytearray | memoryview],
    dill_sections: list[tuple[VariableInfo, Section]],
) -> None:
    manifest = container.manifest
    if container.header.format_version >= 3:
        _load_frames(container.sections, manifest, result, namespace, find_global, blobs)
    else:
        _load_stream(container.sections, manifest, result, namespace, find_global, blobs)
    for info, section in dill_sections:
        data = _decompress(section.codec, section.data, section.raw_size, writable=False)
        try:
            result.variables[info.name] = _RestrictedDillUnpickler(
                io.BytesIO(data), find_global=find_global, builtins_table=namespace.get("__builtins__")
            ).load()
        except Exception as exc:  # as above
            result.failed[info.name] = _describe(exc)


_CODE_MAKERS = frozenset(
    {("cloudpickle.cloudpickle", "_builtin_type"), ("dill._dill", "_load_type"), ("dill._dill", "_create_code")}
)


def _without_code(find_global: FindGlobal, python: tuple[int, int]) -> FindGlobal:
    """``find_global`` for a checkpoint of another Python minor version: its bytecode is refused, not run.

    Another minor version's bytecode may construct fine and crash the interpreter when it runs; the frames that
    hold functions or classes fail instead, and their definitions are re-created from source.
    """

    def refuse(*args: Any) -> Any:
        raise pickle.UnpicklingError(
            f"it holds bytecode of Python {python[0]}.{python[1]}, which Python "
            f"{sys.version_info.major}.{sys.version_info.minor} cannot run"
        )

    def find(module: str, name: str) -> Any:
        found = find_global(module, name)
        if (module, name) not in _CODE_MAKERS:
            return found
        if name == "_create_code":
            return refuse
        return lambda type_name, *rest: refuse() if type_name == "CodeType" else found(type_name, *rest)

    return find


def _load_stream(
    sections: list[Section],
    manifest: Manifest,
    result: LoadedNamespace,
    namespace: dict[str, Any],
    find_global: FindGlobal,
    blobs: Mapping[str, bytes | bytearray | memoryview],
) -> None:
    """Formats 1 and 2: one stream for every variable, sharing one memo (a failure stops the rest)."""
    streams = [s for s in sections if s.kind is SectionKind.STREAM]
    if len(streams) != 1:
        raise CheckpointCorrupt("the checkpoint must hold exactly one pickle stream")
    stream = _decompress(streams[0].codec, streams[0].data, streams[0].raw_size, writable=False)
    buffers: list[bytes | bytearray | memoryview] = []
    for section in sections:
        if section.kind is SectionKind.BUFFER:
            buffers.append(_decompress(section.codec, section.data, section.raw_size, writable=True))
        elif section.kind is SectionKind.BLOB:
            buffers.append(_assemble(section.data, section.raw_size, blobs))
    cloud_vars = [v for v in manifest.variables if v.serializer == "cloudpickle"]
    unpickler = _RestrictedUnpickler(
        io.BytesIO(stream), find_global=find_global, namespace=namespace, buffers=buffers, classes=LoadClasses()
    )
    for index, info in enumerate(cloud_vars):
        try:
            result.variables[info.name] = unpickler.load()
        except Exception as exc:  # restoring runs reducers from the checkpoint
            reason = _describe(exc)
            for later in cloud_vars[index:]:
                result.failed[later.name] = reason if later is info else f"not restored after {info.name} failed"
            break


def frame_parts(sections: list[Section], manifest: Manifest) -> list[list[tuple[Section, list[Section]]]]:
    """Format 3: each frame's parts, as (pickle section, its buffer sections), checked against the manifest.

    Raises:
        CheckpointCorrupt: The sections do not match the manifest's frames.
    """
    pickles = [s for s in sections if s.kind is not SectionKind.DILL]
    frames: list[list[tuple[Section, list[Section]]]] = []
    position = 0
    names = [v.name for v in manifest.variables if v.serializer == "cloudpickle"]
    if sorted(names) != sorted(n for frame in manifest.frames for n in frame.names):
        raise CheckpointCorrupt("the checkpoint's frames do not match its variables")
    for frame in manifest.frames:
        if frame.layout != "values" and len(frame.names) != 1:
            raise CheckpointCorrupt("the checkpoint has a frame of items that holds more than one variable")
        parts = []
        for count in frame.buffers:
            if position + 1 + count > len(pickles):
                raise CheckpointCorrupt("the checkpoint's frames do not match its sections")
            head, buffers = pickles[position], pickles[position + 1 : position + 1 + count]
            if head.kind not in (SectionKind.STREAM, SectionKind.FRAME_BLOB) or any(
                b.kind not in (SectionKind.BUFFER, SectionKind.BLOB) for b in buffers
            ):
                raise CheckpointCorrupt("the checkpoint's frames do not match its sections")
            parts.append((head, buffers))
            position += 1 + count
        frames.append(parts)
    if position != len(pickles):
        raise CheckpointCorrupt("the checkpoint has sections outside its frames")
    return frames


def _pickle_bytes(
    section: Section, listed: set[str], blobs: Mapping[str, bytes | bytearray | memoryview]
) -> bytes | bytearray | memoryview:
    if section.kind is SectionKind.STREAM:
        return _decompress(section.codec, section.data, section.raw_size, writable=False)
    digest = bytes(section.data)
    stored = blobs.get(digest.hex())
    if stored is None or digest.hex() not in listed:
        raise CheckpointCorrupt(f"frame blob {digest.hex()} of the checkpoint is missing; it cannot be loaded")
    if blob_raw_size(stored) != section.raw_size:
        raise CheckpointCorrupt(f"frame blob {digest.hex()} does not hold the bytes the checkpoint says")
    out = bytearray(section.raw_size)
    decode_blob(stored, digest=digest, into=memoryview(out))
    return out


def _load_frames(
    sections: list[Section],
    manifest: Manifest,
    result: LoadedNamespace,
    namespace: dict[str, Any],
    find_global: FindGlobal,
    blobs: Mapping[str, bytes | bytearray | memoryview],
) -> None:
    """Format 3: each frame restored on its own; one that fails costs only its own variables, named with why."""
    listed = {ref.hash for ref in manifest.blobs}
    classes = LoadClasses()  # one class per tracker id across the frames, as in the namespace that was dumped
    for frame, parts in zip(manifest.frames, frame_parts(sections, manifest), strict=True):
        # Bytes first, for every part: a missing or altered blob is the whole checkpoint's problem.
        loaded_parts = []
        for head, buffer_sections in parts:
            data = _pickle_bytes(head, listed, blobs)
            buffers: list[bytes | bytearray | memoryview] = [
                _decompress(b.codec, b.data, b.raw_size, writable=True)
                if b.kind is SectionKind.BUFFER
                else _assemble(b.data, b.raw_size, blobs)
                for b in buffer_sections
            ]
            loaded_parts.append((data, buffers))
        try:
            values = [
                _RestrictedUnpickler(
                    io.BytesIO(data), find_global=find_global, namespace=namespace, buffers=buffers, classes=classes
                ).load()
                for data, buffers in loaded_parts
            ]
            result.variables.update(_assemble_frame(frame.names, frame.layout, values))
            result.restored.update(fast_digest(data) for data, buffers in loaded_parts if not buffers)
        except Exception as exc:  # restoring runs reducers from the checkpoint
            reason = _describe(exc)
            for name in frame.names:
                result.failed[name] = reason


def _assemble_frame(names: list[str], layout: str, values: list[Any]) -> dict[str, Any]:
    if layout == "values":
        (value,) = values
        if not isinstance(value, tuple) or len(value) != len(names):
            raise pickle.UnpicklingError("a frame does not hold one value per variable")
        return dict(zip(names, value, strict=True))
    if not all(isinstance(v, list) for v in values):
        raise pickle.UnpicklingError("a frame part of items is not a list")
    # The parts are joined at C speed (a Python loop over 1M items was a fifth of a 1M-int load); each part is a
    # list its own unpickler just made, so the first one grows into the whole list.
    if layout == "dict":
        return {names[0]: dict(itertools.chain.from_iterable(values))}
    joined: list[Any] = values[0] if values else []
    for part in values[1:]:
        joined.extend(part)
    return {names[0]: joined}


# A buffer may repeat a chunk (a zero-filled array): at most this many times the distinct chunks' bytes in all.
MAX_CHUNK_REPEAT = 1024


def _check_blob_total(sections: list[Section], blobs: Mapping[str, bytes | bytearray | memoryview]) -> None:
    """Refuse blob references that declare far more bytes than the blobs hold, before any buffer is allocated."""
    declared = sum(section.raw_size for section in sections if section.kind is SectionKind.BLOB)
    if not declared:
        return
    real = sum(max(blob_raw_size(data), 0) for data in blobs.values())
    if declared > max(real, CHUNK_BYTES) * MAX_CHUNK_REPEAT:
        raise CheckpointCorrupt(
            f"the checkpoint's buffers declare {declared} bytes but its blobs hold {real}; it was not loaded"
        )


def _assemble(ref: memoryview, raw_size: int, blobs: Mapping[str, bytes | bytearray | memoryview]) -> bytearray:
    """Rebuild one buffer from its chunks, each decoded in place and checked against its hash.

    Every chunk's blob is found and its own header checked against the size the reference needs before the
    buffer is allocated: a reference that claims more than its blobs hold costs nothing.
    """
    digests = unpack_blob_ref(ref, raw_size)
    chunks = []
    for index, digest in enumerate(digests):
        stored = blobs.get(digest.hex())
        if stored is None:
            raise CheckpointCorrupt(
                f"blob {digest.hex()} of the checkpoint is missing from the store; the checkpoint cannot be loaded"
            )
        start = index * CHUNK_BYTES
        expected = min(start + CHUNK_BYTES, raw_size) - start
        if blob_raw_size(stored) != expected:
            raise CheckpointCorrupt(f"blob {digest.hex()} does not hold the {expected} bytes the checkpoint says")
        chunks.append((digest, stored, start, expected))
    out = bytearray(raw_size)
    view = memoryview(out)
    for digest, stored, start, expected in chunks:
        decode_blob(stored, digest=digest, into=view[start : start + expected])
    return out
