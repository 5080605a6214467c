"""The workspace: files persist with the checkpoint, as blobs stored once; paths are checked; quota; mounts.

Process mode only (inline mode has no workspace, tested at the end). One pool serves most tests.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import snapcell
from snapcell import Limits, PolicyError, Pool
from snapcell.checkpoint import BLOB_PREFIX
from snapcell.errors import WorkspaceError, WorkspacePathError, WorkspaceQuotaExceeded
from snapcell.storage import MemoryStore

MIB = 1024 * 1024


class CountingStore(MemoryStore):
    """A memory store that counts the bytes written under the blob prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.blob_bytes = 0
        self.blob_puts = 0

    def put(self, key: str, data: bytes, **kwargs: object) -> None:  # type: ignore[override]
        super().put(key, data, **kwargs)  # type: ignore[arg-type]
        if key.startswith(BLOB_PREFIX):
            self.blob_bytes += len(data)
            self.blob_puts += 1


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool("memory://", isolation="process", min_warm_workers=0) as pool:
        yield pool


def test_a_csv_written_in_turn_1_is_read_in_turn_2_in_another_process(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    turn = textwrap.dedent(
        """
        import json, sys, snapcell
        with snapcell.Pool(sys.argv[1], min_warm_workers=0, create_store=True) as pool, pool.checkout() as session:
            if sys.argv[2]:
                session.load_session(bytes.fromhex(sys.argv[2]))
            value = session.feed_run(sys.argv[3])
            print(json.dumps([value, session.dump().hex()]))
        """
    )
    write = (
        "import csv\nwith open('sales.csv', 'w', newline='') as f:\n    csv.writer(f).writerows([['x', 'y'], [1, 2]])"
    )
    read = "import csv\nwith open('sales.csv', newline='') as f:\n    rows = list(csv.reader(f))\nrows"

    def in_process(code: str, previous: str) -> tuple[object, str]:
        done = subprocess.run(
            [sys.executable, "-c", turn, store, previous, code], capture_output=True, text=True, timeout=120, check=True
        )
        value, checkpoint = json.loads(done.stdout.splitlines()[-1])
        return value, checkpoint

    _, first = in_process(write, "")
    value, _ = in_process(read, first)
    assert value == [["x", "y"], ["1", "2"]]


def test_a_matplotlib_chart_comes_back_as_an_artifact_and_in_the_tool_answer():
    pytest.importorskip("matplotlib")  # in the test extra; only a trimmed install lacks it
    policy = snapcell.Policy().with_modules(["matplotlib"])
    code = (
        "import matplotlib.pyplot as plt\nimport pathlib\npathlib.Path('out').mkdir(exist_ok=True)\n"
        "fig, ax = plt.subplots()\nax.plot([1, 2, 3], [3, 1, 2])\nfig.savefig('out/chart.png')\n"
        "pathlib.Path('notes.txt').write_text('not an artifact')"
    )
    with Pool("memory://", isolation="process", policy=policy, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            result = session.run(code)
            assert result.error is None, result.error.for_model()
            (chart,) = result.files
            assert chart.path == "out/chart.png" and chart.media_type == "image/png"
            assert chart.data is not None and chart.data.startswith(b"\x89PNG\r\n\x1a\n")
            assert len(chart.data) == chart.size_bytes
            # A run that writes nothing under out/ returns no artifacts (the chart is old now).
            assert session.run("1").files == ()
        tool = snapcell.SyncCodeTool(pool)
        try:
            answer = tool.run_code("chart-conv", code.replace("chart.png", "plot.png"))
            assert "[files] out/plot.png (image/png" in answer
        finally:
            tool.close()


def test_artifacts_over_the_cap_come_back_without_their_bytes():
    limits = Limits(max_artifact_bytes=1000)
    with Pool("memory://", isolation="process", limits=limits, min_warm_workers=0) as pool, pool.checkout() as s:
        result = s.run(
            "import pathlib\npathlib.Path('out').mkdir()\npathlib.Path('out/small.txt').write_text('a' * 600)\n"
            "pathlib.Path('out/big.json').write_text('b' * 5000)"
        )
        by_path = {f.path: f for f in result.files}
        assert by_path["out/small.txt"].data == b"a" * 600
        assert by_path["out/big.json"].data is None and by_path["out/big.json"].size_bytes == 5000
        assert s.read_file("out/big.json") == b"b" * 5000


def test_a_100_mb_file_unchanged_for_five_turns_is_stored_once():
    store = CountingStore()
    with Pool(store, isolation="process", min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.run("import random\nwith open('big.bin', 'wb') as f:\n    f.write(random.randbytes(100 * 2**20))")
            checkpoint = session.dump()
        first = store.blob_bytes
        assert first >= 100 * MIB  # random bytes do not compress
        for turn in range(4):
            with pool.checkout() as session:
                session.load_session(checkpoint)
                assert session.feed_run(f"import pathlib\nt = {turn}\npathlib.Path('big.bin').stat().st_size") == (
                    100 * MIB
                )
                checkpoint = session.dump()
        assert store.blob_bytes == first, "an unchanged file was stored again"
        with pool.checkout() as session:
            session.load_session(checkpoint)
            assert [(f.path, f.size_bytes) for f in session.list_files()] == [("big.bin", 100 * MIB)]


def test_forks_do_not_see_each_others_files(pool):
    tool = snapcell.CodeTool(pool.aio)
    try:
        pool.call(tool.run_code("base", "open('shared.txt', 'w').write('base')"))
        pool.call(tool.fork("base", "branch"))
        pool.call(tool.run_code("branch", "open('shared.txt', 'w').write('branch')\nopen('only-branch.txt', 'w')"))
        pool.call(tool.put_file("base", "only-base.txt", b"mine"))
        assert pool.call(tool.get_file("base", "shared.txt")) == b"base"
        assert pool.call(tool.get_file("branch", "shared.txt")) == b"branch"
        assert [f.path for f in pool.call(tool.list_files("base"))] == ["only-base.txt", "shared.txt"]
        assert [f.path for f in pool.call(tool.list_files("branch"))] == ["only-branch.txt", "shared.txt"]
        # put_file is a turn: rewinding undoes it.
        pool.call(tool.rewind("base"))
        assert [f.path for f in pool.call(tool.list_files("base"))] == ["shared.txt"]
    finally:
        pool.call(tool.aclose())


def test_put_file_with_a_committed_turn_id_does_not_write_again(pool):
    tool = snapcell.CodeTool(pool.aio)
    try:
        first = pool.call(tool.put_file("idem", "a.txt", b"one", turn_id="t-1"))
        again = pool.call(tool.put_file("idem", "a.txt", b"two", turn_id="t-1"))
        assert again == first
        assert pool.call(tool.get_file("idem", "a.txt")) == b"one"
        assert "open('a.txt').read()" and "one" in pool.call(tool.run_code("idem", "open('a.txt').read()"))
    finally:
        pool.call(tool.aclose())


def test_host_writes_reads_and_lists_files(pool):
    with pool.checkout() as session:
        session.write_file("in/data.csv", b"a,b\n1,2\n")
        assert session.feed_run("open('in/data.csv').read()") == "a,b\n1,2\n"
        session.run("import pathlib\npathlib.Path('in/data.csv').unlink()\nopen('result.txt', 'w').write('ok')")
        assert [(f.path, f.size_bytes, f.media_type) for f in session.list_files()] == [("result.txt", 2, "text/plain")]
        with pytest.raises(WorkspaceError, match="no file"):
            session.read_file("in/data.csv")
        checkpoint = session.dump()
    with pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.read_file("result.txt") == b"ok"
        assert session.manifest is not None and [f.path for f in session.manifest.files] == ["result.txt"]


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "", "a\x00b"])
def test_escaping_paths_are_refused(pool, path):
    with pool.checkout() as session:
        with pytest.raises(WorkspacePathError):
            session.write_file(path, b"x")
        with pytest.raises(WorkspacePathError):
            session.read_file(path)
        assert session.list_files() == []


def test_symlinks_are_not_followed_by_the_host_api_nor_saved(pool, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    with pool.checkout() as session:
        result = session.run(
            "import pathlib\n"
            f"pathlib.Path('to-secret').symlink_to({str(secret)!r})\n"
            f"pathlib.Path('to-dir').symlink_to({str(tmp_path)!r})\n"
            "open('real.txt', 'w').write('mine')"
        )
        assert result.error is None, result.error.for_model()
        for path in ("to-secret", "to-dir/secret.txt"):
            with pytest.raises(WorkspacePathError):
                session.read_file(path)
        with pytest.raises(WorkspacePathError):
            session.write_file("to-dir/planted.txt", b"x")
        assert not (tmp_path / "planted.txt").exists()
        # The script cannot read through it either: Landlock allows only the workspace and the Python install.
        failed = session.run("open('to-secret').read()")
        assert failed.error is not None and failed.error.exc_type == "PermissionError"
        assert [f.path for f in session.list_files()] == ["real.txt"]
        checkpoint = session.dump()
        assert [f.path for f in session.manifest.files] == ["real.txt"]
        assert "not saved: to-dir, to-secret" in " ".join(session.run("1").notes)
    with pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("import pathlib\nsorted(p.name for p in pathlib.Path('.').iterdir())") == ["real.txt"]


def test_quota_exceeded_is_a_clear_error_and_earlier_files_are_kept():
    limits = Limits(workspace_bytes=1 * MIB)
    with Pool("memory://", isolation="process", limits=limits, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.run("open('keep.txt', 'w').write('k' * 1000)")
            saved = session.dump()
            session.run("open('huge.bin', 'wb').write(b'x' * (2 * 2**20))")
            with pytest.raises(WorkspaceQuotaExceeded) as caught:
                session.dump()
            assert caught.value.limit == "workspace_bytes" and caught.value.value == MIB
            assert caught.value.used_bytes == 2 * MIB + 1000
            assert "Delete or shrink files" in str(caught.value)
            assert session.checkpoint_id == saved  # nothing new was stored
            with pytest.raises(WorkspaceQuotaExceeded):
                session.write_file("another.bin", b"y" * (2 * MIB))
            # The session goes on with its files; once under the quota it saves again.
            assert session.feed_run("import pathlib\npathlib.Path('huge.bin').unlink()\nopen('keep.txt').read(3)") == (
                "kkk"
            )
            assert session.dump() != saved
        with pool.checkout() as session:
            session.load_session(saved)
            assert [f.path for f in session.list_files()] == ["keep.txt"]
        tool = snapcell.SyncCodeTool(pool)
        try:
            tool.run_code("q", "open('keep.txt', 'w').write('1')")
            answer = tool.run_code("q", "open('huge.bin', 'wb').write(b'x' * (2 * 2**20))")
            assert "quota" in answer and "not saved" in answer
            assert [f.path for f in tool.list_files("q")] == ["keep.txt"]
        finally:
            tool.close()


def test_a_mount_is_readable_and_never_writable_nor_saved(tmp_path):
    data = tmp_path / "datasets"
    data.mkdir()
    (data / "prices.csv").write_text("item,price\ntea,3\n")
    with Pool("memory://", isolation="process", min_warm_workers=0) as pool:
        with pool.checkout(mounts={"data": str(data)}) as session:
            assert session.feed_run("open('data/prices.csv').read()") == "item,price\ntea,3\n"
            assert session.read_file("data/prices.csv") == b"item,price\ntea,3\n"
            for attempt in (
                "open('data/new.csv', 'w').write('x')",
                "open('data/prices.csv', 'a').write('x')",
                "import pathlib\npathlib.Path('data/prices.csv').unlink()",
            ):
                result = session.run(attempt)
                assert result.error is not None and result.error.exc_type in ("PermissionError", "OSError"), attempt
                assert "Errno" in result.error.exc_message
            assert sorted(p.name for p in data.iterdir()) == ["prices.csv"]
            assert (data / "prices.csv").read_text() == "item,price\ntea,3\n"
            with pytest.raises(WorkspacePathError, match="read-only mount"):
                session.write_file("data/new.csv", b"x")
            session.run("open('mine.txt', 'w').write('1')")
            session.dump()
            assert [f.path for f in session.manifest.files] == ["mine.txt"]
            assert [f.path for f in session.list_files()] == ["mine.txt"]
            assert "workspace" in pool.isolation_report()
        with pytest.raises(snapcell.ConfigError):
            with pool.checkout(mounts={"data": str(tmp_path / "missing")}):
                pass
        with pytest.raises(snapcell.ConfigError):
            with pool.checkout(mounts={"../up": str(data)}):
                pass


def test_write_errno_of_a_mount_is_erofs_or_eacces(tmp_path):
    # The bind mount is read-only in the kernel (EROFS) for a root host; elsewhere Landlock refuses (EACCES).
    data = tmp_path / "d"
    data.mkdir()
    with Pool("memory://", isolation="process", min_warm_workers=0) as pool:
        with pool.checkout(mounts={"d": str(data)}) as session:
            code = "try:\n    open('d/x', 'w')\nexcept OSError as e:\n    n = e.errno\nn"
            assert session.feed_run(code) in (errno.EROFS, errno.EACCES)


def test_inline_mode_has_no_file_access():
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        result = session.run("open('x.txt', 'w')")
        assert isinstance(result.error, PolicyError) and "inline mode" in result.error.for_model()
        assert isinstance(session.run("import pathlib").error, PolicyError)
        with pytest.raises(WorkspaceError, match="inline mode has no workspace"):
            session.write_file("x.txt", b"x")
        with pytest.raises(WorkspaceError, match="inline mode"):
            session.list_files()
        with pytest.raises(snapcell.ConfigError, match="process"):
            with pool.checkout(mounts={"data": "/"}):
                pass


def test_open_takes_paths_only(pool):
    with pool.checkout() as session:
        result = session.run("open(0)")
        assert isinstance(result.error, PolicyError)
        assert session.run("f = open('x.txt', 'w')\nf.write('1')\nf.close()").error is None


def test_a_file_that_does_not_fit_the_scratch_fails_in_the_script_and_keeps_the_session():
    limits = Limits(max_scratch_bytes=2 * MIB, max_file_bytes=None)
    with Pool("memory://", isolation="process", limits=limits, min_warm_workers=0) as pool, pool.checkout() as s:
        s.run("open('small.txt', 'w').write('ok')")
        result = s.run("open('big.bin', 'wb').write(b'x' * (4 * 2**20))")
        if os.geteuid() == 0:  # the scratch tmpfs needs a root host
            assert result.error is not None and "No space left" in result.error.exc_message
        s.run("import pathlib\npathlib.Path('big.bin').unlink(missing_ok=True)")
        s.dump()
        assert [f.path for f in s.list_files()] == ["small.txt"]


def test_restored_files_replace_the_workspace_files(pool):
    with pool.checkout() as session:
        session.write_file("a.txt", b"1")
        first = session.dump()
        session.write_file("b.txt", b"2")
        session.load_session(first)
        assert [f.path for f in session.list_files()] == ["a.txt"]


def test_a_path_of_the_worker_cannot_be_used_after_checkin(pool):
    with pool.checkout() as session:
        workspace = Path(session.feed_run("import pathlib\nstr(pathlib.Path('.').resolve())"))
        session.write_file("x.txt", b"1")
    assert not (workspace / "x.txt").exists()


FORGE = """
import sys
local = sys.modules['snapcell.workspace._local']
original = local.Workspace.snapshot
def forged(self, **options):
    snap = original(self, **options)
    snap.files = [f.model_copy(update={{'path': {path!r}}}) for f in snap.files]
    return snap
local.Workspace.snapshot = forged
"""


@pytest.mark.parametrize("path", ["../../escape.txt", "/etc/cron.d/x", "data/in-the-mount.txt"])
def test_a_worker_that_lies_about_its_files_is_replaced_and_nothing_is_stored(tmp_path, path):
    """A script past the guard (here: an unrestricted policy) rewrites the worker's file list before the dump."""
    store = CountingStore()
    data = tmp_path / "mounted"
    data.mkdir()
    policy = snapcell.Policy.unrestricted()
    with Pool(store, isolation="process", policy=policy, min_warm_workers=0) as pool:
        with pool.checkout(mounts={"data": str(data)}) as session:
            session.run("open('honest.txt', 'w').write('1')")
            saved = session.dump()
            keys = {info.key for info in store.scan()}
            assert session.run(FORGE.format(path=path)).error is None
            with pytest.raises(snapcell.WorkerLost):
                session.dump()
            assert {info.key for info in store.scan()} == keys  # nothing new stored, nothing signed
            assert session.checkpoint_id == saved
            assert [f.path for f in session.list_files()] == ["honest.txt"]  # restored from the checkpoint


def test_a_worker_that_hides_its_quota_still_meets_the_hosts(tmp_path):
    policy = snapcell.Policy.unrestricted()
    limits = Limits(workspace_bytes=MIB)
    with Pool("memory://", isolation="process", policy=policy, limits=limits, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.run(
                "import sys\nsys.modules['snapcell.workspace._local'].Workspace._check_quota = lambda s, u: None"
            )
            session.run("open('big.bin', 'wb').write(b'x' * (2 * 2**20))")
            with pytest.raises(WorkspaceQuotaExceeded):
                session.dump()


def test_inspect_lists_the_files_and_cleanup_and_usage_count_their_blobs(tmp_path):
    from snapcell.checkpoint import blob_keys_of
    from snapcell.ops import cleanup, inspect_checkpoint, usage
    from snapcell.storage import LocalStore

    store = LocalStore(tmp_path / "store")
    with Pool(store, isolation="process", min_warm_workers=0) as pool, pool.checkout() as session:
        session.write_file("reports/q3.csv", b"r" * (3 * MIB))
        kept = session.dump()
        session.run("import pathlib\npathlib.Path('reports/q3.csv').unlink()")
        session.dump()
    report = inspect_checkpoint(kept, store=store)
    assert report.ok and report.manifest is not None
    assert [(f.path, f.size_bytes) for f in report.manifest.files] == [("reports/q3.csv", 3 * MIB)]
    assert "workspace files (1, 3.0 MiB" in report.render() and "reports/q3.csv" in report.render()
    blob_keys = [info.key for info in store.scan() if info.key.startswith(BLOB_PREFIX)]
    assert blob_keys  # the file's chunk
    counted = usage(store, prefix="")
    assert counted.total_bytes >= sum(info.size for info in store.scan() if info.key.startswith(BLOB_PREFIX))
    # Mark and sweep long after the blob grace: the file's blob lives while a checkpoint refers to it ...
    later = max(info.created_at for info in store.scan()) + 3 * 86400
    cleanup(store, now=later, ttl_s=30 * 86400, blob_refs=blob_keys_of)
    assert all(any(i.key == key for i in store.scan()) for key in blob_keys)
    # ... and goes once the checkpoints that referred to it have expired.
    cleanup(store, now=later + 60 * 86400, ttl_s=30 * 86400, blob_refs=blob_keys_of)
    assert not [info.key for info in store.scan() if info.key.startswith(BLOB_PREFIX)]


def test_a_reused_worker_starts_the_next_session_without_files():
    with Pool("memory://", isolation="process", recycle_after=2, min_warm_workers=0) as pool:
        with pool.checkout() as first:
            first.run("open('private.txt', 'w').write('a')")
            first.write_file("out/x.txt", b"1")
            pid = first._inner._backend.worker.pid
        with pool.checkout() as second:
            assert second._inner._backend.worker.pid == pid  # the same interpreter, reset
            assert second.list_files() == []
            assert second.run("open('private.txt')").error.exc_type == "FileNotFoundError"


def test_reset_forgets_the_files_too(pool):
    with pool.checkout() as session:
        session.write_file("a.txt", b"1")
        session.reset()
        assert session.list_files() == []


@pytest.mark.parametrize(
    "files, blob",
    [
        ([{"path": "../x", "size": 1, "media_type": "text/plain", "data_bytes": 1}], b"x"),
        ([{"path": "notout/x", "size": 1, "media_type": "text/plain", "data_bytes": 1}], b"x"),
        ([{"path": "out/x", "size": 1, "media_type": "text/plain", "data_bytes": 2}], b"xx"),  # more than its size
        ([{"path": "out/x", "size": 5, "media_type": "text/plain", "data_bytes": 1}], b"xx"),  # bytes left over
        ([{"path": "out/x", "size": 5, "media_type": "text/plain"}], b""),
        ("not a list", b""),
        ([{"path": "out/x", "size": 1, "media_type": "t", "data_bytes": 1}] * 300, b"x" * 300),
    ],
)
def test_forged_artifact_descriptions_are_refused(files, blob):
    from snapcell.backends._procbackend import _artifacts

    with pytest.raises(ValueError):  # MalformedMessage and WorkspacePathError are ValueErrors: the worker goes
        _artifacts({"files": files}, Limits(), bytearray(blob))


def test_pandas_writes_and_reads_csv_in_the_workspace():
    pytest.importorskip("pandas")
    policy = snapcell.Policy().with_modules(["pandas", "numpy"])
    with Pool("memory://", isolation="process", policy=policy, min_warm_workers=0) as pool:
        with pool.checkout() as session:
            session.run(
                "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']}).to_csv('t.csv', index=False)"
            )
            checkpoint = session.dump()
        with pool.checkout() as session:
            session.load_session(checkpoint)
            assert session.feed_run("import pandas as pd\npd.read_csv('t.csv')['b'].tolist()") == ["x", "y"]
