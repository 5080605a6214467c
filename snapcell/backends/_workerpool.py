"""A pool of warm worker processes: started ahead of time, handed to sessions, recycled or killed.

Checkouts are admitted through a fair queue: at most ``max_workers`` at once, the next ones wait in
FIFO order, at most ``max_queued`` of them, and one more is refused at once with `Overloaded`.

Every new pool reclaims the scratch directories of hosts that died without closing theirs (see `_scratch`): while its
first zygote starts (the host only waits then), before its first spawned worker, or when it closes, whichever is first.

The pools of one event loop share their zygotes, one per set of preloaded modules (see `_SharedZygote`): a second
pool's first worker costs a fork, not an interpreter start.

Each zygote hashes strings with a random seed of its own, which its children share. A checkout may name another seed
(a paused run resumed under the seed it ran with, which its checkpoint records): it gets a worker of that seed that
is warm already, or a worker spawned for it alone. A seed from a checkpoint serves a resume or two, where a zygote pays
off over many forks: a zygote per seed would cost the same interpreter start and then hold memory for nothing, and
its count would follow what checkpoints hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import weakref
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from snapcell.backends._process import _ENV, _KILL_WAIT_S, _REFILL_DELAY_S, WorkerProcess, _Died, log
from snapcell.backends._zygotehost import MAX_HASH_SEED, Zygote, ZygoteError
from snapcell.errors import ConfigError, Overloaded, SandboxError, SessionError
from snapcell.limits import Limits
from snapcell.policy import Policy
from snapcell.sandbox import make_scratch_root, reclaim_scratch_dirs, remove_scratch_root
from snapcell.wire import HEAVY_MODULES, preload_modules

__all__ = ["CheckoutQueue", "WorkerOptions", "WorkerPool"]

# Checkouts that may wait per worker when the pool is not told otherwise. A waiting checkout costs the host a
# future, and a server would rather serve a burst a little late than refuse it: the wait is bounded by
# `checkout_timeout_s` instead. 64 a worker keeps a runaway client from queueing without end.
QUEUED_PER_WORKER = 64


class _SharedZygote:
    """The zygote for one set of preloaded modules, shared by the pools of one event loop.

    Each pool that uses it holds one reference; the last to let go closes it. Whichever pool finds it dead
    starts the next one, under the lock, so a dead zygote is restarted once however many pools notice.
    """

    def __init__(self) -> None:
        self.zygote: Zygote | None = None
        self.users = 0
        self.lock = asyncio.Lock()


# Zygotes are driven by their event loop (a reader task, futures): they are shared among the pools of one loop.
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], _SharedZygote]] = (
    weakref.WeakKeyDictionary()
)


class CheckoutQueue:
    """Admits ``slots`` checkouts at once; the next ones wait in FIFO order, at most ``max_queued`` of them.

    Args:
        slots: Checkouts served at once.
        max_queued: Checkouts that may wait; one more is refused at once with `Overloaded`.
    """

    def __init__(self, *, slots: int, max_queued: int) -> None:
        self.slots = slots
        self.max_queued = max_queued
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        """Checkouts waiting now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def admit(self, timeout_s: float) -> None:
        """Take a slot, waiting behind earlier checkouts for at most ``timeout_s``; pair with `leave`.

        Raises:
            Overloaded: The queue is full (at once), or no slot came free within ``timeout_s``; no slot is held.
        """
        if self.active < self.slots and not self._waiters:
            self.active += 1
            return
        if self.queued >= self.max_queued:
            raise Overloaded(
                f"the pool is overloaded: {self.slots} sessions are checked out and {self.queued} more are "
                f"waiting (max_queued_checkouts={self.max_queued}); retry the turn later, or raise max_workers",
                max_workers=self.slots,
                max_queued=self.max_queued,
                timed_out=False,
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.leave()  # the slot was handed over just as the wait ended: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"the pool is overloaded: a checkout waited {timeout_s:g} s in the queue without a free worker "
                    f"({self.slots} sessions are checked out); retry the turn later, or raise max_workers",
                    max_workers=self.slots,
                    max_queued=self.max_queued,
                    timed_out=True,
                ) from None
            raise

    def leave(self) -> None:
        """Give a slot back: to the longest-waiting checkout, or free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to this checkout; `active` stays the same
                return
        self.active -= 1

    def close(self) -> None:
        """Refuse every waiting checkout with `SessionError` (the pool is closing)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(SessionError("the pool was closed while this checkout waited for a worker"))


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How a `WorkerPool` starts, keeps and hands out workers; checked when made.

    The names in error messages are `AsyncPool`'s, which builds these from its own keywords.

    Attributes:
        max_workers: Workers alive at once (checked out plus warm).
        min_warm: Workers kept started ahead of time.
        checkout_timeout_s: Seconds `WorkerPool.admit` waits in the queue before `Overloaded`, and
            `WorkerPool.acquire` waits for a free slot before `SessionError`.
        recycle_after: Checkouts a worker serves before it is replaced. 1 (the default) gives every session a
            fresh interpreter. More reuses a worker for later sessions with the same policy and limits: its
            namespace, scratch directory and decimal context are reset, but it is the same interpreter, so
            use it only where the sessions trust each other (one tenant).
        max_queued: Checkouts that may wait in `WorkerPool.admit` for a free worker (None: 64 per worker).
        zygote: Fork workers from a clean zygote interpreter per set of preloaded modules (see `_zygote`), the
            default, shared with the other pools of this event loop; False spawns a fresh interpreter per worker.
            A zygote that cannot start or fork falls back to spawning, and a dead one is restarted on the next
            checkout.
        preload: Heavy modules (numpy, pandas) the warm workers' zygote imports; a checkout whose policy allows
            others gets a worker from a zygote of its own.
        settle: The (policy, limits) most checkouts use (the pool's own): warm workers get them, and so apply
            their sandbox, ahead of time; a checkout with other settings gets a worker of its own.
        worker_command: The interpreter and module a worker is started as (tests start stand-ins); given, every
            worker is spawned with it (no zygote). The default is ``python -s -P -m snapcell.worker._worker``; the
            hash seed is in its environment (``PYTHONHASHSEED``), which a command with ``-I`` or ``-E`` ignores.
        pretouch: Let a worker set up ahead walk a throwaway turn while it waits (see `snapcell.worker._pretouch`).

    Raises:
        ConfigError: A count or a time out of range.
    """

    max_workers: int
    min_warm: int = 1
    checkout_timeout_s: float = 30.0
    recycle_after: int = 1
    max_queued: int | None = None
    zygote: bool = True
    preload: tuple[str, ...] = ()
    settle: tuple[Policy, Limits] | None = None
    worker_command: tuple[str, ...] | None = None
    pretouch: bool = False

    def __post_init__(self) -> None:
        if not _whole(self.max_workers, 1):
            raise ConfigError(f"max_workers must be a positive integer, not {self.max_workers!r}")
        if not _whole(self.min_warm, 0) or self.min_warm > self.max_workers:
            raise ConfigError(f"min_warm_workers must be an integer from 0 to max_workers, not {self.min_warm!r}")
        if not _whole(self.recycle_after, 1):
            raise ConfigError(f"recycle_after must be a whole number >= 1, not {self.recycle_after!r}")
        if self.max_queued is not None and not _whole(self.max_queued, 0):
            raise ConfigError(f"max_queued_checkouts must be a whole number >= 0 or None, not {self.max_queued!r}")
        timeout = self.checkout_timeout_s
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout)) or (
            timeout <= 0
        ):
            raise ConfigError(f"checkout_timeout_s must be a positive, finite number, not {timeout!r}")


class WorkerPool:
    """Keeps warm worker processes so a checkout does not pay for an interpreter start-up.

    Args:
        options: How many workers, how long a checkout waits, and how workers start (see `WorkerOptions`).
    """

    def __init__(self, options: WorkerOptions) -> None:
        max_workers = options.max_workers
        max_queued = QUEUED_PER_WORKER * max_workers if options.max_queued is None else options.max_queued
        self.queue = CheckoutQueue(slots=max_workers, max_queued=max_queued)
        self.recycle_after = options.recycle_after
        self._worker_command = options.worker_command
        self.use_zygote = options.zygote and options.worker_command is None
        self.preload = tuple(name for name in HEAVY_MODULES if name in options.preload)
        # The zygote warm workers are forked from: the pool's, or none of its heavy modules once a checkout asked for
        # a worker without them (see `acquire`), so that the next checkouts like it find one started.
        self._warm_preload = self.preload
        # The shared zygotes this pool holds a reference to, by preloaded modules.
        self._zygotes: dict[tuple[str, ...], _SharedZygote] = {}
        self.settle = options.settle
        self.pretouch = options.pretouch
        # Workers between checkouts, already set up for one (policy, limits); reused by `acquire`.
        self._idle: dict[tuple[Policy, Limits], list[WorkerProcess]] = {}
        self.min_warm = options.min_warm
        self.max_workers = max_workers
        self.checkout_timeout_s = float(options.checkout_timeout_s)
        self._reclaimed = False
        self.scratch_root, lock_fd = make_scratch_root()
        # A pool that is never closed still removes its directory when it is collected or the interpreter exits.
        self._remove_scratch = weakref.finalize(self, remove_scratch_root, self.scratch_root, lock_fd, os.getpid())
        self._warm: list[WorkerProcess] = []
        self._busy: set[WorkerProcess] = set()
        # Killed workers not yet reaped (see `release`): the pool waits for them when it closes.
        self._reaping: set[asyncio.Future[None]] = set()
        self._starting = 0
        self._changed = asyncio.Condition()
        self._fill_task: asyncio.Task[None] | None = None
        self._closed = False
        self._warned: set[str] = set()

    def _reclaim(self) -> None:
        """Reclaim the scratch directories of dead hosts (see `_scratch`), once per pool."""
        if not self._reclaimed:
            self._reclaimed = True
            reclaim_scratch_dirs()

    def _live(self) -> int:
        return len(self._warm) + len(self._busy) + self._starting + sum(map(len, self._idle.values()))

    async def _evict_idle(self) -> bool:
        """Kill one idle worker to free a slot for another configuration; True if there was one."""
        for workers in self._idle.values():
            if workers:
                await workers.pop(0).kill()
                return True
        return False

    def fill(self) -> None:
        """Start warm workers in the background up to ``min_warm``."""
        if self._closed or (self._fill_task is not None and not self._fill_task.done()):
            return
        self._fill_task = asyncio.ensure_future(self._fill())

    async def _fill(self) -> None:
        while not self._closed and len(self._warm) + self._starting < self.min_warm and self._live() < self.max_workers:
            worker = await self._spawn()
            if worker is None:
                async with self._changed:
                    self._changed.notify_all()  # a checkout waiting for this start-up must not wait out its timeout
                return
            if self.settle is not None:
                self._starting += 1  # still counted while it sets up
                try:
                    await worker.init(policy=self.settle[0], limits=self.settle[1], pretouch=self.pretouch)
                except (SandboxError, ConfigError, SessionError, _Died) as exc:
                    # A checkout with these settings will fail the same way, and say why: stop settling ahead.
                    log.debug("snapcell: a warm worker could not be set up ahead of time: %s", exc)
                    self.settle = None
                    await worker.kill()
                    return
                except BaseException:
                    await asyncio.shield(worker.kill())  # cancelled (the pool is closing): leave no process
                    raise
                finally:
                    self._starting -= 1
                worker.settled = self.settle
            async with self._changed:
                if self._closed:
                    await worker.kill()
                    return
                self._warm.append(worker)
                self._changed.notify_all()

    @staticmethod
    def preload_for(policy: Policy) -> tuple[str, ...]:
        """The heavy modules a zygote serving ``policy`` imports."""
        return preload_modules(policy.modules if policy.restricted else frozenset(HEAVY_MODULES))

    async def _zygote(self, preload: tuple[str, ...]) -> Zygote | None:
        """The running zygote for ``preload``, started (or restarted, if it died) now; None to spawn instead."""
        if not self.use_zygote or self._closed:
            return None
        shared = self._zygotes.get(preload)
        if shared is None:
            shared = _SHARED.setdefault(asyncio.get_running_loop(), {}).setdefault(preload, _SharedZygote())
            shared.users += 1  # before any wait: a pool closing meanwhile must not close it under us
            self._zygotes[preload] = shared
        async with shared.lock:
            zygote = shared.zygote
            if zygote is not None and zygote.alive:
                self._reclaim()
                return zygote
            if zygote is not None:
                log.warning("snapcell: the zygote (pid %s) died; starting a new one", zygote.pid)
                shared.zygote = None
                await zygote.close()
            # Not in any pool's scratch directory: it outlives the pool that started it while others use it.
            zygote = Zygote(preload, cwd="/", env=_ENV)
            try:
                await zygote.start(meanwhile=self._reclaim)
            except ZygoteError as exc:
                log.warning("snapcell: %s; spawning workers instead", exc)
                return None
            if shared.users == 0:  # every pool using it closed while it started
                await zygote.close()
                return None
            shared.zygote = zygote
            return zygote

    async def _release_zygotes(self) -> None:
        """Let go of this pool's shared zygotes; close those no other pool uses."""
        loop = asyncio.get_running_loop()
        closing = []
        for preload, shared in self._zygotes.items():
            shared.users -= 1
            if shared.users == 0:
                by_preload = _SHARED.get(loop, {})
                if by_preload.get(preload) is shared:
                    del by_preload[preload]
                if shared.zygote is not None:
                    closing.append(shared.zygote)
                    shared.zygote = None
        self._zygotes.clear()
        await asyncio.gather(*(z.close() for z in closing))

    def _seeded_zygote(self, preload: tuple[str, ...], hash_seed: int) -> Zygote | None:
        """A running zygote this pool uses that hashes with ``hash_seed`` and preloads at least ``preload`` (none is
        started): a resumed run's seed may be that of the zygote for other modules than its checkout's hint names."""
        if self._closed:
            return None
        for shared in self._zygotes.values():
            zygote = shared.zygote
            if (
                zygote is not None
                and zygote.alive
                and zygote.hash_seed == hash_seed
                and set(preload) <= set(zygote.preload)
            ):
                return zygote
        return None

    async def _start_worker(self, preload: tuple[str, ...], hash_seed: int | None = None) -> WorkerProcess:
        """Fork a worker from the zygote for ``preload``, or spawn one if that is not possible.

        With ``hash_seed``, only a zygote of that seed forks it; else it is spawned with that seed.
        """
        for attempt in range(2):  # a zygote found dead while forking is restarted once
            zygote = await self._zygote(preload) if hash_seed is None else self._seeded_zygote(preload, hash_seed)
            if zygote is None:
                break
            worker = WorkerProcess(self.scratch_root, zygote=zygote)
            try:
                await worker.start()
                return worker
            except ZygoteError as exc:
                await worker.kill()
                if attempt or zygote.alive:
                    log.warning("snapcell: %s; spawning a worker instead", exc)
                    break
            except BaseException:
                await asyncio.shield(worker.kill())
                raise
        self._reclaim()
        worker = WorkerProcess(self.scratch_root, command=self._worker_command, hash_seed=hash_seed)
        try:
            await worker.start()
        except BaseException:
            await asyncio.shield(worker.kill())
            raise
        return worker

    async def _spawn(
        self, preload: tuple[str, ...] | None = None, hash_seed: int | None = None
    ) -> WorkerProcess | None:
        self._starting += 1
        try:
            return await self._start_worker(self._warm_preload if preload is None else preload, hash_seed)
        except (SessionError, _Died) as exc:  # the worker was killed; cancelled mid-start, too (pool closing)
            log.warning("snapcell: a worker process failed to start: %s", exc)
            return None
        finally:
            self._starting -= 1

    async def admit(self) -> None:
        """Wait in the fair checkout queue for one of ``max_workers`` slots; pair with `leave`.

        Raises:
            Overloaded: The queue is full (at once), or no slot came free within ``checkout_timeout_s``.
            SessionError: The pool is closed.
        """
        if self._closed:
            raise SessionError("the pool is closed")
        await self.queue.admit(self.checkout_timeout_s)

    def leave(self) -> None:
        """Give back the slot `admit` took, to the next checkout in the queue."""
        self.queue.leave()

    async def acquire(
        self,
        *,
        policy: Policy,
        limits: Limits,
        mounts: Mapping[str, str] | None = None,
        hash_seed: int | None = None,
        modules: Collection[str] | None = None,
    ) -> WorkerProcess:
        """Take a warm worker (or start one), give it its settings, and mark it busy.

        A worker with ``mounts`` (read-only host directories in its workspace) is never reused.

        Args:
            policy: The session's policy.
            limits: The session's limits.
            mounts: Read-only host directories in its workspace, by name.
            hash_seed: The ``PYTHONHASHSEED`` its interpreter must hash strings with (a resumed run's): a warm
                worker of that seed, else one spawned with it. None: any.
            modules: The modules the session is expected to import (None: unknown). When none of the policy's heavy
                modules is among them, the worker comes from a zygote that did not preload them (or is a warm one
                that did, if none of those is ready): a smaller process to fork and to end. A session that imports
                them anyway does so on demand.

        Raises:
            ConfigError: ``hash_seed`` is not an integer from 0 to 2**32 - 1.
            SessionError: No worker became free within ``checkout_timeout_s``, or one failed to start.
        """
        if self._closed:
            raise SessionError("the pool is closed")
        if hash_seed is not None and not (type(hash_seed) is int and 0 <= hash_seed <= MAX_HASH_SEED):
            raise ConfigError(f"a hash seed must be an integer from 0 to {MAX_HASH_SEED}, not {hash_seed!r}")
        preload = self.preload_for(policy)
        if modules is not None and preload and not any(name in modules for name in preload):
            # At most one zygote more per preload set: the one that preloads nothing.
            preload = ()
        reused = None if mounts or hash_seed is not None else self._idle.get((policy, limits))
        while reused:
            again = reused.pop(0)
            if again.gone():  # it died while idle: its checkout's first request would be lost, code or not
                await again.kill()
                async with self._changed:
                    self._changed.notify_all()  # its slot is free
                self.fill()
                continue
            self._take(again, preload)
            again.checkouts += 1
            return again
        if set(preload) <= set(self.preload):
            self._warm_preload = preload  # the workers started ahead from now on are like the one this checkout needs
        try:
            async with asyncio.timeout(self.checkout_timeout_s):
                # A session with mounts needs a worker not yet set up: mounts are attached before the privilege drop.
                worker = await self._claim(preload, None if mounts else (policy, limits), hash_seed)
        except TimeoutError:
            raise SessionError(
                f"no worker process became free within {self.checkout_timeout_s:g} s "
                f"({self.max_workers} are checked out); raise max_workers or check sessions in sooner"
            ) from None
        self._take(worker, preload)
        # Start the replacement a moment later: spawning blocks this loop for a fork and then competes for
        # the CPU, which the session's first run (usually right now) should not pay for.
        asyncio.get_running_loop().call_later(_REFILL_DELAY_S, self.fill)
        try:
            if mounts or worker.settled != (policy, limits):
                await worker.init(policy=policy, limits=limits, mounts=mounts)
        except (SandboxError, ConfigError):  # a layer failed, or the host's sandbox settings are invalid
            await self.release(worker)
            raise
        except (SessionError, _Died) as exc:
            await self.release(worker)
            raise SessionError(f"a worker process failed to start: {exc}") from exc
        worker.checkouts += 1
        for layer, state in worker.sandbox.items():
            if state.startswith("unavailable") and layer not in self._warned:
                self._warned.add(layer)
                log.warning("snapcell: sandbox layer %s is %s", layer, state)
        return worker

    def _take(self, worker: WorkerProcess, preload: tuple[str, ...]) -> None:
        """Mark ``worker`` busy for a checkout that may need ``preload``; its zygote imports those now, if it has not
        (for the next sessions like this one; see `Zygote.want_heavy`)."""
        self._busy.add(worker)
        if preload and worker.zygote is not None:
            worker.zygote.want_heavy()

    async def _claim(
        self, preload: tuple[str, ...], settings: tuple[Policy, Limits] | None, hash_seed: int | None = None
    ) -> WorkerProcess:
        """Take a warm worker fit for ``settings`` (from the zygote for ``preload``, and of ``hash_seed`` if one is
        named), or start one in a free slot.

        Raises:
            SessionError: A worker failed to start.
        """
        async with self._changed:
            while True:
                # A worker whose zygote preloaded more serves too (its own zygote's first: it costs less to end).
                fit = sorted(
                    (
                        w
                        for w in self._warm
                        if w.settled in (None, settings)
                        and hash_seed in (None, w.hash_seed)
                        and set(preload) <= set(self._preloaded(w))
                    ),
                    key=lambda w: self._preloaded(w) != preload,
                )
                if fit:
                    warm = fit[0]
                    self._warm.remove(warm)
                    if not warm.gone() and (warm.zygote is None or warm.zygote.alive):
                        return warm
                    await warm.kill()  # it died while warm, or its zygote did, and it with it
                    continue
                if self._live() < self.max_workers:
                    self._starting += 1  # reserve the slot while we start one
                    break
                if await self._evict_idle():
                    continue
                if self._warm:  # warm, but from another zygote or for other settings: its slot goes to this checkout
                    await self._warm.pop(0).kill()
                    continue
                await self._changed.wait()
        self._starting -= 1
        worker = await self._spawn(preload, hash_seed)
        if worker is None:
            raise SessionError("a worker process failed to start; see the snapcell log")
        return worker

    def _preloaded(self, worker: WorkerProcess) -> tuple[str, ...]:
        """The heavy modules ``worker``'s zygote preloads (a spawned worker counts as the pool's own)."""
        return self.preload if worker.zygote is None else worker.zygote.preload

    async def release(
        self, worker: WorkerProcess, *, reuse_for: tuple[Policy, Limits] | None = None, reap_later: bool = False
    ) -> None:
        """End a worker's checkout: it is killed, or reset and kept for ``reuse_for`` under ``recycle_after``.

        ``reap_later`` (a session's ordinary end, not a worker lost or distrusted): once its scratch is unreachable,
        the checkout ends without waiting for the kernel to tear the killed worker down (see `WorkerProcess.kill`).
        """
        if reuse_for is not None and not worker.dead and worker.checkouts < self.recycle_after and not self._closed:
            try:
                reply, _ = await worker.request({"op": "recycle"}, timeout_s=_KILL_WAIT_S)
            except _Died:
                reply = {}
            if reply.get("op") == "recycled":
                async with self._changed:
                    self._busy.discard(worker)
                    self._idle.setdefault(reuse_for, []).append(worker)
                    self._changed.notify_all()
                return
        await worker.kill(reap_later=reap_later)
        if worker.reaping is not None:
            self._reaping.add(worker.reaping)
            worker.reaping.add_done_callback(self._reaping.discard)
        async with self._changed:
            self._busy.discard(worker)
            self._changed.notify_all()
        self.fill()

    async def close(self) -> None:
        """Kill every worker; none outlives the pool."""
        self._closed = True
        self.queue.close()
        if self._fill_task is not None:
            self._fill_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._fill_task
        workers = [*self._warm, *self._busy, *(w for idle in self._idle.values() for w in idle)]
        self._warm.clear()
        self._busy.clear()
        self._idle.clear()
        await asyncio.gather(*(w.kill() for w in workers), *self._reaping)
        await self._release_zygotes()
        self._reclaim()  # a pool that never started a worker reclaims too
        self._remove_scratch()
