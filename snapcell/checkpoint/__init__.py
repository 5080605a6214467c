"""Namespace <-> bytes: pickling, the container format, compression and signing.

Knows nothing of execution or storage. Its names are imported on first use (`snapcell._support`): the worker
imports the checkpoint code (pydantic, the picklers, zstd) only when it first dumps or loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell.checkpoint._blobs import BLOB_PREFIX, HASH_ALGORITHM, blob_key, blob_keys_of
    from snapcell.checkpoint._format import (
        FORMAT_VERSION,
        BlobRef,
        DroppedVariable,
        Header,
        Manifest,
        VariableInfo,
        WorkspaceFile,
        parse_container,
    )
    from snapcell.checkpoint._pickle import Dumped, dump_namespace
    from snapcell.checkpoint._rule import HELPERS, GlobalRule, Refusal, global_refusal
    from snapcell.checkpoint._signing import ENV_SIGNING_KEY, CheckpointId, Keyring
    from snapcell.checkpoint._unpickle import FindGlobal, LoadedNamespace, load_namespace, make_find_global
    from snapcell.checkpoint.scan._hostscan import scan_body
    from snapcell.checkpoint.scan._scan import scan_pickle

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.checkpoint._blobs": (
        "BLOB_PREFIX",
        "HASH_ALGORITHM",
        "blob_key",
        "blob_keys_of",
    ),
    "snapcell.checkpoint._format": (
        "FORMAT_VERSION",
        "BlobRef",
        "DroppedVariable",
        "Header",
        "Manifest",
        "VariableInfo",
        "WorkspaceFile",
        "parse_container",
    ),
    "snapcell.checkpoint.scan._hostscan": ("scan_body",),
    "snapcell.checkpoint._pickle": (
        "Dumped",
        "dump_namespace",
    ),
    "snapcell.checkpoint._rule": (
        "HELPERS",
        "GlobalRule",
        "Refusal",
        "global_refusal",
    ),
    "snapcell.checkpoint.scan._scan": ("scan_pickle",),
    "snapcell.checkpoint._signing": (
        "ENV_SIGNING_KEY",
        "CheckpointId",
        "Keyring",
    ),
    "snapcell.checkpoint._unpickle": (
        "FindGlobal",
        "LoadedNamespace",
        "load_namespace",
        "make_find_global",
    ),
}

__all__ = [
    "BLOB_PREFIX",
    "HASH_ALGORITHM",
    "BlobRef",
    "Dumped",
    "blob_key",
    "blob_keys_of",
    "ENV_SIGNING_KEY",
    "FORMAT_VERSION",
    "CheckpointId",
    "DroppedVariable",
    "FindGlobal",
    "HELPERS",
    "GlobalRule",
    "Refusal",
    "global_refusal",
    "scan_body",
    "scan_pickle",
    "Header",
    "Keyring",
    "LoadedNamespace",
    "Manifest",
    "VariableInfo",
    "WorkspaceFile",
    "dump_namespace",
    "load_namespace",
    "make_find_global",
    "parse_container",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
