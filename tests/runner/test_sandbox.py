"""The in-worker sandbox layers, each tried for real in a fresh interpreter.

Every test spawns ``python -I`` with an empty environment, applies the sandbox
as a worker would and attempts the forbidden thing; the JSON it prints is
asserted here. A test that needs a kernel feature skips only when the probe
reports that layer unavailable, and says why.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapcell
from snapcell.runner import _seccomp
from snapcell.runner._sandbox import LAYERS, is_active, parse_required, seccomp_denied_syscalls

_MIB = 1024 * 1024

PRELUDE = """
import json, os, sys
from snapcell.runner._limits import Limits
from snapcell.runner._sandbox import apply_sandbox

cfg = json.loads(sys.argv[1])
report = apply_sandbox(
    limits=Limits(**cfg["limits"]),
    scratch_dir=cfg["scratch"],
    read_paths=cfg["read_paths"],
    allow_fds=cfg["allow_fds"],
    **cfg["extra"],
)
out = {"report": report.to_dict(), "notes": list(report.notes)}

def attempt(name, fn):
    try:
        out[name] = {"ok": fn()}
    except BaseException as exc:
        out[name] = {"error": type(exc).__name__, "errno": getattr(exc, "errno", None), "msg": str(exc)}
"""


def worker_read_paths() -> list[str]:
    """Build read paths the way the worker does: the Python installation and the snapcell package."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    paths.add(os.path.dirname(snapcell.__file__))
    return sorted(paths)


def run_sandboxed(
    tmp_path: Path,
    body: str,
    *,
    limits: dict[str, object] | None = None,
    read_paths: list[str] | None = None,
    allow_fds: tuple[int, ...] = (),
    pass_fds: tuple[int, ...] = (),
    extra: dict[str, object] | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    cfg = {
        "limits": limits or {},
        "scratch": str(scratch),
        "read_paths": worker_read_paths() if read_paths is None else read_paths,
        "allow_fds": list(allow_fds),
        "extra": extra or {},
    }
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out, default=repr))\n"
    return subprocess.run(
        [sys.executable, "-I", "-c", code, json.dumps(cfg)],
        env={},
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=timeout,
        pass_fds=(*allow_fds, *pass_fds),
    )


def sandboxed(tmp_path: Path, body: str = "", **kw: object) -> dict[str, object]:
    proc = run_sandboxed(tmp_path, body, **kw)  # type: ignore[arg-type]
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return sandboxed(tmp_path_factory.mktemp("probe"))


# Layers CI says this machine has (.ci/run sets it): for those a missing layer fails instead of skipping.
REQUIRED = parse_required(os.environ.get("SNAPCELL_REQUIRE_SANDBOX", ""))


def require(probe: dict[str, object], layer: str) -> None:
    state = probe["report"][layer]  # type: ignore[index]
    if is_active(state):
        return
    assert layer not in REQUIRED, f"SNAPCELL_REQUIRE_SANDBOX requires {layer}, but it is {state}"
    pytest.skip(f"kernel lacks {layer}: {state}")


def denied(entry: object, err: int | None = None) -> bool:
    assert isinstance(entry, dict)
    return entry.get("error") == "PermissionError" and (err is None or entry.get("errno") == err)


# --------------------------------------------------------------------- report


def test_report_names_every_layer(probe):
    report = probe["report"]
    assert tuple(report) == LAYERS
    for state in report.values():
        assert state in ("active", "off") or state.startswith(("active: ", "unavailable: "))
    # Core dumps are always disabled, and the default limits set memory, CPU, file size and descriptors.
    assert report["rlimits"].startswith("active: ")
    for limit in ("AS=", "CPU=", "FSIZE=", "NOFILE=", "CORE=0"):
        assert limit in report["rlimits"]


