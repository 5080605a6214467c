"""Everything that crosses a process boundary: one codec for frames, plain data, a run's value, every size.

A worker keeps within these sizes and the host checks every frame against them: the host's side of the boundary
reads nothing a worker sends except through here. Its names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.wire._budget import (
        MAX_ARTIFACTS,
        MAX_ASSIGNED,
        MAX_ASSIGNED_CHARS,
        MAX_CHECKPOINT_REPLY_BYTES,
        MAX_DECLARATIONS_CHARS,
        MAX_DUMP_BLOBS,
        MAX_LIST_FILES,
        MAX_MANIFEST_ITEMS,
        MAX_MESSAGE_BYTES,
        MAX_NAME_CHARS,
        MAX_NOTE_CHARS,
        MAX_NOTES,
        MAX_SUMMARY_CHARS,
        Budget,
        either_budget,
        reply_budget,
        value_items,
    )
    from snapcell.wire._plain import JSON_SCALARS, type_name
    from snapcell.wire._values import MAX_FRAME_COLUMNS, ScriptValue, imports_library, to_value
    from snapcell.wire._wire import (
        FRAME,
        MalformedMessage,
        NotPlainData,
        check_script,
        count_items,
        cut_text,
        decode,
        encode,
        error_from_plain,
        error_to_plain,
        split_parts,
        to_plain,
    )
    from snapcell.wire._zygote import HEAVY_MODULES, THREAD_ENV, heavy_modules_named, preload_modules

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.wire._budget": (
        "MAX_ARTIFACTS",
        "MAX_ASSIGNED",
        "MAX_ASSIGNED_CHARS",
        "MAX_CHECKPOINT_REPLY_BYTES",
        "MAX_DECLARATIONS_CHARS",
        "MAX_DUMP_BLOBS",
        "MAX_LIST_FILES",
        "MAX_MANIFEST_ITEMS",
        "MAX_MESSAGE_BYTES",
        "MAX_NAME_CHARS",
        "MAX_NOTE_CHARS",
        "MAX_NOTES",
        "MAX_SUMMARY_CHARS",
        "Budget",
        "either_budget",
        "reply_budget",
        "value_items",
    ),
    "snapcell.wire._plain": (
        "JSON_SCALARS",
        "type_name",
    ),
    "snapcell.wire._values": (
        "MAX_FRAME_COLUMNS",
        "ScriptValue",
        "imports_library",
        "to_value",
    ),
    "snapcell.wire._wire": (
        "FRAME",
        "MalformedMessage",
        "NotPlainData",
        "check_script",
        "count_items",
        "cut_text",
        "decode",
        "encode",
        "error_from_plain",
        "error_to_plain",
        "split_parts",
        "to_plain",
    ),
    "snapcell.wire._zygote": (
        "HEAVY_MODULES",
        "THREAD_ENV",
        "heavy_modules_named",
        "preload_modules",
    ),
}

__all__ = [
    "FRAME",
    "HEAVY_MODULES",
    "JSON_SCALARS",
    "MAX_ARTIFACTS",
    "MAX_ASSIGNED",
    "MAX_ASSIGNED_CHARS",
    "MAX_CHECKPOINT_REPLY_BYTES",
    "MAX_DECLARATIONS_CHARS",
    "MAX_DUMP_BLOBS",
    "MAX_FRAME_COLUMNS",
    "MAX_LIST_FILES",
    "MAX_MANIFEST_ITEMS",
    "MAX_MESSAGE_BYTES",
    "MAX_NAME_CHARS",
    "MAX_NOTES",
    "MAX_NOTE_CHARS",
    "MAX_SUMMARY_CHARS",
    "THREAD_ENV",
    "Budget",
    "MalformedMessage",
    "NotPlainData",
    "ScriptValue",
    "check_script",
    "count_items",
    "cut_text",
    "decode",
    "either_budget",
    "encode",
    "error_from_plain",
    "error_to_plain",
    "heavy_modules_named",
    "imports_library",
    "preload_modules",
    "reply_budget",
    "split_parts",
    "to_plain",
    "to_value",
    "type_name",
    "value_items",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
