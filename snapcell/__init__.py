"""snapcell: a snapshotting Python interpreter for AI agents.

Scripts run in a persistent namespace; ``dump()`` turns it into a signed, compressed checkpoint in
local storage or S3 and returns an opaque ID; ``load_session(id)`` brings it back, in another
process or on another server.

The names below are imported when first used (PEP 562), so that importing a part of the package (a worker
process imports only the runner and the checkpoint code) does not import all of it: the pool, storage
clients, SQLite, the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._lazy import lazy_exports

if TYPE_CHECKING:
    from snapcell._inspect import InspectReport, inspect_checkpoint
    from snapcell._telemetry import conversation_context
    from snapcell.checkpoint import Manifest
    from snapcell.conversation import (
        Conversation,
        ConversationStore,
        FileConversationStore,
        MemoryConversationStore,
        S3ConversationStore,
    )
    from snapcell.errors import (
        CheckpointCorrupt,
        CheckpointError,
        CheckpointExpired,
        CheckpointNotFound,
        CheckpointRefused,
        CheckpointVersionError,
        ConfigError,
        Conflict,
        ConversationBusy,
        ConversationFormatError,
        HeadCorrupt,
        InvalidKey,
        LimitExceeded,
        MemoryLimitExceeded,
        ObjectExists,
        ObjectTooLarge,
        OutputLimitExceeded,
        Overloaded,
        PolicyError,
        QuotaExceeded,
        RunCancelled,
        SandboxError,
        ScriptError,
        ScriptSyntaxError,
        SessionError,
        SnapcellError,
        StorageError,
        StorageTimeout,
        StorageUnavailable,
        TimeLimitExceeded,
        TurnOutcomeUnknown,
        TypingError,
        UnpicklableValue,
        WorkerLost,
        WorkspaceError,
        WorkspacePathError,
        WorkspaceQuotaExceeded,
    )
    from snapcell.pool import AsyncPool, Pool
    from snapcell.runner import Artifact, HostCall, Limits, Policy, RunResult, ScriptValue
    from snapcell.session import AsyncSession, Session
    from snapcell.storage import (
        HeadStore,
        LocalStore,
        MemoryHeads,
        MemoryStore,
        S3Heads,
        S3Store,
        SQLiteHeads,
        Store,
        open_store,
    )
    from snapcell.tool import CodeTool, SyncCodeTool
    from snapcell.workspace import FileInfo

# Where each public name lives; `__getattr__` imports it from there on first use.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell._telemetry": ("conversation_context",),
    "snapcell.checkpoint": ("Manifest",),
    "snapcell._inspect": (
        "InspectReport",
        "inspect_checkpoint",
    ),
    "snapcell.conversation": (
        "Conversation",
        "ConversationStore",
        "FileConversationStore",
        "MemoryConversationStore",
        "S3ConversationStore",
    ),
    "snapcell.errors": (
        "CheckpointCorrupt",
        "CheckpointError",
        "CheckpointExpired",
        "CheckpointNotFound",
        "CheckpointRefused",
        "CheckpointVersionError",
        "ConfigError",
        "Conflict",
        "ConversationBusy",
        "ConversationFormatError",
        "HeadCorrupt",
        "InvalidKey",
        "LimitExceeded",
        "MemoryLimitExceeded",
        "ObjectExists",
        "ObjectTooLarge",
        "OutputLimitExceeded",
        "Overloaded",
        "PolicyError",
        "QuotaExceeded",
        "RunCancelled",
        "SandboxError",
        "ScriptError",
        "ScriptSyntaxError",
        "SessionError",
        "SnapcellError",
        "StorageError",
        "StorageTimeout",
        "StorageUnavailable",
        "TimeLimitExceeded",
        "TurnOutcomeUnknown",
        "TypingError",
        "UnpicklableValue",
        "WorkerLost",
        "WorkspaceError",
        "WorkspacePathError",
        "WorkspaceQuotaExceeded",
    ),
    "snapcell.pool": (
        "AsyncPool",
        "Pool",
    ),
    "snapcell.runner": (
        "Artifact",
        "HostCall",
        "Limits",
        "Policy",
        "RunResult",
        "ScriptValue",
    ),
    "snapcell.session": (
        "AsyncSession",
        "Session",
    ),
    "snapcell.storage": (
        "HeadStore",
        "LocalStore",
        "MemoryHeads",
        "MemoryStore",
        "S3Heads",
        "S3Store",
        "SQLiteHeads",
        "Store",
        "open_store",
    ),
    "snapcell.tool": (
        "CodeTool",
        "SyncCodeTool",
    ),
    "snapcell.workspace": ("FileInfo",),
}

__version__ = "0.1.0"

__all__ = [
    "InspectReport",
    "conversation_context",
    "inspect_checkpoint",
    "AsyncPool",
    "AsyncSession",
    "CheckpointCorrupt",
    "CheckpointRefused",
    "CheckpointError",
    "CheckpointExpired",
    "CheckpointNotFound",
    "CheckpointVersionError",
    "CodeTool",
    "ConfigError",
    "Conflict",
    "ConversationBusy",
    "HeadCorrupt",
    "Conversation",
    "ConversationFormatError",
    "ConversationStore",
    "FileConversationStore",
    "MemoryConversationStore",
    "RunCancelled",
    "S3ConversationStore",
    "HeadStore",
    "HostCall",
    "InvalidKey",
    "LimitExceeded",
    "Limits",
    "LocalStore",
    "Manifest",
    "MemoryHeads",
    "MemoryLimitExceeded",
    "MemoryStore",
    "ObjectExists",
    "ObjectTooLarge",
    "OutputLimitExceeded",
    "Overloaded",
    "Policy",
    "PolicyError",
    "Pool",
    "QuotaExceeded",
    "RunResult",
    "S3Heads",
    "S3Store",
    "SQLiteHeads",
    "SandboxError",
    "ScriptValue",
    "ScriptError",
    "ScriptSyntaxError",
    "Session",
    "SessionError",
    "SnapcellError",
    "StorageError",
    "StorageTimeout",
    "StorageUnavailable",
    "Store",
    "SyncCodeTool",
    "TimeLimitExceeded",
    "TurnOutcomeUnknown",
    "TypingError",
    "UnpicklableValue",
    "WorkerLost",
    "WorkspaceError",
    "WorkspacePathError",
    "WorkspaceQuotaExceeded",
    "Artifact",
    "FileInfo",
    "open_store",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
