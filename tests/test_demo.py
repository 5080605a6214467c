"""The churn example across two real processes sharing a local store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from snapcell import Pool
from snapcell.cli import main
from snapcell.cli._demo import TOOLS, TURN_1

TURN_2_CHILD = """
import json, os, sys
from snapcell.cli import _demo
from snapcell.cli._demo import TURN_2, run_turn

# Record when each ticket lookup starts and ends, to see whether turn 2 ran them concurrently.
events = []
lookup = _demo.TOOLS["list_open_tickets"]
async def list_open_tickets(customer_id):
    events.append(["start", customer_id])
    try:
        return await lookup(customer_id)
    finally:
        events.append(["end", customer_id])
_demo.TOOLS["list_open_tickets"] = list_open_tickets

value, new_hex, size = run_turn(sys.argv[1], TURN_2, sys.argv[2])
print(json.dumps([value, new_hex, size, os.getpid(), events]))
"""


def _child_env() -> dict[str, str]:
    # The store's generated key file must be what both processes use.
    return {k: v for k, v in os.environ.items() if k != "SNAPCELL_SIGNING_KEY"}


def test_demo_command_runs_both_turns(tmp_path: Path) -> None:
    store = tmp_path / "demo-store"
    result = subprocess.run(
        [sys.executable, "-m", "snapcell", "demo", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_child_env(),
    )
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("->")]
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith("-> 2 ")
    assert lines[1].startswith("-> ['Initech'] ")
    assert "bytes)" in lines[0] and "bytes)" in lines[1]
    assert list(store.rglob("checkpoints/*/*")), "the demo wrote no checkpoint into the store"


def test_turn_two_runs_in_another_process_sharing_the_store(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    # Turn 1 here, inline (the demo's own default isolation runs in the `demo` command test above).
    with Pool(store, isolation="inline", create_store=True) as pool, pool.checkout() as session:
        value = session.feed_run(TURN_1, external_lookup=TOOLS)
        checkpoint_hex = session.dump().hex()
    assert value == 2
    child = subprocess.run(
        [sys.executable, "-c", TURN_2_CHILD, store, checkpoint_hex],
        capture_output=True,
        text=True,
        timeout=120,
        env=_child_env(),
    )
    assert child.returncode == 0, child.stderr
    value, new_hex, new_size, pid, events = json.loads(child.stdout.strip().splitlines()[-1])
    assert value == ["Initech"]
    assert pid != os.getpid()
    assert new_hex != checkpoint_hex and new_size > 0  # the child ran snapcell.cli._demo.run_turn
    # And back: this process continues from the child's checkpoint.
    with Pool(store, isolation="inline") as pool, pool.checkout() as session:
        session.load_session(bytes.fromhex(new_hex))
        names = session.feed_run("[c['name'] for c in churned], len(tickets)", external_lookup=TOOLS)
    assert names == (["Acme", "Initech"], 2)
    # Turn 2 looked up both churned customers' tickets in the host, concurrently (asyncio.gather in the
    # script): both lookups started before either ended.
    assert sorted(customer for kind, customer in events if kind == "start") == ["c-1", "c-3"]
    assert [kind for kind, _ in events] == ["start", "start", "end", "end"], events


def test_the_demo_refuses_a_memory_store_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store", "memory://"]) == 2
    err = capsys.readouterr().err
    assert "memory://" in err and "new process" in err and "file://" in err
    assert "forged" not in err and "Corrupt" not in err
