"""The worker process boundary: clean environment, sandbox layers, kills, recovery, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import ConfigError, Limits, MemoryLimitExceeded, Policy, Pool, ScriptError, ScriptSyntaxError, WorkerLost
from snapcell.errors import OutputLimitExceeded
from snapcell.wire import ScriptValue
from tests import procs

UNRESTRICTED = Policy.unrestricted()
# A hang guard for processes to exit, not a timing bound.
HANG_GUARD_S = 60.0


@pytest.fixture(scope="module")
def open_pool() -> Iterator[Pool]:
    """A process-mode pool whose scripts may import anything, to test the process boundary alone."""
    os.environ["SNAPCELL_TEST_CANARY"] = "canary-value-1234"
    try:
        with Pool("memory://", isolation="process", policy=UNRESTRICTED, min_warm_workers=1) as pool:
            yield pool
    finally:
        del os.environ["SNAPCELL_TEST_CANARY"]


def _layer_active(pool: Pool, layer: str) -> None:
    state = pool.isolation_report().get(layer, "missing")
    if not (state == "active" or state.startswith("active:")):
        pytest.skip(f"the {layer} layer is not active on this kernel: {state}")


def test_environment_of_the_host_is_invisible(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        env = session.feed_run("import os\ndict(os.environ)")
        raw = session.run("open('/proc/self/environ', 'rb').read()")
    assert "SNAPCELL_TEST_CANARY" not in env
    # Landlock may forbid reading it at all; if it is readable, the canary is not in it.
    assert raw.error is not None or b"canary-value-1234" not in raw.value
    assert not any(key.startswith(("AWS_", "SNAPCELL_SIGNING")) for key in env)


def test_no_descriptors_inherited_beyond_the_channel(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        pid = session.feed_run("import os\nint(os.readlink('/proc/self'))")  # as the host sees it
        fds = os.listdir(f"/proc/{pid}/fd")
        kinds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
        # O_PATH handles on import roots (the worker's uid imports through them; they cannot be read or written).
        o_path = {
            os.readlink(f"/proc/{pid}/fd/{fd}")
            for fd in fds
            if int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8) & 0o10000000
        }
    # 0-2 (devnull, devnull, a private stderr file), the socket to the host, and epoll/eventfd of its loop.
    # The channel plus the event loop's own self-pipe pair.
    assert sum("socket:" in k for k in kinds) <= 3, kinds
    # Besides those: /dev/null and the worker's own /proc/<pid>/statm (kept open to report memory).
    unexpected = [
        k for k in kinds if k.startswith("/") and k != "/dev/null" and "(deleted)" not in k and k not in o_path
    ]
    assert unexpected == [f"/proc/{pid}/statm"], kinds


def test_scratch_directory_is_private_and_removed(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        cwd = session.feed_run("import os\nopen('note.txt', 'w').write('x')\nos.getcwd()")
        assert os.path.exists(os.path.join(cwd, "note.txt"))
    assert not os.path.exists(cwd)


def test_write_outside_scratch_fails_under_landlock(open_pool: Pool, tmp_path) -> None:
    _layer_active(open_pool, "landlock")
    target = tmp_path / "escaped.txt"
    with open_pool.checkout() as session:
        result = session.run(f"open({str(target)!r}, 'w').write('x')")
    assert result.error is not None and result.error.exc_type == "PermissionError"
    assert not target.exists()


def test_socket_creation_fails_under_seccomp(open_pool: Pool) -> None:
    _layer_active(open_pool, "seccomp")
    with open_pool.checkout() as session:
        result = session.run("import socket\ns = socket.socket()")
        assert result.error is not None and result.error.exc_type == "PermissionError"
        assert session.feed_run("'s' in globals()") is False


def test_c_level_work_is_killed_and_the_session_restored() -> None:
    # No CPU limit: a "timeout" can only be the host's kill at wall_time_s + grace_s + 1 s, which the message names.
    # Without that kill the cell runs for minutes (pytest-timeout fails it), or returns with no WorkerLost.
    limits = Limits(wall_time_s=1.0, grace_s=1.0, cpu_time_s=None)
    with Pool("memory://", isolation="process", limits=limits) as pool, pool.checkout() as session:
        session.feed_run("kept = [1, 2, 3]")
        session.dump()
        session.feed_run("after_dump = 1")
        with pytest.raises(WorkerLost) as lost:
            session.feed_run("x = 10**10**8")
        assert lost.value.reason == "timeout"
        assert "it did not stop within 3 s (the wall-time limit, plus grace_s" in str(lost.value)
        result = session.run("try:\n    after_dump\n    seen = True\nexcept NameError:\n    seen = False\nkept, seen")
        assert result.value == ([1, 2, 3], False)
        assert any("restarted" in note for note in result.notes)


def test_memory_limit_stops_the_script_not_the_host() -> None:
    limits = Limits(memory_bytes=512 * 2**20, wall_time_s=20)
    host_before = _rss()
    with Pool("memory://", isolation="process", limits=limits) as pool, pool.checkout() as session:
        session.feed_run("small = 'ok'")
        try:
            result = session.run("big = bytearray(4 * 1024**3)", raise_on_lost=True)
            assert isinstance(result.error, MemoryLimitExceeded)
        except WorkerLost as exc:
            assert exc.reason in ("memory", "signal", "crash")
        assert session.feed_run("small") == "ok"
    assert _rss() - host_before < 100 * 2**20


def test_kill_from_inside_is_survived_and_setup_cells_rerun(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        session.feed_run("import math\nbase = 40", setup=True)
        session.feed_run("scratch = 'lost'")
        with pytest.raises(WorkerLost) as lost:
            session.feed_run("import os\nos.kill(os.getpid(), 9)")
        assert lost.value.reason == "signal"
        result = session.run("'scratch' in globals(), base + 2")
        assert result.value == (False, 42)
        assert any("restarted" in note for note in result.notes)
        assert any("1 setup cell" in note for note in result.notes)


def test_a_lost_worker_is_a_run_result_unless_the_caller_asks_for_the_error(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        session.feed_run("kept = 1")
        session.dump()
        lost = session.run("import os\nos.kill(os.getpid(), 9)")
        assert lost.status == "lost" and not lost.ok and lost.error is None
        assert any("worker was lost" in note for note in lost.notes), lost.notes
        after = session.run("kept")
        assert after.value == 1 and after.restarted
        with pytest.raises(WorkerLost) as raised:
            session.run("import os\nos.kill(os.getpid(), 9)", raise_on_lost=True)
        assert raised.value.result is not None and raised.value.result.status == "lost"
        assert session.feed_run("kept") == 1


def test_a_run_that_asks_dumps_first_so_its_crash_keeps_what_came_before(open_pool: Pool) -> None:
    """Before the session's first dump, a lost worker costs every variable, unless the risky run dumped first."""
    with open_pool.checkout() as session:
        session.feed_run("kept = [1, 2]")
        assert session.checkpoint_id is None
        unsaved = session.run("import os\nos.kill(os.getpid(), 9)")
        assert unsaved.status == "lost"
        after = session.run("'kept' in dir()")
        assert after.value is False and any("dump_first=True" in note for note in after.notes), after.notes
        session.feed_run("kept = [1, 2]")
        lost = session.run("import os\nos.kill(os.getpid(), 9)", setup=True, dump_first=True)
        assert lost.status == "lost" and session.checkpoint_id is not None
        first = session.checkpoint_id
        assert session.run("kept", dump_first=True).value == [1, 2]
        assert session.checkpoint_id == first  # nothing ran since the restore's load: no new dump
        session.run("1", dump_first=True)  # a run since: it may have changed the namespace
        assert session.checkpoint_id != first


