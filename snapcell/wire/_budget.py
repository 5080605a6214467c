"""What one frame may hold: the size limits of the protocol, and the budget of each reply a host accepts.

A worker keeps within these (it cuts what is longer), and the host checks every frame against the budget of the
request in flight before it allocates anything, so a worker that sends more is not following the protocol.

In snapcell a *budget* is this: the most one frame may hold. Counts against a limit (a run's host calls, see
`snapcell.interpreter.CallCounter`) are counters, not budgets.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from snapcell.limits import Limits

if TYPE_CHECKING:
    from dataclasses import dataclass
else:  # the same classes, made without compiling source text (a zygote's start-up)
    from snapcell._support import dataclass

__all__ = [
    "Budget",
    "either_budget",
    "MAX_ARTIFACTS",
    "MAX_ARTIFACT_FIELD_BYTES",
    "MAX_ASSIGNED",
    "MAX_ASSIGNED_CHARS",
    "MAX_CHECKPOINT_REPLY_BYTES",
    "MAX_DECLARATIONS_CHARS",
    "MAX_DEPTH",
    "MAX_DUMP_BLOBS",
    "MAX_ERROR_NAMES",
    "MAX_ERROR_TEXT_CHARS",
    "MAX_ITEMS",
    "MAX_LIST_BYTES",
    "MAX_LIST_FILES",
    "MAX_MANIFEST_ITEMS",
    "MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_DEPTH",
    "MAX_MESSAGE_ITEMS",
    "MAX_NAME_CHARS",
    "MAX_NOTES",
    "MAX_NOTE_CHARS",
    "MAX_SUMMARY_CHARS",
    "reply_budget",
    "value_items",
]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MAX_DEPTH = 32
MAX_ITEMS = 2_000_000
# A message carries a few plain values (a run's value, a host call's args and kwargs), each within
# MAX_ITEMS and MAX_DEPTH; tags and the message's own fields add a little of both.
MAX_MESSAGE_ITEMS = 8 * MAX_ITEMS
MAX_MESSAGE_DEPTH = MAX_DEPTH + 2
# What one reply may carry besides its value. A worker keeps within these (it cuts what is longer), and the host
# sizes its budget for each reply from them, so a worker that sends more is not following the protocol.
MAX_NOTES = 64
MAX_NOTE_CHARS = 2048
MAX_SUMMARY_CHARS = 1000
MAX_ERROR_TEXT_CHARS = 16 * 1024
MAX_ERROR_NAMES = 256
MAX_NAME_CHARS = 256
# The variables a run assigned (`RunResult.assigned`): this many names, each cut to this many characters.
MAX_ASSIGNED = 64
MAX_ASSIGNED_CHARS = 80
# A dump reply: the new blobs it names, their sizes and the refreshed ones (the host reads the manifest in the body).
# A worker whose checkpoint needs more says so with an error instead. A load reply is a control reply.
MAX_CHECKPOINT_REPLY_BYTES = 32 * 1024 * 1024
MAX_MANIFEST_ITEMS = 1_000_000
MAX_DUMP_BLOBS = 65_536
MAX_DECLARATIONS_CHARS = 1024 * 1024
# Workspace: artifacts per run and the size of each one's description; files and bytes of a listing.
MAX_ARTIFACTS = 256
MAX_ARTIFACT_FIELD_BYTES = 2048
MAX_LIST_FILES = 10_000
MAX_LIST_BYTES = 64 * 1024 * 1024
# Bytes a str character may take in a message: JSON is written as ASCII, and a character outside the BMP
# becomes a surrogate pair of escapes (``\ud83d\ude00``).
_CHAR_BYTES = 12
_TEXT_SLACK = 200  # a text's cut marker ("[... 123 earlier characters of output were dropped ...]")
_FIELDS_BYTES = 16 * 1024  # field names, numbers, the error's short fields
_FIELDS_ITEMS = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The most a reply from a worker may hold; the host checks a frame against it before reading it.

    Attributes:
        message_bytes: Length of the JSON message.
        items: Values in the message (as `count_items` counts them).
        blob_bytes: Length of the blob after the message.
    """

    message_bytes: int
    items: int
    blob_bytes: int = 0


def _text_bytes(*chars: int | None) -> int | None:
    """Bytes of JSON text needed for strings of at most these many characters; None if one is unbounded."""
    if any(c is None for c in chars):
        return None
    return sum(_CHAR_BYTES * (c + _TEXT_SLACK) for c in chars if c is not None)


