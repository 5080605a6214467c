"""LocalStore specifics: atomic files, permissions, path safety and the store secret."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import stat
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Pool
from snapcell.errors import CheckpointNotFound, ConfigError, InvalidKey, ObjectExists, StorageError, StorageUnavailable
from snapcell.storage import LocalStore, open_store
from tests.dirsync import assert_made_durably, record_directory_syncs


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_layout_and_permissions(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("checkpoints/2024-01-01/abc", b"data")
    assert (tmp_path / "s/checkpoints/2024-01-01/abc").read_bytes() == b"data"
    assert _mode(tmp_path / "s/checkpoints/2024-01-01/abc") == 0o600
    assert _mode(tmp_path / "s/checkpoints/2024-01-01") & 0o077 == 0
    assert store.url == f"file://{tmp_path / 's'}"


def test_no_temp_file_left_after_refused_put(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("d/k", b"original")
    with pytest.raises(ObjectExists):
        store.put("d/k", b"other")
    assert _files(tmp_path) == ["d/k"]
    assert store.get("d/k") == b"original"
    store.put("d/k", b"new", overwrite=True)
    assert _files(tmp_path) == ["d/k"]


def test_no_temp_file_left_after_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path)

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(StorageError, match="I/O error"):
        store.put("d/k", b"x")
    monkeypatch.undo()
    assert _files(tmp_path) == []


def test_scan_skips_dot_and_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/k", b"x")
    (tmp_path / "a/.tmp-123abc").write_bytes(b"half")
    (tmp_path / ".snapcell-signing-key").write_bytes(b"k" * 32)
    (tmp_path / "bad name").write_bytes(b"not a key")
    assert [o.key for o in store.scan()] == ["a/k"]


def test_scan_of_missing_root_is_empty(tmp_path: Path) -> None:
    assert list(LocalStore(tmp_path / "never").scan()) == []


def test_created_at_is_mtime(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"x")
    os.utime(tmp_path / "k", (1_000_000.0, 1_000_000.0))
    assert [o.created_at for o in store.scan()] == [1_000_000.0]


def test_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("checkpoints/day1/a", b"x")
    store.put("checkpoints/day2/b", b"x")
    store.delete("checkpoints/day1/a")
    assert not (tmp_path / "s/checkpoints/day1").exists()
    assert (tmp_path / "s/checkpoints/day2/b").exists()
    store.put("checkpoints/day1/c", b"y")  # the directory comes back on demand
    assert store.get("checkpoints/day1/c") == b"y"


def test_symlinked_directory_out_of_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    store = LocalStore(root)
    with pytest.raises(StorageUnavailable, match="outside the store root"):
        store.put("link/k", b"x")
    assert list(outside.iterdir()) == []


def _put_as_nobody(root: Path) -> str:
    """In a forked child running as uid/gid 65534, put a key into ``root``; return what happened."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # 3.12+ warns about forking with threads; the child execs nothing
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome = "nothing raised"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            LocalStore(root).put("k", b"x")
        except StorageUnavailable as exc:
            outcome = f"unavailable: {exc}"
        except BaseException as exc:
            outcome = f"other: {type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        outcome = reader.read().decode()
    os.waitpid(pid, 0)
    return outcome


def test_permission_denied_is_unavailable(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "ro"
    root.mkdir(mode=0o555)
    if os.geteuid() != 0:
        with pytest.raises(StorageUnavailable):
            LocalStore(root).put("k", b"x")
        return
    # Root ignores file permissions: try as another user, who may enter the directory but not write to it.
    for directory in (tmp_path.parent, tmp_path, shared):
        directory.chmod(directory.stat().st_mode | 0o005)
    outcome = _put_as_nobody(root)
    if outcome.startswith("other: PermissionError: [Errno 1]"):  # pragma: no cover - setuid forbidden here
        pytest.skip(f"cannot switch to another user here: {outcome}")
    assert outcome.startswith("unavailable:") and "Permission denied" in outcome, outcome
    assert list(root.iterdir()) == []


@contextlib.contextmanager
def _mounted(*args: str) -> Iterator[None]:
    """Run ``mount *args`` and unmount afterwards; skip when this machine does not allow mounting."""
    target = args[-1]
    result = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        pytest.skip(f"mount is not permitted here ({result.stderr.strip() or result.returncode})")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True, timeout=60)


