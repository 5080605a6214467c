"""A worker, and every process it starts, ends with its host or its zygote, whatever the worker did to itself.

The worker of these tests is compromised: it clears its own pdeathsig (prctl, allowed or not by its filter), forks
a child (``max_processes`` allows it) that leaves the worker's session and process group and has no pdeathsig, and
then sleeps in its run, reading nothing from its host. Only the pid namespace both live in (its init dies with the
zygote or launcher, which dies with the host) ends them; with pdeathsig alone, both would live on.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import AsyncPool, Limits, Policy, WorkerLost
from snapcell.backends import RunRequest, _process, _zygotehost
from snapcell.backends._procbackend import ProcessBackend
from snapcell.backends._procstat import parent_of
from snapcell.backends._workerpool import WorkerOptions, WorkerPool
from snapcell.sandbox import _lifetime, _sandbox
from tests import procs
from tests.sandbox.sandbox_helpers import HANG_GUARD_S, REQUIRED, worker_read_paths

# Forking allowed (RLIMIT_NPROC still bounds it), and a run long enough to outlast every test here.
LIMITS = Limits(max_processes=4, wall_time_s=600.0)

# The compromised worker: its report goes to the host function ``report``, and then it sleeps in the run.
HOSTILE = textwrap.dedent(
    """
    import ctypes, os, time
    libc = ctypes.CDLL(None, use_errno=True)

    def clear_pdeathsig():
        libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG, 0: may be allowed by the filter, or not
        sig = ctypes.c_int(-1)
        libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        return sig.value

    def host_pid():
        return int(os.readlink("/proc/self"))

    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.setsid()  # out of the worker's session and process group, if the filter allows it
        except OSError:
            pass
        os.write(w, b"%d %d" % (host_pid(), clear_pdeathsig()))
        while True:
            time.sleep(60)
    os.close(w)
    child_pid, child_sig = (int(word) for word in os.read(r, 64).split())
    report(host_pid(), clear_pdeathsig(), child_pid, child_sig)
    while True:
        time.sleep(60)
    """
)


_alive = procs.alive


def _wait_gone(pids: list[int]) -> list[int]:
    """The pids of ``pids`` still alive after a generous deadline (a hang guard; gone at once when it works)."""
    return procs.wait_gone(pids, HANG_GUARD_S)


def _kill_left(pids: list[int]) -> None:
    """Kill what a failing test left running (never a pid that is gone: it may be another process by now)."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _require_namespace() -> None:
    if os.geteuid() != 0:
        assert "lifetime" not in REQUIRED, "SNAPCELL_REQUIRE_SANDBOX requires lifetime, but the host is not root"
        pytest.skip("a pid namespace needs a root host")


# ------------------------------------------------------------------ the host dies

_HOST = textwrap.dedent(
    """
    import json, sys, time
    import snapcell
    from snapcell.backends import _zygotehost

    if sys.argv[1] == "spawn":
        async def no_zygote(self, **_):
            raise _zygotehost.ZygoteError("spawned workers for this test")

        _zygotehost.Zygote.start = no_zygote

    def report(worker, worker_sig, child, child_sig):
        print(json.dumps([worker, worker_sig, child, child_sig]), flush=True)

    limits = snapcell.Limits(**json.loads(sys.argv[2]))
    policy = snapcell.Policy.unrestricted()
    with snapcell.Pool("memory://", isolation="process", policy=policy, limits=limits, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.feed_run(sys.argv[3], external_lookup={"report": report})
    """
)


