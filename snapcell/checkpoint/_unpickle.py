"""Checkpoint body -> namespace: restricted unpickling, decompression, and blobs put back in place.

Every global a checkpoint names goes through `make_find_global`, so loading never imports an
arbitrary module. Helpers that pickles name by path stay in `_pickle` (old checkpoints refer to them).
"""

from __future__ import annotations

import functools
import importlib
import io
import pickle
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import dill
import zstandard

from snapcell.checkpoint._blobs import (
    CHUNK_BYTES,
    decode_blob,
    unpack_blob_ref,
)
from snapcell.checkpoint._format import (
    Codec,
    Manifest,
    SectionKind,
    parse_container,
)
from snapcell.checkpoint._pickle import (
    _CLOUDPICKLE_HELPERS,
    _COPYREG,
    _GETATTR_PRIVATE,
    _NAMESPACE_PID,
    _SAFE_BUILTINS,
    _code_in_cell,
    _describe,
    _rebuild_datetime_array,
    _rebuild_lru_cache,
    _rebuild_recursive_repr,
)
from snapcell.errors import CheckpointCorrupt

__all__ = ["FindGlobal", "LoadedNamespace", "load_namespace", "make_find_global"]

# Pickles name snapcell's own reconstruction helpers by this module path.
_PICKLE_MODULE = "snapcell.checkpoint._pickle"
FindGlobal = Callable[[str, str], Any]


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


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(
        self, file: io.BytesIO, *, find_global: FindGlobal, namespace: dict[str, Any], buffers: list[Any]
    ) -> None:
        super().__init__(file, buffers=buffers)
        self._find_global = find_global
        self._namespace = namespace

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (_PICKLE_MODULE, "_session_namespace"):
            return lambda: self._namespace
        if (module, name) == ("cloudpickle.cloudpickle", "_make_function") and "__builtins__" in self._namespace:
            return functools.partial(_make_function, self._namespace["__builtins__"])
        return self._find_global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if pid == _NAMESPACE_PID:  # checkpoints written before the namespace token
            return self._namespace
        raise pickle.UnpicklingError(f"unknown persistent reference {pid!r}")


def _make_function(
    builtins_table: Any, code: types.CodeType, globals: dict[str, Any], name: str, argdefs: Any, closure: Any
) -> types.FunctionType:
    # cloudpickle's own helper installs the real builtins, which a function keeps for life; the session's go in.
    globals["__builtins__"] = builtins_table
    return types.FunctionType(code, globals, name, argdefs, closure)


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
            # dill's own helpers, except the ones that import a module or read any attribute by name.
            if name == "_import_module":
                return lambda import_name, safe=False: self._find_global("cloudpickle.cloudpickle", "subimport")(
                    import_name
                )
            if name == "_get_attr":
                return self._find_global("builtins", "getattr")
            if name == "_create_function" and self._builtins is not None:
                return functools.partial(_dill_create_function, self._builtins)
            return super().find_class(module, name)
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
) -> LoadedNamespace:
    """Restore variables from a verified checkpoint body.

    Only call this with a body whose signature was verified. Functions come back with ``namespace``
    as their globals. A variable that cannot be restored is reported in ``failed``; because the
    stream shares one memo, so are the stream variables after it.

    Args:
        body: The verified body.
        namespace: The dict restored functions will use as globals (the session namespace).
        find_global: Resolves every global the pickles name; see `make_find_global`.
        max_raw_bytes: Refuse checkpoints that would decompress to more than this.
        blobs: The stored bytes of the blobs the checkpoint refers to, by hash hex (see ``manifest.blobs``).

    Raises:
        CheckpointCorrupt: Malformed bytes, or a blob that is missing or does not match its hash.
        CheckpointVersionError: Another format or Python version wrote them.
    """
    container = parse_container(body, max_raw_bytes=max_raw_bytes)
    streams = [s for s in container.sections if s.kind is SectionKind.STREAM]
    if len(streams) != 1:
        raise CheckpointCorrupt("the checkpoint must hold exactly one pickle stream")
    stream = _decompress(streams[0].codec, streams[0].data, streams[0].raw_size, writable=False)
    buffers: list[bytes | bytearray | memoryview] = []
    for section in container.sections:
        if section.kind is SectionKind.BUFFER:
            buffers.append(_decompress(section.codec, section.data, section.raw_size, writable=True))
        elif section.kind is SectionKind.BLOB:
            buffers.append(_assemble(section.data, section.raw_size, blobs or {}))
    dill_data = [s for s in container.sections if s.kind is SectionKind.DILL]
    cloud_vars = [v for v in container.manifest.variables if v.serializer == "cloudpickle"]
    dill_vars = [v for v in container.manifest.variables if v.serializer == "dill"]
    if len(dill_vars) != len(dill_data):
        raise CheckpointCorrupt("the checkpoint manifest does not match its sections")
    result = LoadedNamespace({}, container.manifest)
    unpickler = _RestrictedUnpickler(io.BytesIO(stream), find_global=find_global, namespace=namespace, buffers=buffers)
    for index, info in enumerate(cloud_vars):
        try:
            result.variables[info.name] = unpickler.load()
        except Exception as exc:  # restoring runs reducers from the checkpoint
            reason = _describe(exc)
            for later in cloud_vars[index:]:
                result.failed[later.name] = reason if later is info else f"not restored after {info.name} failed"
            break
    for info, section in zip(dill_vars, dill_data, strict=True):
        data = _decompress(section.codec, section.data, section.raw_size, writable=False)
        try:
            result.variables[info.name] = _RestrictedDillUnpickler(
                io.BytesIO(data), find_global=find_global, builtins_table=namespace.get("__builtins__")
            ).load()
        except Exception as exc:  # as above
            result.failed[info.name] = _describe(exc)
    return result


