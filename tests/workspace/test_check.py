"""The host's checks of a worker's file list, and the worker-side restore, with hostile and broken input."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from snapcell.checkpoint import BlobRef, Manifest, WorkspaceFile
from snapcell.checkpoint._blobs import CHUNK_BYTES, encode_blob, hash_buffer
from snapcell.errors import CheckpointCorrupt, WorkspacePathError, WorkspaceQuotaExceeded
from snapcell.session._verify import ForgedFiles, check_files
from snapcell.workspace import check_path
from snapcell.workspace._local import Workspace


def _ref(data: bytes) -> BlobRef:
    return BlobRef(hash=hash_buffer(data).hex(), raw_bytes=len(data), stored_bytes=len(data) + 1, stamp=0.0)


def _manifest(files: list[WorkspaceFile], blobs: list[BlobRef]) -> Manifest:
    return Manifest(created_at=0.0, python="3", libraries={}, variables=[], blobs=blobs, files=files)


GOOD = b"hello"
GOOD_REF = _ref(GOOD)


def _file(path: str, size: int = len(GOOD), chunks: list[str] | None = None) -> WorkspaceFile:
    return WorkspaceFile(path=path, size_bytes=size, chunks=[GOOD_REF.hash] if chunks is None else chunks)


def test_a_good_list_passes_and_counts_its_bytes():
    manifest = _manifest([_file("a.txt"), _file("dir/b.txt")], [GOOD_REF])
    assert check_files(manifest, quota_bytes=100) == 2 * len(GOOD)


@pytest.mark.parametrize(
    "files",
    [
        [_file("../up.txt")],
        [_file("/abs.txt")],
        [_file("a//b.txt")],  # not normalized
        [_file("./a.txt")],
        [_file("a.txt"), _file("a.txt")],  # twice
        [_file("a"), _file("a/b")],  # a file and a directory at once
        [_file("a.txt", size=6)],  # size does not match the chunk
        [_file("a.txt", chunks=[])],
        [_file("a.txt", chunks=["0" * 32])],  # a chunk that is not a listed blob
        [_file("a.txt", chunks=[GOOD_REF.hash, GOOD_REF.hash])],
        [_file("data/x.csv")],  # inside a mount
    ],
)
def test_forged_lists_are_refused(files):
    with pytest.raises(ForgedFiles):
        check_files(_manifest(files, [GOOD_REF]), quota_bytes=None, mounts={"data"})


def test_a_list_over_the_quota_is_refused_with_the_quota_error():
    with pytest.raises(WorkspaceQuotaExceeded) as caught:
        check_files(_manifest([_file("a"), _file("b")], [GOOD_REF]), quota_bytes=len(GOOD) + 1)
    assert caught.value.used_bytes == 2 * len(GOOD)


def test_a_large_file_needs_full_chunks():
    big = WorkspaceFile(path="big", size_bytes=CHUNK_BYTES + 5, chunks=[GOOD_REF.hash, GOOD_REF.hash])
    with pytest.raises(ForgedFiles):
        check_files(_manifest([big], [GOOD_REF]), quota_bytes=None)


@pytest.mark.parametrize("path, normal", [("a/./b", "a/b"), ("a//b/", "a/b"), ("x", "x")])
def test_paths_are_normalized(path, normal):
    assert check_path(path) == normal


@pytest.mark.parametrize("path", ["..", "a/../..", "/", "", "a\x00", "x/" * 70, "é" * 200])
def test_bad_paths_are_refused(path):
    with pytest.raises(WorkspacePathError):
        check_path(path)


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "workspace"
    root.mkdir()
    return Workspace(str(root), staging=str(tmp_path / "staging"), quota_bytes=10_000)


def test_a_snapshot_restores_exactly_and_skips_what_is_not_a_regular_file(workspace, tmp_path):
    root = workspace.root
    os.makedirs(os.path.join(root, "d"))
    with open(os.path.join(root, "d", "f.txt"), "wb") as f:
        f.write(b"content")
    os.symlink("/etc/passwd", os.path.join(root, "link"))
    os.mkfifo(os.path.join(root, "pipe"))
    snap = workspace.snapshot(known={}, level=1, created_at=time.time())
    assert [f.path for f in snap.files] == ["d/f.txt"]
    assert sorted(snap.skipped) == ["link", "pipe"]
    workspace.clear()
    workspace.stage(snap.files, snap.new_blobs)
    workspace.commit_staging()
    assert os.listdir(root) == ["d"]
    with open(os.path.join(root, "d", "f.txt"), "rb") as f:
        assert f.read() == b"content"


def test_an_altered_chunk_leaves_the_workspace_untouched(workspace):
    with open(os.path.join(workspace.root, "keep.txt"), "wb") as f:
        f.write(b"old")
    entry = WorkspaceFile(path="new.txt", size_bytes=len(GOOD), chunks=[GOOD_REF.hash])
    forged = {GOOD_REF.hash: encode_blob(b"HELLO", 1)}
    with pytest.raises(CheckpointCorrupt):
        workspace.stage([entry], forged)
    with pytest.raises(CheckpointCorrupt):
        workspace.stage([entry], {})  # missing chunk
    assert not os.path.exists(workspace.staging)
    assert os.listdir(workspace.root) == ["keep.txt"]


def test_quota_and_symlinks_in_worker_side_writes(workspace, tmp_path):
    workspace.write("a.bin", b"x" * 9000)
    with pytest.raises(WorkspaceQuotaExceeded):
        workspace.write("b.bin", b"x" * 2000)
    workspace.write("a.bin", b"x" * 9500)  # replacing counts the old size out
    os.symlink(str(tmp_path), os.path.join(workspace.root, "out-link"))
    with pytest.raises(WorkspacePathError):
        workspace.write("out-link/escape.txt", b"x")
    with pytest.raises(WorkspacePathError):
        workspace.read("out-link/staging", max_bytes=None)
    assert not os.path.exists(tmp_path / "escape.txt")


def test_the_stale_scratch_sweep_spares_a_worker_still_setting_up():
    """A worker mounts its scratch as root and drops to its own uid a moment later: another pool's sweep in that
    moment used to unmount the fresh scratch, and the worker then built its workspace outside its quota."""
    from snapcell.sandbox import _privileges

    if os.geteuid() != 0:
        pytest.skip("the scratch tmpfs needs a root host")
    me = os.getpid()
    assert _privileges._worker_alive(me, _privileges.WORKER_UID_BASE + me)  # uid 0 now: setting up
    gone = _reaped_pid()
    assert not _privileges._worker_alive(gone, _privileges.WORKER_UID_BASE + gone)


def _reaped_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
