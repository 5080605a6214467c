"""The examples in examples/ run as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from snapcell import FileConversationStore

ROOT = Path(__file__).resolve().parents[1]


def test_conversation_loop_keeps_messages_and_state_together(tmp_path: Path) -> None:
    def run() -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "conversation_loop.py"), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    first = run()
    assert "Load the numbers. -> The answer is 8." in first and "sum? -> The answer is 31." in first
    second = run()  # a new process: the code of this run uses `numbers` and `total` from the first
    assert "mean? -> The answer is 3.875." in second
    third = run()  # truncates the last exchange, then asks again on the state before it
    assert "truncated the last exchange" in third and "mean? -> The answer is 3.875." in third
    stored = FileConversationStore(tmp_path / "conversations").load_sync("demo")
    assert stored is not None
    assert [m["content"] for m in stored.messages if m["role"] == "user"] == [
        "Load the numbers.",
        "What is their sum?",
        "And their mean?",
    ]
    assert stored.usage.runs == 4
    assert stored.usage.by_status == {"ok": 4}
