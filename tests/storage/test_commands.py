"""The storage CLI commands, through `add_commands` on a parser built here."""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import time
from pathlib import Path

import pytest

from snapcell.cli._storage import _Progress, add_commands, parse_duration, parse_size
from snapcell.errors import ConfigError
from snapcell.storage import LocalStore, S3Config, S3Store

DAY = 86400.0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snapcell")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def run(*argv: str) -> int:
    args = make_parser().parse_args(list(argv))
    code = args.func(args)
    assert isinstance(code, int)
    return code


def age(root: Path, key: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(root / key, (t, t))


@pytest.fixture
def local(tmp_path: Path) -> tuple[Path, LocalStore]:
    store = LocalStore(tmp_path / "store")
    for i, days in enumerate([10, 9, 3, 2, 0]):
        key = f"checkpoints/k{i}"
        store.put(key, b"x" * 100)
        age(store.root, key, days * DAY + (0 if days else 60))
    return store.root, store


def test_cleanup_json(local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]) -> None:
    root, store = local
    assert run("cleanup", f"file://{root}", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted_expired_objects"] == 2
    assert report["kept_objects"] == 3
    assert [o.key for o in store.scan()] == ["checkpoints/k2", "checkpoints/k3", "checkpoints/k4"]


def test_cleanup_dry_run_text(local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]) -> None:
    root, store = local
    assert run("cleanup", str(root), "--dry-run", "--ttl", "1d") == 0
    out = capsys.readouterr().out
    assert "would delete 4 expired" in out
    assert len(list(store.scan())) == 5


def test_cleanup_over_quota_exits_non_zero(local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]) -> None:
    root, store = local
    code = run("cleanup", str(root), "--quota", "150", "--keep", "checkpoints/k2", "--keep", "checkpoints/k3", "--json")
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["over_quota"] is True
    assert report["quota_bytes"] == 150
    # k4 is younger than the 1 h grace period; k2 and k3 are kept.
    assert [o.key for o in store.scan()] == ["checkpoints/k2", "checkpoints/k3", "checkpoints/k4"]


def test_cleanup_quota_and_grace(local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]) -> None:
    root, store = local
    assert run("cleanup", str(root), "--quota", "0.1KB", "--grace", "30s", "--json") == 2  # below the floor
    assert "below the 600 s floor" in capsys.readouterr().err and len(list(store.scan())) == 5
    assert run("cleanup", str(root), "--quota", "0.1KB", "--grace", "30s", "--json", "--force") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted_quota_objects"] == 2
    assert [o.key for o in store.scan()] == ["checkpoints/k4"]


def test_usage_text_and_json(local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = local
    assert run("usage", str(root)) == 0
    out = capsys.readouterr().out
    assert "total" in out and "500 B" in out
    assert run("usage", str(root), "--json", "--ttl", "3.5d") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_objects"] == 5
    assert data["expired_objects"] == 2  # 10 and 9 days old
    assert data["expiring_24h_objects"] == 1  # 3 days old: expires in half a day


def test_bad_store_url_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("cleanup", "ftp://nowhere") == 2
    assert "unknown store scheme" in capsys.readouterr().err
    assert run("usage", "gs://bucket") == 2


def test_storage_error_exit_code(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert run("usage", "s3://bucket/p", "--endpoint-url", closed) == 3
    assert "check the endpoint URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cleanup", "x", "--ttl", "7x"], "invalid duration '7x'"),
        (["cleanup", "x", "--grace", "soon"], "invalid duration 'soon'"),
        (["cleanup", "x", "--quota", "10 parsecs"], "invalid size '10 parsecs'"),
        (["usage", "x", "--ttl=-1d"], "invalid duration '-1d'"),
        (["s3", "setup"], "STORE_URL"),
    ],
)
def test_argument_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        make_parser().parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1w", 604800), ("45", 45), ("1.5h", 5400)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10GiB", 10 * 1024**3),
        ("500MB", 500_000_000),
        ("1024", 1024),
        ("2KiB", 2048),
        ("1.5kb", 1500),
        ("3 TB", 3 * 10**12),
        ("7B", 7),
        ("1g", 10**9),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "10XB", "-5", "1e3", "GiB"])
def test_parse_size_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(("text", "size"), [("1EiB", 2**60), ("2 PiB", 2 * 2**50), ("2Gi", 2 * 1024**3), (" 7 ", 7)])
def test_parse_size_takes_every_unit_of_pydantics_byte_size(text: str, size: int) -> None:
    assert parse_size(text) == size and type(parse_size(text)) is int


