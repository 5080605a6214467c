"""The snapcell exception hierarchy.

Script problems (`ScriptError`, `LimitExceeded`) are the model's to fix: render
them with `str()` or `.for_model()` and hand the text back. Everything else is
the application's: checkpoints, storage and sessions.

Every class says when it is raised and whether the session is still usable.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapcell._support import RunCancelled

__all__ = [
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointExpired",
    "CheckpointNotFound",
    "CheckpointRefused",
    "CheckpointVersionError",
    "ConfigError",
    "Conflict",
    "ConversationBusy",
    "HeadCorrupt",
    "ConversationFormatError",
    "RunCancelled",
    "RunCancelledError",
    "InvalidKey",
    "LimitExceeded",
    "MemoryLimitExceeded",
    "ObjectExists",
    "ObjectTooLarge",
    "OutputLimitExceeded",
    "Overloaded",
    "PolicyError",
    "QuotaExceeded",
    "ResumeDiverged",
    "SandboxError",
    "ScriptError",
    "ScriptSyntaxError",
    "SessionError",
    "SnapcellError",
    "StorageError",
    "StorageTimeout",
    "StorageUnavailable",
    "TimeLimitExceeded",
    "TurnOnOtherBranch",
    "TurnOutcomeUnknown",
    "TypingError",
    "UnpicklableValue",
    "WorkerLost",
    "WorkspaceError",
    "WorkspacePathError",
    "WorkspaceQuotaExceeded",
    "map_exceptions",
]


class SnapcellError(Exception):
    """Root of every error snapcell raises on purpose."""


class ConfigError(SnapcellError, ValueError):
    """Raised when a configuration object, URL or argument is invalid; nothing was started."""


# --------------------------------------------------------------------- script


class ScriptError(SnapcellError):
    """Raised when a script fails; the session and every variable assigned before the failure stay usable.

    Attributes:
        exc_type: Name of the exception the script raised (``"ZeroDivisionError"``).
        exc_message: Its message.
        traceback_text: Traceback restricted to the script's own frames.
        lineno: Line of the script (1-based) where it failed, when known.
        cell: Filename of the cell (``"<cell-3>"``), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        exc_type: str = "",
        exc_message: str = "",
        traceback_text: str = "",
        lineno: int | None = None,
        cell: str | None = None,
        hint: str = "",
    ) -> None:
        super().__init__(message)
        self.exc_type = exc_type or type(self).__name__
        self.exc_message = exc_message or message
        self.traceback_text = traceback_text
        self.lineno = lineno
        self.cell = cell
        self.hint = hint

    def for_model(self) -> str:
        """Render the error as short text a model can act on: traceback, error line, hint."""
        parts = []
        if self.traceback_text:
            parts.append(self.traceback_text.rstrip())
        else:
            where = f" (line {self.lineno})" if self.lineno else ""
            parts.append(f"{self.exc_type}: {self.exc_message}{where}")
        if self.hint:
            parts.append(self.hint)
        return "\n".join(parts)


class RunCancelledError(ScriptError):
    """The error of a run its caller cancelled; variables it had assigned before it stopped are kept."""


class ScriptSyntaxError(ScriptError):
    """Raised when a script does not parse; it did not run and the session is unchanged."""


class PolicyError(ScriptError):
    """Raised when a script uses a blocked import, builtin or attribute; the session stays usable.

    Raised before the script runs when the AST check finds the problem (the
    session is unchanged), or during the run for dynamic access (variables
    assigned before that point are kept).
    """