def kernel_landlock_abi() -> int:
    """The Landlock ABI as the kernel reports it to this (unsandboxed) test process; 0 without Landlock."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_..._VERSION
    return max(int(abi), 0)


def test_landlock_uses_the_kernels_full_abi(probe):
    """A set-up bug that silently falls back to an older ABI (fewer rights handled) shows here."""
    abi = kernel_landlock_abi()
    if abi == 0:
        assert "landlock" not in REQUIRED, "SNAPCELL_REQUIRE_SANDBOX requires landlock, but the kernel has none"
        pytest.skip("kernel lacks Landlock")
    assert probe["report"]["landlock"].startswith(f"active: ABI {abi}:"), probe["report"]["landlock"]


def test_report_api():
    from snapcell.runner._sandbox import SandboxReport

    report = SandboxReport(
        layers={"seccomp": "active: allowlist", "landlock": "unavailable: landlock_create_ruleset: nope", "x": "off"}
    )
    assert report.active("seccomp") and not report.active("landlock") and not report.active("pdeathsig")
    assert not report.active("x")
    copy = report.to_dict()
    copy["seccomp"] = "off"
    assert report.layers["seccomp"] == "active: allowlist"


def test_bad_arguments_raise_config_error_before_anything_applies(tmp_path):
    body = """
    from snapcell.errors import ConfigError
    import threading
    def bad(**kw):
        args = dict(limits=Limits(), scratch_dir=cfg["scratch"], read_paths=[])
        args.update(kw)
        try:
            apply_sandbox(**args)
        except ConfigError as exc:
            return str(exc)
        return "no error"
    out["relative_scratch"] = bad(scratch_dir="scratch")
    out["missing_scratch"] = bad(scratch_dir="/nonexistent/scratch")
    out["str_read_paths"] = bad(read_paths="/usr")
    out["relative_read_path"] = bad(read_paths=["usr"])
    out["closed_fd"] = bad(allow_fds=[1000])
    out["uid_zero"] = bad(uid=0, gid=65534)
    out["gid_text"] = bad(uid=65534, gid="65534")
    out["unknown_layer"] = bad(require=["selinux"])
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    out["thread_running"] = bad()
    stop.set()
    t.join()
    """
    # The sandbox the prelude applied first is harmless to these checks.
    out = sandboxed(tmp_path, body)
    keys = ("relative_scratch", "missing_scratch", "str_read_paths", "relative_read_path", "closed_fd")
    for key in (*keys, "uid_zero", "gid_text", "unknown_layer"):
        assert out[key] != "no error", key
    assert "before any other thread" in out["thread_running"]


# -------------------------------------------------------------------- seccomp


def test_sockets_are_denied_but_asyncio_works(probe, tmp_path):
    require(probe, "seccomp")
    out = sandboxed(
        tmp_path,
        """
        import asyncio, socket
        attempt("inet", lambda: socket.socket().fileno())
        attempt("inet6", lambda: socket.socket(socket.AF_INET6).fileno())
        attempt("unix", lambda: socket.socket(socket.AF_UNIX).fileno())
        attempt("udp", lambda: socket.socket(type=socket.SOCK_DGRAM).fileno())
        attempt("inet_pair", lambda: socket.socketpair(socket.AF_INET).__len__())
        attempt("unix_pair", lambda: len(socket.socketpair()))
        attempt("asyncio", lambda: asyncio.run(asyncio.sleep(0, "done")))
        """,
    )
    for key in ("inet", "inet6", "unix", "udp", "inet_pair"):
        assert denied(out[key], 1), (key, out[key])
    assert out["unix_pair"] == {"ok": 2}
    assert out["asyncio"] == {"ok": "done"}


def test_inherited_channel_stays_usable_and_other_fds_are_closed(tmp_path):
    host, worker = socket.socketpair()
    stray_r, stray_w = os.pipe()
    try:
        host.sendall(b"back")
        out = sandboxed(
            tmp_path,
            f"""
            import socket
            chan = socket.socket(fileno={worker.fileno()})
            chan.sendall(b"hello")
            chan.sendmsg([b" world"])
            out["recv"] = chan.recv(4).decode()
            attempt("stray", lambda: os.fstat({stray_r}).st_mode)
            """,
            allow_fds=(worker.fileno(),),
            pass_fds=(stray_r,),
        )
        host.settimeout(5)
        received = b""
        while len(received) < len(b"hello world"):
            received += host.recv(100)
    finally:
        for closable in (host, worker):
            closable.close()
        os.close(stray_r)
        os.close(stray_w)
    assert out["recv"] == "back"
    assert received == b"hello world"
    assert out["stray"]["error"] == "OSError" and out["stray"]["errno"] == errno.EBADF


def test_fork_and_exec_are_denied(probe, tmp_path):
    require(probe, "seccomp")
    out = sandboxed(
        tmp_path,
        """
        import ctypes, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        def raw(nr, *args):
            if libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args)) == -1:
                return ctypes.get_errno()
            return 0
        attempt("fork", os.fork)
        attempt("subprocess", lambda: subprocess.run(["/bin/true"]).returncode)
        attempt("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {}))
        attempt("execv", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]))
        out["unshare_user"] = libc.unshare(0x10000000) == -1 and ctypes.get_errno()
        out["clone3"] = raw(435, 0, 0)
        out["ptrace_traceme"] = raw(101 if os.uname().machine == "x86_64" else 117, 0, 0, 0, 0)
        """,
    )
    for key in ("fork", "subprocess", "posix_spawn", "execv"):
        assert denied(out[key], errno.EPERM), (key, out[key])
    assert out["unshare_user"] == errno.EPERM
    assert out["clone3"] == errno.ENOSYS
    assert out["ptrace_traceme"] == errno.EPERM


def test_max_processes_allows_fork_but_never_exec(probe, tmp_path):
    require(probe, "seccomp")
    out = sandboxed(
        tmp_path,
        """
        def fork_and_wait():
            pid = os.fork()
            if pid == 0:
                os._exit(7)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        attempt("fork", fork_and_wait)
        attempt("execv", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]))
        """,
        limits={"max_processes": 4},
    )
    assert out["fork"] == {"ok": 7}
    assert denied(out["execv"], errno.EPERM)


def test_threads_still_work(probe, tmp_path):
    require(probe, "seccomp")
    out = sandboxed(
        tmp_path,
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor
        seen = []
        t = threading.Thread(target=seen.append, args=("thread",))
        t.start()
        t.join()
        out["thread"] = seen
        with ThreadPoolExecutor(4) as pool:
            out["pool"] = sorted(pool.map(lambda x: x * x, range(8)))
        """,
    )
    assert out["thread"] == ["thread"]
    assert out["pool"] == [x * x for x in range(8)]


