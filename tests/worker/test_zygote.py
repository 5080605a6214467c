"""Workers forked from a clean zygote: every sandbox layer in the child, fresh random streams, restarts, deaths."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from snapcell import ConfigError, Limits, Policy, Pool, WorkerLost
from snapcell.backends import RunRequest
from snapcell.backends._procbackend import ProcessBackend
from snapcell.backends._procstat import parent_of
from snapcell.backends._workerpool import WorkerOptions, WorkerPool
from snapcell.wire import preload_modules
from tests import procs

NUMPY = Policy.unrestricted()  # os, to see pids; numpy and pandas preloaded
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def numpy_pool() -> Iterator[Pool]:
    if not preload_modules(frozenset({"numpy"})):
        pytest.skip("numpy is not installed")
    with Pool("memory://", isolation="process", policy=NUMPY, max_workers=3) as pool:
        yield pool


_alive = procs.alive


def _wait_gone(pids: list[int]) -> list[int]:
    return procs.wait_gone(pids, HANG_GUARD_S)


def _zygote_pid(pool: Pool) -> int:
    start = pool.isolation_report()["start"]
    assert start.startswith("zygote (pid "), start
    return int(start.split()[2].rstrip(","))


# A worker's pid as the host sees it: in the pid namespace a worker lives in, os.getpid() is another number, and its
# parent (the zygote, outside) is not seen at all.
HOST_PID = "int(os.readlink('/proc/self'))"
_DRAW = f"import os, random, numpy\n({HOST_PID}, [random.random() for _ in range(4)], numpy.random.rand(4).tolist())"


def _with_parent(drawn: tuple[int, list[float], list[float]]) -> tuple[int, int, list[float], list[float]]:
    pid, *streams = drawn
    return (pid, parent_of(pid), *streams)  # type: ignore[return-value]


def test_two_children_of_one_zygote_get_different_random_streams(numpy_pool: Pool) -> None:
    zygote = _zygote_pid(numpy_pool)
    with numpy_pool.checkout() as one, numpy_pool.checkout() as two:
        first, second = _with_parent(one.feed_run(_DRAW)), _with_parent(two.feed_run(_DRAW))
    assert first[0] != second[0] and first[1] == second[1] == zygote  # two children of the same zygote
    assert first[2] != second[2]  # random's global generator was reseeded in each child
    assert first[3] != second[3]  # so was numpy.random's legacy global state


def test_every_layer_names_the_child_itself(numpy_pool: Pool) -> None:
    report = numpy_pool.isolation_report()
    assert "numpy" in report["start"]
    with numpy_pool.checkout() as session:
        pid, host_pid = session.feed_run(f"import os\nos.getpid(), {HOST_PID}")
        ppid = parent_of(host_pid)
        uid = session.feed_run("import os\nos.getuid()")
        layers = session._inner._backend.sandbox
    # The uid, the seccomp filter and pdeathsig are the child's own, derived after the fork: the uid from its pid as
    # the host sees it (unique on the machine), the filter from its pid as the kernel reads its own system calls.
    assert uid == 1_000_000_000 + host_pid, (uid, host_pid)
    assert f"uid {uid} " in layers["privileges"]
    assert f"only for pid {pid}," in layers["seccomp"]
    assert f"(pid {ppid}) dies, which dies with the host (pid {os.getpid()})" in layers["pdeathsig"]
    if os.geteuid() == 0:  # a pid namespace needs root
        assert f"dies with the zygote (pid {ppid}), which dies with the host" in layers["lifetime"], layers["lifetime"]
    assert layers["landlock"].startswith("active")


def test_a_killed_zygote_is_restarted_and_its_sessions_restored(numpy_pool: Pool) -> None:
    with numpy_pool.checkout() as session:
        session.feed_run("kept = 'from the checkpoint'")
        session.dump()
        child = session.feed_run(f"import os\n{HOST_PID}")
        zygote = parent_of(child)
        os.kill(zygote, signal.SIGKILL)
        assert _wait_gone([zygote, child]) == []  # its children die with it (its pid namespace, and pdeathsig)
        with pytest.raises(WorkerLost):
            session.feed_run("1 + 1")
        again = session.run(f"import os\nkept, {HOST_PID}")
        assert again.error is None and again.value[0] == "from the checkpoint"
        assert parent_of(again.value[1]) not in (zygote, os.getpid())  # a new zygote
    assert _zygote_pid(numpy_pool) not in (zygote, os.getpid())
    with numpy_pool.checkout() as session:
        assert session.feed_run("import numpy\nint(numpy.arange(4).sum())") == 6


def test_the_zygote_reports_a_childs_exit_status_and_peak_memory() -> None:
    async def main() -> tuple[int, int, int]:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=HANG_GUARD_S))
        backend = ProcessBackend(workers, policy=Policy.unrestricted(), limits=Limits())
        try:
            await backend.start()
            worker = backend.worker
            assert worker is not None and worker.forked is not None and worker.process is None
            forked = worker.forked
            code = "import os, signal\nb = bytearray(200 * 2**20)\nos.kill(os.getpid(), signal.SIGSEGV)"
            with pytest.raises(WorkerLost) as lost:
                await backend.run(RunRequest(code=code, lookup={}, setup=False, limits=Limits()))
            assert lost.value.reason == "crash", lost.value
            status, peak = await asyncio.wait_for(forked.exited, HANG_GUARD_S)
            assert peak is not None
            return status, peak, forked.inherited_rss
        finally:
            await workers.close()

    status, peak, inherited = asyncio.run(main())
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
    # The child's own 200 MiB, seen through the zygote's wait4, above what it started from (the zygote's own peak, not
    # the host's, which a long test run makes large).
    assert peak - inherited >= 150 * 2**20, (peak, inherited)


_HOST = textwrap.dedent(
    """
    import os, sys
    import snapcell
    pool = snapcell.Pool("memory://", isolation="process", policy=snapcell.Policy.unrestricted())
    with pool.checkout() as session:
        pid = session.feed_run("import os\\nint(os.readlink('/proc/self'))")  # as the host sees it
        with open(f"/proc/{pid}/stat") as stat:
            print(stat.read().rpartition(")")[2].split()[1], pid, flush=True)  # its parent, the zygote, and itself
        os.kill(os.getpid(), 9)
    """
)


def test_the_host_dying_takes_the_zygote_and_its_children_with_it() -> None:
    host = subprocess.run(
        [sys.executable, "-c", _HOST], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    assert host.returncode == -signal.SIGKILL, host.stderr
    zygote, child = (int(word) for word in host.stdout.split())
    assert _wait_gone([zygote, child]) == []


def test_a_checkout_hinted_away_from_the_heavy_modules_forks_from_a_zygote_without_them(numpy_pool: Pool) -> None:
    heavy = WorkerPool.preload_for(NUMPY)
    # The first ones may take warm workers of the pool's own zygote (they serve too, and one may be starting
    # already); the workers started from then on come from the zygote that preloads nothing. Bounded: at most
    # max_workers of the pool's own can be warm or starting.
    preloads = []
    for _ in range(5):
        with numpy_pool.checkout(modules_hint=["json"]) as light:
            assert light.feed_run("import json\njson.dumps([1])") == "[1]"
            zygote = light._inner._backend.worker.zygote
            assert zygote is not None
            preloads.append(zygote.preload)
        if preloads[-1] == ():
            break
    assert preloads[-1] == (), preloads
    with numpy_pool.checkout(modules_hint={"numpy"}) as session:
        worker = session._inner._backend.worker
        assert worker.zygote is not None and worker.zygote.preload == heavy
    with numpy_pool.checkout() as session:  # no hint: the pool's own zygote
        worker = session._inner._backend.worker
        assert worker.zygote is not None and worker.zygote.preload == heavy


def test_a_resumed_runs_seed_is_found_in_any_zygote_that_preloads_what_the_checkout_needs() -> None:
    async def main() -> list[object]:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1))
        light = SimpleNamespace(alive=True, hash_seed=11, preload=())
        heavy = SimpleNamespace(alive=True, hash_seed=22, preload=("numpy", "pandas"))
        workers._zygotes = {  # type: ignore[assignment]
            (): SimpleNamespace(zygote=light),
            ("numpy", "pandas"): SimpleNamespace(zygote=heavy),
        }
        try:
            return [
                workers._seeded_zygote((), 22),  # a light checkout, paused in a worker of the other zygote
                workers._seeded_zygote((), 11),
                workers._seeded_zygote(("numpy", "pandas"), 11),  # that zygote lacks numpy: spawned instead
                workers._seeded_zygote((), 33),
            ]
        finally:
            workers._zygotes = {}
            await workers.close()

    light_or_heavy = asyncio.run(main())
    assert [getattr(z, "hash_seed", None) for z in light_or_heavy] == [22, 11, None, None]


def test_worker_command_bypasses_the_zygote() -> None:
    async def main() -> tuple[str, int]:
        workers = WorkerPool(
            WorkerOptions(
                min_warm=0,
                max_workers=1,
                checkout_timeout_s=HANG_GUARD_S,
                worker_command=(sys.executable, "-I", "-m", "snapcell.worker._worker"),
            )
        )
        backend = ProcessBackend(workers, policy=Policy(), limits=Limits())
        try:
            await backend.start()
            result = await backend.run(RunRequest(code="1 + 1", lookup={}, setup=False, limits=Limits()))
            return backend.start_path, result.value
        finally:
            await workers.close()

    assert asyncio.run(main()) == ("spawn", 2)


def test_a_checkout_may_name_a_hash_seed_which_a_worker_of_another_zygote_gets() -> None:
    """Children share their zygote's seed; a checkout naming another (a resume's) gets a worker spawned with it."""

    async def main() -> tuple[int, int, list[object]]:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=HANG_GUARD_S))
        backend = ProcessBackend(workers, policy=Policy(), limits=Limits())
        hashed = []
        try:
            await backend.start()
            assert backend.start_path.startswith("zygote")
            own = backend.hash_seed
            assert own is not None
            assert not await backend.use_hash_seed(own)  # the zygote's own seed: the worker is kept
            other = (own + 1) % 2**32
            for seed in (other, own):
                assert await backend.use_hash_seed(seed)  # a new worker, with an empty namespace
                assert backend.hash_seed == seed
                hashed.append(backend.start_path)
                result = await backend.run(RunRequest(code="hash('snapcell')", lookup={}, setup=False, limits=Limits()))
                hashed.append(result.value)
            for bad in (-1, 2**32, True, "1"):
                with pytest.raises(ConfigError, match="hash seed"):
                    await workers.acquire(policy=Policy(), limits=Limits(), hash_seed=bad)  # type: ignore[arg-type]
            return own, other, hashed
        finally:
            await workers.close()

    own, other, hashed = asyncio.run(main())
    # Another seed: spawned (no zygote of that seed is started for it); the zygote's own: forked again.
    assert hashed[0] == "spawn" and str(hashed[2]).startswith("zygote")
    for seed, value in ((other, hashed[1]), (own, hashed[3])):
        reference = subprocess.run(
            [sys.executable, "-c", "print(hash('snapcell'))"],
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert value == int(reference.stdout)


def test_a_zygote_that_cannot_start_falls_back_to_spawning(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.backends import _zygotehost

    async def broken(self: _zygotehost.Zygote, **_: object) -> None:
        raise _zygotehost.ZygoteError("no zygote here")

    monkeypatch.setattr(_zygotehost.Zygote, "start", broken)
    with Pool("memory://", isolation="process") as pool:
        assert pool.isolation_report()["start"] == "spawn"
        with pool.checkout() as session:
            assert session.feed_run("1 + 1") == 2


def test_the_zygote_builds_the_default_sessions_pandas_view_that_its_children_then_use() -> None:
    """A child imports pandas (or loads a DataFrame) through the view its zygote built, not one of its own."""
    if not preload_modules(frozenset({"pandas"})):
        pytest.skip("pandas is not installed")
    script = textwrap.dedent(
        """
        import pandas
        from snapcell.policy import _guard
        from snapcell.worker import _zygote
        from snapcell.policy._policy import Policy
        from snapcell.interpreter._runner import Runner
        from snapcell.limits import Limits

        before = len(_guard._views)
        _zygote._build_views(["pandas"])
        built = len(_guard._views) - before
        prebuilt = _guard._views.get((Runner(policy=Policy.process_default(), limits=Limits(), file_access=True)
                                      .policy.modules, "pandas"))
        runner = Runner(policy=Policy.process_default(), limits=Limits(), file_access=True)
        seen = runner.builtins["__import__"]("pandas")
        print(built > 100, prebuilt is not None and seen is prebuilt, len(_guard._views) - before == built)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def test_the_modules_to_preload_are_looked_up_once_per_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asked on every checkout; looking them up took ~0.1 ms a time.
    import importlib.util

    lookups: list[str] = []
    real = importlib.util.find_spec

    def counting(name: str, package: str | None = None) -> object:
        lookups.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", counting)
    preload_modules.cache_clear()
    policy = Policy().with_modules(["numpy", "pandas"])
    first = WorkerPool.preload_for(policy)
    assert [WorkerPool.preload_for(policy) for _ in range(5)] == [first] * 5
    assert sorted(lookups) == ["numpy", "pandas"]
    preload_modules.cache_clear()


