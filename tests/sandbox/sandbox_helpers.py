"""Helpers of the sandbox tests: a fresh interpreter that applies the sandbox and prints what it could do."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

import snapcell
from snapcell.sandbox._sandbox import is_active, parse_required

# How long a test waits for a killed process to be gone before failing: a hang guard, far above the usual instant.
HANG_GUARD_S = 60.0

_MIB = 1024 * 1024

PRELUDE = """
import json, os, sys
from snapcell.limits import Limits
from snapcell.sandbox._sandbox import apply_sandbox

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


def kernel_landlock_abi() -> int:
    """The Landlock ABI as the kernel reports it to this (unsandboxed) test process; 0 without Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_..._VERSION
    return max(int(abi), 0)


def received(target: socket.socket) -> list[bytes]:
    """Every datagram queued at the non-blocking ``target`` (a unix datagram is queued before its send returns)."""
    got = []
    while True:
        try:
            got.append(target.recv(1000))
        except BlockingIOError:
            return got


def wait_gone(pid: int, timeout: float) -> bool:
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
