"""snapcell: a snapshotting Python interpreter for AI agents.

Scripts run in a persistent namespace; ``dump()`` turns it into a signed, compressed checkpoint in
local storage or S3 and returns an opaque ID; ``load_session(id)`` brings it back, in another
process or on another server.
"""

from snapcell._inspect import InspectReport, inspect_checkpoint
from snapcell._telemetry import conversation_context
from snapcell.checkpoint import Manifest
from snapcell.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointExpired,
    CheckpointNotFound,
    CheckpointVersionError,
    ConfigError,
    Conflict,
    ConversationBusy,
    InvalidKey,
    LimitExceeded,
    MemoryLimitExceeded,
    ObjectExists,
    OutputLimitExceeded,
    PolicyError,
    QuotaExceeded,
    SandboxError,
    ScriptError,
    ScriptSyntaxError,
    SessionError,
    SnapcellError,
    StorageError,
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
from snapcell.runner import Artifact, HostCall, Limits, Policy, RunResult
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

__version__ = "0.1.0"

__all__ = [
    "InspectReport",
    "conversation_context",
    "inspect_checkpoint",
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
    "ConversationBusy",
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
    "OutputLimitExceeded",
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
