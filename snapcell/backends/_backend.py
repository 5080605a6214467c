"""Where a session's runner lives: the `Backend` protocol and the in-process backend."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, Protocol

from snapcell.checkpoint import BlobRef, Dumped, Manifest
from snapcell.errors import SessionError, WorkspaceError
from snapcell.interpreter import LocalBridge, Runner, RunResult
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.typecheck import declarations_from_namespace

__all__ = ["Backend", "DumpRequest", "InlineBackend", "LoadRequest", "RunRequest"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DumpRequest:
    """What `Backend.dump` takes (and a run's ``then_dump``, fixed before the run starts).

    Attributes:
        created_at: Creation time for the manifest.
        level: zstd level.
        on_unpicklable: What to do with a variable that cannot be serialized.
        known_blobs: Blobs the store already has, by hash; they are referenced, not encoded again.
        passed_frames: Hashes (hex) of frame blobs the host's scan passed under this session's policy; the runner
            does not scan a frame with those bytes again (the host checks every byte it signs either way).
    """

    created_at: float
    level: int
    on_unpicklable: Literal["skip", "fail"]
    known_blobs: Mapping[str, BlobRef]
    passed_frames: Collection[str] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest:
    """What `Backend.run` takes: one cell, and how to run it.

    Attributes:
        code: The script.
        lookup: Host functions by name (sync or async), callable from the script during this run.
        setup: A setup cell (imports, data loading), run again after a restart.
        limits: The limits this run runs under.
        then_dump: A dump the backend may do right after the run, in the same request (see `Backend.run`).
        report: False when the caller reads only the result's value and error (`feed_run`): ``cpu_time_s``,
            ``peak_memory_bytes``, ``memory_bytes``, ``namespace_summary`` and ``files`` may then be left unset
            rather than measured.
        inputs: The run may pause: its clocks and random sources are recorded, replaying this earlier record
            (``{}`` for none; see `Runner.run`). None for a run that cannot pause.
        types: The static types the type checker gave the names the script binds (None: it was not checked).
    """

    code: str
    lookup: Mapping[str, Callable[..., Any]]
    setup: bool
    limits: Limits
    then_dump: DumpRequest | None = None
    report: bool = True
    inputs: Mapping[str, Any] | None = None
    types: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoadRequest:
    """What `Backend.load` takes: a checkpoint the host verified.

    Attributes:
        body: The verified checkpoint body.
        blobs: Its blobs as the store holds them, by hash hex (the runner checks each one's hash before use).
        manifest: The host's own parse of ``body``'s manifest; `Backend.load` returns it.
    """

    body: bytes | bytearray | memoryview
    blobs: Mapping[str, bytes]
    manifest: Manifest


class Backend(Protocol):
    """A session's runner, in this process or in a worker; every method is a request to it."""

    async def run(self, request: RunRequest) -> RunResult:
        """Run one cell; see `Runner.run`.

        With ``request.then_dump``, a backend may dump right after the run, in the same request: `pending_dump` then
        says so, and `dumped` returns that dump. A backend that does not (or a run that ended in an error) leaves
        `pending_dump` None.
        """
        ...

    @property
    def pending_dump(self) -> DumpRequest | None:
        """The dump the last run was asked to do after it, if that dump is under way and not yet taken by `dumped`."""
        ...

    async def dumped(self) -> Dumped:
        """The dump of `pending_dump` (then None); as `dump`, with the same errors."""
        ...

    async def dump(self, request: DumpRequest) -> Dumped:
        """Serialize the namespace into an unsigned checkpoint body plus the blobs the store lacks."""
        ...

    async def load(self, request: LoadRequest) -> Manifest:
        """Replace the namespace with a verified checkpoint body and its blobs.

        Returns ``request.manifest``, the one the host parsed from these very bytes: the session's view of the
        checkpoint is its own parse of what it verified, never a worker's account of it.
        """
        ...

    async def reset(self) -> None:
        """Start again from an empty namespace."""
        ...

    async def queue(self, *, notes: list[str], setup_cells: list[str]) -> None:
        """Add notes for the next run, and setup cells to run before its cell."""
        ...

    async def discard(self) -> None:
        """Throw the runner away (it misbehaved); the next request starts a new one."""
        ...

    @property
    def hash_seed(self) -> int | None:
        """The seed the runner's interpreter hashes strings with (``PYTHONHASHSEED``), or None if not known."""
        ...

    async def use_hash_seed(self, seed: int) -> bool:
        """Run from now on in an interpreter that hashes strings with ``seed`` (a resumed run's, for its set orders).

        Returns:
            True when the runner was replaced for it: its namespace is empty (the caller loads one). False when the
            runner hashes with ``seed`` already, or the backend cannot choose (inline mode: the host's interpreter).

        Raises:
            ConfigError: ``seed`` is not a ``PYTHONHASHSEED`` value.
            SessionError: No runner of that seed could start (the runner is gone; the next request starts one).
        """
        ...

    async def ping(self) -> bool:
        """Whether the runner is alive and answers a request that changes nothing.

        False for a runner that is gone (a worker that died, or did not answer in time and was killed); the next
        request then finds it so, as after any loss.
        """
        ...

    async def declarations(self) -> str:
        """Type declarations for the namespace's variables (for the type checker)."""
        ...

    async def close(self) -> None:
        """Release the runner."""
        ...

    async def write_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        """Write a workspace file (a normalized path); see `AsyncSession.write_file`."""
        ...

    async def read_file(self, path: str, *, max_bytes: int | None) -> bytes:
        """Read a workspace file (a normalized path); see `AsyncSession.read_file`."""
        ...

    async def list_files(self) -> list[tuple[str, int]]:
        """Every workspace file and its size; see `AsyncSession.list_files`."""
        ...


class InlineBackend:
    """Runs scripts in the host process: fastest, and no protection at all (trusted code only)."""

    def __init__(self, *, policy: Policy, limits: Limits) -> None:
        self._policy = policy
        self._limits = limits
        self.runner = Runner(policy=policy, limits=limits)

    async def run(self, request: RunRequest) -> RunResult:
        # ``then_dump`` is left to `dump`: in this process there is no round trip to save.
        lookup, limits = request.lookup, request.limits
        bridge = LocalBridge(lookup, max_calls=limits.max_host_calls)
        return await self.runner.run(
            request.code,
            bridge=bridge,
            host_names=tuple(lookup),
            setup=request.setup,
            limits=limits,
            report=request.report,
            inputs=request.inputs,
            types=request.types,
        )

    async def dump(self, request: DumpRequest) -> Dumped:
        # Off the event loop: a large namespace takes seconds to pickle and compress.
        return await asyncio.to_thread(
            self.runner.dump,
            created_at=request.created_at,
            level=request.level,
            on_unpicklable=request.on_unpicklable,
            known_blobs=request.known_blobs,
            passed_frames=request.passed_frames,
        )

    async def load(self, request: LoadRequest) -> Manifest:
        return await asyncio.to_thread(self.runner.load, request.body, request.blobs, manifest=request.manifest)

    @property
    def pending_dump(self) -> DumpRequest | None:
        return None

    async def dumped(self) -> Dumped:
        raise SessionError("no dump is under way: this backend dumps when asked")

    async def reset(self) -> None:
        self.runner = Runner(policy=self._policy, limits=self._limits)

    async def queue(self, *, notes: list[str], setup_cells: list[str]) -> None:
        self.runner.pending_notes.extend(notes)
        self.runner.pending_setup.extend(setup_cells)

    async def discard(self) -> None:
        self.runner = Runner(policy=self._policy, limits=self._limits)

    @property
    def hash_seed(self) -> int | None:
        return None  # the host process's: fixed when it started, and not readable back

    async def use_hash_seed(self, seed: int) -> bool:
        return False

    async def ping(self) -> bool:
        return True  # the runner is this process

    async def declarations(self) -> str:
        return declarations_from_namespace(self.runner.variables(), types=self.runner.static_types)

    async def close(self) -> None:
        self.runner = Runner(policy=self._policy, limits=self._limits)

    async def write_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        raise _no_workspace(path)

    async def read_file(self, path: str, *, max_bytes: int | None) -> bytes:
        raise _no_workspace(path)

    async def list_files(self) -> list[tuple[str, int]]:
        raise _no_workspace(None)


def _no_workspace(path: str | None) -> WorkspaceError:
    return WorkspaceError(
        "inline mode has no workspace: scripts there have no file access, and sessions no files; use "
        'isolation="process" (the default) for files',
        path=path,
    )
