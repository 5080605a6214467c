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
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import snapcell
from snapcell.sandbox import _seccomp
from snapcell.sandbox._sandbox import LAYERS, seccomp_denied_syscalls
from tests.sandbox.sandbox_helpers import (
    _MIB,
    HANG_GUARD_S,
    PRELUDE,
    REQUIRED,
    denied,
    kernel_landlock_abi,
    require,
    run_sandboxed,
    sandboxed,
    wait_gone,
    worker_read_paths,
)

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


_LANDLOCK_RECORDED = """
import ctypes, json, os, sys
from snapcell.sandbox import _sandbox

cfg = json.loads(sys.argv[1])
created, rules = [], []
real = _sandbox._syscall


def recording(nr, *args):
    if nr == _sandbox._LANDLOCK_CREATE_RULESET and args[0]:
        fields = (ctypes.c_uint64 * 3).from_address(args[0])
        created.append({"size": args[1], "fields": list(fields)[: args[1] // 8]})
    elif nr == _sandbox._LANDLOCK_ADD_RULE:
        rule = _sandbox._PathBeneathAttr.from_address(args[2])
        rules.append([os.readlink(f"/proc/self/fd/{rule.parent_fd}"), rule.allowed_access])
    return real(nr, *args)


_sandbox._syscall = recording
state = _sandbox._apply_landlock(cfg["scratch"], cfg["read_paths"], [])
print(json.dumps({"state": state, "created": created, "rules": rules}))
"""

# Landlock's rights (include/uapi/linux/landlock.h), written out here apart from the code, by the ABI that brought them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_CHAR, _MAKE_BLOCK, _REFER, _TRUNCATE, _IOCTL_DEV = 1 << 6, 1 << 11, 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: _REFER, 3: _TRUNCATE, 5: _IOCTL_DEV}  # ABI 1: EXECUTE .. MAKE_SYM
_NET_BY_ABI = {4: 0b11}  # BIND_TCP, CONNECT_TCP
_SCOPED_BY_ABI = {6: 0b11}  # ABSTRACT_UNIX_SOCKET, SIGNAL


def _rights(table: dict[int, int], abi: int) -> int:
    return sum(bits for since, bits in table.items() if abi >= since)


def test_landlock_uses_the_kernels_full_abi(probe, tmp_path):
    """The ruleset the code hands the kernel handles every right the kernel's ABI has, and the rules grant few.

    Read off the ``landlock_create_ruleset`` and ``landlock_add_rule`` calls themselves: a set-up bug that silently
    falls back to an older ABI (fewer rights handled: no TRUNCATE, no IOCTL_DEV) shows here.
    """
    abi = kernel_landlock_abi()
    if abi == 0:
        assert "landlock" not in REQUIRED, "SNAPCELL_REQUIRE_SANDBOX requires landlock, but the kernel has none"
        pytest.skip("kernel lacks Landlock")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cfg = {"scratch": str(scratch), "read_paths": worker_read_paths()}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _LANDLOCK_RECORDED, json.dumps(cfg)],
        env={},
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["state"].startswith(f"active: ABI {abi}:"), out["state"]
    assert probe["report"]["landlock"].startswith(f"active: ABI {abi}:"), probe["report"]["landlock"]
    (created,) = out["created"]
    handled = created["fields"]
    fs = _rights(_FS_BY_ABI, abi)
    assert handled[0] == fs, f"handled filesystem rights {handled[0]:#x}, the kernel's ABI {abi} has {fs:#x}"
    if abi >= 3:
        assert handled[0] & _TRUNCATE
    if abi >= 4:
        assert handled[1] == _rights(_NET_BY_ABI, abi)
    if abi >= 6:
        assert handled[2] == _rights(_SCOPED_BY_ABI, abi)
    rules = {os.path.realpath(path): access for path, access in out["rules"]}
    assert rules.pop(str(scratch.resolve())) == fs & ~(_EXECUTE | _MAKE_CHAR | _MAKE_BLOCK)
    assert rules.pop("/dev/null") == (_READ_FILE | _WRITE_FILE | (fs & _TRUNCATE))
    for path, access in rules.items():
        assert access & ~(_READ_FILE | _READ_DIR) == 0, (path, f"{access:#x}")  # everything else is read-only


