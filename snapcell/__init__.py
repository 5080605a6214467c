"""snapcell: a snapshotting Python interpreter for AI agents.

Scripts run in a persistent namespace; ``dump()`` turns it into a signed, compressed checkpoint in local storage or
S3 and returns an opaque ID; ``load_session(id)`` brings it back, in another process or on another server.

This module holds what an application touches: the pools and sessions, the ``run_code`` tool, `Conversation`,
`Limits`, `Policy`, `RunResult`, `open_store` and the errors a caller catches. Everything else lives in its
package's face: `snapcell.storage` (stores), `snapcell.heads` (head stores), `snapcell.conversation`
(conversation stores), `snapcell.errors` (every error), `snapcell.ops` (cleanup, usage, inspect),
`snapcell.interpreter`, `snapcell.checkpoint`, `snapcell.workspace`, `snapcell.telemetry`.

The names are imported when first used (PEP 562), so that importing a part of the package (a worker process imports
only the interpreter and the checkpoint code) does not import all of it: the pool, storage clients, SQLite, the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcell._support import VERSION, lazy_exports

if TYPE_CHECKING:
    from snapcell.conversation import Conversation
    from snapcell.errors import (
        CheckpointCorrupt,
        CheckpointError,
        CheckpointExpired,
        CheckpointNotFound,
        CheckpointVersionError,
        ConfigError,
        Conflict,
        LimitExceeded,
        MemoryLimitExceeded,
        Overloaded,
        PolicyError,
        ResumeDiverged,
        ScriptError,
        ScriptSyntaxError,
        SessionError,
        SnapcellError,
        StorageError,
        TimeLimitExceeded,
        TurnOutcomeUnknown,
        TypingError,
        WorkerLost,
    )
    from snapcell.interpreter import RunResult
    from snapcell.limits import Limits
    from snapcell.policy import Policy
    from snapcell.pool import AsyncPool, Pool
    from snapcell.session import AsyncSession, Session
    from snapcell.storage import open_store
    from snapcell.tool import CodeTool, SyncCodeTool

# Where each public name lives; `__getattr__` imports it from there on first use.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "snapcell.pool": (
        "AsyncPool",
        "Pool",
    ),
    "snapcell.session": (
        "AsyncSession",
        "Session",
    ),
    "snapcell.tool": (
        "CodeTool",
        "SyncCodeTool",
    ),
    "snapcell.conversation": ("Conversation",),
    "snapcell.limits": ("Limits",),
    "snapcell.policy": ("Policy",),
    "snapcell.interpreter": ("RunResult",),
    "snapcell.storage": ("open_store",),
    "snapcell.errors": (
        "CheckpointCorrupt",
        "CheckpointError",
        "CheckpointExpired",
        "CheckpointNotFound",
        "CheckpointVersionError",
        "ConfigError",
        "Conflict",
        "LimitExceeded",
        "MemoryLimitExceeded",
        "Overloaded",
        "PolicyError",
        "ResumeDiverged",
        "ScriptError",
        "ScriptSyntaxError",
        "SessionError",
        "SnapcellError",
        "StorageError",
        "TimeLimitExceeded",
        "TurnOutcomeUnknown",
        "TypingError",
        "WorkerLost",
    ),
}

# Names that live in a package's face instead: asking the top level for one says where it is.
_MOVED: dict[str, tuple[str, ...]] = {
    "snapcell.ops": (
        "InspectReport",
        "inspect_checkpoint",
    ),
    "snapcell.telemetry": ("conversation_context",),
    "snapcell.checkpoint": ("Manifest",),
    "snapcell.conversation": (
        "ConversationStore",
        "FileConversationStore",
        "MemoryConversationStore",
        "S3ConversationStore",
    ),
    "snapcell.errors": (
        "CheckpointRefused",
        "ConversationBusy",
        "ConversationFormatError",
        "HeadCorrupt",
        "InvalidKey",
        "ObjectExists",
        "ObjectTooLarge",
        "OutputLimitExceeded",
        "QuotaExceeded",
        "RunCancelled",
        "SandboxError",
        "StorageTimeout",
        "StorageUnavailable",
        "UnpicklableValue",
        "WorkspaceError",
        "WorkspacePathError",
        "WorkspaceQuotaExceeded",
    ),
    "snapcell.interpreter": (
        "Artifact",
        "HostCall",
    ),
    "snapcell.wire": ("ScriptValue",),
    "snapcell.heads": (
        "HeadStore",
        "MemoryHeads",
        "S3Heads",
        "SQLiteHeads",
    ),
    "snapcell.storage": (
        "LocalStore",
        "MemoryStore",
        "S3Store",
        "Store",
    ),
    "snapcell.workspace": ("FileInfo",),
}

__version__ = VERSION

__all__ = [
    "AsyncPool",
    "AsyncSession",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointExpired",
    "CheckpointNotFound",
    "CheckpointVersionError",
    "CodeTool",
    "ConfigError",
    "Conflict",
    "Conversation",
    "LimitExceeded",
    "Limits",
    "MemoryLimitExceeded",
    "Overloaded",
    "Policy",
    "PolicyError",
    "Pool",
    "ResumeDiverged",
    "RunResult",
    "ScriptError",
    "ScriptSyntaxError",
    "Session",
    "SessionError",
    "SnapcellError",
    "StorageError",
    "SyncCodeTool",
    "TimeLimitExceeded",
    "TurnOutcomeUnknown",
    "TypingError",
    "WorkerLost",
    "open_store",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), moved=_MOVED)