@pytest.mark.parametrize("start", ["zygote", "spawn"])
def test_a_worker_that_clears_its_pdeathsig_and_forks_dies_with_its_killed_host(start: str) -> None:
    _require_namespace()
    limits = json.dumps({"max_processes": LIMITS.max_processes, "wall_time_s": LIMITS.wall_time_s})
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, start, limits, HOSTILE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        assert line, host.stderr.read() if host.stderr is not None else ""
        worker, worker_sig, child, child_sig = json.loads(line)
        pids = [worker, child]
        assert child_sig == 0  # the worker's child has no pdeathsig; the worker's own may or may not be cleared
        maker = parent_of(worker)  # the zygote, or the spawned worker's launcher
        assert maker not in (0, host.pid) and parent_of(maker) == host.pid
        pids.append(maker)
        assert all(_alive(pid) for pid in pids)
        host.kill()
        host.wait(HANG_GUARD_S)
        assert _wait_gone(pids) == [], f"alive after their host was killed: {pids} (worker pdeathsig {worker_sig})"
    finally:
        host.kill()
        host.wait()
        for stream in (host.stdout, host.stderr):
            if stream is not None:
                stream.close()
        _kill_left(pids)


# ------------------------------------------------------------------ the zygote (or launcher) dies


async def _hostile_run(start: str, found: asyncio.Future[list[int]]) -> tuple[list[int], BaseException | None]:
    """Run the compromised worker in a pool of this process; kill its zygote (or launcher) once it reports."""
    workers = WorkerPool(
        WorkerOptions(
            min_warm=0,
            max_workers=1,
            checkout_timeout_s=HANG_GUARD_S,
            zygote=start == "zygote",
        )
    )
    backend = ProcessBackend(workers, policy=Policy.unrestricted(), limits=LIMITS)

    def report(worker: int, worker_sig: int, child: int, child_sig: int) -> None:
        found.set_result([worker, worker_sig, child, child_sig])

    try:
        await backend.start()
        run = asyncio.ensure_future(
            backend.run(RunRequest(code=HOSTILE, lookup={"report": report}, setup=False, limits=LIMITS))
        )
        try:
            worker, _, child, child_sig = await asyncio.wait_for(asyncio.shield(found), HANG_GUARD_S)
        except TimeoutError:
            run.cancel()
            raise
        assert child_sig == 0
        maker = parent_of(worker)
        assert maker not in (0, os.getpid()) and parent_of(maker) == os.getpid()
        os.kill(maker, signal.SIGKILL)
        left = await asyncio.to_thread(_wait_gone, [maker, worker, child])
        _kill_left(left)  # a failure ends here, not in the run's wait below
        try:
            await asyncio.wait_for(run, HANG_GUARD_S)
        except (WorkerLost, TimeoutError) as exc:
            return left, exc
        return left, None
    finally:
        await backend.discard()
        await workers.close()


@pytest.mark.parametrize("start", ["zygote", "spawn"])
def test_a_worker_that_clears_its_pdeathsig_and_forks_dies_with_its_killed_zygote(start: str) -> None:
    _require_namespace()
    pids: list[int] = []

    async def main() -> tuple[list[int], BaseException | None]:
        found: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        try:
            return await _hostile_run(start, found)
        finally:
            if found.done() and not found.cancelled():
                worker, _, child, _ = found.result()
                pids.extend([worker, child])

    try:
        left, outcome = asyncio.run(main())
        assert left == [], f"alive after their {start} was killed: {left}"
        assert isinstance(outcome, WorkerLost), outcome  # the host saw its worker go
    finally:
        _kill_left(pids)


# ------------------------------------------------------------------ how the layer is set up and reported


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_lifetime, "_state", None)
    monkeypatch.setattr(_lifetime, "_init_pid", 0)
    yield


class _FailingUnshare:
    """A stand-in for libc whose unshare fails with ``err`` (and forks nothing)."""

    def __init__(self, err: int) -> None:
        self.err = err

    def unshare(self, flags: Any) -> int:
        ctypes.set_errno(self.err)
        return -1