# ------------------------------------------------------------------- landlock


def test_writes_stay_in_scratch(probe, tmp_path):
    require(probe, "landlock")
    outside = tmp_path / "outside.txt"
    out = sandboxed(
        tmp_path,
        f"""
        def scratch_work():
            with open("a.txt", "w") as f:
                f.write("data")
            os.mkdir("sub")
            os.rename("a.txt", "sub/b.txt")
            with open("sub/b.txt") as f:
                text = f.read()
            os.unlink("sub/b.txt")
            os.rmdir("sub")
            return text
        attempt("scratch", scratch_work)
        attempt("outside", lambda: open({str(outside)!r}, "w").close())
        attempt("outside_dir", lambda: os.mkdir({str(tmp_path / "d")!r}))
        attempt("tmp", lambda: open("/tmp/snapcell-sandbox-escape", "w").close())
        """,
    )
    assert out["scratch"] == {"ok": "data"}
    for key in ("outside", "outside_dir", "tmp"):
        assert denied(out[key]), (key, out[key])
    assert not outside.exists()


def test_sibling_of_a_read_path_is_unreadable(probe, tmp_path):
    require(probe, "landlock")
    root = tmp_path / "D"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "file.txt").write_text("public")
    (root / "secret").write_text("signing key")
    repo_file = Path(snapcell.__file__).resolve().parent.parent / "pyproject.toml"
    out = sandboxed(
        tmp_path,
        f"""
        attempt("pkg_file", lambda: open({str(root / "pkg" / "file.txt")!r}).read())
        attempt("pkg_list", lambda: os.listdir({str(root / "pkg")!r}))
        attempt("secret", lambda: open({str(root / "secret")!r}).read())
        attempt("list_root", lambda: os.listdir({str(root)!r}))
        attempt("repo_file", lambda: open({str(repo_file)!r}).read(10))
        attempt("etc_passwd", lambda: open("/etc/passwd").read(10))
        attempt("write_pkg", lambda: open({str(root / "pkg" / "file.txt")!r}, "a").close())
        """,
        read_paths=[*worker_read_paths(), str(root / "pkg")],
    )
    assert out["pkg_file"] == {"ok": "public"}
    assert out["pkg_list"] == {"ok": ["file.txt"]}
    for key in ("secret", "list_root", "etc_passwd", "write_pkg"):
        assert denied(out[key]), (key, out[key])
    readable = [Path(p) for p in worker_read_paths()]
    if repo_file.exists() and not any(repo_file.is_relative_to(p) for p in readable):
        # snapcell installed editable: its package dir is readable, the repo root (a local store) is not.
        assert denied(out["repo_file"]), out["repo_file"]