def test_host_function_error_is_catchable_with_its_message(open_pool: Pool) -> None:
    def lookup(key: str) -> str:
        raise KeyError(f"no customer {key}")

    with open_pool.checkout() as session:
        value = session.feed_run(
            "try:\n    lookup('c-9')\nexcept KeyError as e:\n    caught = str(e)\ncaught",
            external_lookup={"lookup": lookup},
        )
    assert "no customer c-9" in value


def test_values_that_are_not_plain_data_come_back_as_script_values(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        result = session.run("class P:\n    def __repr__(self):\n        return 'P()'\nP()")
    assert result.value == ScriptValue("P", "P()")
    assert result.value_repr == "P()"


def test_host_function_gets_plain_data_only(open_pool: Pool) -> None:
    seen = []

    def record(value: object) -> int:
        seen.append(value)
        return 1

    with open_pool.checkout() as session:
        result = session.run("class Q: pass\nrecord(Q())", external_lookup={"record": record})
    assert result.error is not None and result.error.exc_type == "TypeError"
    assert seen == []


def test_closing_the_pool_mid_run_leaves_no_process() -> None:
    code = textwrap.dedent(
        """
        import asyncio, json, snapcell
        async def main():
            pool = snapcell.AsyncPool("memory://", isolation="process", min_warm_workers=2)
            async with pool.checkout() as session:
                pids = sorted({w.pid for w in pool._workers._busy} | {w.pid for w in pool._workers._warm})
                started = asyncio.Event()
                loop = asyncio.get_running_loop()

                def running() -> None:
                    loop.call_soon_threadsafe(started.set)

                run = asyncio.ensure_future(
                    session.feed_run("running()\\nwhile True: pass", external_lookup={"running": running})
                )
                await started.wait()  # mid-run: the worker is in the loop's first iteration
                print(json.dumps(pids), flush=True)
                await pool.aclose()
                run.cancel()
        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pids = json.loads(out.stdout.strip().splitlines()[0])
    assert pids
    assert _wait_gone(pids) == []


def test_workers_die_with_their_host() -> None:
    code = textwrap.dedent(
        """
        import json, sys, time, snapcell
        pool = snapcell.Pool("memory://", isolation="process", min_warm_workers=1)
        with pool.checkout() as session:
            pid = session.feed_run("1") and pool._inner._workers and [w.pid for w in pool._inner._workers._busy]
            print(json.dumps(pid), flush=True)
            time.sleep(60)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        pids = json.loads(host.stdout.readline())
        assert pids and all(_alive(pid) for pid in pids)
        host.send_signal(signal.SIGKILL)
        host.wait(HANG_GUARD_S)
        assert _wait_gone(pids) == []
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()


def test_script_errors_cross_as_script_errors(open_pool: Pool) -> None:
    with open_pool.checkout() as session:
        with pytest.raises(ScriptError) as error:
            session.feed_run("def f():\n    return 1 / 0\nf()")
    assert error.value.exc_type == "ZeroDivisionError"
    assert "return 1 / 0" in error.value.traceback_text
    assert "snapcell" not in error.value.traceback_text


_alive = procs.alive


def _wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive once they are all gone, or after the hang guard."""
    return procs.wait_gone(pids, HANG_GUARD_S)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_recycled_workers_forget_the_previous_session() -> None:
    with Pool("memory://", isolation="process", policy=UNRESTRICTED, recycle_after=3, min_warm_workers=0) as pool:
        pids = []
        for _ in range(4):
            with pool.checkout() as session:
                assert session.run("leak").error is not None  # a fresh namespace
                result = session.run(
                    "import os, decimal\n"
                    "before = sorted(os.listdir('.'))\n"
                    "open(f'file-{os.getpid()}.txt', 'w').write('x')\n"
                    "assert decimal.getcontext().prec == 28\n"  # the previous session set 3
                    "decimal.getcontext().prec = 3\n"
                    "leak = 'from an earlier session'\n"
                    "os.getpid(), before"
                )
                assert result.error is None, result.error
                pid, before = result.value
                pids.append(pid)
                assert before == []  # the scratch directory was emptied
        assert pids[0] == pids[1] == pids[2] != pids[3]  # three checkouts, then a new interpreter


def test_recycle_after_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        Pool("memory://", recycle_after=0)


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_script_over_max_script_bytes_does_not_run_and_the_session_keeps_its_variables(isolation: str) -> None:
    limits = Limits(max_script_bytes=1000)
    with Pool("memory://", isolation=isolation, limits=limits) as pool, pool.checkout() as session:
        session.feed_run("kept = [1, 2]")
        result = session.run("big = '" + "x" * 2000 + "'")
        assert isinstance(result.error, OutputLimitExceeded)
        assert result.error.limit == "max_script_bytes" and "max_script_bytes" in str(result.error)
        with pytest.raises(OutputLimitExceeded):
            session.feed_run("# é" * 400)  # 400 characters, 1,600 bytes in UTF-8
        assert session.feed_run("kept") == [1, 2]
        assert session.run("big").error is not None  # the oversize cell did not run
        default = session.run("x = 1", limits=Limits())  # a run's own limits apply: 1 MiB
        assert default.error is None


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_a_script_that_is_not_text_is_a_syntax_error(isolation: str) -> None:
    with Pool("memory://", isolation=isolation) as pool, pool.checkout() as session:
        session.feed_run("kept = 1")
        for code in (None, 123, b"1+1"):
            with pytest.raises(ScriptSyntaxError, match="text"):
                session.feed_run(code)  # type: ignore[arg-type]
        assert session.feed_run("kept") == 1


def test_the_worker_refuses_a_script_that_is_not_text() -> None:
    import asyncio
    import dataclasses

    from snapcell.backends._procbackend import ProcessBackend
    from snapcell.backends._workerpool import WorkerOptions, WorkerPool

    async def main() -> object:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=60))
        backend = ProcessBackend(workers, policy=Policy(), limits=Limits())
        try:
            await backend.start()
            assert backend.worker is not None
            reply, _ = await backend.worker.request({"op": "run", "code": 123, "limits": dataclasses.asdict(Limits())})
            return reply
        finally:
            await workers.close()

    reply = asyncio.run(main())
    assert isinstance(reply, dict) and reply["op"] == "ran"
    assert reply["error"]["class"] == "ScriptSyntaxError" and reply["value"] is None


# The worker's module is __main__ in a spawned worker and snapcell.worker._worker in one forked from a zygote.
_PATCH_DUMP_REPLY = """
import sys
worker = sys.modules["snapcell.worker._worker"] if "snapcell.worker._worker" in sys.modules else sys.modules["__main__"]
_handle = worker.Worker.handle
def handle(self, op, message, blob):
    reply, out = _handle(self, op, message, blob)
    if op == "dump":
        {change}
    return reply, out
worker.Worker.handle = handle
"""


@pytest.mark.parametrize(
    "change",
    [
        # The manifest is the body's own (the reply carries none): one the host cannot parse, a body cut short.
        "i = out[0].index(b'{\"version\"'); out[0][i : i + 10] = b'{\"garbage\"'",
        "del out[0][30:]; reply['parts'][0] = 30",
        "reply['parts'] = ['x']",
        "reply['parts'] = [1] * 3",
        "reply['new_blobs'] = 7",
        "reply.clear(); reply.update(op='error', error=[1, 2])",
        "reply['op'] = 'loaded'",
    ],
)
@pytest.mark.parametrize("then_dump", [False, True], ids=["asked-alone", "asked-with-the-run"])
def test_a_malformed_dump_reply_loses_the_worker_and_the_session_is_restored(
    open_pool: Pool, change: str, then_dump: bool
) -> None:
    with open_pool.checkout() as session:
        session.feed_run("kept = 'from the checkpoint'")
        session.dump()
        pid = session.feed_run("import os\nint(os.readlink('/proc/self'))")  # as the host sees it
        session.run(_PATCH_DUMP_REPLY.replace("{change}", change), then_dump=then_dump)
        with pytest.raises(WorkerLost, match="malformed") as lost:
            session.dump()
        assert lost.value.reason == "crash"
        result = session.run("import os\nkept, int(os.readlink('/proc/self'))")
        assert result.error is None and result.value[0] == "from the checkpoint"
        assert result.value[1] != pid and not _alive(pid)
        assert any("restarted" in note for note in result.notes)


_SEND_FRAME = """
import gc, os, sys
channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "_send_lock"))
worker = sys.modules[type(channel).__module__]
with channel._send_lock:
    channel._sock.sendall(worker.FRAME.pack(2, {blob_size}) + b"{{}}" + b"x" * {sent})
