"""The host that `test_kill.py` SIGKILLs: turns of a few conversations through `CodeTool`, until done or killed.

Usage: ``python -m tests.faults.kill_driver CONFIG_JSON`` (see `DriverConfig` for the keys).

Each conversation runs turns 1..N in order, one at a time; turn ``k`` of conversation ``c`` has the turn ID
``c-turn-k`` and runs `turn_code`: it appends ``k`` to the list ``log`` in the namespace and calls the host
function ``record(c, k)``, which appends a line ``c k token`` to the ``calls`` file (so a turn that ran twice shows)
and returns ``token``, a name for that very run, which the answer then shows (and a number of loops to spin, 0
but at the ``spinning`` hook). Once ``run_code`` answers, the
driver appends ``c k token`` to the ``acks`` file. A restarted driver starts each conversation at its first turn
without an ack: the turn that was interrupted runs again with the same turn ID, which is the retry the tool
promises to make safe.

With ``pause`` set, the driver stops for good (until killed) the first time it reaches the named hook in a turn
``>= pause.turn`` of ``pause.conversation``, after printing ``paused HOOK CONVERSATION TURN``:

- ``leased``: the lease was taken, nothing else happened (the killed turn's lease stays behind).
- ``running``: inside the script's host call (its worker is alive, mid-run, waiting for the host's reply).
- ``spinning``: the host call returns and tells the script to spin (its worker is busy in a loop and does not
  notice that its host is gone; only its pid namespace stops it, as the run's wall-time limit is two minutes).
- ``dumped``: the checkpoint was stored, the head not moved yet.
- ``committed``: the head moved, the answer not returned yet.
- ``answered``: ``run_code`` returned, the ack is not written yet.

It prints ``ready`` once its pool is up and ``done`` when every turn is acknowledged. The signing key comes from
``SNAPCELL_SIGNING_KEY``; S3 credentials are the moto test ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapcell import AsyncPool, CodeTool, Limits, StorageError, TurnOutcomeUnknown
from snapcell.heads import HeadStore, S3Heads, SQLiteHeads
from snapcell.storage import S3Config, S3Store, Store, open_store
from tests.s3server import TEST_CREDENTIALS, TEST_REGION

HOOKS = ("leased", "running", "spinning", "dumped", "committed", "answered")
TOKEN = re.compile(r"'(run-\d+-\d+)'")
# A retried turn may meet a store that is still slow after a restart; more than this many tries is a bug.
_ATTEMPTS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverConfig:
    """What one driver run does.

    Attributes:
        backend: ``"local"`` (a local store with SQLite heads) or ``"s3"`` (S3 with S3 heads).
        store: The local store's directory, or ``bucket/prefix`` on S3.
        endpoint: The S3 endpoint URL (``"s3"`` only).
        state_dir: Where the ``calls`` and ``acks`` files are.
        conversations: The conversation IDs.
        turns: Turns per conversation.
        holder_id: The tool's stable holder ID (the same in every run).
        pause: ``[hook, conversation, turn]`` or None.
        max_workers: The pool's worker processes.
    """

    backend: str
    store: str
    state_dir: str
    conversations: Sequence[str]
    turns: int
    holder_id: str
    endpoint: str = ""
    pause: Sequence[Any] | None = None
    max_workers: int = 2

    def to_json(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self.__slots__})

    @classmethod
    def from_json(cls, text: str) -> DriverConfig:
        return cls(**json.loads(text))


def turn_id(conversation: str, turn: int) -> str:
    return f"{conversation}-turn-{turn}"


def turn_code(conversation: str, turn: int) -> str:
    return (
        f"try:\n    log\nexcept NameError:\n    log = []\nlog.append({turn})\n"
        f"token, spin = record({conversation!r}, {turn})\nfor _ in range(spin):\n    pass\ntoken"
    )


def read_lines(path: Path) -> list[tuple[str, int, str]]:
    """The ``conversation turn token`` lines of a ``calls`` or ``acks`` file, in the order they were written."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        conversation, turn, token = line.split()
        rows.append((conversation, int(turn), token))
    return rows


def next_turns(state_dir: Path, conversations: Sequence[str]) -> dict[str, int]:
    """The first turn of each conversation without an ack."""
    done = {c: 0 for c in conversations}
    for conversation, turn, _ in read_lines(state_dir / "acks"):
        if turn != done[conversation] + 1:
            raise SystemExit(f"acks out of order: {conversation} turn {turn} after {done[conversation]}")
        done[conversation] = turn
    return {c: n + 1 for c, n in done.items()}


