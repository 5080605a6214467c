"""`snapcell repl`: console input handling, persistence across processes, and the % commands."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapcell import Pool
from snapcell.cli._repl import Repl
from snapcell.tool import SyncCodeTool


def _repl(store: Path, text: str, *extra: str) -> str:
    """Run ``snapcell repl`` in a new process with ``text`` piped to standard input; return what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "snapcell", "repl", "--store", f"file://{store}", "--conversation", "t1", *extra]
        + ["--create"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_variables_survive_across_processes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # The library default (a worker process), then inline: both read the same conversation.
    first = _repl(store, "x = 41\ndef double(a):\n    return a * 2\n\nprint('defined')\n")
    assert "a new conversation" in first
    assert "defined" in first

    second = _repl(
        store, "double(x)\nimport asyncio\nawait asyncio.sleep(0, result='awaited')\n%vars\n", "--isolation", "inline"
    )
    assert "restored after turn 3: 2 variables (x, double)" in second
    assert "82" in second
    assert "'awaited'" in second
    lines = second.replace(">>> ", "\n").splitlines()
    var_lines = [line.split() for line in lines if line.split()[:1] in (["x"], ["double"])]
    assert ["double", "function"] == var_lines[0][:2]  # largest first
    assert ["x", "int"] == var_lines[1][:2]


@pytest.fixture
def console() -> Iterator[tuple[Repl, io.StringIO]]:
    with Pool("memory://", isolation="inline") as pool:
        tool = SyncCodeTool(pool)
        out = io.StringIO()
        yield Repl(tool, pool, "c1", out=out), out


def _type(repl: Repl, out: io.StringIO, *lines: str) -> str:
    start = out.tell()
    more = False
    for line in lines:
        if not more and line.startswith("%"):
            repl.command(line)
        else:
            more = repl.push(line)
    assert not more, "input left incomplete"
    out.seek(start)
    text = out.read()
    out.seek(0, io.SEEK_END)
    return text


def test_multiline_blocks_wait_for_their_end(console: tuple[Repl, io.StringIO]) -> None:
    repl, out = console
    assert repl.push("def f(n):") is True
    assert repl.push("    total = 0") is True
    assert repl.push("    for i in range(n):") is True
    assert repl.push("        total += i") is True
    assert repl.push("    return total") is True
    assert out.getvalue() == ""
    assert repl.push("") is False
    assert _type(repl, out, "f(5)") == "10\n"
    # An `await` inside a block does not end it early.
    _type(repl, out, "import asyncio")
    assert repl.push("for i in range(2):") is True
    assert repl.push("    await asyncio.sleep(0)") is True
    assert _type(repl, out, "    print(i)", "") == "0\n1\n"


def test_errors_and_notes_are_shown(console: tuple[Repl, io.StringIO]) -> None:
    repl, out = console
    text = _type(repl, out, "1/0")
    assert "ZeroDivisionError: division by zero" in text and "Traceback" in text
    assert "SyntaxError" in _type(repl, out, "def (:")
    assert "PolicyError" in _type(repl, out, "import socket")
    text = _type(repl, out, "g = (i for i in range(3))", "y = 1")
    assert "not saved in the checkpoint" in text and "g (generator)" in text


def test_history_rewind_and_id(console: tuple[Repl, io.StringIO]) -> None:
    repl, out = console
    assert "no turns yet" in _type(repl, out, "%history")
    assert "no variables yet" in _type(repl, out, "%vars")
    _type(repl, out, "a = 1", "b = 2", "c = 3")
    history = _type(repl, out, "%history")
    assert history.splitlines()[1].split()[:4] == ["*", "0", "3", "3"]
    assert [line.split()[-3:] for line in history.splitlines()[1:]] == [
        ["c", "=", "3"],
        ["b", "=", "2"],
        ["a", "=", "1"],
    ]
    assert "... 2 older" in _type(repl, out, "%history 1")

    assert "rewound 2 turns to turn 1; variables: a" in _type(repl, out, "%rewind 2")
    assert "NameError" in _type(repl, out, "b")
    assert _type(repl, out, "a") == "1\n"
    current = _type(repl, out, "%id").strip()
    assert len(bytes.fromhex(current)) == 41
    assert "cannot go back" in _type(repl, out, "%rewind 9")
    assert "positive number" in _type(repl, out, "%rewind x")
    assert "unknown command %nope" in _type(repl, out, "%nope")
    assert "%rewind" in _type(repl, out, "%help")


def test_exit_and_eof(tmp_path: Path) -> None:
    text = _repl(tmp_path / "s", "v = 5\nexit\nv = 6\n", "--isolation", "inline")
    assert text.count(">>> ") == 2
    assert "v = 5" not in text
    assert "restored after turn 1: 1 variable (v)" in _repl(tmp_path / "s", "", "--isolation", "inline")


def _head_file(store: Path) -> Path:
    """The checkpoint file of conversation t1's head in a local store."""
    from snapcell.heads import SQLiteHeads

    heads = SQLiteHeads(store / ".heads.sqlite3", create=False)
    try:
        head = heads.get("t1")
    finally:
        heads.close()
    assert head is not None and head.checkpoint_id is not None
    (path,) = [
        p for p in (store / "checkpoints").rglob("*") if p.is_file() and head.checkpoint_id.hex()[18:50] in p.name
    ]
    return path


def test_starts_when_the_head_checkpoint_was_deleted(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _repl(store, "x = 1\n", "--isolation", "inline")
    _head_file(store).unlink()  # as cleanup does once the checkpoint expired

    text = _repl(store, "y = 2\nprint('after', y)\n%history\n", "--isolation", "inline")
    banner = text.splitlines()[1]
    assert banner.startswith("current checkpoint unreadable: CheckpointNotFound") and "%rewind or start over" in banner
    assert "state of this conversation is gone" in text
    assert "after 2" in text
    assert "print('after', y)" in text.split("last input")[-1]  # the new turns were saved


def test_starts_when_the_head_checkpoint_was_tampered(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _repl(store, "a = 1\nb = 2\n", "--isolation", "inline")
    path = _head_file(store)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    text = _repl(store, "b\n%rewind\nprint('ok', a)\n", "--isolation", "inline")
    banner = text.splitlines()[1]
    assert banner.startswith("current checkpoint unreadable: CheckpointCorrupt") and "%rewind or start over" in banner
    assert "rewound 1 turn to turn 1; variables: a" in text
    assert "ok 1" in text


def test_storage_errors_of_a_turn_are_printed_and_the_prompt_stays(
    console: tuple[Repl, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcell.errors import StorageError, WorkerLost

    repl, out = console
    real = repl.tool.run_code
    for error in (StorageError("the disk went away\nsecond line"), WorkerLost("the worker died", reason="signal")):

        def failing(conversation_id: str, code: str, setup: bool = False, error: Exception = error) -> str:
            raise error

        monkeypatch.setattr(repl.tool, "run_code", failing)
        text = _type(repl, out, "x = 1")
        assert text.startswith(f"{type(error).__name__}: ") and text.count("\n") == 1, text
    monkeypatch.setattr(repl.tool, "run_code", real)
    assert _type(repl, out, "x = 2", "x") == "2\n"


@pytest.mark.parametrize("command", ["%history ²", "%rewind ²", "%history -1", "%rewind 0", "%history ٣"])
def test_bad_command_arguments_print_usage(console: tuple[Repl, io.StringIO], command: str) -> None:
    repl, out = console
    _type(repl, out, "a = 1", "a = 2")
    text = _type(repl, out, command)
    name = command.split()[0]
    assert text.startswith(f"{name}: ") and f"usage: {name} [N]" in text and text.count("\n") == 1, text
    assert _type(repl, out, "a") == "2\n"  # nothing moved


def test_interrupt_reports_whether_the_turn_was_saved(
    console: tuple[Repl, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    repl, out = console
    real = repl.tool.run_code

    def interrupted_after_commit(conversation_id: str, code: str, setup: bool = False) -> str:
        real(conversation_id, code, setup)
        raise KeyboardInterrupt

    def interrupted_before(conversation_id: str, code: str, setup: bool = False) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(repl.tool, "run_code", interrupted_after_commit)
    text = _type(repl, out, "kept = 1")
    assert "KeyboardInterrupt" in text and "saved" in text and "lost" not in text, text

    monkeypatch.setattr(repl.tool, "run_code", interrupted_before)
    text = _type(repl, out, "gone = 1")
    assert "KeyboardInterrupt" in text and "lost" in text, text

    monkeypatch.setattr(repl.tool, "run_code", real)
    assert _type(repl, out, "kept") == "1\n"
    assert "NameError" in _type(repl, out, "gone")
