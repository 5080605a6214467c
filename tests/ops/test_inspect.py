"""`snapcell inspect`: verify first, then show the manifest; nothing is ever unpickled."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from snapcell import CheckpointCorrupt, CheckpointNotFound, ConfigError, Pool
from snapcell.checkpoint import dump_namespace
from snapcell.cli import main
from snapcell.ops._inspect import inspect_checkpoint


def _write_canary(path: str) -> None:
    Path(path).write_text("unpickled!")
    raise RuntimeError("this checkpoint was unpickled")


class Bomb:
    """Unpickling it writes a canary file and raises."""

    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _write_canary, (self.canary,)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def _checkpoint(store_dir: Path, code: str, *, extra: dict[str, Any] | None = None, setup: str = "") -> str:
    """Run code in an inline session over a local store, dump it and return the checkpoint ID in hex."""
    with Pool(f"file://{store_dir}", create_store=True, isolation="inline") as pool, pool.checkout() as session:
        if setup:
            session.run(setup, setup=True)
        session.run(code)
        if not extra:
            return session.dump().hex()
        # Objects a script could not make go straight into the checkpoint, signed with the store's key as a key
        # holder could (the host itself never signs a pickle naming a global like the bomb's).
        runner = session._inner._backend.runner  # type: ignore[attr-defined]
        dumped = dump_namespace({**runner.variables(), **extra}, namespace=runner.namespace, created_at=time.time())
        keyring = pool.aio.keyring
        cid = keyring.new_id()
        pool.store.put(cid.storage_key, bytes(keyring.sign(dumped.body, cid)))
        return cid.raw.hex()


def _file_of(store_dir: Path, checkpoint_hex: str) -> Path:
    files = [p for p in (store_dir / "checkpoints").rglob("*") if p.is_file()]
    (match,) = [p for p in files if checkpoint_hex[18:50] in p.name]
    return match


def test_manifest_is_shown_without_unpickling(store_dir: Path, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    # The bomb is armed: plain unpickling fires it.
    with pytest.raises(RuntimeError, match="unpickled"):
        pickle.loads(pickle.dumps(Bomb(str(canary))))
    assert canary.exists()
    canary.unlink()

    checkpoint = _checkpoint(store_dir, "numbers = list(range(1000))\nname = 'x'", extra={"bomb": Bomb(str(canary))})
    report = inspect_checkpoint(checkpoint, store=f"file://{store_dir}")

    assert not canary.exists()
    assert report.ok and report.verified
    assert report.manifest is not None
    variables = {v.name: v for v in report.manifest.variables}
    assert variables["bomb"].type_name.endswith("Bomb")
    assert variables["numbers"].type_name == "list"
    text = report.render()
    assert "bomb" in text and "verified" in text
    # Largest first.
    assert text.index("numbers") < text.index("name ")
    assert [s.kind for s in report.sections][0] == "stream"
    assert not canary.exists()


def test_cli_text_and_json(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = _checkpoint(
        store_dir, "big = 'x' * 5000\ngen = (i for i in range(3))\nsmall = 1", setup="import math\nscale = 2"
    )
    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}"]) == 0
    text = capsys.readouterr().out
    for expected in ("created", "expires", "python", "cloudpickle", "big", "dropped", "gen", "setup cells", "sections"):
        assert expected in text, expected
    assert "import math" in text
    assert text.index("big") < text.index("small")

    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verified"] is True and data["problem"] is None
    assert data["checkpoint_id"] == checkpoint
    assert {v["name"] for v in data["manifest"]["variables"]} >= {"big", "small", "scale", "math"}
    assert [d["name"] for d in data["manifest"]["dropped"]] == ["gen"]
    assert data["manifest"]["setup_cells"] == ["import math\nscale = 2"]
    assert data["expires_at"] - data["created_at"] == pytest.approx(7 * 86400)
    assert data["sections"][0]["kind"] == "stream"


def test_tampered_checkpoint_is_reported_and_not_parsed(
    store_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canary = tmp_path / "canary"
    checkpoint = _checkpoint(store_dir, "a = 1", extra={"bomb": Bomb(str(canary))})
    path = _file_of(store_dir, checkpoint)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    report = inspect_checkpoint(checkpoint, store=f"file://{store_dir}")
    assert not report.verified and not report.ok
    assert report.manifest is None and report.header is None and not report.sections
    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "nothing was parsed" in out
    assert not canary.exists()


def test_forged_id_is_reported(store_dir: Path) -> None:
    checkpoint = _checkpoint(store_dir, "a = 1")
    forged = checkpoint[:-2] + ("00" if checkpoint[-2:] != "00" else "01")
    report = inspect_checkpoint(forged, store=f"file://{store_dir}")
    assert not report.verified
    assert "FAILED" in report.verification and "ID" in report.verification
    assert report.manifest is None


def test_file_needs_its_id_or_no_verify(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = _checkpoint(store_dir, "value = 42")
    other = _checkpoint(store_dir, "other = 1")
    path = _file_of(store_dir, checkpoint)

    with pytest.raises(ConfigError, match="--id"):
        inspect_checkpoint(path=path)
    assert main(["inspect", str(path)]) == 1
    assert "--id" in capsys.readouterr().err

    # The key comes from the local store the file sits in.
    report = inspect_checkpoint(checkpoint, path=path)
    assert report.ok and report.manifest is not None
    assert [v.name for v in report.manifest.variables] == ["value"]

    mismatched = inspect_checkpoint(other, path=path)
    assert not mismatched.verified and "stored as" in mismatched.verification

    assert main(["inspect", str(path), "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "NOT CHECKED" in out and "value" in out


def test_wrong_key_fails_verification(store_dir: Path) -> None:
    checkpoint = _checkpoint(store_dir, "a = 1")
    report = inspect_checkpoint(checkpoint, store=f"file://{store_dir}", signing_keys=["another key, 16+ bytes"])
    assert not report.verified and report.manifest is None


def test_expiry_and_missing_checkpoints(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = _checkpoint(store_dir, "a = 1")
    fresh = inspect_checkpoint(checkpoint, store=f"file://{store_dir}")
    assert fresh.created_at is not None
    late = inspect_checkpoint(checkpoint, store=f"file://{store_dir}", ttl_s=60, now=fresh.created_at + 3600)
    assert late.expired and late.ok
    assert "EXPIRED" in late.render(now=fresh.created_at + 3600)

    _file_of(store_dir, checkpoint).unlink()
    with pytest.raises(CheckpointNotFound):
        inspect_checkpoint(checkpoint, store=f"file://{store_dir}")
    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}"]) == 1
    assert "CheckpointNotFound" in capsys.readouterr().err


def test_no_store_no_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a snapcell store"):
        inspect_checkpoint("00" * 41, store=f"file://{tmp_path / 'missing'}")


def test_checkpoint_of_another_python_is_shown_with_a_warning(
    store_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from snapcell.checkpoint import Keyring

    checkpoint = _checkpoint(store_dir, "value = 42")
    keyring = Keyring([(store_dir / ".snapcell-signing-key").read_bytes()])
    cid = keyring.parse_id(checkpoint)
    path = _file_of(store_dir, checkpoint)
    body = bytearray(keyring.verify(path.read_bytes(), cid))
    other_minor = 12 if sys.version_info.minor != 12 else 11
    body[11] = other_minor  # the header's Python minor version; re-signed, so the checkpoint still verifies
    path.write_bytes(bytes(keyring.sign(body, cid)))

    report = inspect_checkpoint(checkpoint, store=f"file://{store_dir}")
    assert report.ok and report.header is not None and report.header.python == (3, other_minor)
    assert report.manifest is not None and [v.name for v in report.manifest.variables] == ["value"]
    assert len(report.warnings) == 1 and f"Python 3.{other_minor}" in report.warnings[0]

    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}"]) == 0
    text = capsys.readouterr().out
    (warning,) = [line for line in text.splitlines() if line.startswith("WARNING")]
    assert f"3.{other_minor}" in warning and "value" in text
    assert main(["inspect", checkpoint, "--store", f"file://{store_dir}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == list(report.warnings)


def test_inspect_never_creates_a_signing_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ConfigError, match=r"\.snapcell-signing-key.*--signing-key.*SNAPCELL_SIGNING_KEY"):
        inspect_checkpoint("00" * 41, store=f"file://{plain}")
    assert list(plain.iterdir()) == []

    # A file that merely looks like it sits in a store's checkpoints/<day>/ directory.
    fake = tmp_path / "docs" / "checkpoints" / "2024" / "notes.bin"
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"x" * 100)
    assert main(["inspect", str(fake), "--id", "00" * 41]) in (1, 2)
    err = capsys.readouterr().err
    assert "ConfigError" in err and ".snapcell-signing-key" in err and "--signing-key" in err
    assert sorted(p.name for p in (tmp_path / "docs").rglob("*")) == ["2024", "checkpoints", "notes.bin"]


def test_a_mistyped_id_is_reported_as_such_not_as_corrupt(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = _checkpoint(store_dir, "a = 1")
    store = f"file://{store_dir}"
    # One hex digit of the token changed: no checkpoint has this ID.
    typo = checkpoint[:30] + ("0" if checkpoint[30] != "0" else "1") + checkpoint[31:]
    with pytest.raises(CheckpointNotFound) as info:
        inspect_checkpoint(typo, store=store)
    assert "no checkpoint with this ID" in str(info.value) and "mistyped" in str(info.value)
    assert main(["inspect", typo, "--store", store]) == 1
    err = capsys.readouterr().err
    assert "CheckpointNotFound" in err and "forged" not in err and "Corrupt" not in err
    # Not an ID at all (too short, not hex) and not a file either.
    for target in (checkpoint[:40], "zz" * 41, "abcd"):
        assert main(["inspect", target, "--store", store]) == 2
        err = capsys.readouterr().err
        assert "is not a checkpoint ID" in err and "82 hex digits" in err and "Corrupt" not in err


def test_an_id_from_another_process_memory_store_names_the_cause(tmp_path: Path) -> None:
    from snapcell.checkpoint import Keyring

    elsewhere = Keyring([b"another process's random key"]).new_id().raw  # what a memory store elsewhere made
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        with pytest.raises(CheckpointCorrupt) as info:
            session.load_session(elsewhere)
    assert "memory://" in str(info.value) and "made in another process" in str(info.value)


def test_the_size_line_says_what_each_figure_is(store_dir: Path) -> None:
    from snapcell.checkpoint import Keyring
    from snapcell.ops._cleanup import format_bytes

    checkpoint = _checkpoint(store_dir, "a = 1\nnames = ['x'] * 3")  # small: the manifest outweighs the variables
    report = inspect_checkpoint(checkpoint, store=f"file://{store_dir}")
    (line,) = [row for row in report.render().splitlines() if row.startswith("size")]
    stored = sum(s.stored_bytes for s in report.sections)
    raw = sum(s.raw_bytes for s in report.sections)
    assert raw < report.checkpoint_bytes  # the reading that looked wrong: less "uncompressed" than "stored"
    assert "uncompressed" not in line
    assert f"{format_bytes(report.checkpoint_bytes)} in the store" in line
    assert f"{format_bytes(stored)} of variables ({format_bytes(raw)} before compression)" in line
    assert f"{format_bytes(report.checkpoint_bytes - stored)} of manifest, header and signature" in line
    # Which key verified it, by key ID and origin.
    key_id = Keyring([(store_dir / ".snapcell-signing-key").read_bytes()]).key_id()
    assert f"key {key_id} (the store's key file" in report.verification
