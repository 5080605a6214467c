"""Each sandbox layer pinned on its own, without the others' help.

On a root host the uid switch alone stops much of what the other layers stop (an unprivileged uid cannot signal
root's processes or read their limits), so a test of the whole sandbox can pass with one layer gone. Here a fresh
interpreter either applies one layer and nothing else (the seccomp filter: no uid switch, no Landlock;
``no_new_privs`` only because an unprivileged process needs it to install a filter), or the whole sandbox without
the uid switch, trying what no layer but the one under test could refuse. Every attempt is one that succeeds in an
unconfined process; each test also checks that what a worker needs still works.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.sandbox_helpers import (
    PRELUDE,
    REQUIRED,
    denied,
    kernel_landlock_abi,
    received,
    sandboxed,
    worker_read_paths,
)

# ------------------------------------------------------------------ seccomp alone

_SECCOMP_ONLY = """
import asyncio, ctypes, errno, fcntl, json, os, socket, struct, sys, threading
from snapcell.sandbox import _sandbox, _seccomp

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
parent = os.getppid()
# Made before the filter, which cannot make one: the filter alone must keep it from sending anywhere.
dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
pipe_r, pipe_w = os.pipe()
if cfg["warm"]:
    _seccomp.warm_filters()  # the zygote's way: the child patches its pid into a packed template
out = {"nnp": _sandbox._apply_no_new_privs()}
out["seccomp"] = _sandbox._apply_seccomp(_seccomp.machine(), deny_fork=cfg["deny_fork"], notes=[])


def raw(nr, *args):
    result = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    return ctypes.get_errno() if result == -1 else 0


def prctl(*args):
    args = [ctypes.c_ulong(a & (2**64 - 1)) for a in args] + [ctypes.c_ulong(0)] * (5 - len(args))
    return ctypes.get_errno() if libc.prctl(*args) == -1 else 0


def attempt(fn):
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return 0


def ioctl(fd, request, arg=bytes(40)):
    return attempt(lambda: fcntl.ioctl(fd, request, arg))


refused = out["refused"] = {}
refused["prctl_set_pdeathsig_0"] = prctl(1, 0)
refused["prctl_set_dumpable"] = prctl(4, 1)
refused["prctl_set_child_subreaper"] = prctl(36, 1)
refused["prctl_set_securebits_0"] = prctl(28, 0)
refused["prctl_set_keepcaps"] = prctl(8, 1)
for name, kind in (("dgram", socket.SOCK_DGRAM), ("seqpacket", socket.SOCK_SEQPACKET)):
    for flags in (0, socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK):
        refused[f"socketpair_{name}_{flags}"] = attempt(lambda: socket.socketpair(socket.AF_UNIX, kind | flags))
refused["sendto_address"] = attempt(lambda: dgram.sendto(b"forged by sendto", cfg["target"]))
refused["sendmsg_address"] = attempt(lambda: dgram.sendmsg([b"forged by sendmsg"], [], 0, cfg["target"]))
refused["ioctl_siocgifconf"] = ioctl(dgram.fileno(), 0x8912, bytes(16))  # ifc_len 0, ifc_buf NULL: the size
refused["ioctl_siocgifhwaddr"] = ioctl(dgram.fileno(), 0x8927, b"lo".ljust(40, b"\\0"))
refused["ioctl_fiosetown"] = ioctl(dgram.fileno(), 0x8901, struct.pack("i", parent))
refused["fcntl_setown"] = attempt(lambda: fcntl.fcntl(pipe_r, fcntl.F_SETOWN, parent))
refused["fcntl_setsig"] = attempt(lambda: fcntl.fcntl(pipe_r, 10, 0))  # F_SETSIG
one = struct.pack("HBBI", 0x06, 0, 0, 0xFFFF)  # a socket filter that lets everything through
code = ctypes.create_string_buffer(one)
fprog = struct.pack("HxxxxxxQ", 1, ctypes.addressof(code))
refused["setsockopt_attach_filter"] = attempt(lambda: dgram.setsockopt(socket.SOL_SOCKET, 26, fprog))
old = (ctypes.c_uint64 * 2)()
prlimit64 = 302 if x86 else 261
refused["prlimit64_parent"] = raw(prlimit64, parent, 7, 0, ctypes.addressof(old))  # read RLIMIT_NOFILE
refused["prlimit64_pid1"] = raw(prlimit64, 1, 7, 0, ctypes.addressof(old))
refused["kill_parent"] = attempt(lambda: os.kill(parent, 0))
refused["kill_pid1"] = attempt(lambda: os.kill(1, 0))
stream, peer = socket.socketpair()
refused["sendmsg_on_a_stream"] = attempt(lambda: stream.sendmsg([b"fds could ride along"]))
if not cfg["deny_fork"]:
    pid = libc.syscall(ctypes.c_long(56 if x86 else 220), ctypes.c_long(0x8000 | 17), *[ctypes.c_long(0)] * 4)
    if pid == 0:  # CLONE_PARENT | SIGCHLD: a process handed to the parent, out of this one's reach
        os._exit(0)
    refused["clone_parent"] = ctypes.get_errno() if pid == -1 else 0