if {exit}:
    os._exit(0)
"""


@pytest.mark.parametrize(
    ("blob_size", "sent", "exit"),
    [(2**50, 0, False), (2**30, 1000, True)],
    ids=["over-the-cap", "under-the-cap-then-gone"],
)
def test_a_frame_claiming_a_huge_blob_costs_the_host_nothing(
    open_pool: Pool, blob_size: int, sent: int, exit: bool
) -> None:
    import resource

    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss_before = _rss()
    with open_pool.checkout() as session:
        session.feed_run("kept = 1")
        session.dump()
        pid = session.feed_run("import os\nint(os.readlink('/proc/self'))")  # as the host sees it
        with pytest.raises(WorkerLost) as lost:
            session.feed_run(_SEND_FRAME.format(blob_size=blob_size, sent=sent, exit=exit))
        if not exit:
            assert "announced" in str(lost.value) and lost.value.reason == "crash"
        assert not _alive(pid)
        assert session.feed_run("kept") == 1
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak_after - max(peak_before, rss_before) < 256 * 2**20
    assert _rss() - rss_before < 256 * 2**20


# Counts, in the worker, event-loop runs and tasks created.
_COUNT_LOOP_WORK = """
import asyncio, sys, types
counts = sys.modules.setdefault("loop_counts", types.ModuleType("loop_counts"))
counts.runs = counts.tasks = 0
cls = type(asyncio.get_running_loop())
run_forever, create_task = cls.run_forever, cls.create_task
def counted_run_forever(self, *a, **k):
    counts.runs += 1
    return run_forever(self, *a, **k)