def test_imports_still_work_after_the_sandbox(probe, tmp_path):
    require(probe, "landlock")
    has_numpy = importlib.util.find_spec("numpy") is not None
    out = sandboxed(
        tmp_path,
        f"""
        import decimal, fractions, statistics, json, sqlite3, zlib, hashlib, zoneinfo
        out["stdlib"] = [
            str(decimal.Decimal("1.1") + decimal.Decimal("2.2")),
            str(fractions.Fraction(1, 3) * 3),
            statistics.mean([1, 2, 3]),
            sqlite3.connect(":memory:").execute("select 40 + 2").fetchone()[0],
            len(zlib.compress(b"x" * 1000)) < 100,
            hashlib.sha256(b"").hexdigest()[:8],
            str(zoneinfo.ZoneInfo("Europe/Paris")),
        ]
        if {has_numpy}:
            import numpy as np
            a = np.arange(40000, dtype=float).reshape(200, 200)
            out["numpy"] = float((a @ a.T).trace())
        """,
    )
    assert out["stdlib"] == ["3.3", "1", 2, 42, True, "e3b0c442", "Europe/Paris"]
    if has_numpy:
        import numpy as np

        a = np.arange(40000, dtype=float).reshape(200, 200)
        assert out["numpy"] == float((a @ a.T).trace())


def test_signals_cannot_leave_the_sandbox(probe, tmp_path):
    require(probe, "landlock")
    abi = int(probe["report"]["landlock"].split()[2].rstrip(":"))
    if abi < 6:
        pytest.skip(f"kernel lacks Landlock signal scoping: ABI {abi} < 6")
    out = sandboxed(
        tmp_path,
        """
        attempt("parent", lambda: os.kill(os.getppid(), 0))
        attempt("self", lambda: os.kill(os.getpid(), 0))
        """,
    )
    assert denied(out["parent"], errno.EPERM)
    assert out["self"] == {"ok": None}


# -------------------------------------------------------------------- rlimits


def test_memory_limit_turns_a_huge_allocation_into_memory_error(probe, tmp_path):
    require(probe, "rlimits")
    out = sandboxed(
        tmp_path,
        """
        attempt("huge", lambda: len(bytearray(4 * 1024**3)))
        attempt("small", lambda: len(bytearray(16 * 1024**2)))
        """,
        limits={"memory_bytes": 512 * _MIB},
    )
    assert out["huge"]["error"] == "MemoryError"
    assert out["small"] == {"ok": 16 * _MIB}


def test_file_size_limit_stops_a_large_write(probe, tmp_path):
    require(probe, "rlimits")
    out = sandboxed(
        tmp_path,
        """
        def write():
            with open("big", "wb", buffering=0) as f:
                f.write(b"x" * (1024 * 1024))
                f.write(b"x" * (1024 * 1024))
        attempt("write", write)
        out["size"] = os.path.getsize("big")
        """,
        limits={"max_file_bytes": _MIB},
    )
    assert out["write"]["errno"] == errno.EFBIG
    assert out["size"] == _MIB


def test_open_files_limit(probe, tmp_path):
    require(probe, "rlimits")
    out = sandboxed(
        tmp_path,
        """
        held = []
        def open_many():
            for i in range(64):
                held.append(open(f"f{i}", "w"))
        attempt("open", open_many)
        out["held"] = len(held)
        """,
        limits={"max_open_files": 16},
    )
    assert out["open"]["errno"] == errno.EMFILE
    assert out["held"] < 16


def test_cpu_limit_ends_a_busy_loop(probe, tmp_path):
    require(probe, "rlimits")
    proc = run_sandboxed(tmp_path, "while True:\n    pass\n", limits={"cpu_time_s": 1}, timeout=20)
    assert proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL), proc.stderr


def test_core_dumps_disabled(tmp_path):
    out = sandboxed(tmp_path, "import resource\nout['core'] = resource.getrlimit(resource.RLIMIT_CORE)")
    assert out["core"] == [0, 0]


# ------------------------------------------------------------------ pdeathsig