works = out["works"] = {}
cloexec_stream = socket.SOCK_STREAM | socket.SOCK_CLOEXEC
works["stream_socketpair"] = attempt(lambda: socket.socketpair(socket.AF_UNIX, cloexec_stream))
stream.sendall(b"over the channel")
works["send_recv"] = peer.recv(100).decode()
works["setblocking"] = attempt(lambda: stream.setblocking(False))  # ioctl FIONBIO
works["fionread"] = ioctl(peer.fileno(), 0x541B, bytes(4))
works["fioclex"] = ioctl(peer.fileno(), 0x5451)
works["isatty"] = os.isatty(0)
works["tcgets"] = ioctl(0, 0x5401, bytes(60))  # ENOTTY on /dev/null, never EPERM
works["tiocgwinsz"] = ioctl(0, 0x5413, bytes(8))
works["set_blocking"] = attempt(lambda: os.set_blocking(pipe_r, False))  # fcntl F_GETFL/F_SETFL
works["set_inheritable"] = attempt(lambda: os.set_inheritable(pipe_r, True))
works["dup"] = attempt(lambda: os.close(os.dup(pipe_r)))  # fcntl F_DUPFD_CLOEXEC
works["getown"] = attempt(lambda: fcntl.fcntl(pipe_r, fcntl.F_GETOWN))
works["sndbuf"] = attempt(lambda: stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536))
works["so_type"] = stream.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
works["get_pdeathsig"] = prctl(2, ctypes.addressof(ctypes.c_int()))
works["set_name"] = prctl(15, ctypes.addressof(ctypes.create_string_buffer(b"renamed")))
works["get_securebits"] = prctl(27)
works["capbset_read"] = prctl(23, 0)
works["set_vma"] = prctl(0x53564D41, 0, 0, 0, ctypes.addressof(ctypes.create_string_buffer(b"x")))
works["kill_self"] = attempt(lambda: os.kill(os.getpid(), 0))
works["prlimit_self"] = raw(prlimit64, 0, 7, 0, ctypes.addressof(old))
seen = []
thread = threading.Thread(target=seen.append, args=("thread",))
thread.start()
thread.join()
works["thread"] = seen
works["asyncio"] = asyncio.run(asyncio.sleep(0, "done"))
print(json.dumps(out))
"""


def _seccomp_alone(tmp_path: Path, target: str, *, deny_fork: bool, warm: bool) -> dict[str, object]:
    cfg = {"target": target, "deny_fork": deny_fork, "warm": warm}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _SECCOMP_ONLY, json.dumps(cfg)],
        env={},
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(("deny_fork", "warm"), [(True, False), (True, True), (False, True)])
def test_the_seccomp_filter_alone_refuses_escapes_and_allows_a_worker(tmp_path, datagram_target, deny_fork, warm):
    target, path = datagram_target
    out = _seccomp_alone(tmp_path, path, deny_fork=deny_fork, warm=warm)
    if not str(out["seccomp"]).startswith("active"):
        assert "seccomp" not in REQUIRED, f"SNAPCELL_REQUIRE_SANDBOX requires seccomp, but it is {out['seccomp']}"
        pytest.skip(f"no seccomp filter here: {out['seccomp']}")
    refused = out["refused"]
    assert isinstance(refused, dict)
    assert refused == dict.fromkeys(refused, errno.EPERM), {k: v for k, v in refused.items() if v != errno.EPERM}
    assert len(refused) == 22 + (not deny_fork)
    assert received(target) == []  # nothing reached the datagram socket
    works = out["works"]
    assert isinstance(works, dict)
    assert works.pop("send_recv") == "over the channel"
    assert works.pop("so_type") == socket.SOCK_STREAM
    assert works.pop("thread") == ["thread"]
    assert works.pop("asyncio") == "done"
    assert works.pop("isatty") is False
    for name in ("tcgets", "tiocgwinsz"):
        assert works.pop(name) == errno.ENOTTY, name  # stdin is /dev/null: the kernel answered, not the filter
    # PR_SET_VMA names memory only on kernels built with CONFIG_ANON_VMA_NAME (EINVAL elsewhere): never EPERM.
    assert works.pop("set_vma") in (0, errno.EINVAL)
    assert works == dict.fromkeys(works, 0), {k: v for k, v in works.items() if v != 0}


# ------------------------------------------------------------------ landlock alone


def test_truncating_a_writable_file_outside_scratch_is_refused(tmp_path):
    """Only Landlock's TRUNCATE right stops this: the file is writable by anyone and the process keeps uid 0."""
    abi = kernel_landlock_abi()
    if abi < 3:
        assert abi > 0 or "landlock" not in REQUIRED, (
            "SNAPCELL_REQUIRE_SANDBOX requires landlock, but the kernel has none"
        )
        pytest.skip(f"kernel lacks Landlock's truncate right: ABI {abi} < 3")
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = shared / "notes.txt"
    victim.write_text("keep me")
    victim.chmod(0o666)
    body = f"""
    attempt("truncate", lambda: os.truncate({str(victim)!r}, 0))
    attempt("read", lambda: open({str(victim)!r}).read())
    """
    out = sandboxed(tmp_path, body, read_paths=[*worker_read_paths(), str(shared)])
    assert out["read"] == {"ok": "keep me"}
    assert denied(out["truncate"], errno.EACCES), out["truncate"]
    assert victim.read_text() == "keep me"


