"""What the host does per worker start is bounded: settings are converted once per (policy, limits), not per worker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from snapcell import Limits, Policy, Pool
from snapcell.backends import _process, _procstat
from snapcell.sandbox import _privileges, _sandbox


def test_settings_are_converted_once_per_policy_and_limits_not_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[Policy] = []
    real = _process.policy_to_plain

    def counting(policy: Policy) -> dict[str, Any]:
        converted.append(policy)
        return real(policy)

    monkeypatch.setattr(_process, "policy_to_plain", counting)
    _process.plain_settings.cache_clear()
    limits = Limits(wall_time_s=7)
    with Pool("memory://", isolation="process", max_workers=1, limits=limits) as pool:
        for n in range(3):  # every checkout gets a fresh worker (recycle_after=1), and each is set up
            with pool.checkout() as session:
                assert session.feed_run(f"{n} + 1") == n + 1
        assert len(converted) == 1
        with pool.checkout(policy=Policy(extra_modules=frozenset({"decimal"})), limits=limits) as session:
            assert session.feed_run("import decimal; 2") == 2
        assert len(converted) == 2  # another policy is converted once too
    policy, plain_limits = _process.plain_settings(Policy(), limits)
    assert plain_limits["wall_time_s"] == 7 and "json" in policy["allowed_modules"]


def test_the_uid_map_is_read_once_it_is_written(tmp_path: Path) -> None:
    uid_map = tmp_path / "uid_map"
    uid_map.write_text("")  # a namespace whose map is not written yet: read again next time
    assert not _privileges._uid_mapped(65534, str(uid_map))
    uid_map.write_text("         0     100000      65536\n")
    assert _privileges._uid_mapped(65534, str(uid_map))
    # The kernel lets a map be written only once; a change here could only be a second read.
    uid_map.write_text("         0     100000          1\n")
    assert _privileges._uid_mapped(65534, str(uid_map))
    assert not _privileges._uid_mapped(_privileges.WORKER_UID_BASE + 5, str(uid_map))


def test_the_parent_of_a_process_whose_name_holds_parentheses_and_numbers(tmp_path: Path) -> None:
    # A worker cannot rename itself before the check, but a name like this one would fool a naive split of /proc/stat.
    odd = tmp_path / "w) S 1 (x"
    odd.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(odd), "30"])
    try:
        with open(f"/proc/{child.pid}/stat", "rb") as stat:
            assert b"(w) S 1 (x)" in stat.read()
        assert _procstat.parent_of(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert _procstat.parent_of(child.pid) == 0  # gone: unknown


def test_stale_mounts_are_swept_every_few_worker_starts_not_on_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root host sweeps scratch mounts (an unprivileged one has none)")
    sweeps: list[None] = []
    monkeypatch.setattr(_sandbox, "sweep_stale_scratch", lambda: sweeps.append(None))
    monkeypatch.setattr(_sandbox, "_STARTS_UNSWEPT", 0)
    every = _sandbox.SWEEP_EVERY_STARTS
    for n in range(2 * every + 1):
        settings = _sandbox.worker_sandbox_settings(1000 + n, str(tmp_path))
        assert settings["quota_scratch"] is True and settings["uid"] is not None
    assert len(sweeps) == 3  # the first start, then one in every SWEEP_EVERY_STARTS
    assert 1 < every <= 64