def test_report_api():
    from snapcell.sandbox._sandbox import SandboxReport

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
        attempt("dgram_pair", lambda: len(socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)))
        attempt("seqpacket_pair", lambda: len(socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)))
        attempt("unix_pair", lambda: len(socket.socketpair()))
        attempt("sendmsg", lambda: socket.socketpair()[0].sendmsg([b"x"]))
        attempt("asyncio", lambda: asyncio.run(asyncio.sleep(0, "done")))
        """,
    )
    for key in ("inet", "inet6", "unix", "udp", "inet_pair", "dgram_pair", "seqpacket_pair", "sendmsg"):
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
            chan.send(b" world")
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
        assert wait_gone(worker_pid, HANG_GUARD_S), "worker outlived its parent"  # gone at once when pdeathsig works
    finally:
        middle.kill()
        middle.wait()
        if middle.stdout is not None:
            middle.stdout.close()
        if worker_pid is not None and not wait_gone(worker_pid, 0):
            os.kill(worker_pid, signal.SIGKILL)


def test_parent_already_gone_kills_the_worker(probe, tmp_path):
    require(probe, "pdeathsig")
    proc = run_sandboxed(tmp_path, "", extra={"parent_pid": os.getpid() + 1_000_000})
    assert proc.returncode == -signal.SIGKILL


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
    for name in ("sendmsg", "sendmmsg"):  # their destination and descriptors lie in memory a filter cannot read
        assert name in notable
    assert not allowed & set(_seccomp._GUARDED[machine].values())  # allowed only by argument, never plainly


# ------------------------------------------------ the filter run on made-up calls (any architecture)

_X86_NR = {"prctl": 157, "ioctl": 16, "fcntl": 72, "socketpair": 53, "sendto": 44, "sendmsg": 46, "sendmmsg": 307}
_X86_NR |= {"setsockopt": 54, "kill": 62, "prlimit64": 302, "clone": 56, "read": 0, "write": 1}
_ARM_NR = {"prctl": 167, "ioctl": 29, "fcntl": 25, "socketpair": 199, "sendto": 206, "sendmsg": 211, "sendmmsg": 269}
_ARM_NR |= {"setsockopt": 208, "kill": 129, "prlimit64": 261, "clone": 220, "read": 63, "write": 64}
_ALLOW = 0x7FFF0000
_EPERM = 0x00050000 | errno.EPERM
_PID = 4242


def _run_filter(prog: list[tuple[int, int, int, int]], arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What classic BPF ``prog`` returns for a call (the instructions a seccomp filter here may use)."""
    words = [nr, arch, 0, 0]  # nr, arch, instruction pointer (two words)
    for arg in (*args, *(0,) * (6 - len(args))):
        words += [arg & 0xFFFFFFFF, (arg >> 32) & 0xFFFFFFFF]  # little-endian: low word first
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = words[k // 4]
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif code in (0x15, 0x35, 0x45):  # BPF_JMP | BPF_JEQ / BPF_JGE / BPF_JSET, BPF_K
            taken = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if taken else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"instruction {code:#x} at {pc - 1} is not one this test knows")


