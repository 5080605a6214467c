"""Pools hand out sessions; they own the store, the signing keys, and (in process mode) the workers."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal, TypeVar

from snapcell._support import SyncLoop
from snapcell.backends import Backend, InlineBackend, ProcessBackend, WorkerOptions, WorkerPool
from snapcell.checkpoint import Keyring, PassedFrames
from snapcell.errors import ConfigError, SessionError
from snapcell.limits import Limits
from snapcell.policy import Policy, with_file_access
from snapcell.sandbox import reclaim_scratch_dirs
from snapcell.session import DEFAULT_MAX_CLOCK_SKEW_S, AsyncSession, Session, SessionConfig, Verifier
from snapcell.storage import DEFAULT_TTL_S, AsyncStore, LocalStore, MemoryStore, Store, open_store
from snapcell.typecheck import TypeChecker
from snapcell.workspace import check_mounts

__all__ = ["DEFAULT_TTL_S", "AsyncPool", "Pool", "reclaim_scratch_dirs"]

T = TypeVar("T")

Isolation = Literal["process", "inline"]
# A memory store lives as long as the process, and so does its key.
_PROCESS_KEY = secrets.token_bytes(32)
log = logging.getLogger("snapcell")
# Modules already named in a warning: a server that builds many pools says it once.
_warned_missing: set[str] = set()


def _warn_missing_modules(policy: Policy) -> None:
    """Log a warning, once per module, for each module ``policy`` allows that is not installed here."""
    missing = sorted(policy.missing_modules() - _warned_missing)
    if missing:
        _warned_missing.update(missing)
        log.warning(
            "the policy allows modules that are not installed here: %s; scripts that import them get "
            "ModuleNotFoundError (install them where the workers run, or leave them out of the policy)",
            ", ".join(missing),
        )


def resolve_keyring(store: Store, signing_keys: Sequence[bytes | str] | None) -> Keyring:
    """Pick the signing keys: the argument, then ``SNAPCELL_SIGNING_KEY``, then the store's default.

    A local store keeps a generated key in its directory (owner-only); a memory store uses a random
    key for the life of the process; any other store needs a key. A local store that already has its key file
    keeps verifying with it when ``SNAPCELL_SIGNING_KEY`` is set (the configured key signs), so setting the
    variable does not orphan the checkpoints written before.

    Raises:
        ConfigError: No key is configured for a store that has no default, or ``signing_keys`` is malformed.
    """
    if signing_keys or isinstance(signing_keys, str | bytes):
        return Keyring(signing_keys)  # a bare str or bytes is refused there, not split into characters
    from_env = Keyring.from_env()
    if from_env is not None:
        if isinstance(store, LocalStore) and store.secret_path().exists():
            try:
                return from_env.verifying_also(store.secret(), f"the store's key file {store.secret_path()}")
            except ConfigError as exc:  # a key file others can read or write is never trusted, even to verify
                log.warning("not verifying with the key file of %s: %s", store.url, exc)
        return from_env
    if isinstance(store, LocalStore):
        return Keyring([store.secret()], labels=[f"the store's key file {store.secret_path()}"])
    if isinstance(store, MemoryStore):
        return Keyring(
            [_PROCESS_KEY],
            labels=[
                "this process's memory:// key: a memory store and its key end with their process, so an ID made in "
                "another process never verifies here"
            ],
        )
    raise ConfigError(
        f"no signing key for {store.url}: set SNAPCELL_SIGNING_KEY (at least 16 bytes; comma-separate "
        "several to rotate) or pass signing_keys= to the pool"
    )


# What makes an object a store here: the four methods every backend has (an application's own store may lack the
# optional ones, such as touch), so a wrong argument fails now instead of at the first dump.
_STORE_METHODS = ("put", "get", "delete", "scan")


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_options(*, limits: object, policy: object) -> None:
    """Refuse ``limits``/``policy`` of the wrong type now, rather than at the first run."""
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(f"limits must be a snapcell Limits(...) or None, not {type(limits).__name__}")
    if policy is not None and not isinstance(policy, Policy):
        raise ConfigError(f"policy must be a snapcell Policy(...) or None, not {type(policy).__name__}")


def _checked_modules(modules: object) -> frozenset[str] | None:
    """A checkout's ``modules_hint`` as a set of names (None: no hint).

    Raises:
        ConfigError: It is not None or a collection of module names.
    """
    if modules is None:
        return None
    if isinstance(modules, str | bytes) or not isinstance(modules, Collection):
        raise ConfigError(f"modules_hint must be a collection of module names or None, not {type(modules).__name__}")
    names = frozenset(modules)
    if not all(isinstance(name, str) for name in names):
        raise ConfigError("modules_hint must hold module names (str)")
    return names


class AsyncPool:
    """Hands out sessions that share a store, signing keys and defaults.

    Args:
        store: A `Store`, or a URL for `open_store` (``file://dir``, ``s3://bucket/prefix``, ``memory://``). A local
            store's directory must exist unless ``create_store`` is True.
        signing_keys: Keys that sign and verify checkpoints (the first signs); see `resolve_keyring`.
        ttl_s: Seconds a checkpoint stays loadable (default 7 days); older IDs raise `CheckpointExpired`.
        policy: What scripts may import and touch. The default allows safe standard-library modules, plus numpy
            and pandas in process mode when they are installed (`Policy.process_default`); pass
            ``Policy.stdlib_only()`` to narrow it.
        limits: Default limits of every run.
        isolation: ``"process"`` (default) runs each session in its own sandboxed worker process, the
            security boundary; ``"inline"`` runs scripts in this process: fastest, and no protection at all
            (trusted code and tests only).
        min_warm_workers: Worker processes kept started ahead of time, so a checkout skips the start-up.
        max_workers: Worker processes alive at once (default: the CPU count); a checkout waits for a free one.
        max_queued_checkouts: Checkouts that may wait for a free worker, served first come, first served
            (default: 64 per worker, so a burst of conversations waits its turn rather than fails). One more is
            refused at once with `Overloaded`, so an overloaded application can back off instead of piling up
            turns that would time out (process mode). Size it to the burst you expect beyond ``max_workers``;
            `checkout_timeout_s` bounds how long each waits.
        checkout_timeout_s: Seconds a checkout waits in the queue for a free worker before `Overloaded`.
        recycle_after: Checkouts a worker serves before it is replaced (default 1: a fresh interpreter per
            session). Higher values skip the start-up of a new worker for later sessions with the same policy
            and limits, which share the interpreter: use them only for sessions that trust each other.
        compression_level: zstd level for checkpoints (1 is fast and compresses well).
        pretouch_workers: Let a worker started ahead of its checkout walk a throwaway turn while it waits, taking
            the copy-on-write page faults of its first turn ahead of time (process mode). Its first turn is then
            about 3 ms faster, but the walk costs the worker more CPU than it saves (about 4 ms more per worker on
            the benchmark machine, see the performance page): off by default, for servers that pay for CPU rather
            than for the latency of a cold turn on an idle machine.
        clock: Returns the current time in seconds; injectable for tests.
        create_store: Make a local store's directory when ``store`` is a URL naming one that does not exist (by
            default that is refused, so a mistyped path does not become a new, empty store).
        max_clock_skew_s: How far in the future (by ``clock``) a checkpoint ID may be dated before it is refused
            (default 5 minutes: hosts whose clocks disagree by less still share checkpoints).

    Raises:
        ConfigError: A setting is invalid or no signing key can be found.
    """

    def __init__(
        self,
        store: Store | str = "memory://",
        *,
        signing_keys: Sequence[bytes | str] | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        policy: Policy | None = None,
        limits: Limits | None = None,
        isolation: Isolation = "process",
        min_warm_workers: int = 1,
        max_workers: int | None = None,
        max_queued_checkouts: int | None = None,
        checkout_timeout_s: float = 30.0,
        recycle_after: int = 1,
        compression_level: int = 1,
        pretouch_workers: bool = False,
        clock: Callable[[], float] = time.time,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
        create_store: bool = False,
    ) -> None:
        if isolation not in ("process", "inline"):
            raise ConfigError(f"isolation must be 'process' or 'inline', not {isolation!r}")
        # Counts and times of the worker processes, checked here even in inline mode (which starts none).
        self._worker_options = WorkerOptions(
            max_workers=max_workers if max_workers is not None else max(os.cpu_count() or 1, 1),
            min_warm=min_warm_workers,
            checkout_timeout_s=checkout_timeout_s,
            recycle_after=recycle_after,
            max_queued=max_queued_checkouts,
        )
        if not _positive_number(ttl_s):
            raise ConfigError(f"ttl_s must be a positive, finite number of seconds, not {ttl_s!r}")
        if not isinstance(compression_level, int) or not -7 <= compression_level <= 22:
            raise ConfigError(f"compression_level must be an integer from -7 to 22, not {compression_level!r}")
        if not isinstance(pretouch_workers, bool):
            raise ConfigError(f"pretouch_workers must be True or False, not {pretouch_workers!r}")
        _check_options(limits=limits, policy=policy)
        if not callable(clock):
            raise ConfigError(f"clock must be a function returning seconds, not {clock!r}")
        if not _positive_number(max_clock_skew_s):
            raise ConfigError(f"max_clock_skew_s must be a positive, finite number, not {max_clock_skew_s!r}")
        if isinstance(store, str):
            store = open_store(store, create=create_store)
        elif not all(callable(getattr(store, name, None)) for name in _STORE_METHODS):
            raise ConfigError(
                f"store must be a Store or a store URL (file:///path, s3://bucket/prefix, memory://), "
                f"not {type(store).__name__}"
            )
        self.store = store
        self.keyring = resolve_keyring(self.store, signing_keys)
        # Frame blobs the host scanned, by policy: a session loading this pool's own dump need not scan them again.
        self._passed_frames = PassedFrames()
        self.ttl_s = float(ttl_s)
        self.policy = policy or (Policy.process_default() if isolation == "process" else Policy.stdlib_only())
        _warn_missing_modules(self.policy)
        self.limits = limits or Limits()
        self.isolation = isolation
        self.compression_level = compression_level
        self.clock = clock
        self.max_clock_skew_s = float(max_clock_skew_s)
        self.min_warm_workers = min_warm_workers
        self.max_workers = self._worker_options.max_workers
        self.max_queued_checkouts = max_queued_checkouts
        self.checkout_timeout_s = float(checkout_timeout_s)
        self.recycle_after = recycle_after
        self.pretouch_workers = pretouch_workers
        self._workers: WorkerPool | None = None
        self._async_store = AsyncStore(self.store)
        # What every session of this pool shares, built once.
        self._session_config = SessionConfig(
            store=self._async_store,
            keyring=self.keyring,
            ttl_s=self.ttl_s,
            clock=self.clock,
            compression_level=self.compression_level,
            max_clock_skew_s=self.max_clock_skew_s,
        )
        self._closed = False
        self._sessions: set[AsyncSession] = set()

    async def __aenter__(self) -> AsyncPool:
        if self.isolation == "process":
            self._worker_pool().fill()
        return self

    def _worker_pool(self) -> WorkerPool:
        if self._workers is None:
            self._workers = WorkerPool(
                dataclasses.replace(
                    self._worker_options,
                    preload=WorkerPool.preload_for(self.policy),
                    settle=(self.policy, self.limits),
                    pretouch=self.pretouch_workers,
                )
            )
        return self._workers

    async def isolation_report(self) -> dict[str, str]:
        """Which isolation layers a worker of this pool has: "active: details", "off" or "unavailable: why".

        In inline mode every layer is reported as "off".
        """
        if self.isolation == "inline":
            return {"process": "off (inline mode)"}
        workers = self._worker_pool()
        await workers.admit()
        try:
            backend = ProcessBackend(workers, policy=self.policy, limits=self.limits)
            await backend.start()
            try:
                return {"process": "active", "start": backend.start_path, **backend.sandbox}
            finally:
                await backend.close()
        finally:
            workers.leave()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _backend(
        self, policy: Policy, limits: Limits, mounts: dict[str, str], modules: frozenset[str] | None = None
    ) -> Backend:
        if self.isolation == "inline":
            if mounts:
                raise ConfigError('mounts need a workspace, which only isolation="process" has')
            return InlineBackend(policy=policy, limits=limits)
        backend = ProcessBackend(self._worker_pool(), policy=policy, limits=limits, mounts=mounts, modules=modules)
        await backend.start()
        return backend

    @asynccontextmanager
    async def checkout(
        self,
        *,
        type_check: bool = False,
        type_check_stubs: str = "",
        limits: Limits | None = None,
        policy: Policy | None = None,
        mounts: Mapping[str, str] | None = None,
        modules_hint: Collection[str] | None = None,
    ) -> AsyncIterator[AsyncSession]:
        """Check out a fresh session with an empty namespace; it is checked in when the block ends.

        Args:
            type_check: Type-check every script against ``type_check_stubs`` before it runs (needs ty).
            type_check_stubs: Python stubs of the host functions, e.g. ``"def list_customers() -> list[dict]: ..."``.
            limits: Limits for this session instead of the pool's.
            policy: Policy for this session instead of the pool's.
            mounts: Host directories readable (never writable, never saved) in the session's workspace, by name:
                ``{"data": "/srv/datasets"}`` shows ``/srv/datasets`` at ``data/`` (process mode only).
            modules_hint: Modules the session is expected to import (process mode; None, the default: unknown). If
                none of the heavy modules the policy allows (numpy, pandas) is among them, the session's worker is
                forked from a zygote that did not import them, which costs less CPU to fork and to end. Only a hint:
                a session that imports one anyway gets it, on demand (slower, same result).

        Raises:
            ConfigError: An argument has the wrong type, a mount is not an existing absolute directory (or the pool
                is inline), or ``type_check=True`` but ty is not installed; nothing was checked out.
            Overloaded: Every worker is busy and the checkout queue is full (raised at once), or the checkout
                waited ``checkout_timeout_s`` in the queue; nothing was checked out, retry later.
            SessionError: The pool is closed.
        """
        if self._closed:
            raise SessionError("the pool is closed; create a new pool")
        if not isinstance(type_check, bool):
            raise ConfigError(f"type_check must be True or False, not {type_check!r}")
        if not isinstance(type_check_stubs, str):
            raise ConfigError(
                f"type_check_stubs must be Python source text (a str), not {type(type_check_stubs).__name__}"
            )
        _check_options(limits=limits, policy=policy)
        checked_mounts = check_mounts(mounts)
        modules = _checked_modules(modules_hint)
        limits = limits or self.limits
        async with self._admitted():
            checker = TypeChecker(type_check_stubs) if type_check else None
            try:
                backend = await self._backend(policy or self.policy, limits, checked_mounts, modules)
            except BaseException:
                if checker is not None:
                    checker.close()
                raise
            async with self._checked_out(backend, policy or self.policy, limits, checker, checked_mounts) as session:
                yield session

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """Hold one of the worker pool's checkout slots (process mode) for the length of a checkout."""
        if self.isolation == "inline":
            yield
            return
        workers = self._worker_pool()
        await workers.admit()
        try:
            yield
        finally:
            workers.leave()

    @asynccontextmanager
    async def _checked_out(
        self,
        backend: Backend,
        policy: Policy,
        limits: Limits,
        checker: TypeChecker | None,
        mounts: dict[str, str],
    ) -> AsyncIterator[AsyncSession]:
        verifier = Verifier(
            policy=with_file_access(policy) if self.isolation == "process" else policy,
            limits=limits,
            mounts=mounts,
            passed=self._passed_frames,
        )
        session = AsyncSession(
            backend=backend, config=self._session_config, limits=limits, verifier=verifier, checker=checker
        )
        self._sessions.add(session)
        try:
            yield session
        finally:
            session._close()
            self._sessions.discard(session)
            await backend.close()
            if checker is not None:
                checker.close()

    async def aclose(self) -> None:
        """Close the pool; sessions still checked out become unusable."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions):
            session._close()
        if self._workers is not None:
            await self._workers.close()
        self.store.close()


class Pool:
    """The synchronous twin of `AsyncPool`, for scripts and the CLI; it owns one event loop.

    Takes the same arguments as `AsyncPool`. Do not use it inside a running event loop; use `AsyncPool` there.
    """

    def __init__(
        self,
        store: Store | str = "memory://",
        *,
        signing_keys: Sequence[bytes | str] | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        policy: Policy | None = None,
        limits: Limits | None = None,
        isolation: Isolation = "process",
        min_warm_workers: int = 1,
        max_workers: int | None = None,
        checkout_timeout_s: float = 30.0,
        max_queued_checkouts: int | None = None,
        recycle_after: int = 1,
        compression_level: int = 1,
        pretouch_workers: bool = False,
        clock: Callable[[], float] = time.time,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
        create_store: bool = False,
    ) -> None:
        self._inner = AsyncPool(
            store,
            signing_keys=signing_keys,
            ttl_s=ttl_s,
            policy=policy,
            limits=limits,
            isolation=isolation,
            min_warm_workers=min_warm_workers,
            max_workers=max_workers,
            checkout_timeout_s=checkout_timeout_s,
            max_queued_checkouts=max_queued_checkouts,
            recycle_after=recycle_after,
            compression_level=compression_level,
            pretouch_workers=pretouch_workers,
            clock=clock,
            max_clock_skew_s=max_clock_skew_s,
            create_store=create_store,
        )
        self._loop = SyncLoop()
        self._closed = False

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._closed:
            coro.close()
            raise SessionError("the pool is closed; create a new pool")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            in_loop = False
        else:
            in_loop = True
        if in_loop:
            coro.close()
            raise SessionError("Pool and Session are synchronous; inside a running event loop use AsyncPool instead")
        # The caller's context (its OpenTelemetry span, conversation label) follows the call into the loop.
        return self._loop.run(coro, context=contextvars.copy_context())

    @property
    def store(self) -> Store:
        """The pool's store."""
        return self._inner.store

    @property
    def aio(self) -> AsyncPool:
        """The `AsyncPool` this pool wraps; hand it to async-only code and drive that code with `call`."""
        return self._inner

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the async API (``pool.aio``, its sessions, a `CodeTool`) on this pool's event loop."""
        result: T = self._call(coro)
        return result

    def __enter__(self) -> Pool:
        if self._closed:
            raise SessionError("the pool is closed; create a new pool")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def isolation_report(self) -> dict[str, str]:
        """See `AsyncPool.isolation_report`."""
        report: dict[str, str] = self._call(self._inner.isolation_report())
        return report

    @contextmanager
    def checkout(
        self,
        *,
        type_check: bool = False,
        type_check_stubs: str = "",
        limits: Limits | None = None,
        policy: Policy | None = None,
        mounts: Mapping[str, str] | None = None,
        modules_hint: Collection[str] | None = None,
    ) -> Iterator[Session]:
        """See `AsyncPool.checkout`."""
        if self._closed:
            raise SessionError("the pool is closed; create a new pool")
        manager = self._inner.checkout(
            type_check=type_check,
            type_check_stubs=type_check_stubs,
            limits=limits,
            policy=policy,
            mounts=mounts,
            modules_hint=modules_hint,
        )
        inner = self._call(manager.__aenter__())
        try:
            yield Session(inner, self._call)
        except BaseException as exc:
            # A pool closed inside the block already checked the session in (closing the loop finished it).
            if not self._closed:
                self._call(manager.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        else:
            if not self._closed:
                self._call(manager.__aexit__(None, None, None))

    def close(self) -> None:
        """Close the pool and its event loop; sessions still checked out become unusable. Closing twice is a no-op."""
        if self._closed:
            return
        try:
            self._call(self._inner.aclose())
        finally:
            self._closed = True
            self._loop.close()