@pytest.mark.parametrize("err", [errno.EPERM, errno.EINVAL, errno.ENOSPC])
def test_a_missing_privilege_or_kernel_feature_reads_unavailable(
    monkeypatch: pytest.MonkeyPatch, fresh_state: None, err: int
) -> None:
    monkeypatch.setattr(_lifetime, "_libc", _FailingUnshare(err))
    state = _lifetime.start_pid_namespace("zygote", os.getpid())
    assert state.startswith("unavailable: unshare(CLONE_NEWPID): ") and os.strerror(err) in state, state
    assert "pdeathsig only" in state  # what the workers still have
    assert _lifetime.layer_state() == state and _lifetime.namespace_init_pid() == 0


def test_any_other_failure_is_raised(monkeypatch: pytest.MonkeyPatch, fresh_state: None) -> None:
    monkeypatch.setattr(_lifetime, "_libc", _FailingUnshare(errno.EFAULT))
    with pytest.raises(OSError, match="unshare"):
        _lifetime.start_pid_namespace("zygote", os.getpid())


def test_an_unavailable_lifetime_fails_the_sandbox_only_when_required(
    monkeypatch: pytest.MonkeyPatch, fresh_state: None, tmp_path: Any
) -> None:
    monkeypatch.setattr(_lifetime, "_libc", _FailingUnshare(errno.EPERM))
    _lifetime.start_pid_namespace("zygote", os.getpid())
    # In a fresh interpreter (the sandbox confines its caller for good), with the state this process computed.
    code = textwrap.dedent(
        """
        import json, sys
        from snapcell.errors import SandboxError
        from snapcell.limits import Limits
        from snapcell.sandbox import _lifetime, _sandbox
        cfg = json.loads(sys.argv[1])
        _lifetime._state = cfg["state"]
        try:
            report = _sandbox.apply_sandbox(
                limits=Limits(), scratch_dir=cfg["scratch"], read_paths=cfg["read_paths"], require=cfg["require"]
            )
            print(json.dumps({"lifetime": report.layers["lifetime"]}))
        except SandboxError as exc:
            print(json.dumps({"layer": exc.layer, "error": str(exc)}))
        """
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    outs = []
    for require in ([], ["lifetime"]):
        cfg = {"state": _lifetime.layer_state(), "scratch": str(scratch), "read_paths": worker_read_paths()}
        proc = subprocess.run(
            [sys.executable, "-I", "-c", code, json.dumps({**cfg, "require": require})],
            env={},
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout.splitlines()[-1]))
    assert outs[0] == {"lifetime": _lifetime.layer_state()}
    assert outs[1]["layer"] == "lifetime" and "required" in outs[1]["error"], outs[1]


def test_apply_sandbox_without_a_zygote_or_launcher_reports_the_layer_off(probe: dict[str, Any]) -> None:
    assert "lifetime" in _sandbox.LAYERS
    assert probe["report"]["lifetime"] == "off"  # the caller's choice, which a requirement accepts


def test_the_isolation_report_names_the_lifetime_layer_of_each_start_path(monkeypatch: pytest.MonkeyPatch) -> None:
    async def report() -> dict[str, str]:
        async with AsyncPool("memory://", isolation="process", min_warm_workers=0) as pool:
            return await pool.isolation_report()

    zygote = asyncio.run(report())

    async def no_zygote(self: _zygotehost.Zygote, **_: object) -> None:
        raise _zygotehost.ZygoteError("spawned workers for this test")

    monkeypatch.setattr(_zygotehost.Zygote, "start", no_zygote)
    spawned = asyncio.run(report())
    assert zygote["start"].startswith("zygote") and spawned["start"] == "spawn"
    for layers, maker in ((zygote, "zygote"), (spawned, "launcher")):
        if os.geteuid() == 0:
            assert layers["lifetime"].startswith("active: pid namespace whose init"), layers["lifetime"]
            assert f"dies with the {maker} (pid " in layers["lifetime"]
            assert f"which dies with the host (pid {os.getpid()})" in layers["lifetime"]
        else:
            assert layers["lifetime"].startswith("unavailable: "), layers["lifetime"]


# ------------------------------------------------------------------ a launcher exits as its worker did


