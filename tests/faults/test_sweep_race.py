"""The sweep of stale scratch mounts spares a worker that mounted its tmpfs and has not yet dropped root.

A worker mounts its scratch tmpfs (as root, with ``uid=WORKER_UID_BASE + pid``) and only then switches to that uid.
Every pool start on the machine (and every few worker starts) sweeps stale mounts; a sweep in between used to take
the starting worker for a dead one (its uid was not yet the mount's) and unmount its scratch, so the worker then
failed with "Permission denied" on its own workspace. The kill suite starts many pools at once on a shared machine
and hit it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from snapcell.sandbox import _privileges
from snapcell.sandbox._privileges import WORKER_UID_BASE, sweep_stale_scratch


def test_a_sweep_spares_a_live_worker_that_still_runs_as_the_host_and_sweeps_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starting = os.getpid()  # alive, and running as the host's own uid: a worker between its mount and its switch
    gone = 999_999_999  # beyond any pid_max: a worker that is gone
    mounts = tmp_path / "mounts"
    mounts.write_text(
        f"snapcell-scratch /scratch/starting tmpfs rw,nosuid,uid={WORKER_UID_BASE + starting},gid=65534 0 0\n"
        f"snapcell-scratch /scratch/gone tmpfs rw,nosuid,uid={WORKER_UID_BASE + gone},gid=65534 0 0\n"
        "tmpfs /tmp tmpfs rw,nosuid 0 0\n"
    )
    unmounted: list[bytes] = []

    def umount2(path: bytes, flags: object) -> int:
        unmounted.append(path)
        return 0

    monkeypatch.setattr(_privileges._libc, "umount2", umount2)
    assert sweep_stale_scratch(str(mounts)) == ["/scratch/gone"]
    assert unmounted == [b"/scratch/gone"]