@pytest.mark.parametrize("text", ["5MB of RAM", "1GiB,", "10 G B", "3 bytes", "1" * 400 + "EiB"])
def test_parse_size_refuses_text_around_a_size(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid size .*: use bytes or a number with KB, MB, GB, TB, KiB, MiB"):
        parse_size(text)


@pytest.mark.parametrize("text", ["", "d", "7days", "-1s", "1y"])
def test_parse_duration_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid duration"):
        parse_duration(text)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_terminal_rewrites_one_line() -> None:
    stream = FakeTTY()
    progress = _Progress(stream, "deleting", interval_s=0)
    for done in range(4):
        progress(done, 3)
    progress.finish()
    assert stream.getvalue() == "\rdeleting: 0/3 (0%)\rdeleting: 1/3 (33%)\rdeleting: 2/3 (66%)\rdeleting: 3/3 (100%)\n"


def test_progress_off_terminal_prints_plain_lines() -> None:
    stream = io.StringIO()
    progress = _Progress(stream, "deleting")
    for done in range(1001):
        progress(done, 1000)
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "deleting: 0/1000 (0%)"
    assert lines[-1] == "deleting: 1000/1000 (100%)"
    assert len(lines) == 2  # throttled: one line every 5 s, plus the last


@pytest.mark.integration
def test_s3_setup(s3_bucket: str, s3_server: str, s3_client, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert run("s3", "setup", f"s3://{s3_bucket}/proj", "--ttl", "3d", "--endpoint-url", s3_server) == 0
    out = capsys.readouterr().out
    assert "expire after 4 days" in out
    assert "expire after 5 days" in out  # blobs outlive the checkpoints that refer to them
    rules = s3_client.get_bucket_lifecycle_configuration(Bucket=s3_bucket)["Rules"]
    assert [r["Filter"]["Prefix"] for r in rules] == ["proj/checkpoints/", "proj/blobs/"]
    assert run("s3", "setup", "file:///tmp/x") == 2


@pytest.mark.integration
def test_cleanup_cli_on_s3(s3_bucket: str, s3_config: S3Config, s3_server: str, capsys, monkeypatch) -> None:
    store = S3Store(s3_bucket, "p", config=s3_config)
    store.put("checkpoints/a", b"x" * 10)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SNAPCELL_S3_ENDPOINT_URL", s3_server)
    assert run("cleanup", f"s3://{s3_bucket}/p", "--json", "--ttl", "0s", "--grace", "0s", "--force") == 0
    assert json.loads(capsys.readouterr().out)["deleted_expired_objects"] == 1
    assert list(store.scan()) == []


@pytest.mark.parametrize("command", ["cleanup", "usage"])
@pytest.mark.parametrize("url", ["file://%00", "file://\x00"])
def test_nul_byte_in_store_path_is_a_config_error(command: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(command, url) == 2
    err = capsys.readouterr().err
    assert f"snapcell {command}: error:" in err and "NUL byte" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["cleanup", "usage"])
def test_missing_local_store_is_an_error(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo" / "store"
    assert run(command, str(missing)) == 2
    assert run(command, f"file://{missing}") == 2
    err = capsys.readouterr().err
    assert f"no store at file://{missing}" in err and "does not exist" in err
    assert not (tmp_path / "typo").exists()  # nothing was created (no directory, no signing key)


def test_cleanup_refuses_a_heads_database_that_does_not_exist(
    local: tuple[Path, LocalStore], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, store = local
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", "commands-test-signing-key-0123")
    before = [o.key for o in store.scan()]
    typo = tmp_path / "typo" / "heads.db"
    assert (
        run("cleanup", f"file://{root}", "--quota", "0", "--grace", "0", "--force", "--heads", f"sqlite://{typo}") == 2
    )
    err = capsys.readouterr().err
    assert f"no head store at {typo}" in err
    assert not typo.parent.exists()  # neither the database nor its directory was created
    assert [o.key for o in store.scan()] == before  # and nothing was deleted
    assert run("cleanup", f"file://{root}", "--heads", "memory://") == 2
    assert "memory:// head store is always empty" in capsys.readouterr().err


def test_cleanup_with_an_existing_heads_database(
    local: tuple[Path, LocalStore], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcell.heads import SQLiteHeads

    root, _store = local
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", "commands-test-signing-key-0123")
    path = tmp_path / "heads.db"
    SQLiteHeads(path).close()
    assert run("cleanup", f"file://{root}", "--heads", f"sqlite://{path}", "--json") == 0
    assert json.loads(capsys.readouterr().out)["deleted_expired_objects"] == 2


def test_sqlite_heads_in_must_exist_mode(tmp_path: Path) -> None:
    from snapcell.heads import SQLiteHeads

    with pytest.raises(ConfigError, match="no head store at"):
        SQLiteHeads(tmp_path / "missing" / "heads.db", create=False)
    assert not (tmp_path / "missing").exists()
    SQLiteHeads(tmp_path / "heads.db").close()
    heads = SQLiteHeads(tmp_path / "heads.db", create=False)
    assert list(heads.scan()) == []
    heads.close()


def test_cleanup_reports_reclaimed_temp_files(
    local: tuple[Path, LocalStore], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _store = local
    stale = root / "checkpoints" / ".tmp-0123456789abcdef"
    stale.write_bytes(b"half a checkpoint")
    old = time.time() - 2 * DAY
    os.utime(stale, (old, old))
    assert run("cleanup", f"file://{root}", "--dry-run") == 0
    assert "would delete 1 temporary files left by interrupted writes" in capsys.readouterr().out
    assert stale.exists()
    assert run("cleanup", f"file://{root}", "--json") == 0
    assert json.loads(capsys.readouterr().out)["deleted_temp_files"] == 1
    assert not stale.exists()


def _open_heads_file(path: str) -> str:
    from snapcell.heads import SQLiteHeads

    try:
        SQLiteHeads(path).close()
    except Exception as exc:  # reported back to the parent, which asserts on it
        return f"{type(exc).__name__}: {exc}"
    return ""


def test_processes_opening_a_new_heads_file_at_once_all_succeed(tmp_path: Path) -> None:
    # Switching a new file to WAL reports "database is locked" without waiting; the open must wait and retry.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(8) as workers:
        for round_ in range(40):
            path = str(tmp_path / f"{round_}" / "heads.db")
            assert [e for e in workers.map(_open_heads_file, [path] * 8) if e] == []


def test_cleanup_with_heads_refuses_to_invent_a_signing_key(
    local: tuple[Path, LocalStore], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcell.heads import SQLiteHeads

    root, _store = local
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    path = tmp_path / "heads.db"
    SQLiteHeads(path).close()
    assert run("cleanup", f"file://{root}", "--heads", f"sqlite://{path}") == 2
    assert "needs the signing key" in capsys.readouterr().err
    assert not (root / ".snapcell-signing-key").exists()


def test_cleanup_keeps_the_heads_next_to_a_local_store_without_being_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import snapcell

    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    root = tmp_path / "store"
    with snapcell.Pool(f"file://{root}", create_store=True, isolation="inline") as pool:
        tool = snapcell.SyncCodeTool(pool)
        tool.run_code("c", "x = [1] * 1000")
        tool.close()
    assert run("cleanup", f"file://{root}", "--quota", "1B", "--grace", "0s", "--force", "--json") == 1  # over quota
    captured = capsys.readouterr()
    assert "keeping conversation heads" in captured.err
    assert json.loads(captured.out)["deleted_quota_objects"] == 0


def test_cleanup_skips_a_corrupt_head_does_the_rest_and_exits_4(
    local: tuple[Path, LocalStore], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from snapcell.heads import SQLiteHeads

    root, store = local
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", "commands-test-signing-key-0123456789")
    path = tmp_path / "heads.db"
    SQLiteHeads(path).close()
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "INSERT INTO heads (conversation_id, checkpoint_id, history, version, updated_at, lease_owner,"
            " lease_expires_at) VALUES ('bad-one', NULL, '[\"zz\"]', 'v1', 0, NULL, 0)"
        )
    db.close()
    code = run("cleanup", f"file://{root}", "--heads", f"sqlite://{path}", "--quota", "150", "--json")
    captured = capsys.readouterr()
    assert code == 4
    report = json.loads(captured.out)
    assert report["deleted_expired_objects"] == 2 and report["deleted_quota_objects"] == 2  # expiry and quota ran
    assert len(report["skipped_heads"]) == 1 and "'bad-one'" in report["skipped_heads"][0]
    assert "skipped a head" in captured.err and "'bad-one'" in captured.err
    assert [o.key for o in store.scan()] == ["checkpoints/k4"]  # younger than the grace


def test_cleanup_removes_scratch_directories_of_dead_hosts(
    local: tuple[Path, LocalStore], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    root, _store = local
    temp_dir = tmp_path / "tmp"
    temp_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_dir))
    dead = temp_dir / "snapcell-workers-999999999-1-abc"  # no such pid: its host is gone
    (dead / "session-x").mkdir(parents=True)
    live = temp_dir / f"snapcell-workers-{os.getpid()}-0-abc"  # named after this live process: kept
    live.mkdir()
    assert run("cleanup", f"file://{root}", "--dry-run") == 0
    assert "would remove 1 worker scratch directory of dead hosts" in capsys.readouterr().out
    assert dead.exists()
    assert run("cleanup", f"file://{root}") == 0
    assert "removed  1 worker scratch directory of dead hosts" in capsys.readouterr().out
    assert not dead.exists() and live.exists()
