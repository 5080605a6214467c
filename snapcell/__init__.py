"""snapcell: a snapshotting Python interpreter for AI agents.

Scripts run in a persistent namespace; ``dump()`` turns it into a signed, compressed checkpoint in
local storage or S3 and returns an opaque ID; ``load_session(id)`` brings it back, in another
process or on another server.
"""

from snapcell._telemetry import conversation_context
from snapcell.checkpoint import Manifest
from snapcell.cli._inspect import InspectReport, inspect_checkpoint
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
)
from snapcell.pool import AsyncPool, Pool
from snapcell.runner import HostCall, Limits, Policy, RunResult
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
    "open_store",
]