# ------------------------------------------------------------------ privileges alone

_HELD = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out["securebits"] = libc.prctl(27, 0, 0, 0, 0)
out["ambient_raised"] = RAISED
out["bounding"] = [cap for cap in range(64) if libc.prctl(23, cap, 0, 0, 0) == 1]
print(json.dumps(out), flush=True)
sys.stdin.read()  # held open until the test has read /proc/PID/status
"""

# Raise one ambient capability before the sandbox, so that an empty ambient set is the privilege drop's doing.
_RAISE_AMBIENT = """
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)
_header = (ctypes.c_uint32 * 2)(0x20080522, 0)
_data = (ctypes.c_uint32 * 6)()
_libc.syscall(ctypes.c_long(125 if os.uname().machine == "x86_64" else 90), _header, _data)  # capget
_data[2], _data[5] = _data[1], _data[4]  # inheritable = permitted
_libc.syscall(ctypes.c_long(126 if os.uname().machine == "x86_64" else 91), _header, _data)  # capset
RAISED = _libc.prctl(47, 2, 0, 0, 0)  # PR_CAP_AMBIENT_RAISE CAP_CHOWN
"""


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, value in (line.split(":", 1) for line in lines)}


def test_the_privilege_drop_alone_empties_every_capability_set_and_locks_securebits(tmp_path):
    """Without a uid switch (the harness keeps uid 0), only the drop itself empties the sets of a root process."""
    held = int(_status(os.getpid())["CapEff"], 16)
    if not held & (1 << 8):  # CAP_SETPCAP: what the bounding set and securebits need
        pytest.skip("this test process holds no CAP_SETPCAP: it has no capabilities for a child to drop")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    prelude = PRELUDE.replace("cfg = json.loads", _RAISE_AMBIENT + "cfg = json.loads", 1)
    code = prelude + _HELD
    cfg = {"limits": {}, "scratch": str(scratch), "read_paths": worker_read_paths(), "allow_fds": [], "extra": {}}
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", code, json.dumps(cfg)],
        env={},
        cwd=scratch,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        out = json.loads(line)
        status = _status(child.pid)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(60)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert out["ambient_raised"] == 0  # so an empty ambient set below is the drop's doing
    assert out["report"]["privileges"] == "off"  # uid 0 kept: no switch to hide a capability left behind
    assert status["Uid"].split()[0] == "0"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert out["bounding"] == []
    # NOROOT and NO_CAP_AMBIENT_RAISE set, NO_SETUID_FIXUP and KEEP_CAPS off, all four locked: uid 0 never regains
    # a capability, a uid change clears them, and the process cannot change any of it back.
    assert out["securebits"] == 0b1110_1011
