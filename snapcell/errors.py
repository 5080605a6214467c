"""The snapcell exception hierarchy.

Script problems (`ScriptError`, `LimitExceeded`) are the model's to fix: render
them with `str()` or `.for_model()` and hand the text back. Everything else is
the application's: checkpoints, storage and sessions.

Every class says when it is raised and whether the session is still usable.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = [
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointExpired",
    "CheckpointNotFound",
    "CheckpointVersionError",
    "ConfigError",
    "Conflict",
    "ConversationBusy",
    "InvalidKey",
    "LimitExceeded",
    "MemoryLimitExceeded",
    "ObjectExists",
    "OutputLimitExceeded",
    "PolicyError",
    "QuotaExceeded",
    "SandboxError",
    "ScriptError",
    "ScriptSyntaxError",
    "SessionError",
    "SnapcellError",
    "StorageError",
    "StorageUnavailable",
    "TimeLimitExceeded",
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


class CheckpointVersionError(CheckpointError):
    """Raised when a checkpoint was written by an incompatible format or Python version; nothing was unpickled."""


# -------------------------------------------------------------------- storage


class StorageError(SnapcellError, OSError):
    """Raised when the store cannot do what was asked; the session is unchanged and the call may be retried."""


class StorageUnavailable(StorageError):
    """Raised when the store cannot be reached or refuses access (endpoint, credentials, bucket)."""


class InvalidKey(StorageError, ValueError):
    """Raised when a storage key or conversation ID is malformed; nothing was read or written."""


class ObjectExists(StorageError, FileExistsError):
    """Raised when a create-only write finds the key already taken; the existing object is untouched."""


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
    """Raised when a turn's head write failed and reading the head back could not tell whether it landed.

    The turn may or may not be committed; run it again with the same ``turn_id`` to get its committed answer (it
    does not run twice) or, if it never landed, to run it.

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


class WorkerLost(SessionError):
    """Raised when a session's worker process died; the session is restored from its last checkpoint.

    Attributes:
        reason: ``"timeout"``, ``"memory"``, ``"signal"`` or ``"crash"``.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


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
                raise target(f"{message}: {exc}") from exc
        raise
