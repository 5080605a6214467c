"""The two-turn churn example: which customers churned, and which of those have open tickets."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from snapcell.errors import ConfigError
from snapcell.pool import Pool

__all__ = ["TOOLS", "TURN_1", "TURN_2", "run_demo", "run_turn"]

_CUSTOMERS: list[dict[str, str | None]] = [
    {"id": "c-1", "name": "Acme", "churned_at": "2026-08-14"},
    {"id": "c-2", "name": "Globex", "churned_at": None},
    {"id": "c-3", "name": "Initech", "churned_at": "2026-09-02"},
]


def list_customers() -> list[dict[str, str | None]]:
    """Host function: every customer, with the date it churned (or None)."""
    return [dict(c) for c in _CUSTOMERS]


async def list_open_tickets(customer_id: str) -> list[dict[str, str]]:
    """Host function (async): the customer's open support tickets."""
    await asyncio.sleep(0.01)  # stands in for a network call
    return [{"id": "T-101", "subject": "Export fails"}] if customer_id == "c-3" else []


TOOLS: dict[str, Callable[..., Any]] = {"list_customers": list_customers, "list_open_tickets": list_open_tickets}

TURN_1 = """\
churned = [c for c in list_customers() if c["churned_at"] and c["churned_at"] >= "2026-07-01"]
len(churned)
"""

TURN_2 = """\
import asyncio
tickets = await asyncio.gather(*[list_open_tickets(c["id"]) for c in churned])
[c["name"] for c, t in zip(churned, tickets) if t]
"""


def run_turn(store: str, code: str, checkpoint_hex: str | None) -> tuple[Any, str, int]:
    """Run one turn: load the previous checkpoint (if any), run ``code``, dump.

    Returns:
        The value, the new checkpoint ID as hex, and the checkpoint's size in bytes.
    """
    # The demo is the first command on a fresh machine: it makes its store (turn 2 then finds it).
    with Pool(store, create_store=checkpoint_hex is None) as pool, pool.checkout() as session:
        if checkpoint_hex:
            session.load_session(bytes.fromhex(checkpoint_hex))
        value = session.feed_run(code, external_lookup=TOOLS)
        checkpoint_id = session.dump()
        size = session.checkpoint_bytes or 0
    return value, checkpoint_id.hex(), size


def run_demo(store: str) -> int:
    """Run turn 1 here and turn 2 in a separate Python process sharing the store.

    Raises:
        ConfigError: ``store`` is a memory store, which the second process could not see.
    """
    if store.lower().startswith("memory:"):
        raise ConfigError(
            f"the demo cannot use {store}: its turn 2 runs in a new process, and a memory:// store (its "
            "checkpoints and its signing key) ends with the process that made it; use a directory such as "
            "file://.snapcell, or s3://bucket/prefix"
        )
    print(f"store: {store}")
    print(f"turn 1 (this process):\n{_indent(TURN_1)}")
    value, checkpoint_hex, size = run_turn(store, TURN_1, None)
    print(f"  -> {value!r}   checkpoint {checkpoint_hex} ({size} bytes)")
    print(f"turn 2 (a new Python process, after load_session):\n{_indent(TURN_2)}")
    child = subprocess.run(
        [sys.executable, "-m", "snapcell", "demo", "--store", store, "--turn-2", checkpoint_hex],
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(child.stdout)
    sys.stderr.write(child.stderr)
    return child.returncode


def run_second_turn(store: str, checkpoint_hex: str) -> int:
    """Turn 2 of the demo, run by the child process."""
    value, new_hex, size = run_turn(store, TURN_2, checkpoint_hex)
    print(f"  -> {value!r}   checkpoint {new_hex} ({size} bytes)")
    return 0


def _indent(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())
