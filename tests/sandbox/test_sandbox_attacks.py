"""Attacks a script could make once past the policy guard, from a real process-mode worker: each effect is absent."""

from __future__ import annotations

import errno
import json
import math
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapcell
from snapcell.sandbox import reclaim_scratch_dirs
from tests.sandbox.sandbox_helpers import HANG_GUARD_S, received, wait_gone

# ------------------------------------------------- attacks from a real worker
#
# Each test is an attack a script could make once past the policy guard (the pool allows everything, so
# scripts reach the real os, ctypes and resource modules), run against a process-mode pool with default
# limits. Each asserts the attack's effect is absent, and that the host and the next session are fine.

UNRESTRICTED = snapcell.Policy.unrestricted()

_RAW_SYSCALL = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def raw(nr, *args):
    if libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args)) == -1:
        return ctypes.get_errno()
    return 0
x86 = os.uname().machine == "x86_64"
"""


@pytest.fixture(scope="module")
def attack_pool() -> Iterator[snapcell.Pool]:
    with snapcell.Pool("memory://", isolation="process", policy=UNRESTRICTED, min_warm_workers=1) as pool:
        yield pool


def attack(pool: snapcell.Pool, code: str, **kw: object) -> snapcell.RunResult:
    """Run ``code`` in a fresh session, then check that the next session of the pool works."""
    with pool.checkout() as session:
        result = session.run(code, **kw)
        assert session.feed_run("41 + 1") == 42  # the attacked session itself lives on
    with pool.checkout() as session:
        assert session.feed_run("'next session'") == "next session"
    return result


def test_worker_cannot_lower_the_hosts_rlimit(attack_pool):
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        result = attack(
            attack_pool,
            f"import resource\nresource.prlimit({os.getpid()}, resource.RLIMIT_NOFILE, (0, {before[1]}))",
        )
        after = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)  # only the soft limit could have moved
    assert result.error is not None and result.error.exc_type == "PermissionError", result.error
    assert after == before
    own = attack(attack_pool, "import resource\nresource.prlimit(0, resource.RLIMIT_NOFILE)[0] > 0")
    assert own.value is True  # the worker still reads (and may lower) its own limits


def test_worker_cannot_renice_the_host(attack_pool):
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        result = attack(attack_pool, f"import os\nos.setpriority(os.PRIO_PROCESS, {os.getpid()}, 19)")
        after = os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
    assert result.error is not None and result.error.exc_type == "PermissionError", result.error
    assert after == before
    peek = attack(attack_pool, f"import os\nos.getpriority(os.PRIO_PROCESS, {os.getpid()})")
    assert peek.error is not None and peek.error.exc_type == "PermissionError"


def test_worker_cannot_pin_the_host_to_a_cpu(attack_pool):
    before = os.sched_getaffinity(0)
    try:
        result = attack(attack_pool, f"import os\nos.sched_setaffinity({os.getpid()}, {{0}})")
        after = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)
    assert result.error is not None and result.error.exc_type == "PermissionError", result.error
    assert after == before
    own = attack(attack_pool, "import os\nlen(os.sched_getaffinity(0)) > 0")
    assert own.value is True


def test_worker_cannot_signal_the_host(attack_pool):
    result = attack(attack_pool, f"import os\nos.kill({os.getpid()}, 0)")
    assert result.error is not None and result.error.exc_type == "PermissionError", result.error
    group = attack(attack_pool, "import os\nos.kill(0, 0)")  # its own process group, which is all it owns
    assert group.error is not None and group.error.exc_type == "PermissionError"


def test_worker_runs_unprivileged_with_no_capabilities(attack_pool):
    # Landlock keeps the worker out of /proc, so its status is read from here (by its pid as the host sees it: in its
    # pid namespace, os.getpid() is another number); securebits only it can read.
    inside = (
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        "int(os.readlink('/proc/self')), os.getuid(), os.getgid(), os.getgroups(), libc.prctl(27, 0, 0, 0, 0),"
        " [cap for cap in range(64) if libc.prctl(23, cap, 0, 0, 0) == 1]"
    )
    with attack_pool.checkout() as session:
        pid, uid, gid, groups, securebits, bounding = session.feed_run(inside)
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert bounding == []
    own = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    if int(own["CapEff"], 16) & (1 << 8):  # a host with CAP_SETPCAP hands it to the worker, which locks securebits
        assert securebits == 0b1110_1011, bin(securebits)
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    if os.geteuid() == 0:  # a non-root host's workers keep its uid (and it has no capabilities to lose)
        assert uid != 0 and gid != 0 and groups == []
        assert set(status["Uid"].split()) == {str(uid)} and set(status["Gid"].split()) == {str(gid)}
        assert status["Groups"].strip() == ""


def test_syscalls_outside_the_allowlist_fail_with_eperm(attack_pool):
    # Each call is harmless should it ever succeed: the clock is set to what it reads, the host name to itself.
    code = _RAW_SYSCALL + textwrap.dedent(
        """
        out = {}
        out["shmget"] = raw(29 if x86 else 194, 0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        out["fanotify_init"] = raw(300 if x86 else 262, 0, 0)
        class timespec(ctypes.Structure):
            _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
        now = timespec()
        libc.clock_gettime(0, ctypes.byref(now))
        out["clock_settime"] = raw(227 if x86 else 112, 0, ctypes.addressof(now))
        name = os.uname().nodename.encode()
        buf = ctypes.create_string_buffer(name)
        out["sethostname"] = raw(170 if x86 else 161, ctypes.addressof(buf), len(name))
        out["memfd_create"] = raw(319 if x86 else 279, ctypes.addressof(buf), 0)
        out["mq_open"] = raw(240 if x86 else 180, 0, 0o100, 0o600, 0)  # a NULL name: EFAULT if ever allowed
        out["setuid0"] = raw(105 if x86 else 146, 0)
        out["tkill"] = raw(200 if x86 else 130, os.getppid(), 0)
        out["pidfd_open"] = raw(434, os.getppid(), 0)
        out["unknown"] = raw(1000)
        out["getpid_ok"] = raw(39 if x86 else 172)
        out
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    denied = {name: err for name, err in result.value.items() if name != "getpid_ok"}
    assert denied == dict.fromkeys(denied, errno.EPERM), denied
    assert result.value["getpid_ok"] == 0


_PRCTL = """
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
def prctl(*args):
    args = [ctypes.c_ulong(a) for a in args] + [ctypes.c_ulong(0)] * (5 - len(args))
    return ctypes.get_errno() if libc.prctl(*args) == -1 else 0
"""


def test_worker_cannot_change_its_process_settings_through_prctl(attack_pool):
    code = _PRCTL + textwrap.dedent(
        """
        out = {
            "pdeathsig_off": prctl(1, 0),  # PR_SET_PDEATHSIG: would outlive the host
            "dumpable": prctl(4, 1),  # PR_SET_DUMPABLE: /proc/PID and core dumps open to its uid
            "subreaper": prctl(36, 1),  # PR_SET_CHILD_SUBREAPER
            "timerslack": prctl(29, 1),  # PR_SET_TIMERSLACK
        }
        sig = ctypes.c_int(-1)
        libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG: reads still work
        out, sig.value, prctl(15, ctypes.addressof(ctypes.create_string_buffer(b"renamed")))  # PR_SET_NAME works
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    refused, pdeathsig, renamed = result.value
    assert refused == dict.fromkeys(refused, errno.EPERM), refused
    assert pdeathsig == signal.SIGKILL
    assert renamed == 0


def test_worker_cannot_outlive_its_host_by_disarming_pdeathsig(tmp_path):
    """A worker that clears its parent-death signal and ignores every interrupt still dies with its host."""
    code = textwrap.dedent(
        """
        import json, snapcell
        # Its pid as the host sees it (in its pid namespace, os.getpid() is another number).
        attack = (
            "import ctypes, os\\n"
            "int(os.readlink('/proc/self')), os.getcwd(), ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)"
        )
        hold = (
            "import time\\nopen('holding', 'w').close()\\n"
            "while True:\\n    try:\\n        time.sleep(3600)\\n    except BaseException:\\n        pass"
        )
        policy = snapcell.Policy.unrestricted()
        with snapcell.Pool("memory://", isolation="process", policy=policy, min_warm_workers=0) as pool:
            with pool.checkout() as session:
                print(json.dumps(session.feed_run(attack)), flush=True)
                session.feed_run(hold)  # does not return: the worker never reads its channel again
        """
    )
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert host.stdout is not None
        pid, workspace, disarmed = json.loads(host.stdout.readline())
        # Once the worker holds on in its loop, EOF on its channel cannot end it: only pdeathsig can.
        deadline = time.monotonic() + HANG_GUARD_S
        while not os.path.exists(os.path.join(workspace, "holding")) and time.monotonic() < deadline:
            time.sleep(0.05)
        host.kill()
        host.wait(HANG_GUARD_S)
        gone = wait_gone(pid, HANG_GUARD_S)
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()
        if pid is not None and not wait_gone(pid, 0):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, HANG_GUARD_S)
        reclaim_scratch_dirs()  # the killed host's scratch directory and tmpfs
    assert gone, f"the worker outlived its host (prctl(PR_SET_PDEATHSIG, 0) returned {disarmed})"
    assert disarmed == -1


def test_worker_cannot_send_a_datagram_to_a_host_socket(attack_pool, datagram_target):
    """A pathname socket is outside Landlock (ABI 7 and below): only seccomp keeps forged lines from it."""
    target, path = datagram_target
    code = textwrap.dedent(
        f"""
        import socket
        out = {{}}
        for name, kind in (("plain", socket.SOCK_DGRAM), ("cloexec", socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)):
            try:
                one, two = socket.socketpair(socket.AF_UNIX, kind)
                one.sendto(b"<13>forged by sendto", {path!r})
                one.sendmsg([b"<13>forged by sendmsg"], [], 0, {path!r})
                out[name] = 0
            except OSError as exc:
                out[name] = exc.errno
        out
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    assert received(target) == []
    assert result.value == {"plain": errno.EPERM, "cloexec": errno.EPERM}


def test_worker_cannot_list_the_hosts_network_interfaces(attack_pool):
    code = textwrap.dedent(
        """
        import array, fcntl, socket, struct
        one, two = socket.socketpair()
        buf = array.array("B", bytes(40 * 64))
        ifconf = struct.pack("iiQ", len(buf), 0, buf.buffer_info()[0])
        size = struct.unpack("iiQ", fcntl.ioctl(one.fileno(), 0x8912, ifconf))[0]  # SIOCGIFCONF
        names = [bytes(buf[at : at + 16]).split(b"\\0")[0] for at in range(0, size, 40)]
        mac = fcntl.ioctl(one.fileno(), 0x8927, struct.pack("16s24s", names[-1], b""))[18:24]  # SIOCGIFHWADDR
        names, mac.hex()
        """
    )
    result = attack(attack_pool, code)
    assert result.error is not None and result.error.exc_type == "PermissionError", (result.error, result.value)


def test_writing_a_gib_to_scratch_fails_cleanly(attack_pool):
    code = textwrap.dedent(
        """
        import errno, os
        chunk = b"x" * (1024 * 1024)
        written, error = 0, None
        try:
            for i in range(16):  # 16 files of 64 MiB: each under max_file_bytes, 1 GiB in all
                with open(f"part{i}", "wb") as f:
                    for _ in range(64):
                        f.write(chunk)
                        written += len(chunk)
        except OSError as exc:
            error = errno.errorcode.get(exc.errno)
        for name in os.listdir("."):
            os.unlink(name)
        with open("after", "wb") as f:  # the space comes back
            f.write(chunk)
        written, error
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    written, error = result.value
    assert error == "ENOSPC"
    assert written <= snapcell.Limits().max_scratch_bytes


def test_hundreds_of_threads_are_refused(attack_pool):
    code = textwrap.dedent(
        """
        import threading
        threading.stack_size(256 * 1024)  # so that memory is not what stops them
        stop = threading.Event()
        started, error = [], None
        try:
            for _ in range(500):
                t = threading.Thread(target=stop.wait)
                t.start()
                started.append(t)
        except RuntimeError as exc:
            error = str(exc)
        stop.set()
        for t in started:
            t.join()
        len(started), error
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    count, error = result.value
    assert error is not None and "thread" in error
    assert count < snapcell.Limits().max_threads


def test_default_limits_reach_the_worker(attack_pool):
    """CPU seconds and threads are bounded by default, and scratch is a tmpfs of the default size."""
    defaults = snapcell.Limits()
    with attack_pool.checkout() as session:
        pid, cwd = session.feed_run("import os\nint(os.readlink('/proc/self')), os.getcwd()")  # pid: the host's view
        limits = Path(f"/proc/{pid}/limits").read_text()
        mounts = Path(f"/proc/{pid}/mounts").read_text().splitlines()
    cpu = next(line for line in limits.splitlines() if line.startswith("Max cpu time"))
    assert cpu.split()[3] == str(math.ceil(defaults.cpu_time_s))
    if os.geteuid() == 0:
        nproc = next(line for line in limits.splitlines() if line.startswith("Max processes"))
        assert nproc.split()[2] == str(defaults.max_threads)
        scratch = os.path.dirname(cwd)  # the working directory is the workspace, inside the scratch tmpfs
        tmpfs = [line.split() for line in mounts if line.split()[1] == scratch]
        assert tmpfs and tmpfs[-1][2] == "tmpfs", mounts
        assert f"size={defaults.max_scratch_bytes // 1024}k" in tmpfs[-1][3]
    assert not os.path.ismount(os.path.dirname(cwd))  # unmounted when the session ended


def test_a_busy_c_loop_hits_the_cpu_limit_and_the_session_recovers():
    limits = snapcell.Limits(cpu_time_s=1, wall_time_s=60, grace_s=30)
    with snapcell.Pool("memory://", isolation="process", limits=limits, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.feed_run("kept = 'from the checkpoint'")
            session.dump()
            with pytest.raises(snapcell.WorkerLost) as lost:
                session.feed_run("import re\nre.match('(a*)*b', 'a' * 64)")  # backtracks in C for ages
            assert lost.value.reason == "timeout"
            assert session.feed_run("kept") == "from the checkpoint"
        with pool.checkout() as session:
            assert session.feed_run("1 + 1") == 2


def test_worker_cannot_read_a_local_stores_signing_key(attack_pool, tmp_path):
    store_dir = tmp_path / "store"
    with snapcell.Pool(f"file://{store_dir}", create_store=True, isolation="inline"):
        pass
    keys = [p for p in store_dir.rglob("*") if "key" in p.name]
    assert keys, list(store_dir.rglob("*"))
    result = attack(attack_pool, f"open({str(keys[0])!r}, 'rb').read()")
    assert result.error is not None and result.error.exc_type == "PermissionError", result.error


def test_lazy_stdlib_imports_work_after_the_privilege_drop(attack_pool):
    code = textwrap.dedent(
        """
        import sys
        # Not cmath or array: the zygote of an unrestricted policy preloads numpy and pandas, which import them.
        lazy = [m for m in ("statistics", "colorsys", "termios") if m not in sys.modules]
        import statistics, colorsys, termios, fractions, zoneinfo, sqlite3, decimal
        values = [
            colorsys.rgb_to_hsv(1.0, 0.0, 0.0),
            termios.B9600,  # a C extension in lib-dynload
            statistics.mean([1, 2, 3]),
            str(fractions.Fraction(1, 3) * 3),
            str(zoneinfo.ZoneInfo("Europe/Paris")),
            sqlite3.connect(":memory:").execute("select 40 + 2").fetchone()[0],
            str(decimal.Decimal("1.1") + decimal.Decimal("2.2")),
        ]
        lazy, values, [sys.flags.no_user_site, sys.flags.safe_path]
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    lazy, values, flags = result.value
    assert lazy == ["statistics", "colorsys", "termios"]  # imported for the first time after the sandbox
    assert values == [(0.0, 1.0, 1.0), 13, 2, "1", "Europe/Paris", 42, "3.3"]
    assert flags == [1, True]  # the worker runs as python -s -P: no user site, no working directory on sys.path


# What a worker reports of its start: the planted modules it imported, its sys.path, its flags and PYTHON* variables.
_START_PROBE = """
import os, sys
planted = sorted(name for name in ("planted", "sitecustomize", "usercustomize", "startup") if name in sys.modules)
[planted, sys.path, os.getcwd(), sys.flags.inspect, sys.flags.no_user_site, sys.flags.safe_path,
 sorted(name for name in os.environ if name.startswith("PYTHON")), hash("snapcell")]
"""


def test_the_hosts_python_variables_do_not_reach_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers start without -E (it would ignore the hash seed the host sets), so the environment they get is the
    host's own construction: none of the host's PYTHON* variables is honoured, by a forked worker or a spawned one."""
    import asyncio

    from snapcell.backends import ProcessBackend, RunRequest, WorkerOptions, WorkerPool

    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    for name in ("planted", "sitecustomize", "usercustomize", "startup"):
        (planted / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    user_site = planted / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(f"open({str(marker)!r}, 'a').write('user site')\n")
    for name, value in {
        "PYTHONPATH": str(planted),
        "PYTHONSTARTUP": str(planted / "startup.py"),
        "PYTHONINSPECT": "1",
        "PYTHONUSERBASE": str(planted),
        "PYTHONHOME": str(planted),  # honoured, it would keep the interpreter from starting at all
        "PYTHONHASHSEED": "0",
    }.items():
        monkeypatch.setenv(name, value)

    async def probe(zygote: bool) -> tuple[list[object], int | None]:
        workers = WorkerPool(WorkerOptions(max_workers=1, min_warm=0, zygote=zygote, checkout_timeout_s=HANG_GUARD_S))
        backend = ProcessBackend(workers, policy=UNRESTRICTED, limits=snapcell.Limits())
        try:
            await backend.start()
            result = await backend.run(RunRequest(code=_START_PROBE, lookup={}, setup=False, limits=snapcell.Limits()))
            assert result.error is None, result.error
            assert backend.start_path.startswith("zygote" if zygote else "spawn")
            return result.value, backend.hash_seed
        finally:
            await workers.close()

    for zygote in (True, False):
        (modules, path, cwd, inspect, no_user_site, safe_path, variables, hashed), seed = asyncio.run(probe(zygote))
        assert modules == [] and not marker.exists()
        assert not any(entry == "" or entry == cwd or str(planted) in entry for entry in path), path
        assert (inspect, no_user_site, safe_path) == (0, 1, True)
        assert variables == ["PYTHONHASHSEED"]  # the one the host sets: its own seed, not the host's variable
        assert seed is not None
        reference = subprocess.run(
            [sys.executable, "-c", "print(hash('snapcell'))"],
            env={"PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert hashed == int(reference.stdout)  # the worker hashes with the seed the host chose and knows
