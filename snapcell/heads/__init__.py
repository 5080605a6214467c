"""Conversation heads: each conversation's current checkpoint ID, its history, turn records and the turn lease.

Backends: `MemoryHeads`, `SQLiteHeads` (one machine), `S3Heads` and `PostgresHeads` (many servers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import lazy_exports

if TYPE_CHECKING:
    from snapcell.heads._async import AsyncHeads, call_head_store
    from snapcell.heads._heads import (
        Head,
        HeadStore,
        MemoryHeads,
        RecordHeads,
        TurnRecord,
        new_lease_owner,
        validate_conversation_id,
        validate_turn_id,
    )
    from snapcell.heads._open import default_heads, open_heads
    from snapcell.heads._pgdb import PostgresDatabase
    from snapcell.heads._postgres import PostgresHeads
    from snapcell.heads._s3 import S3Heads
    from snapcell.heads._sqlite import SQLiteHeads

_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.heads._async": (
        "AsyncHeads",
        "call_head_store",
    ),
    "snapcell.heads._heads": (
        "Head",
        "HeadStore",
        "MemoryHeads",
        "RecordHeads",
        "TurnRecord",
        "new_lease_owner",
        "validate_conversation_id",
        "validate_turn_id",
    ),
    "snapcell.heads._open": (
        "default_heads",
        "open_heads",
    ),
    "snapcell.heads._pgdb": ("PostgresDatabase",),
    "snapcell.heads._postgres": ("PostgresHeads",),
    "snapcell.heads._s3": ("S3Heads",),
    "snapcell.heads._sqlite": ("SQLiteHeads",),
}

__all__ = [
    "AsyncHeads",
    "Head",
    "HeadStore",
    "MemoryHeads",
    "PostgresDatabase",
    "PostgresHeads",
    "RecordHeads",
    "S3Heads",
    "SQLiteHeads",
    "TurnRecord",
    "call_head_store",
    "default_heads",
    "new_lease_owner",
    "open_heads",
    "validate_conversation_id",
    "validate_turn_id",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
