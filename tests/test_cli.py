"""The ``snapcell`` command's small things: version, defaults, pipes, head, keygen, plurals, REPL options."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Policy, Pool, SyncCodeTool
from snapcell.checkpoint import Keyring
from snapcell.cli import build_parser, main
from snapcell.cli._repl import Repl, describe_variables
from snapcell.heads import MemoryHeads


def _cli(*argv: str, cwd: Path | None = None, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SNAPCELL_SIGNING_KEY"}
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "snapcell", *argv],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"snapcell {importlib.metadata.version('snapcell')}"


def test_usage_defaults_to_the_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["usage"]) == 2  # nothing there yet: the same error as for a mistyped path
    assert "no store at file://" in (err := capsys.readouterr().err) and ".snapcell does not exist" in err
    with Pool("file://.snapcell", create_store=True, isolation="inline") as pool, pool.checkout() as session:
        session.run("x = 1")
        session.dump()
    assert main(["usage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_objects"] >= 1


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written, as `| head` after its lines
    try:
        done = _cli("keygen", stdout=write_end)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141


def test_head_prints_the_current_checkpoint_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    with Pool(f"file://{store}", create_store=True, isolation="inline") as pool:
        tool = SyncCodeTool(pool)
        tool.run_code("chat-1", "a = 1")
        tool.run_code("chat-1", "b = 2")
        head = tool.head("chat-1")
        tool.close()
    assert head is not None and head.checkpoint_id is not None
    assert main(["head", "chat-1", "--store", f"file://{store}"]) == 0
    assert capsys.readouterr().out.split() == [head.checkpoint_id.hex()]
    assert main(["head", "chat-1", "--store", str(store), "--history"]) == 0
    assert capsys.readouterr().out.split() == [head.checkpoint_id.hex(), *(h.hex() for h in head.history)]
    assert main(["head", "chat-1", "--store", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_id"] == head.checkpoint_id.hex()
    assert main(["head", "chat-2", "--store", str(store)]) == 1
    assert "has no turns" in capsys.readouterr().err
    assert main(["head", "not a conversation id", "--store", str(store)]) == 1


def test_keygen_prints_a_key_the_environment_accepts(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    keys = []
    for _ in range(2):
        assert main(["keygen"]) == 0
        keys.append(capsys.readouterr().out.strip())
    assert keys[0] != keys[1]
    assert all(len(key) >= 32 and "," not in key and key.isascii() and key.isprintable() for key in keys)
    monkeypatch.setenv("SNAPCELL_SIGNING_KEY", f"{keys[0]},{keys[1]}")
    keyring = Keyring.from_env()
    assert keyring is not None
    checkpoint_id = keyring.new_id()
    assert Keyring([keys[0]]).parse_id(checkpoint_id.raw) == checkpoint_id  # the first key signs


def test_cleanup_heads_without_a_key_says_how_to_pass_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SNAPCELL_SIGNING_KEY", raising=False)
    argv = ["cleanup", "s3://bucket/prefix", "--heads", "s3://bucket/prefix", "--endpoint-url", "http://127.0.0.1:9"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "SNAPCELL_SIGNING_KEY=KEY snapcell cleanup" in err
    assert "signing_keys=" not in err and "to the pool" not in err


def test_repl_help_and_allow(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--version" in build_parser().format_help()
    with pytest.raises(SystemExit):
        main(["repl", "--help"])
    help_text = capsys.readouterr().out
    assert "%%" not in help_text and "%help" in help_text and "--allow MODULES" in help_text


def test_repl_allow_lets_scripts_import_the_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = "import numpy\nint(numpy.arange(4).sum())\n"
    base = ["repl", "--store", f"file://{tmp_path / 's'}", "--create", "--isolation", "inline"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    assert main([*base, "--conversation", "a"]) == 0
    assert "PolicyError" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    assert main([*base, "--conversation", "b", "--allow", "numpy, pandas"]) == 0
    out = capsys.readouterr().out
    assert "PolicyError" not in out and "\n6\n" in out.replace(">>> ", "\n")


def test_plurals_in_the_repl() -> None:
    with Pool("memory://", isolation="inline") as pool:
        tool = SyncCodeTool(pool, heads=MemoryHeads())
        tool.run_code("c", "only = 1")
        head = tool.head("c")
        assert head is not None and head.checkpoint_id is not None
        repl = Repl(tool, pool, "c")
        assert "restored after turn 1: 1 variable (only)" in repl.banner()
        manifest = repl._manifest(head.checkpoint_id)
    assert describe_variables(manifest)[-1].startswith("1 variable, ")


def test_a_failed_restore_is_not_reported_as_restored_and_moves_no_head(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    with Pool(url, isolation="inline", policy=Policy().with_modules(["numpy"]), create_store=True) as pool:
        tool = SyncCodeTool(pool)
        tool.run_code("c", "import numpy\nrows = numpy.arange(3)\nn = 5")
        tool.close()
    with Pool(url, isolation="inline") as pool:  # started without --allow numpy
        tool = SyncCodeTool(pool)
        before = tool.head("c")
        out = _Output()
        repl = Repl(tool, pool, "c", out=out)  # type: ignore[arg-type]
        banner = repl.banner()
        assert "restored after turn" not in banner, banner
        assert "NOT restored: could not be restored: rows (numpy.ndarray" in banner and "--allow" in banner
        repl.turn("n = 6")
        assert tool.head("c") == before  # the checkpoint with rows and n is still the head
        assert "not run" in out.text
        tool.close()
    with Pool(url, isolation="inline", policy=Policy().with_modules(["numpy"])) as pool:
        tool = SyncCodeTool(pool)
        repl = Repl(tool, pool, "c", out=_Output())  # type: ignore[arg-type]
        assert "restored after turn 1: 3 variables (numpy, rows, n)" in repl.banner()
        tool.close()


class _Output:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def _helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """Every command's help text, the top level's included, with argparse's line breaks undone."""
    yield parser.prog, " ".join(parser.format_help().split())
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from _helps(command)


def test_help_shows_durations_and_environment_variables_as_a_person_types_them() -> None:
    helps = dict(_helps(build_parser()))
    assert len(helps) > 10
    for prog, text in helps.items():
        assert not re.search(r"\d\.\d{3,}", text), (prog, text)  # 6.16667h
        assert not re.search(r"(?<!\$)\bSNAPCELL_[A-Z_]+", text), (prog, text)  # the variable, not its name
    assert "--blob-grace below 6h10m" in helps["snapcell cleanup"]


def test_cleanup_keep_takes_one_key_per_flag_and_leaves_the_store_url() -> None:
    args = build_parser().parse_args(["cleanup", "--keep", "checkpoints/k2", "--keep", "checkpoints/k3", "store"])
    assert args.keep == ["checkpoints/k2", "checkpoints/k3"] and args.store_url == "store"
    args = build_parser().parse_args(["cleanup", "--keep", "checkpoints/k2", "store"])
    assert args.keep == ["checkpoints/k2"] and args.store_url == "store"