async def _spawned_death(code: str, limits: Limits) -> tuple[WorkerLost, int, int, int]:
    """Run ``code`` in a spawned worker that it kills: the loss, the launcher's exit code, and both pids."""
    workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=HANG_GUARD_S, zygote=False))
    backend = ProcessBackend(workers, policy=Policy.unrestricted(), limits=limits)
    try:
        await backend.start()
        worker = backend.worker
        assert worker is not None and worker.process is not None and worker.pid is not None
        with pytest.raises(WorkerLost) as lost:
            await backend.run(RunRequest(code=code, lookup={}, setup=False, limits=limits))
        exit_code = await asyncio.to_thread(worker.process.wait, HANG_GUARD_S)
        return lost.value, exit_code, worker.pid, worker.process.pid
    finally:
        await workers.close()


@pytest.mark.parametrize(
    ("code", "expected", "reason"),
    [
        ("import os\nos._exit(7)", 7, "crash"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", -signal.SIGSEGV, "crash"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, "signal"),
    ],
    ids=["exit-code", "sigsegv", "sigkill"],
)
def test_a_spawned_workers_launcher_exits_as_the_worker_did(code: str, expected: int, reason: str) -> None:
    lost, exit_code, pid, launcher = asyncio.run(_spawned_death(code, Limits()))
    assert exit_code == expected and lost.reason == reason, (exit_code, lost)
    if os.geteuid() == 0:
        assert pid != launcher and parent_of(pid) in (
            0,
            launcher,
        )  # the host spoke to the worker, waited for its launcher
    assert not _alive(pid) and not _alive(launcher)


def test_a_spawned_workers_peak_memory_reaches_the_host_through_its_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    reaped: list[tuple[int, int | None]] = []
    real = _process.WorkerProcess._reap

    def recorded(self: _process.WorkerProcess) -> tuple[int, int | None]:
        reaped.append(real(self))
        return reaped[-1]

    monkeypatch.setattr(_process.WorkerProcess, "_reap", recorded)
    # A child's peak RSS starts at the host's (inherited across fork and exec): the worker goes well past it.
    hog = max(200 * 2**20, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + 64 * 2**20)
    code = f"import os, signal\nb = bytearray({hog})\nos.kill(os.getpid(), signal.SIGSEGV)"
    lost, exit_code, _, _ = asyncio.run(_spawned_death(code, Limits()))
    assert exit_code == -signal.SIGSEGV and lost.reason == "crash"
    code, peak = reaped[0]  # what the launcher's wait4 said: the worker's end, and its peak
    assert code == -signal.SIGSEGV and peak is not None and peak >= hog, (peak, hog)


def _name(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def test_an_init_that_dies_alone_takes_its_workers_and_zygote_and_the_session_is_restored() -> None:
    _require_namespace()

    async def main() -> tuple[list[int], Any, Any]:
        async with AsyncPool("memory://", isolation="process", policy=Policy.unrestricted()) as pool:
            async with pool.checkout() as session:
                await session.feed_run("kept = 'from the checkpoint'")
                await session.dump()
                worker = await session.feed_run("import os\nint(os.readlink('/proc/self'))")
                zygote = parent_of(worker)
                inits = [pid for pid in _children(zygote) if _name(pid) == "snapcell-init"]
                assert len(inits) == 1, inits
                os.kill(inits[0], signal.SIGKILL)
                left = await asyncio.to_thread(_wait_gone, [inits[0], worker, zygote])
                _kill_left(left)
                with pytest.raises(WorkerLost):
                    await session.feed_run("1 + 1")
                again = await session.feed_run("import os\nkept, int(os.readlink('/proc/self'))")
                return left, again, parent_of(again[1]) != zygote

    left, (kept, _), new_zygote = asyncio.run(main())
    assert left == []  # the zygote, which can fork no more, exits too
    assert kept == "from the checkpoint" and new_zygote