def test_the_per_fork_reports_are_the_json_they_stand_for() -> None:
    # Formatted by hand, so that a fork copies fewer of the zygote's pages; the host reads them as JSON.
    from snapcell.worker import _zygote

    one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with one, two:
        _zygote._send_forked(one, 4321, 56_789_000, ["numpy", "pandas"])
        _zygote._send_exited(one, 4321, -9, 123_456)
        forked, exited = json.loads(two.recv(4096)), json.loads(two.recv(4096))
    assert forked == {"op": "forked", "pid": 4321, "rss": 56_789_000, "preloaded": ["numpy", "pandas"]}
    assert exited == {"op": "exited", "pid": 4321, "status": -9, "maxrss": 123_456}


def test_the_zygotes_reports_are_the_wires_messages() -> None:
    """One message format between snapcell's processes: each report the zygote sends (hand-formatted or not) is
    byte for byte what `snapcell.wire.encode` writes for it, and the host reads it with `snapcell.wire.decode`."""
    from snapcell.backends import _zygotehost
    from snapcell.wire import decode, encode
    from snapcell.worker import _zygote

    one, two = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with one, two:
        _zygote._send(one, {"op": "ready", "pid": 7, "preload": ["numpy"], "preloaded": [], "threads": 1})
        _zygote._send_forked(one, 4321, 56_789_000, ["numpy", "pandas"])
        _zygote._send_exited(one, 4321, -9, 123_456)
        _zygote._send(one, {"op": "fork_failed", "error": "no memory"})
        sent = [two.recv(4096) for _ in range(4)]
    assert all(data == encode(decode(data)) for data in sent), sent
    assert _zygotehost.decode is decode  # the host's reader


def test_the_zygotes_peak_rss_is_read_from_its_status() -> None:
    from snapcell.worker import _zygote

    peak = _zygote._high_water_rss()
    with open("/proc/self/status") as status:
        after = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    assert 0 < peak <= after