def _assemble(ref: memoryview, raw_size: int, blobs: Mapping[str, bytes | bytearray | memoryview]) -> bytearray:
    """Rebuild one buffer from its chunks, each decoded in place and checked against its hash."""
    out = bytearray(raw_size)
    view = memoryview(out)
    for index, digest in enumerate(unpack_blob_ref(ref, raw_size)):
        stored = blobs.get(digest.hex())
        if stored is None:
            raise CheckpointCorrupt(
                f"blob {digest.hex()} of the checkpoint is missing from the store; the checkpoint cannot be loaded"
            )
        start = index * CHUNK_BYTES
        decode_blob(stored, digest=digest, into=view[start : min(start + CHUNK_BYTES, raw_size)])
    return out


_OWN_HELPERS: dict[str, Callable[..., Any]] = {
    "_rebuild_datetime_array": _rebuild_datetime_array,
    "_rebuild_lru_cache": _rebuild_lru_cache,
    "_rebuild_recursive_repr": _rebuild_recursive_repr,
    "_code_in_cell": _code_in_cell,
}


def _public_getattr(obj: object, name: str, *default: object) -> Any:
    """``getattr`` for checkpoints (enum members and ``object.__new__`` pickle through it): public names only."""
    if not isinstance(name, str) or (name.startswith("_") and name not in _GETATTR_PRIVATE):
        raise pickle.UnpicklingError(f"the checkpoint reads the private attribute {name!r}, which is not allowed")
    return getattr(obj, name, *default)


def _guarded_subimport(allow_module: Callable[[str], bool]) -> Callable[[str], Any]:
    def subimport(name: str) -> Any:
        if not allow_module(name):
            raise pickle.UnpicklingError(f"the checkpoint imports module {name!r}, which the policy does not allow")
        return importlib.import_module(name)

    return subimport


def make_find_global(
    allow_module: Callable[[str], bool],
    overrides: Mapping[tuple[str, str], Any] | None = None,
    *,
    resolve: FindGlobal | None = None,
) -> FindGlobal:
    """Build the resolver the restricted unpickler uses for every global a checkpoint names.

    Allowed: ``overrides`` first (``builtins.getattr`` defaults to one that refuses private names), the serializers' own
    helpers, plain builtin types, and attributes of modules ``allow_module`` accepts. Anything else
    is refused, so loading never imports an arbitrary module. ``resolve``, when given, looks up
    ``module.name`` for allowed modules instead of a plain attribute walk (the policy's guarded lookup).
    """
    overrides = {("builtins", "getattr"): _public_getattr, **(overrides or {})}
    subimport = _guarded_subimport(allow_module)

    def find_global(module: str, name: str) -> Any:
        if (module, name) in overrides:
            return overrides[(module, name)]
        if module == "cloudpickle.cloudpickle":
            if name in ("subimport", "dynamic_subimport"):
                return subimport
            if name in _CLOUDPICKLE_HELPERS:
                return getattr(cloudpickle.cloudpickle, name)
        elif module == _PICKLE_MODULE and name in _OWN_HELPERS:
            return _OWN_HELPERS[name]
        elif module == "builtins":
            if name in _SAFE_BUILTINS or _is_builtin_exception(name):
                return getattr(__import__("builtins"), name)
        elif module == "copyreg" and name in _COPYREG:
            return getattr(__import__("copyreg"), name)
        elif allow_module(module) and resolve is not None:
            owner, _, last = name.rpartition(".")
            if owner and last in _GETATTR_PRIVATE:
                # Classes pickle their own ``__new__`` by reference (``enum.Enum.__new__`` in every Enum subclass).
                return _public_getattr(resolve(module, owner), last)
            return resolve(module, name)
        elif allow_module(module):
            target: Any = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
            return target
        raise pickle.UnpicklingError(f"the checkpoint refers to {module}.{name}, which the policy does not allow")

    return find_global


def _is_builtin_exception(name: str) -> bool:
    value = getattr(__import__("builtins"), name, None)
    return isinstance(value, type) and issubclass(value, BaseException)