class _Hooks:
    """Pause at the head-store hooks: a mixin over a real head store."""

    _pause: Callable[[str, str], None]

    def acquire_lease(self, conversation_id: str, owner: str, ttl_s: float, **kw: Any) -> bool:
        taken: bool = super().acquire_lease(conversation_id, owner, ttl_s, **kw)  # type: ignore[misc]
        if taken:
            self._pause("leased", conversation_id)
        return taken

    def compare_and_set(self, conversation_id: str, *args: Any, **kw: Any) -> str:
        self._pause("dumped", conversation_id)
        version: str = super().compare_and_set(conversation_id, *args, **kw)  # type: ignore[misc]
        self._pause("committed", conversation_id)
        return version


class HookedSQLiteHeads(_Hooks, SQLiteHeads):
    def __init__(self, pause: Callable[[str, str], None], path: Path) -> None:
        super().__init__(path)
        self._pause = pause


class HookedS3Heads(_Hooks, S3Heads):
    def __init__(self, pause: Callable[[str, str], None], store: S3Store) -> None:
        super().__init__(store)
        self._pause = pause


class Driver:
    """One run: the hooks, the host function and the turn loop."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.state = Path(config.state_dir)
        self.current: dict[str, int] = {}
        self._runs = itertools.count(1)
        self._calls = os.open(self.state / "calls", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._acks = os.open(self.state / "acks", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def at(self, hook: str, conversation: str) -> bool:
        """Whether the config names this hook, conversation and (at least) this turn; if so, say so on stdout."""
        if self.config.pause is None:
            return False
        want_hook, want_conversation, want_turn = self.config.pause
        turn = self.current.get(conversation, 0)
        if hook == want_hook and conversation == want_conversation and turn >= want_turn:
            os.write(1, f"paused {hook} {conversation} {turn}\n".encode())
            return True
        return False

    def pause(self, hook: str, conversation: str) -> None:
        """Stop here for good (until the parent's SIGKILL) at the configured hook."""
        if self.at(hook, conversation):
            while True:
                time.sleep(3600)

    def record(self, conversation: str, turn: int) -> list[object]:
        """The script's host function: note this run in ``calls``; return its name and the loops to spin."""
        token = f"run-{os.getpid()}-{next(self._runs)}"
        os.write(self._calls, f"{conversation} {turn} {token}\n".encode())
        self.pause("running", conversation)
        return [token, 10**15 if self.at("spinning", conversation) else 0]

    async def conversation(self, tool: CodeTool, conversation: str, first: int) -> None:
        for turn in range(first, self.config.turns + 1):
            self.current[conversation] = turn
            answer = await self._turn(tool, conversation, turn)
            found = TOKEN.search(answer)
            if found is None:
                raise SystemExit(f"turn {turn} of {conversation} answered without its run's name: {answer!r}")
            self.pause("answered", conversation)
            os.write(self._acks, f"{conversation} {turn} {found.group(1)}\n".encode())

    async def _turn(self, tool: CodeTool, conversation: str, turn: int) -> str:
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await tool.run_code(
                    conversation, turn_code(conversation, turn), turn_id=turn_id(conversation, turn)
                )
            except (TurnOutcomeUnknown, StorageError) as exc:  # the documented retry: the same turn ID
                print(f"turn {turn} of {conversation}, attempt {attempt}: {exc!r}; retrying", file=sys.stderr)
                if attempt == _ATTEMPTS:
                    raise
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    def heads(self, store: Store) -> HeadStore:
        if isinstance(store, S3Store):
            return HookedS3Heads(self.pause, store)
        return HookedSQLiteHeads(self.pause, Path(self.config.store) / ".heads.sqlite3")

    def store(self) -> Store:
        if self.config.backend == "s3":
            bucket, _, prefix = self.config.store.partition("/")
            config = S3Config(endpoint_url=self.config.endpoint, region_name=TEST_REGION, **TEST_CREDENTIALS)
            return S3Store(bucket, prefix, config=config)
        return open_store(f"file://{self.config.store}", create=True)

    async def run(self) -> None:
        first = next_turns(self.state, self.config.conversations)
        store = self.store()
        heads = self.heads(store)
        limits = Limits(wall_time_s=120.0)
        pool = AsyncPool(store, max_workers=self.config.max_workers, min_warm_workers=1, limits=limits)
        async with pool:
            tool = CodeTool(pool, heads=heads, tools={"record": self.record}, holder_id=self.config.holder_id)
            os.write(1, b"ready\n")
            await asyncio.gather(*(self.conversation(tool, c, first[c]) for c in self.config.conversations))
            await tool.aclose()
        heads.close()
        os.write(1, b"done\n")


def main(argv: list[str]) -> int:
    asyncio.run(Driver(DriverConfig.from_json(argv[0])).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
