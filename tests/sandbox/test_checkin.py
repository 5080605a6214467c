"""A check-in ends once the worker's scratch is unreachable, without waiting for the kernel to tear the worker down."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Policy, Pool
from snapcell.sandbox._scratch import detach_scratch
from snapcell.worker import _workersetup
from tests import procs

_libc = ctypes.CDLL(None, use_errno=True)


def _mount_points() -> set[str]:
    with open("/proc/self/mounts") as mounts:
        return {line.split()[1].encode().decode("unicode_escape") for line in mounts}


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A tmpfs mounted on a fresh directory, and a descriptor held on its root (as a live worker's cwd is)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    point = tmp_path / "session-x"
    point.mkdir()
    if _libc.mount(b"snapcell-test", os.fsencode(point), b"tmpfs", 0, b"size=1m") != 0:
        pytest.skip(f"this kernel or container does not allow mounting a tmpfs: {os.strerror(ctypes.get_errno())}")
    fd = os.open(point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield point, fd
    finally:
        os.close(fd)
        if os.path.ismount(point):
            _libc.umount2(os.fsencode(point), 2)


def test_detach_makes_a_live_tmpfs_unreachable_at_once(tmpfs: tuple[Path, int]) -> None:
    point, fd = tmpfs
    os.close(os.open("before.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    assert (point / "before.txt").exists()
    assert detach_scratch(str(point)) is True
    assert not point.exists() and str(point) not in _mount_points()
    # The holder (a dying worker) may still write there: into the detached tmpfs, which no path leads to.
    os.close(os.open("after.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    assert sorted(os.listdir(fd)) == ["after.txt", "before.txt"]
    assert os.listdir(point.parent) == []


def test_a_plain_scratch_directory_is_left_until_its_worker_is_gone(tmp_path: Path) -> None:
    scratch = tmp_path / "session-y"
    scratch.mkdir()
    (scratch / "note.txt").write_text("x")
    assert detach_scratch(str(scratch)) is False
    assert (scratch / "note.txt").read_text() == "x"


def test_a_checked_in_workers_scratch_is_unreachable_for_the_next_session() -> None:
    with Pool("memory://", isolation="process", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
        with pool.checkout() as first:
            # The worker's pid as the host sees it (in its pid namespace, os.getpid() is another number).
            cwd, pid = first.feed_run(
                "import os\nopen('secret.txt', 'w').write('x')\nos.getcwd(), int(os.readlink('/proc/self'))"
            )
            scratch = Path(cwd).parent
        assert not os.path.exists(cwd) and not scratch.exists()
        assert not any(point == str(scratch) or point.startswith(f"{scratch}/") for point in _mount_points())
        with pool.checkout() as second:
            # Landlock does not stop a lookup: were the directory there, the next session would see it exists.
            seen = second.feed_run(
                f"import os\nos.path.exists({str(scratch)!r}), os.path.exists({cwd + '/secret.txt'!r})"
            )
        assert seen == (False, False)
    # The pool waited for the workers it did not wait for at check-in.
    assert not procs.alive(pid)


def test_read_only_paths_are_computed_once_per_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    calls: list[int] = []
    real = sysconfig.get_paths

    def counted(*args: object, **kwargs: object) -> dict[str, str]:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sysconfig, "get_paths", counted)
    monkeypatch.setattr(_workersetup, "_READ_PATHS", {})
    first = _workersetup._read_paths()
    assert _workersetup._read_paths() == first and len(calls) == 1
    monkeypatch.setattr(sys, "path", [*sys.path, "/nonexistent-snapcell-path"])
    assert _workersetup._read_paths() == first and len(calls) == 2


def test_detach_asks_the_kernel_once_and_stats_nothing(
    tmpfs: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    point, _ = tmpfs
    stats: list[object] = []
    real_lstat, real_stat = os.lstat, os.stat

    def counting_lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(path)
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(path)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", counting_lstat)
    monkeypatch.setattr(os, "stat", counting_stat)
    assert detach_scratch(str(point)) is True
    assert stats == []  # the umount itself says whether it was a mount
    assert not point.exists() and str(point) not in _mount_points()


def test_detach_does_not_follow_a_symlink_to_a_mount(tmpfs: tuple[Path, int], tmp_path: Path) -> None:
    point, _ = tmpfs
    link = tmp_path / "session-link"
    link.symlink_to(point)
    assert detach_scratch(str(link)) is False
    assert str(point) in _mount_points() and link.is_symlink()