class TypingError(ScriptError):
    """Raised when a script fails type checking; it did not run and the session is unchanged.

    Attributes:
        diagnostics: The checker's findings, mapped to the script's own lines.
    """

    def __init__(self, message: str, *, diagnostics: Sequence[object] = (), **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.diagnostics = list(diagnostics)

    def display(self, format: str = "full") -> str:
        """Render the diagnostics as text; ``format`` is ``"full"`` or ``"concise"``."""
        if format not in ("full", "concise"):
            raise ConfigError(f"format must be 'full' or 'concise', not {format!r}")
        lines = []
        for diag in self.diagnostics:
            render = getattr(diag, "render", None)
            lines.append(render(format) if callable(render) else str(diag))
        return "\n".join(lines) if lines else str(self)

    def for_model(self) -> str:
        """Render the diagnostics in full, as a model should read them, saying that nothing ran."""
        count = len(self.diagnostics)
        head = f"The script did not run: type checking found {count} problem{'s' if count != 1 else ''}."
        return f"{head}\n{self.display('full')}\nFix them and run the script again."


class LimitExceeded(ScriptError):
    """Raised when a run hits a limit; see each subclass for what survives.

    Attributes:
        limit: Name of the `Limits` field that was hit (``"wall_time_s"``).
        value: The configured limit.
    """

    def __init__(self, message: str, *, limit: str, value: float | int | None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.limit = limit
        self.value = value


class TimeLimitExceeded(LimitExceeded, TimeoutError):
    """Raised when a run exceeds its wall-time limit; the session and earlier variables stay usable.

    Attributes:
        timed_out: Always true; kept for callers that test the attribute.
    """

    timed_out = True


class MemoryLimitExceeded(LimitExceeded, MemoryError):
    """Raised when a script runs out of memory; the session stays usable with earlier variables.

    If the worker process died of it instead, the run raises `WorkerLost` and the session is restored.
    """


class OutputLimitExceeded(LimitExceeded):
    """Raised when a limit on host calls, output volume or script size stops a run; earlier variables stay usable."""


class WorkspaceQuotaExceeded(LimitExceeded):
    """Raised when the workspace's files exceed ``Limits.workspace_bytes``; nothing was stored, earlier files are kept.

    Attributes:
        used_bytes: Bytes the workspace's files would take.
    """

    def __init__(
        self, message: str, *, limit: str, value: float | int | None, used_bytes: int = 0, **kwargs: object
    ) -> None:
        super().__init__(message, limit=limit, value=value, **kwargs)
        self.used_bytes = used_bytes


# ----------------------------------------------------------------- checkpoint


class CheckpointError(SnapcellError):
    """Root of errors about checkpoint bytes; the live session is unaffected."""


class UnpicklableValue(CheckpointError):
    """Raised by ``dump(on_unpicklable="fail")`` when a variable cannot be serialized; nothing was stored.

    Attributes:
        variable_names: The variables that could not be serialized.
    """

    def __init__(self, message: str, *, variable_names: Sequence[str]) -> None:
        super().__init__(message)
        self.variable_names = list(variable_names)


class CheckpointCorrupt(CheckpointError, ValueError):
    """Raised when checkpoint bytes or an ID are tampered, truncated or signed with another key.

    Nothing was unpickled; the session that tried to load it is unchanged.

    Attributes:
        checkpoint_id: The ID involved, when known.
    """

    def __init__(self, message: str, *, checkpoint_id: bytes | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id


class CheckpointRefused(CheckpointError):
    """Raised by ``dump()`` when a pickle stream names a global the loader would refuse; nothing was signed or stored.

    The session is unchanged and usable; delete or recreate the named variable and dump again.

    Attributes:
        module: Module of the first refused global.
        name: Its qualified name (or the refused argument of a helper).
        reason: Why it was refused.
        variable_names: Variables whose pickle holds it, when known.
    """

    def __init__(
        self, message: str, *, module: str, name: str, reason: str, variable_names: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.module = module
        self.name = name
        self.reason = reason
        self.variable_names = list(variable_names)


class CheckpointVersionError(CheckpointError):
    """Raised when a checkpoint was written by an incompatible format or Python version; nothing was unpickled."""


# -------------------------------------------------------------------- storage


class StorageError(SnapcellError, OSError):
    """Raised when the store cannot do what was asked; the session is unchanged and the call may be retried."""


class StorageUnavailable(StorageError):
    """Raised when the store cannot be reached or refuses access (endpoint, credentials, bucket)."""


class StorageTimeout(StorageUnavailable, TimeoutError):
    """Raised when a store call does not finish within its deadline; the session is unchanged, retry later.

    Attributes:
        operation: What was being done (``"get"``, ``"put"``, ``"scan"``, ...).
        key: The key involved, when there is one.
        timeout_s: The deadline the call had, in seconds.
        attempts: Requests made before giving up (0 when the deadline passed before the first).
    """

    def __init__(
        self, message: str, *, operation: str, key: str | None = None, timeout_s: float, attempts: int = 0
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.key = key
        self.timeout_s = timeout_s
        self.attempts = attempts


class InvalidKey(StorageError, ValueError):
    """Raised when a storage key or conversation ID is malformed; nothing was read or written."""


class ObjectExists(StorageError, FileExistsError):
    """Raised when a create-only write finds the key already taken; the existing object is untouched."""


class HeadCorrupt(StorageError):
    """Raised when a conversation's head record was not written by snapcell; other conversations are unaffected.

    Attributes:
        conversation_id: The conversation whose head cannot be read.
    """

    def __init__(self, message: str, *, conversation_id: str) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id


class ObjectTooLarge(StorageError):
    """Raised by a size-bounded read when the stored object is larger than the caller allows; nothing was read.

    Attributes:
        key: The object's key.
        size: Its size in bytes.
        limit: The most the caller would read.
    """

    def __init__(self, message: str, *, key: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.key = key
        self.size = size
        self.limit = limit


class CheckpointNotFound(StorageError, KeyError):
    """Raised when no checkpoint exists under an ID; the session is unchanged.

    Attributes:
        checkpoint_id: The ID that was asked for, when known.
        key: The storage key that was missing.
    """

    def __init__(self, message: str, *, checkpoint_id: bytes | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.key = key

    def __str__(self) -> str:
        # KeyError.__str__ would quote the message.
        return str(self.args[0]) if self.args else ""


class CheckpointExpired(StorageError):
    """Raised when an ID is older than the pool's ttl, even if its bytes still exist; the session is unchanged.

    Attributes:
        checkpoint_id: The expired ID.
        created_at: Its signed creation time (seconds since the epoch).
        expired_at: When it expired (seconds since the epoch).
    """

    def __init__(self, message: str, *, checkpoint_id: bytes, created_at: float, expired_at: float) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.created_at = created_at
        self.expired_at = expired_at


class TurnOutcomeUnknown(StorageError):
    """Raised when a head write (a turn, a rewind, a fork, a file put) failed and reading the head back could not
    tell whether it landed.

    It may or may not have landed; call again with the same ``turn_id``. If it landed, a turn returns its committed
    answer without running its code again (a rewind, fork or file put is not done again). If it did not, the code
    runs again, and so do the host functions it calls: their first calls happened either way. The conversation's
    state holds the turn once.

    Attributes:
        conversation_id: The conversation.
        turn_id: The turn's ID, to pass again.
    """

    def __init__(self, message: str, *, conversation_id: str, turn_id: str) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.turn_id = turn_id


class QuotaExceeded(StorageError):
    """Raised when cleanup cannot bring a store under its quota without deleting needed checkpoints.

    Attributes:
        quota_bytes: The quota.
        used_bytes: Bytes still in use after cleanup.
    """

    def __init__(self, message: str, *, quota_bytes: int, used_bytes: int) -> None:
        super().__init__(message)
        self.quota_bytes = quota_bytes
        self.used_bytes = used_bytes


# -------------------------------------------------------------------- session


class SessionError(SnapcellError):
    """Raised when a session or pool is used wrongly (closed, checked out twice, timed out)."""


class Conflict(SessionError):
    """Raised when another turn of the same conversation holds it or won the race; nothing was overwritten."""


class ConversationBusy(Conflict):
    """Raised when a turn waited too long for the lease of its conversation; nothing ran, the turn may be retried.

    Attributes:
        conversation_id: The conversation.
        holder: Who holds the lease (``"<holder>/<turn>"``), when known.
        stale: True when the holder stopped renewing the lease (it crashed or lost the store), False when it is
            renewing it (a turn is running), None when unknown.
        lease_expires_at: When the lease expires (seconds since the epoch), 0 when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        holder: str | None = None,
        stale: bool | None = None,
        lease_expires_at: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.holder = holder
        self.stale = stale
        self.lease_expires_at = lease_expires_at


class TurnOnOtherBranch(Conflict):
    """Raised when a turn ID given with a `Conversation` was committed from another state than the conversation
    stands on (it was truncated or forked since, or another copy of it ran the turn); nothing ran, nothing changed.

    The committed turn's state is not adopted: it holds another branch's variables. Call again with a new turn ID
    to run the code on the conversation's own state.

    Attributes:
        conversation_id: The conversation.
        turn_id: The turn ID.
        started_from: The checkpoint the committed turn started from (None: an empty session).
        expected: The checkpoint the conversation stands on (None: an empty session).
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        turn_id: str,
        started_from: bytes | None,
        expected: bytes | None,
    ) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.started_from = started_from
        self.expected = expected


class SandboxError(SessionError):
    """Raised when a worker cannot apply a sandbox layer it must have; no worker was started and no script ran.

    Attributes:
        layer: The layer that failed (``"seccomp"``, ``"landlock"``, ``"privileges"``, ...).
        errno: The kernel's error number, or None when the layer is missing but required.
    """

    def __init__(self, message: str, *, layer: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.layer = layer
        self.errno = errno


class Overloaded(SessionError):
    """Raised when a pool's checkout queue is full, or a queued checkout waited too long; nothing was checked out.

    Retry the turn later, or give the pool more workers (``max_workers``) or a longer queue
    (``max_queued_checkouts``). No session was used, so nothing of the conversation changed.

    Attributes:
        max_workers: Checkouts the pool serves at once.
        max_queued: Checkouts that may wait for a free worker.
        timed_out: False when the queue was full (refused at once); True when the checkout waited
            ``checkout_timeout_s`` in the queue without being served.
    """

    def __init__(self, message: str, *, max_workers: int, max_queued: int, timed_out: bool) -> None:
        super().__init__(message)
        self.max_workers = max_workers
        self.max_queued = max_queued
        self.timed_out = timed_out


class ConversationFormatError(StorageError, ValueError):
    """Raised when a stored conversation is malformed or from an unknown future version; nothing was loaded.

    Attributes:
        conversation_id: The conversation, when known.
        version: The version the data claims, when it has one.
    """

    def __init__(self, message: str, *, conversation_id: str | None = None, version: object = None) -> None:
        super().__init__(message)
        self.conversation_id = conversation_id
        self.version = version


class WorkerLost(SessionError):
    """Raised when a session's worker process died; the session is restored from its last checkpoint.

    Attributes:
        reason: ``"timeout"``, ``"memory"``, ``"signal"`` or ``"crash"``.
        result: From `AsyncSession.run`: the run's `RunResult`, with status ``"lost"``; None otherwise.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.result: Any = None


class ResumeDiverged(SessionError):
    """Raised when a resumed run does not replay its log; nothing of the replay is kept, the session stays paused.

    The replay made a host call the log does not have (another name or other arguments), or the cell ended before
    the paused call. The session is still at the paused checkpoint and may be resumed again (with the cell's host
    functions as they were) or abandoned.

    Attributes:
        difference: The first difference, in words.
        call_index: The position (from 0) of the host call where the replay left the log, when it was a call.
    """

    def __init__(self, message: str, *, difference: str, call_index: int | None = None) -> None:
        super().__init__(message)
        self.difference = difference
        self.call_index = call_index


class WorkspaceError(SessionError):
    """Raised when a workspace file operation is refused or fails; the session and its files are unchanged.

    Attributes:
        path: The workspace path concerned, when there is one.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class WorkspacePathError(WorkspaceError, ValueError):
    """Raised for a workspace path that is absolute, escapes with ``..``, crosses a symlink or names a mount."""


@contextmanager
def map_exceptions(
    mapping: Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...], type[SnapcellError]]], message: str
) -> Iterator[None]:
    """Translate foreign exceptions into snapcell errors, keeping the cause.

    Args:
        mapping: Pairs of (exception types to catch, snapcell error to raise), tried in order.
        message: What was being done; the original error's text is appended.

    Raises:
        SnapcellError: The mapped error, ``from`` the original.
    """
    try:
        yield
    except SnapcellError:
        raise
    except Exception as exc:
        for caught, target in mapping:
            if isinstance(exc, caught):
                error = target(f"{message}: {exc}")
                if isinstance(exc, OSError) and isinstance(error, OSError):
                    error.errno = exc.errno  # so callers can still test for ENOSPC, EROFS...
                raise error from exc
        raise


def __getattr__(name: str) -> Any:
    """`RunCancelled` is an `asyncio.CancelledError`, so it is defined (in `snapcell._support._cancelled`) on first use:
    importing the errors does not import asyncio, which a worker's first run does not need."""
    if name == "RunCancelled":
        from snapcell._support import RunCancelled

        globals()[name] = RunCancelled
        return RunCancelled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