@pytest.mark.parametrize(
    ("machine", "audit_arch", "nr"),
    [
        pytest.param("x86_64", 0xC000003E, _X86_NR, id="x86_64"),
        pytest.param("aarch64", 0xC00000B7, _ARM_NR, id="aarch64"),
    ],
)
@pytest.mark.parametrize("deny_fork", [True, False])
def test_the_filter_checks_arguments(machine, audit_arch, nr, deny_fork):
    prog = _seccomp.build_filter(machine, pid=_PID, deny_fork=deny_fork)

    def fate(name: str, *args: int) -> int:
        return _run_filter(prog, audit_arch, nr[name], args)

    socket_types = (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0)
    refused = {
        "PR_SET_PDEATHSIG": fate("prctl", 1, 0),
        "PR_SET_DUMPABLE": fate("prctl", 4, 1),
        "PR_SET_SECCOMP": fate("prctl", 22, 1),
        "PR_SET_MM": fate("prctl", 35, 1),
        "PR_SET_PTRACER": fate("prctl", 0x59616D61, -1),
        "PR_SET_CHILD_SUBREAPER": fate("prctl", 36, 1),
        "PR_SET_NO_NEW_PRIVS": fate("prctl", 38, 1),
        "PR_CAP_AMBIENT": fate("prctl", 47, 2, 0),
        "PR_SCHED_CORE": fate("prctl", 62, 1, 1),
        "SIOCGIFCONF": fate("ioctl", 0, 0x8912),
        "SIOCGIFHWADDR": fate("ioctl", 0, 0x8927),
        "FIOSETOWN": fate("ioctl", 0, 0x8901),
        "TIOCSTI": fate("ioctl", 0, 0x5412),
        "F_SETOWN": fate("fcntl", 3, 8, _PID + 1),
        "F_SETSIG": fate("fcntl", 3, 10, 0),
        "F_SETOWN_EX": fate("fcntl", 3, 15, 0),
        "F_SETLEASE": fate("fcntl", 3, 1024, 0),
        "F_NOTIFY": fate("fcntl", 3, 1026, 0),
        "SO_ATTACH_FILTER": fate("setsockopt", 3, 1, 26, 1, 16),
        "SO_SNDBUF at another level": fate("setsockopt", 3, 6, 7, 1, 4),
        "socketpair AF_INET": fate("socketpair", 2, 1, 0),
        **{f"socketpair type {kind:#x}": fate("socketpair", 1, kind, 0) for kind in socket_types},
        "sendto an address": fate("sendto", 3, 1, 1, 0, 0x7FFF_0000_1000, 110),
        "sendto an address above 4 GiB": fate("sendto", 3, 1, 1, 0, 0x7FFF_0000_0000, 110),
        "sendmsg": fate("sendmsg", 3, 0x1000, 0),
        "sendmmsg": fate("sendmmsg", 3, 0x1000, 1, 0),
        "kill another": fate("kill", _PID + 1, 0),
        "prlimit64 pid 1": fate("prlimit64", 1, 7, 0, 0x1000),
        "clone CLONE_PARENT": fate("clone", 0x8000 | 17),
    }
    assert refused == dict.fromkeys(refused, _EPERM), {k: hex(v) for k, v in refused.items() if v != _EPERM}
    allowed = {
        "read": fate("read", 0, 0x1000, 10),
        **{name: fate("prctl", option) for name, option in _seccomp.prctl_options(machine).items()},
        "TCGETS": fate("ioctl", 0, 0x5401),
        "TCGETS2": fate("ioctl", 0, 0x802C542A),
        "FIONBIO": fate("ioctl", 3, 0x5421, 0x1000),
        "FIOCLEX": fate("ioctl", 3, 0x5451),
        "TIOCGWINSZ": fate("ioctl", 1, 0x5413),
        "FIONREAD (high bits ignored by the kernel)": fate("ioctl", 3, 0xFFFF_FFFF_0000_541B),
        "F_GETFL": fate("fcntl", 3, 3),
        "F_SETFL": fate("fcntl", 3, 4, 0o4000),
        "F_SETFD": fate("fcntl", 3, 2, 1),
        "F_DUPFD_CLOEXEC": fate("fcntl", 3, 1030, 0),
        "F_SETLK": fate("fcntl", 3, 6, 0x1000),
        "SO_SNDBUF": fate("setsockopt", 3, 1, 7, 0x1000, 4),
        "socketpair stream": fate("socketpair", 1, socket.SOCK_STREAM, 0, 0x1000),
        "socketpair stream, cloexec, nonblock": fate(
            "socketpair", 1, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK, 0, 0x1000
        ),
        "sendto its peer": fate("sendto", 3, 0x1000, 10, 0, 0, 0),
        "kill itself": fate("kill", _PID, 0),
        "prlimit64 itself": fate("prlimit64", 0, 7, 0, 0x1000),
        "a thread": fate("clone", 0x3D0F00),  # glibc's pthread_create flags
    }
    assert allowed == dict.fromkeys(allowed, _ALLOW), {k: hex(v) for k, v in allowed.items() if v != _ALLOW}
    forked = fate("clone", 0x01200011)  # glibc's fork: CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
    assert forked == (_EPERM if deny_fork else _ALLOW)


@pytest.mark.parametrize("deny_fork", [True, False])
def test_a_warmed_filter_is_the_built_one_with_the_pid_patched_in(monkeypatch, deny_fork):
    arch = _seccomp.machine()
    if arch is None:
        pytest.skip(f"no seccomp filter for {os.uname().machine}")
    monkeypatch.setattr(_seccomp, "_PACKED", {})
    pids = (1, 4242, 4_194_303)
    cold = [_seccomp.packed_filter(arch, pid=pid, deny_fork=deny_fork) for pid in pids]
    _seccomp.warm_filters()
    built = []
    real = _seccomp.build_filter
    monkeypatch.setattr(_seccomp, "build_filter", lambda *a, **k: (built.append(1), real(*a, **k))[1])
    warm = [_seccomp.packed_filter(arch, pid=pid, deny_fork=deny_fork) for pid in pids]
    assert built == []  # patched from the template, not built again
    assert warm == cold and len(set(warm)) == len(pids)  # the same bytes as a fresh build, each naming its pid
    for pid, packed in zip(pids, warm, strict=True):
        insns = [_seccomp._INSN.unpack_from(packed, at) for at in range(0, len(packed), _seccomp._INSN.size)]
        assert insns == real(arch, pid=pid, deny_fork=deny_fork)


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
    # Each call allowed only by argument says which arguments.
    for name, allowed in (("prctl", "PR_GET_PDEATHSIG"), ("ioctl", "FIONBIO"), ("fcntl", "F_DUPFD_CLOEXEC")):
        assert fates[name].startswith("EPERM unless") and allowed in fates[name], fates[name]
    assert "PR_SET_PDEATHSIG" not in fates["prctl"] and "SIOCGIFCONF" not in fates["ioctl"]
    assert "F_SETOWN," not in fates["fcntl"] and "SO_ATTACH_FILTER" not in fates["setsockopt"]
    assert "SOCK_STREAM" in fates["socketpair"] and "AF_UNIX" in fates["socketpair"]
    assert "NULL" in fates["sendto"]
    assert fates["sendmsg"] == fates["sendmmsg"] == "EPERM"
    assert "CLONE_PARENT" in fates["clone"] and "CLONE_PARENT" in seccomp_denied_syscalls(deny_fork=False)["clone"]