def test_pdeathsig_is_armed(probe, tmp_path):
    require(probe, "pdeathsig")
    out = sandboxed(
        tmp_path,
        """
        import ctypes
        sig = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
        out["sig"] = sig.value
        """,
    )
    assert out["sig"] == signal.SIGKILL


def test_worker_dies_with_its_parent(probe, tmp_path):
    require(probe, "pdeathsig")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cfg = json.dumps(
        {"limits": {}, "scratch": str(scratch), "read_paths": worker_read_paths(), "allow_fds": [], "extra": {}}
    )
    worker_code = PRELUDE + "print('ready', flush=True)\nimport time\ntime.sleep(60)\n"
    middle_code = (
        "import subprocess, sys, time\n"
        f"argv = [sys.executable, '-I', '-c', {worker_code!r}, {cfg!r}]\n"
        f"p = subprocess.Popen(argv, env={{}}, cwd={str(scratch)!r})\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    middle = subprocess.Popen([sys.executable, "-I", "-c", middle_code], stdout=subprocess.PIPE, text=True, env={})
    worker_pid = None
    try:
        assert middle.stdout is not None
        lines = {middle.stdout.readline().strip(), middle.stdout.readline().strip()}
        assert "ready" in lines, lines
        worker_pid = int(next(line for line in lines if line != "ready"))
        middle.kill()
        middle.wait()
        assert _wait_gone(worker_pid, 5), "worker outlived its parent"
    finally:
        middle.kill()
        middle.wait()
        if middle.stdout is not None:
            middle.stdout.close()
        if worker_pid is not None and not _wait_gone(worker_pid, 0):
            os.kill(worker_pid, signal.SIGKILL)


def test_parent_already_gone_kills_the_worker(probe, tmp_path):
    require(probe, "pdeathsig")
    proc = run_sandboxed(tmp_path, "", extra={"parent_pid": os.getpid() + 1_000_000})
    assert proc.returncode == -signal.SIGKILL


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        if "\nState:\tZ" in status:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# ------------------------------------------------------------- filter itself


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("deny_fork", [True, False])
def test_filter_is_well_formed(machine, deny_fork):
    prog = _seccomp.build_filter(machine, pid=4242, deny_fork=deny_fork)
    assert len(prog) < 4096
    for i, (code, jt, jf, _k) in enumerate(prog):
        if code & 0x07 == 0x05:  # BPF_JMP: both targets inside the program
            assert i + 1 + max(jt, jf) < len(prog)
    assert prog[-1] == (0x06, 0, 0, 0x00050000 | errno.EPERM)  # default: deny with EPERM
    assert (0x06, 0, 0, 0x80000000) not in prog[3:]  # only another ABI kills; denied calls return EPERM
    allowed = set(_seccomp.allowed_syscalls(machine, deny_fork=deny_fork).values())
    notable = _seccomp._NOTABLE_DENIED[machine]
    assert not allowed & set(notable.values()), sorted(n for n, nr in notable.items() if nr in allowed)
    for name in ("shmget", "fanotify_init", "clock_settime", "sethostname", "socket", "execve", "ptrace", "bpf"):
        assert name in notable


def test_denied_syscalls_listing():
    fates = seccomp_denied_syscalls()
    if not fates:
        pytest.skip(f"no seccomp filter for {os.uname().machine}")
    for name in ("socket", "execve", "execveat", "ptrace", "mount", "unshare", "setns", "bpf", "keyctl", "shmget"):
        assert fates[name] == "EPERM"
    assert fates["clone3"] == "ENOSYS"
    assert "CLONE_THREAD" in fates["clone"]
    assert "itself" in fates["kill"] and "own" in fates["prlimit64"]
    assert fates["*"].startswith("EPERM")


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
    with attack_pool.checkout() as session:
        pid, uid, gid, groups = session.feed_run("import os\nos.getpid(), os.getuid(), os.getgid(), os.getgroups()")
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
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
        pid, cwd = session.feed_run("import os\nos.getpid(), os.getcwd()")
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
    with snapcell.Pool(f"file://{store_dir}", isolation="inline"):
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
        lazy, values, sys.flags.isolated
        """
    )
    result = attack(attack_pool, code)
    assert result.error is None, result.error
    lazy, values, isolated = result.value
    assert lazy == ["statistics", "colorsys", "termios"]  # imported for the first time after the sandbox
    assert values == [(0.0, 1.0, 1.0), 13, 2, "1", "Europe/Paris", 42, "3.3"]
    assert isolated == 1  # the worker runs as python -I


# ------------------------------------------------ broken layers fail, missing ones are reported

_BREAK = """
import errno, json, sys
from snapcell.errors import SandboxError
from snapcell.runner import _sandbox, _seccomp
from snapcell.runner._limits import Limits

cfg = json.loads(sys.argv[1])
exec(cfg["patch"])
try:
    report = _sandbox.apply_sandbox(
        limits=Limits(), scratch_dir=cfg["scratch"], read_paths=cfg["read_paths"], require=cfg["require"]
    )
    out = {"report": report.to_dict()}
except SandboxError as exc:
    out = {"error": str(exc), "layer": exc.layer, "errno": exc.errno}
print(json.dumps(out))
"""


def break_layer(tmp_path: Path, patch: str, require: tuple[str, ...] = ()) -> dict[str, object]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    cfg = {"patch": textwrap.dedent(patch), "scratch": str(scratch), "read_paths": worker_read_paths()}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _BREAK, json.dumps({**cfg, "require": list(require)})],
        env={},
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_a_landlock_setup_error_fails_instead_of_reading_unavailable(probe, tmp_path):
    require(probe, "landlock")
    # An access right this kernel does not know: a genuine EINVAL from landlock_create_ruleset.
    out = break_layer(tmp_path, "_sandbox._FS_V1 |= 1 << 62")
    assert out.get("layer") == "landlock" and out.get("errno") == errno.EINVAL, out
    assert "landlock_create_ruleset" in out["error"] and "EINVAL" not in out["error"].split(":")[0]


def test_a_seccomp_setup_error_fails_instead_of_reading_unavailable(probe, tmp_path):
    require(probe, "seccomp")
    # A filter flag no kernel defines: a genuine EINVAL from seccomp(2).
    out = break_layer(tmp_path, "_sandbox._SECCOMP_FILTER_FLAG_TSYNC = 1 << 30")
    assert out.get("layer") == "seccomp" and out.get("errno") == errno.EINVAL, out
    # A malformed program (a jump past its end) is refused the same way.
    out = break_layer(
        tmp_path,
        """
        real = _seccomp.build_filter
        _seccomp.build_filter = lambda *a, **k: [(0x15, 200, 0, 0), *real(*a, **k)[-1:]]
        """,
    )
    assert out.get("layer") == "seccomp" and out.get("errno") == errno.EINVAL, out


def test_an_einval_from_a_layer_fails_but_enosys_reads_unavailable(tmp_path):
    fake = """
    real = _sandbox._syscall
    def fake(nr, *args):
        if nr == _sandbox._LANDLOCK_CREATE_RULESET:
            raise OSError(errno.{err}, "injected")
        return real(nr, *args)
    _sandbox._syscall = fake
    """
    out = break_layer(tmp_path, fake.format(err="EINVAL"))
    assert out.get("layer") == "landlock" and out.get("errno") == errno.EINVAL, out
    out = break_layer(tmp_path, fake.format(err="EFAULT"))
    assert out.get("layer") == "landlock" and out.get("errno") == errno.EFAULT, out
    for missing in ("ENOSYS", "EOPNOTSUPP"):
        out = break_layer(tmp_path, fake.format(err=missing))
        assert "report" in out, out
        state = out["report"]["landlock"]
        assert state.startswith("unavailable: ") and os.strerror(getattr(errno, missing)) in state
    # The same missing layer is a hard failure once it is required.
    out = break_layer(tmp_path, fake.format(err="ENOSYS"), require=("landlock",))
    assert out.get("layer") == "landlock" and out.get("errno") is None and "required" in out["error"], out


def test_a_missing_seccomp_architecture_reads_unavailable_unless_required(tmp_path):
    out = break_layer(tmp_path, "_seccomp.machine = lambda: None")
    assert out["report"]["seccomp"].startswith("unavailable: no filter for architecture"), out
    out = break_layer(tmp_path, "_seccomp.machine = lambda: None", require=("all",))
    assert out.get("layer") == "seccomp", out


def test_required_layers_are_parsed_strictly():
    assert parse_required("") == ()
    assert parse_required(" seccomp , landlock,seccomp") == ("seccomp", "landlock")
    assert parse_required("all") == LAYERS
    with pytest.raises(snapcell.ConfigError, match="unknown layers"):
        parse_required("seccomp,selinux")


def test_an_invalid_requirement_fails_the_checkout_and_frees_the_worker(monkeypatch):
    monkeypatch.setenv("SNAPCELL_REQUIRE_SANDBOX", "landlock,apparmor")
    with snapcell.Pool("memory://", isolation="process", min_warm_workers=0, max_workers=1) as pool:
        with pytest.raises(snapcell.ConfigError, match="apparmor"):
            with pool.checkout():
                pass
        monkeypatch.setenv("SNAPCELL_REQUIRE_SANDBOX", "all" if os.geteuid() == 0 else "landlock")
        with pool.checkout() as session:  # the one worker slot was given back
            assert session.feed_run("1 + 1") == 2


def test_a_workers_sandbox_failure_becomes_a_sandbox_error():
    from snapcell.runner._sandbox import sandbox_failure

    error = sandbox_failure(
        {"op": "sandbox_failed", "message": "sandbox layer seccomp ...", "layer": "seccomp", "errno": 22}
    )
    assert isinstance(error, snapcell.SandboxError) and isinstance(error, snapcell.SessionError)
    assert (error.layer, error.errno, str(error)) == ("seccomp", 22, "sandbox layer seccomp ...")
    hostile = sandbox_failure({"message": "x" * 10**6, "layer": ["not", "text"], "errno": True})
    assert len(str(hostile)) <= 2000 and hostile.layer == "unknown" and hostile.errno is None


def test_a_scratch_tmpfs_left_by_a_killed_host_is_swept_by_the_next_pool():
    if os.geteuid() != 0:
        pytest.skip("scratch tmpfs needs a root host")
    code = textwrap.dedent(
        """
        import json, time, snapcell
        policy = snapcell.Policy.unrestricted()
        with snapcell.Pool("memory://", isolation="process", policy=policy, min_warm_workers=0) as pool:
            with pool.checkout() as session:
                print(json.dumps(session.feed_run("import os\\nos.getpid(), os.getcwd()")), flush=True)
                time.sleep(60)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        pid, workspace = json.loads(host.stdout.readline())
        scratch = os.path.dirname(workspace)  # the working directory is the workspace, inside the scratch tmpfs
        assert os.path.ismount(scratch)
        host.kill()
        host.wait(10)
        assert _wait_gone(pid, 10), "the worker outlived its host"
        assert os.path.ismount(scratch)  # nobody was left to unmount it
        with snapcell.Pool("memory://", isolation="process", min_warm_workers=0) as pool, pool.checkout() as session:
            assert session.feed_run("1") == 1
        assert not os.path.ismount(scratch)
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()


def test_worker_identity_follows_the_environment_and_the_uid_map(tmp_path):
    from snapcell.runner import _privileges

    if os.geteuid() != 0:
        assert _privileges.worker_identity(123, {}) == {"uid": None, "gid": None}
        return
    assert _privileges.worker_identity(123, {}) == {"uid": _privileges.WORKER_UID_BASE + 123, "gid": 65534}
    fixed = {"SNAPCELL_WORKER_UID": "4000", "SNAPCELL_WORKER_GID": "4001"}
    assert _privileges.worker_identity(123, fixed) == {"uid": 4000, "gid": 4001}
    for bad in ("0", "-5", "nobody", str(2**32 - 1)):
        with pytest.raises(snapcell.ConfigError, match="SNAPCELL_WORKER_UID"):
            _privileges.worker_identity(123, {"SNAPCELL_WORKER_UID": bad})
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("         0     100000      65536\n")  # a container's root: 65536 ids mapped
    assert not _privileges._uid_mapped(_privileges.WORKER_UID_BASE + 123, str(uid_map))
    assert _privileges._uid_mapped(65534, str(uid_map))


def test_new_limits_are_validated():
    assert snapcell.Limits(max_threads=None, max_scratch_bytes=None).max_threads is None
    for bad in ({"max_threads": 2}, {"max_threads": True}, {"max_scratch_bytes": -1}, {"max_scratch_bytes": 1.5e9}):
        with pytest.raises(snapcell.ConfigError, match=next(iter(bad))):
            snapcell.Limits(**bad)
    with pytest.raises(snapcell.ConfigError, match="cpu_time_s"):
        snapcell.Limits(cpu_time_s=0)