_ERROR_BYTES = _text_bytes(*[MAX_ERROR_TEXT_CHARS] * 4, *[MAX_NAME_CHARS] * 8, MAX_ERROR_NAMES * MAX_NAME_CHARS) or 0
_ERROR_ITEMS = MAX_ERROR_NAMES + 64


def _bounded(message_bytes: int | None, items: int | None, blob_bytes: int = 0) -> Budget:
    if message_bytes is None or message_bytes > MAX_MESSAGE_BYTES:
        message_bytes = MAX_MESSAGE_BYTES
    if items is None or items > MAX_MESSAGE_ITEMS:
        items = MAX_MESSAGE_ITEMS
    return Budget(message_bytes=message_bytes, items=items, blob_bytes=blob_bytes)


def value_items(limits: Limits) -> int:
    """Most items a run's value (or a host call's arguments) may hold under ``Limits.max_value_bytes``."""
    return MAX_ITEMS if limits.max_value_bytes is None else min(limits.max_value_bytes // 8, MAX_ITEMS)


@functools.lru_cache(maxsize=256)
def reply_budget(kind: str, limits: Limits, blob_bytes: int = 0) -> Budget:
    """The budget of a reply to request ``kind`` (``"run"``, ``"dump"``, ...), or of a host ``"call"`` frame.

    Every reply may instead be an ``error`` reply, so each budget covers one of those as well. A
    limit that is None leaves the matching part bounded only by `MAX_MESSAGE_BYTES`.

    Args:
        kind: The request's op, or ``"call"`` for a worker's host-function call.
        limits: The limits the request runs under.
        blob_bytes: Largest blob a dump reply may carry (the worker's checkpoint budget).
    """
    value = limits.max_value_bytes
    if kind == "call":
        return _bounded(None if value is None else value + _FIELDS_BYTES, value_items(limits) + _FIELDS_ITEMS)
    if kind == "run":
        text = _text_bytes(
            limits.max_output_bytes,
            limits.max_output_bytes,
            limits.max_value_repr_bytes,
            MAX_NOTES * MAX_NOTE_CHARS,
            MAX_SUMMARY_CHARS,
            MAX_ASSIGNED * MAX_ASSIGNED_CHARS,
        )
        size = None if value is None or text is None else value + text + _ERROR_BYTES + _FIELDS_BYTES
        if size is not None:  # the artifacts' descriptions (path, size, media type)
            size += MAX_ARTIFACTS * MAX_ARTIFACT_FIELD_BYTES
        items = value_items(limits) + MAX_NOTES + MAX_ASSIGNED + _ERROR_ITEMS + _FIELDS_ITEMS + 6 * MAX_ARTIFACTS
        return _bounded(size, items, limits.max_artifact_bytes)
    if kind == "dump":
        return _bounded(MAX_CHECKPOINT_REPLY_BYTES, 3 * MAX_DUMP_BLOBS + _ERROR_ITEMS + _FIELDS_ITEMS, blob_bytes)
    if kind == "ws_read":
        return _bounded(_ERROR_BYTES + _FIELDS_BYTES, _ERROR_ITEMS + _FIELDS_ITEMS, blob_bytes)
    if kind == "ws_list":
        return _bounded(
            _ERROR_BYTES + _FIELDS_BYTES + MAX_LIST_BYTES, _ERROR_ITEMS + _FIELDS_ITEMS + 4 * MAX_LIST_FILES
        )
    if kind == "declarations":
        return _bounded((_text_bytes(MAX_DECLARATIONS_CHARS) or 0) + _ERROR_BYTES, _ERROR_ITEMS + _FIELDS_ITEMS)
    # Control requests (init, queue, reset, recycle, close) and start-up: a few short fields, or an error.
    return _bounded(_ERROR_BYTES + _FIELDS_BYTES, _ERROR_ITEMS + _FIELDS_ITEMS)


@functools.lru_cache(maxsize=64)
def either_budget(a: Budget, b: Budget) -> Budget:
    """A budget that admits what either does (a run's frames: its reply, or a host-function call)."""
    return Budget(
        message_bytes=max(a.message_bytes, b.message_bytes),
        items=max(a.items, b.items),
        blob_bytes=max(a.blob_bytes, b.blob_bytes),
    )