def _everything(root: Path) -> list[str]:
    """Every file under ``root``, dot-files (temporary files) included."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_full_disk_fails_the_put_cleanly_and_keeps_earlier_objects(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    with _mounted("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)):
        store = LocalStore(small / "store")
        first, second = os.urandom(600_000), os.urandom(600_000)
        store.put("checkpoints/a", first)
        store.put("checkpoints/b", second)
        with pytest.raises(StorageError) as info:
            store.put("checkpoints/c", os.urandom(1_500_000))
        error = info.value
        assert (
            error.errno == errno.ENOSPC and "No space left on device" in str(error) and "'checkpoints/c'" in str(error)
        )
        assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
        assert _everything(store.root) == ["checkpoints/a", "checkpoints/b"]  # no partial or temporary file
        assert store.get("checkpoints/a") == first and store.get("checkpoints/b") == second
        with pytest.raises(CheckpointNotFound):
            store.get("checkpoints/c")
        store.delete("checkpoints/a")  # room again: writes work
        store.put("checkpoints/c", b"c" * 1000)
        assert store.get("checkpoints/c") == b"c" * 1000


def test_a_read_only_store_reads_but_refuses_writes_clearly(tmp_path: Path) -> None:
    root = tmp_path / "store"
    LocalStore(root).put("checkpoints/a", b"kept")
    with _mounted("--bind", str(root), str(root)):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True, capture_output=True, timeout=60)
        store = LocalStore(root)
        assert store.get("checkpoints/a") == b"kept" and [o.key for o in store.scan()] == ["checkpoints/a"]
        for write in (lambda: store.put("checkpoints/b", b"new"), lambda: store.delete("checkpoints/a")):
            with pytest.raises(StorageUnavailable, match="read-only") as info:
                write()
            assert info.value.errno == errno.EROFS and isinstance(info.value.__cause__, OSError)
        assert _everything(root) == ["checkpoints/a"]


def test_open_store_local_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    absolute = open_store(f"file://{tmp_path}/abs", create=True)
    relative = open_store("file://rel/dir", create=True)
    plain = open_store("plain/dir", create=True)
    assert isinstance(absolute, LocalStore) and absolute.root == tmp_path / "abs"
    assert isinstance(relative, LocalStore) and relative.root == tmp_path / "rel/dir"
    assert isinstance(plain, LocalStore) and plain.root == tmp_path / "plain/dir"
    relative.put("k", b"v")
    assert (tmp_path / "rel/dir/k").read_bytes() == b"v"


@pytest.mark.parametrize(
    "url", ["memory", ".snapcell typo", "file://.snapcell typo", "{tmp}/no/such/store", "file://{tmp}/x"]
)
def test_a_local_store_that_does_not_exist_is_refused_unless_created(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = url.format(tmp=tmp_path)
    with pytest.raises(ConfigError, match="does not exist") as info:
        open_store(url)
    assert "create=True" in str(info.value)
    assert os.listdir(tmp_path) == []  # nothing was made on the way
    if url == "memory":
        assert "memory://" in str(info.value)  # the likely meaning
    created = open_store(url, create=True)
    assert isinstance(created, LocalStore) and created.root.is_dir()
    assert isinstance(open_store(url), LocalStore)  # it exists now


def test_a_file_where_the_store_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    for create in (False, True):
        with pytest.raises(ConfigError, match="not a directory"):
            open_store(f"file://{tmp_path}/f", create=create)


@pytest.mark.parametrize("url", ["file://~/store", "~/store", "file://~root/store"])
def test_a_home_directory_in_a_store_url_is_refused_not_expanded(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for create in (False, True):
        with pytest.raises(ConfigError, match="~") as info:
            open_store(url, create=create)
        assert "absolute path" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_pool_refuses_a_store_url_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Pool(f"file://{tmp_path}/typo", isolation="inline")
    assert not (tmp_path / "typo").exists()
    with Pool(f"file://{tmp_path}/new", isolation="inline", create_store=True) as pool:
        assert isinstance(pool.store, LocalStore) and pool.store.root == tmp_path / "new"


@pytest.mark.parametrize("url", ["ftp://x", "gs://bucket", "s3:bucket", "", "file://"])
def test_open_store_bad_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_store(url)


def test_open_store_options_must_fit_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not apply"):
        open_store(f"file://{tmp_path}", endpoint_url="http://x")
    with pytest.raises(ConfigError, match="does not apply"):
        open_store("memory://", region_name="eu-west-1")


def test_unknown_scheme_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("ftp://host/x")
    assert "s3://bucket/prefix" in str(info.value) and "memory://" in str(info.value)


def test_secret_is_created_once_with_owner_only_mode(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    first = store.secret()
    assert len(first) == 32
    assert store.secret() == first
    assert LocalStore(tmp_path / "s").secret() == first
    path = tmp_path / "s/.snapcell-signing-key"
    assert _mode(path) == 0o600
    assert store.secret("other", size=64) != first
    assert list(store.scan()) == []


@pytest.mark.parametrize("name", ["../x", "a/b", ".x", ""])
def test_secret_rejects_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        LocalStore(tmp_path).secret(name)


def _secret_in_child(root: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    barrier.wait()
    out.put(LocalStore(root).secret())


def test_secret_race_between_processes_gives_one_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        root = str(tmp_path / f"race{attempt}")
        barrier = ctx.Barrier(2)
        out = ctx.Queue()
        procs = [ctx.Process(target=_secret_in_child, args=(root, barrier, out)) for _ in range(2)]
        for p in procs:
            p.start()
        keys = [out.get(timeout=30), out.get(timeout=30)]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        out.close()
        out.join_thread()
        assert keys[0] == keys[1] == LocalStore(root).secret()
        assert [p.name for p in Path(root).iterdir()] == [".snapcell-signing-key"]


def test_key_validation_happens_before_any_path_is_built(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    with pytest.raises(InvalidKey):
        store.put("../escape", b"x")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "s").exists()


def test_permission_error_maps_to_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "link", denied)
    with pytest.raises(StorageUnavailable) as info:
        store.put("k", b"x")
    assert isinstance(info.value.__cause__, PermissionError)
    monkeypatch.undo()
    assert _files(tmp_path) == []


def _temp_file(directory: Path, name: str, age_s: float, now: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"partial")
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_reclaim_temp_files_deletes_only_old_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("checkpoints/2024-01-01/k", b"data")
    now = 1_700_000_000.0
    day = 86400.0
    crashed = _temp_file(store.root / "checkpoints/2024-01-01", ".tmp-00aa", 2 * day, now)
    crashed_root = _temp_file(store.root, ".tmp-11bb", day + 1, now)
    writing = _temp_file(store.root / "checkpoints/2024-01-01", ".tmp-22cc", 60, now)  # a write in progress
    secret = _temp_file(store.root, ".snapcell-other", 10 * day, now)  # not a temp file
    assert store.reclaim_temp_files(day, now=now, dry_run=True) == 2
    assert crashed.exists() and crashed_root.exists()
    assert store.reclaim_temp_files(day, now=now) == 2
    assert not crashed.exists() and not crashed_root.exists()
    assert writing.exists() and secret.exists()
    assert store.get("checkpoints/2024-01-01/k") == b"data"
    assert store.reclaim_temp_files(day, now=now) == 0


def test_reclaim_temp_files_on_a_missing_root(tmp_path: Path) -> None:
    assert LocalStore(tmp_path / "never-written").reclaim_temp_files(0.0) == 0


def test_cleanup_reclaims_temp_files_a_day_old(tmp_path: Path) -> None:
    from snapcell.ops import cleanup

    store = LocalStore(tmp_path / "s")
    now = 1_700_000_000.0
    old = _temp_file(store.root / "checkpoints", ".tmp-00aa", 86400.0 + 60, now)
    young = _temp_file(store.root / "checkpoints", ".tmp-11bb", 3600.0, now)
    report = cleanup(store, now=now, dry_run=True)
    assert report.deleted_temp_files == 1 and old.exists()
    report = cleanup(store, now=now)
    assert report.deleted_temp_files == 1
    assert "1 temporary files" in report.summary()
    assert not old.exists() and young.exists()
    assert report.scanned_objects == 0  # temp files were never objects


@pytest.mark.parametrize("url", ["file://\x00", "file://%00", "file:///a/b%00c"])
def test_open_store_refuses_nul_bytes(url: str) -> None:
    with pytest.raises(ConfigError, match="NUL byte"):
        open_store(url)


def test_a_symlinked_object_out_of_root_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the store's")
    root = tmp_path / "root"
    (root / "day").mkdir(parents=True)
    (root / "day" / "k").symlink_to(secret)
    store = LocalStore(root)
    with pytest.raises(StorageUnavailable, match="outside the store root"):
        store.get("day/k")
    with pytest.raises(StorageUnavailable, match="outside the store root"):
        store.put("day/k", b"x", overwrite=True)
    assert secret.read_bytes() == b"not the store's"


def test_a_symlink_that_stays_inside_the_root_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real")
    store = LocalStore(root)
    store.put("alias/k", b"x")
    assert (root / "real" / "k").read_bytes() == b"x"
    assert store.get("alias/k") == b"x"


def test_a_key_path_costs_one_lstat_per_component_and_no_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "deep" / "er" / "root")
    store.put("checkpoints/day/ab/k", b"x")
    lstats: list[str] = []
    real_lstat = os.lstat

    def counting_lstat(path: str, *args: object, **kwargs: object) -> os.stat_result:
        lstats.append(os.fspath(path))
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    def no_resolve(self: Path, strict: bool = False) -> Path:
        raise AssertionError(f"resolved {self}")

    monkeypatch.setattr(os, "lstat", counting_lstat)
    monkeypatch.setattr(Path, "resolve", no_resolve)
    assert store.get("checkpoints/day/ab/k") == b"x"
    # The key's four components, none of the root's: the root is not resolved again on every call.
    assert len(lstats) == 4 and all(p.startswith(str(store.root) + os.sep) for p in lstats)
    lstats.clear()
    with pytest.raises(CheckpointNotFound):
        store.get("checkpoints/other/ab/k")
    assert len(lstats) == 2  # the walk stops at the first component that does not exist


def test_a_put_into_an_existing_directory_makes_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path / "s")
    made: list[Path] = []
    real_mkdir = Path.mkdir

    def counting_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        made.append(self)
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", counting_mkdir)
    store.put("checkpoints/day/a", b"x")
    assert made[0] == tmp_path / "s" / "checkpoints" / "day"  # missing: made (with its parents)
    assert _mode(tmp_path / "s" / "checkpoints" / "day") == 0o700
    made.clear()
    store.put("checkpoints/day/b", b"y")
    assert made == []
    assert store.get("checkpoints/day/b") == b"y"


def test_a_directory_made_for_a_write_is_synced_into_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first checkpoint of a day makes its day's directory: that new entry is synced in its parent as well."""
    synced = record_directory_syncs(monkeypatch)
    store = LocalStore(tmp_path / "store")
    store.put("checkpoints/2026-12-06/abc", b"data")
    made = [tmp_path / "store", tmp_path / "store" / "checkpoints", tmp_path / "store" / "checkpoints" / "2026-12-06"]
    assert_made_durably(made, synced)
    assert made[-1] in synced  # and the file's own directory, as before