def counted_create_task(self, *a, **k):
    counts.tasks += 1
    return create_task(self, *a, **k)
cls.run_forever, cls.create_task = counted_run_forever, counted_create_task
"""
_LOOP_COUNTS = "import sys\n(sys.modules['loop_counts'].runs, sys.modules['loop_counts'].tasks)"


def test_a_synchronous_cell_creates_no_task_and_runs_no_event_loop_in_the_worker(open_pool: Pool) -> None:
    """STYLE: drive the loop only when the code is a coroutine; sync host calls need no loop either."""
    with open_pool.checkout() as session:
        session.feed_run(_COUNT_LOOP_WORK)
        assert session.feed_run(_LOOP_COUNTS) == (0, 0)
        for _ in range(5):
            assert session.feed_run("x = 1 + 1\nf(x)", external_lookup={"f": lambda x: x * 10}) == 20
        session.feed_run("y = [i for i in range(10)]\nprint(len(y))")
        assert session.feed_run(_LOOP_COUNTS) == (0, 0)

        async def g(x: int) -> int:
            return x + 1

        # A cell that awaits runs in the loop, and its host call's result arrives there.
        assert session.feed_run("await g(1)", external_lookup={"g": g}) == 2
        runs, tasks = session.feed_run(_LOOP_COUNTS)
        assert runs == 1 and tasks >= 1
        # A task a synchronous cell leaves behind is still reaped within its run (the loop runs for that alone).
        session.feed_run(
            "import asyncio\nasync def forever():\n    await asyncio.sleep(3600)\nt = asyncio.ensure_future(forever())"
        )
        assert session.feed_run("t.cancelled()") is True
        assert session.feed_run(_LOOP_COUNTS)[0] == 2


def test_finished_async_cells_leave_no_tasks_alive_in_the_worker(open_pool: Pool) -> None:
    """Every run asks asyncio for all tasks alive; finished cells must not keep theirs (through their watchdogs)."""
    with open_pool.checkout() as session:
        session.feed_run("import asyncio, gc")
        for _ in range(100):
            session.feed_run("await asyncio.sleep(0)")
        alive = session.feed_run("sum(isinstance(o, asyncio.Task) for o in gc.get_objects())")
    assert alive <= 3, alive
