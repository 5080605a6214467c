"""Namespace <-> bytes: pickling, the container format, compression and signing.

Knows nothing of execution or storage. Its names are imported on first use (`snapcell._support`): the worker
imports the checkpoint code (pydantic, the picklers, zstd) only when it first dumps or loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.checkpoint._blobs import (
        BLOB_PREFIX,
        CHUNK_BYTES,
        DIGEST_BYTES,
        HASH_ALGORITHM,
        LEGACY_DIGEST_BYTES,
        REFRESH_AFTER_S,
        blob_key,
        blob_raw_size,
        decode_blob,
        encode_blob,
        fast_digest,
        hash_buffer,
    )
    from snapcell.checkpoint._findglobal import make_find_global
    from snapcell.checkpoint._format import (
        FORMAT_VERSION,
        MAX_MANIFEST_BYTES,
        BlobRef,
        Codec,
        Container,
        DroppedVariable,
        Header,
        Manifest,
        PausedRun,
        SectionKind,
        VariableInfo,
        WorkspaceFile,
        blob_keys_of,
        manifest_bytes,
        pack_container,
        parse_container,
        parse_manifest,
        with_manifest,
    )
    from snapcell.checkpoint._hostscan import (
        AnyOf,
        PassedFrames,
        UnscannedFrame,
        check_frame_blobs,
        declared_raw_bytes,
        frame_blob_hashes,
        scan_body,
        scanned_frames,
    )
    from snapcell.checkpoint._pickle import Dumped, DumpOptions, dump_namespace
    from snapcell.checkpoint._rule import HELPERS, GlobalRule, Refusal, global_refusal
    from snapcell.checkpoint._signing import ENV_SIGNING_KEY, ID_BODY, ID_BYTES, MAC_BYTES, CheckpointId, Keyring
    from snapcell.checkpoint._trial import make_trial_load
    from snapcell.checkpoint._unpickle import FindGlobal, LoadedNamespace, load_namespace

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.checkpoint._blobs": (
        "BLOB_PREFIX",
        "CHUNK_BYTES",
        "DIGEST_BYTES",
        "HASH_ALGORITHM",
        "LEGACY_DIGEST_BYTES",
        "REFRESH_AFTER_S",
        "blob_key",
        "blob_raw_size",
        "decode_blob",
        "encode_blob",
        "fast_digest",
        "hash_buffer",
    ),
    "snapcell.checkpoint._findglobal": ("make_find_global",),
    "snapcell.checkpoint._format": (
        "FORMAT_VERSION",
        "MAX_MANIFEST_BYTES",
        "BlobRef",
        "Codec",
        "Container",
        "DroppedVariable",
        "Header",
        "Manifest",
        "PausedRun",
        "SectionKind",
        "VariableInfo",
        "WorkspaceFile",
        "blob_keys_of",
        "manifest_bytes",
        "pack_container",
        "parse_container",
        "parse_manifest",
        "with_manifest",
    ),
    "snapcell.checkpoint._hostscan": (
        "AnyOf",
        "PassedFrames",
        "UnscannedFrame",
        "check_frame_blobs",
        "declared_raw_bytes",
        "frame_blob_hashes",
        "scan_body",
        "scanned_frames",
    ),
    "snapcell.checkpoint._pickle": (
        "Dumped",
        "DumpOptions",
        "dump_namespace",
    ),
    "snapcell.checkpoint._rule": (
        "HELPERS",
        "GlobalRule",
        "Refusal",
        "global_refusal",
    ),
    "snapcell.checkpoint._signing": (
        "ENV_SIGNING_KEY",
        "ID_BODY",
        "ID_BYTES",
        "MAC_BYTES",
        "CheckpointId",
        "Keyring",
    ),
    "snapcell.checkpoint._trial": ("make_trial_load",),
    "snapcell.checkpoint._unpickle": (
        "FindGlobal",
        "LoadedNamespace",
        "load_namespace",
    ),
}

__all__ = [
    "BLOB_PREFIX",
    "CHUNK_BYTES",
    "DIGEST_BYTES",
    "ENV_SIGNING_KEY",
    "FORMAT_VERSION",
    "HASH_ALGORITHM",
    "HELPERS",
    "ID_BODY",
    "ID_BYTES",
    "LEGACY_DIGEST_BYTES",
    "MAC_BYTES",
    "MAX_MANIFEST_BYTES",
    "REFRESH_AFTER_S",
    "AnyOf",
    "BlobRef",
    "CheckpointId",
    "Codec",
    "Container",
    "DroppedVariable",
    "DumpOptions",
    "Dumped",
    "FindGlobal",
    "GlobalRule",
    "Header",
    "Keyring",
    "LoadedNamespace",
    "Manifest",
    "PassedFrames",
    "PausedRun",
    "Refusal",
    "SectionKind",
    "UnscannedFrame",
    "VariableInfo",
    "WorkspaceFile",
    "blob_key",
    "blob_keys_of",
    "blob_raw_size",
    "check_frame_blobs",
    "declared_raw_bytes",
    "decode_blob",
    "dump_namespace",
    "encode_blob",
    "fast_digest",
    "frame_blob_hashes",
    "global_refusal",
    "hash_buffer",
    "load_namespace",
    "make_find_global",
    "make_trial_load",
    "manifest_bytes",
    "pack_container",
    "parse_container",
    "parse_manifest",
    "scan_body",
    "scanned_frames",
    "with_manifest",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
