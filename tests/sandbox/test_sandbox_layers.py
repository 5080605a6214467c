"""A sandbox layer that fails to apply fails the worker start; one the machine lacks is reported, not skipped."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import snapcell
from snapcell.sandbox._sandbox import LAYERS, parse_required
from tests.sandbox.sandbox_helpers import (
    HANG_GUARD_S,
    require,
    wait_gone,
    worker_read_paths,
)

# ------------------------------------------------ broken layers fail, missing ones are reported

_BREAK = """
import errno, json, sys
from snapcell.errors import SandboxError
from snapcell.sandbox import _sandbox, _seccomp
from snapcell.limits import Limits

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
    from snapcell.sandbox._sandbox import sandbox_failure

    error = sandbox_failure(
        {"op": "sandbox_failed", "message": "sandbox layer seccomp ...", "layer": "seccomp", "errno": 22}
    )
    assert isinstance(error, snapcell.errors.SandboxError) and isinstance(error, snapcell.SessionError)
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
                # The worker's pid as the host sees it (in its pid namespace, os.getpid() is another number).
                found = session.feed_run("import os\\nint(os.readlink('/proc/self')), os.getcwd()")
                print(json.dumps(found), flush=True)
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
        host.wait(HANG_GUARD_S)
        assert wait_gone(pid, HANG_GUARD_S), "the worker outlived its host"
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
    from snapcell.sandbox import _privileges

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
