"""How a zygote gets going: ready before its heavy imports, and shared by the pools of one event loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from snapcell import AsyncPool, Limits, Policy
from snapcell.backends import RunRequest, _zygotehost
from snapcell.backends._procbackend import ProcessBackend
from snapcell.backends._procstat import parent_of
from snapcell.backends._workerpool import WorkerOptions, WorkerPool
from snapcell.wire import preload_modules
from tests import procs

NUMPY = Policy.unrestricted()  # os and sys, to see pids and modules; numpy (and pandas) preloaded
HANG_GUARD_S = 60.0

_PROBE = (
    "import os, sys, random\n"
    "had_numpy = 'numpy' in sys.modules\n"
    "import numpy\n"
    # Its pid as the host sees it, and its pid in its own pid namespace (the number its seccomp filter names).
    "(had_numpy, int(os.readlink('/proc/self')), os.getpid(), os.getuid(), int(numpy.arange(4).sum()),\n"
    " [random.random() for _ in range(4)], numpy.random.rand(4).tolist())"
)


def _state(layers: dict[str, str]) -> dict[str, str]:
    return {name: value.split(":")[0] for name, value in layers.items()}


async def _until(condition: Any) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _import_roots(pid: int) -> dict[str, str]:
    """The O_PATH descriptors of process ``pid`` (its pinned import roots), by number, with what they name."""
    roots = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            flags = int(info.read().split("flags:")[1].split()[0], 8)
        if flags & os.O_PATH:
            roots[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return roots


def test_a_child_forked_before_the_heavy_imports_imports_numpy_itself_in_a_full_sandbox() -> None:
    if not preload_modules(frozenset({"numpy"})):
        pytest.skip("numpy is not installed")

    async def main() -> None:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=2, checkout_timeout_s=HANG_GUARD_S))
        try:
            early = ProcessBackend(workers, policy=NUMPY, limits=Limits())
            await early.start()  # the zygote's first fork: it is asked to preload only after this one
            assert early.worker is not None and early.worker.forked is not None
            zygote = early.worker.zygote
            assert zygote is not None and "numpy" in zygote.preloading + zygote.preloaded
            assert early.worker.forked.preloaded == ()
            first = (await early.run(RunRequest(code=_PROBE, lookup={}, setup=False, limits=Limits()))).value

            await _until(lambda: not zygote.preloading)
            assert "numpy" in zygote.preloaded
            late = ProcessBackend(workers, policy=NUMPY, limits=Limits())
            await late.start()
            assert late.worker is not None and late.worker.forked is not None
            assert late.worker.zygote is zygote and "numpy" in late.worker.forked.preloaded
            second = (await late.run(RunRequest(code=_PROBE, lookup={}, setup=False, limits=Limits()))).value
            if os.geteuid() == 0:
                # The zygote pinned the import roots at the end of its second stage: the late child reaches its
                # imports through the descriptors it inherited, and opened none (the early one pinned its own).
                zygote_roots = _import_roots(zygote.pid)
                assert zygote_roots and _import_roots(second[1]) == zygote_roots
                assert set(_import_roots(first[1]).values()) == set(zygote_roots.values())

            assert first[0] is False and second[0] is True  # imported on demand, and inherited from the zygote
            assert first[4] == second[4] == 6
            assert parent_of(first[1]) == parent_of(second[1]) == zygote.pid and first[1] != second[1]
            # The early child has every layer the late one has, each derived from its own pid.
            assert _state(early.sandbox) == _state(late.sandbox)
            for (_, host_pid, pid, uid, *_), layers in ((first, early.sandbox), (second, late.sandbox)):
                assert f"only for pid {pid}," in layers["seccomp"] or not layers["seccomp"].startswith("active")
                if layers["privileges"].startswith("active: uid"):
                    assert uid == 1_000_000_000 + host_pid
            assert first[5] != second[5] and first[6] != second[6]  # random streams of their own
            await early.close()
            await late.close()
        finally:
            await workers.close()

    asyncio.run(main())


def _count_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    starts: list[int] = []
    real = _zygotehost.Zygote.start

    async def counted(self: _zygotehost.Zygote, **kwargs: Any) -> None:
        await real(self, **kwargs)
        starts.append(self.pid)

    monkeypatch.setattr(_zygotehost.Zygote, "start", counted)
    return starts


async def _parent(pool: AsyncPool) -> int:
    async with pool.checkout() as session:
        pid: int = await session.feed_run("import os\nint(os.readlink('/proc/self'))")  # as the host sees it
        return parent_of(pid)


def test_two_pools_of_one_loop_share_one_zygote_until_the_last_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = _count_starts(monkeypatch)

    async def main() -> tuple[int, int, int]:
        one = AsyncPool("memory://", policy=NUMPY, min_warm_workers=0)
        two = AsyncPool("memory://", policy=NUMPY, min_warm_workers=0)
        async with one:
            async with two:
                first, second = await _parent(one), await _parent(two)
            after_two = await _parent(one)  # closing one pool left the zygote to the other
        return first, second, after_two

    first, second, after_two = asyncio.run(main())
    assert first == second == after_two == starts[0]
    assert len(starts) == 1
    assert _wait_gone(starts[0])  # the last pool to close closed it


def test_a_dead_shared_zygote_is_restarted_once_for_every_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = _count_starts(monkeypatch)

    async def main() -> tuple[int, int, int]:
        async with AsyncPool("memory://", policy=NUMPY) as one, AsyncPool("memory://", policy=NUMPY) as two:
            before = await _parent(one)
            os.kill(before, signal.SIGKILL)
            await asyncio.to_thread(_wait_gone, before)
            return before, await _parent(two), await _parent(one)

    before, restarted, again = asyncio.run(main())
    assert starts == [before, restarted] and restarted == again != before


def _wait_gone(pid: int) -> bool:
    return procs.wait_gone([pid], HANG_GUARD_S) == []


def test_a_failing_preload_step_is_skipped_and_the_zygote_carries_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from snapcell.worker import _worker, _zygote

    def broken(name: str) -> object:
        raise RuntimeError(f"{name} is broken here")

    def broken_warm_up() -> None:
        raise ValueError("no warm-up")

    monkeypatch.setattr(_zygote.importlib, "import_module", broken)
    monkeypatch.setattr(_worker, "_warm_up", broken_warm_up)
    monkeypatch.setattr(_zygote, "_freeze", lambda: None)  # not this test process's heap
    monkeypatch.setattr(_zygote, "_reap", lambda ctrl: None)  # nor its children
    host, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with host, zygote_end:
        preloader = _zygote._Preloader(["numpy", "pandas"])
        assert not preloader.pending
        preloader.start()
        steps = 0
        while preloader.pending:
            preloader.step(zygote_end)
            steps += 1
        report = json.loads(host.recv(4096))
    assert steps == 4  # snapcell's deferred modules, numpy, pandas, the warm-up
    assert report["op"] == "preloaded" and report["preloaded"] == []
    err = capsys.readouterr().err
    assert "'<snapcell>' failed: RuntimeError('asyncio is broken here')" in err
    assert "'numpy' failed: RuntimeError" in err and "'warm-up' failed: ValueError" in err


def test_the_heavy_modules_come_only_when_asked_for_after_a_stage_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.worker import _worker, _zygote

    done: list[str] = []
    monkeypatch.setattr(_zygote, "DEFERRED_MODULES", ("json",))
    monkeypatch.setattr(_zygote.importlib, "import_module", done.append)
    monkeypatch.setattr(_worker, "_warm_up", lambda: done.append("warm-up"))
    monkeypatch.setattr(_worker, "_warm_up_data", lambda preloaded: None)
    monkeypatch.setattr(_zygote, "_build_views", lambda preloaded: None)
    monkeypatch.setattr(_zygote, "_freeze", lambda: None)  # not this test process's heap
    monkeypatch.setattr(_zygote, "_reap", lambda ctrl: None)  # nor its children
    host, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def run(preloader: Any) -> dict[str, Any]:
        while preloader.pending:
            preloader.step(zygote_end)
        report: dict[str, Any] = json.loads(host.recv(4096))
        return report

    with host, zygote_end:
        light = _zygote._Preloader(["numpy", "pandas"])
        light.start(heavy=False)
        assert run(light) | {"threads": 0} == {"op": "preloaded", "preloaded": [], "heavy": False, "threads": 0}
        assert done == ["json", "warm-up"]
        light.start(heavy=False)  # nothing new: no step, no report
        assert not light.pending
        light.start()  # then a session may need them: they, and the warm-up once more
        assert run(light)["preloaded"] == ["numpy", "pandas"] and done[2:] == ["numpy", "pandas", "warm-up"]

        done.clear()
        early = _zygote._Preloader(["numpy"])
        early.start(heavy=False)
        early.start()  # asked for before the first stage ran: one stage, one warm-up, one report
        report = run(early)
        assert done == ["json", "numpy", "warm-up"] and report["heavy"] is True and report["preloaded"] == ["numpy"]


def test_a_zygote_whose_sessions_name_no_heavy_module_never_imports_them() -> None:
    if not preload_modules(frozenset({"numpy"})):
        pytest.skip("numpy is not installed")

    async def main() -> None:
        preload = WorkerPool.preload_for(NUMPY)
        options = WorkerOptions(min_warm=1, max_workers=3, preload=preload, checkout_timeout_s=HANG_GUARD_S)
        workers = WorkerPool(options)
        try:
            workers.fill()  # the pool's own zygote, numpy's, forks the worker started ahead
            await _until(lambda: workers._warm)
            light = await workers.acquire(policy=NUMPY, limits=Limits(), modules=frozenset())
            lighter = await workers.acquire(policy=NUMPY, limits=Limits(), modules={"json"})
            heavy_zygote = workers._zygotes[preload].zygote
            assert heavy_zygote is not None and lighter.zygote is not None and lighter.zygote is not heavy_zygote
            await _until(lambda: heavy_zygote._stage_sent == b"L" and "nothing yet" in heavy_zygote.preload_report)
            await asyncio.sleep(0.5)  # its stage without them had time to end; they were not imported meanwhile
            assert heavy_zygote.preloaded == [] and not heavy_zygote.preloading
            assert "numpy" not in _modules_of(heavy_zygote.pid)

            unknown = await workers.acquire(policy=NUMPY, limits=Limits())  # no hint: it may need them
            assert unknown.zygote is heavy_zygote and "numpy" in heavy_zygote.preloading
            await _until(lambda: "numpy" in heavy_zygote.preloaded and not heavy_zygote.preloading)
            assert "numpy" in _modules_of(heavy_zygote.pid)
            for worker in (light, lighter, unknown):
                await workers.release(worker)
        finally:
            await workers.close()

    asyncio.run(main())


def _modules_of(pid: int) -> str:
    """The files process ``pid`` has mapped: an imported numpy maps its compiled modules."""
    with open(f"/proc/{pid}/maps") as maps:
        return maps.read()


_DURING_A_STEP = """
import json, os, select, socket, sys
from snapcell.worker import _zygote

host, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

def long_import(name):
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    # The import goes on until the child's exit has been reported (or 20 s pass).
    ready, _, _ = select.select([host], [], [], 20)
    print(json.dumps({"pid": pid, "report": json.loads(host.recv(4096)) if ready else None}), flush=True)

_zygote.importlib.import_module = long_import
_zygote.DEFERRED_MODULES = ("json",)  # the first step: one long import
preloader = _zygote._Preloader(["numpy"])
preloader.start()
preloader.step(zygote_end)
"""


def test_a_child_that_exits_during_a_preload_step_is_reported_before_the_step_ends() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _DURING_A_STEP], capture_output=True, text=True, timeout=HANG_GUARD_S, check=True
    )
    out = json.loads(done.stdout)
    report = out["report"]
    assert report is not None, done.stderr
    assert report["op"] == "exited" and report["pid"] == out["pid"]
    assert os.WIFEXITED(report["status"]) and os.WEXITSTATUS(report["status"]) == 7


_DATA_WARM_UP = """
import json, linecache, os, sys
from snapcell.worker import _worker
{imports}
before = set(linecache.cache)
_worker._warm_up_data({preloaded!r})
print(json.dumps([len(os.listdir("/proc/self/task")), sorted(set(linecache.cache) - before), "pandas" in sys.modules]))
"""


@pytest.mark.parametrize("preloaded", [["numpy", "pandas"], ["numpy"]])
def test_the_zygote_s_dataframe_warm_up_starts_no_thread_and_leaves_no_cell(preloaded: list[str]) -> None:
    """It runs in the zygote, which forks only with one thread; its cells must not show in a session's tracebacks."""
    from snapcell.wire import THREAD_ENV

    probe = _DATA_WARM_UP.format(imports="\n".join(f"import {m}" for m in preloaded), preloaded=preloaded)
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120, env=dict(THREAD_ENV)
    )
    assert done.returncode == 0, done.stderr
    threads, cells, pandas_imported = json.loads(done.stdout)
    assert threads == 1 and cells == []
    assert pandas_imported == ("pandas" in preloaded)  # without pandas preloaded it does nothing
