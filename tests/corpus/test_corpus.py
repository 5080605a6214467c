"""The corpus of ordinary agent scripts: each turn restored from its checkpoint, compared with CPython.

Every turn of a conversation runs in a new session restored from the previous turn's checkpoint: a new worker
process in process mode. What it gives (the value of its last expression, its output, the type of its error)
must equal what plain CPython gives running the same turns in one namespace. The conversations run concurrently
over one pool per mode, once; each conversation is then its own test. A few conversations also reload in a new
host process for every turn (`test_conversations_survive_new_host_processes`).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from snapcell import AsyncPool, Policy, RunResult
from tests.corpus.conversations import CORPUS, TOOLS

MODES = ("inline", "process")
CONCURRENCY = 4


@dataclass(frozen=True)
class Outcome:
    """What one turn gave: the last expression's value, the output, the error's type (None without one)."""

    value: Any
    stdout: str
    error: str | None


# ------------------------------------------------------------------ plain CPython


def _split_value(code: str) -> ast.Module:
    tree = ast.parse(code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        target = ast.Name(id="_corpus_value", ctx=ast.Store())
        tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
        ast.fix_missing_locations(tree)
    return tree


def reference(turns: list[str]) -> list[Outcome]:
    """The conversation in plain CPython: one namespace, one event loop for top-level await."""
    namespace: dict[str, Any] = {"__name__": "__main__", **TOOLS}
    loop = asyncio.new_event_loop()
    outcomes = []
    try:
        for code in turns:
            # dont_inherit: a script does not get this module's `from __future__ import annotations`.
            compiled = compile(
                _split_value(code), "<turn>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
            )
            out = io.StringIO()
            error = None
            with contextlib.redirect_stdout(out):
                try:
                    if compiled.co_flags & 0x80:  # CO_COROUTINE
                        loop.run_until_complete(eval(compiled, namespace))
                    else:
                        exec(compiled, namespace)
                except Exception as exc:
                    error = type(exc).__name__
            outcomes.append(Outcome(namespace.pop("_corpus_value", None), out.getvalue(), error))
    finally:
        loop.close()
    return outcomes


# ------------------------------------------------------------------ snapcell


def _outcome(result: RunResult) -> Outcome:
    error = result.error.exc_type if result.error is not None else None
    return Outcome(result.value if error is None else None, result.stdout, error)


async def _conversation(pool: AsyncPool, turns: list[str], gate: asyncio.Semaphore) -> list[Outcome]:
    async with gate:
        checkpoint: bytes | None = None
        outcomes = []
        for code in turns:
            async with pool.checkout() as session:  # a new worker process in process mode
                if checkpoint is not None:
                    await session.load_session(checkpoint)
                outcomes.append(_outcome(await session.run(code, external_lookup=TOOLS)))
                checkpoint = await session.dump()
        return outcomes


async def _run_corpus(mode: str) -> dict[str, list[Outcome] | BaseException]:
    gate = asyncio.Semaphore(CONCURRENCY)
    pool = AsyncPool(
        "memory://",
        isolation=mode,
        policy=Policy.process_default(),
        min_warm_workers=CONCURRENCY,
        max_workers=CONCURRENCY + 2,
    )
    async with pool:
        results = await asyncio.gather(
            *(_conversation(pool, turns, gate) for _, turns in CORPUS), return_exceptions=True
        )
    return {name: result for (name, _), result in zip(CORPUS, results, strict=True)}


_outcomes: dict[str, dict[str, list[Outcome] | BaseException]] = {}


def outcomes(mode: str) -> dict[str, list[Outcome] | BaseException]:
    """Every conversation's outcomes in ``mode``, run once (concurrently) and kept for the tests."""
    if mode not in _outcomes:
        _outcomes[mode] = asyncio.run(_run_corpus(mode))
    return _outcomes[mode]


def _cases() -> list[Any]:
    cases = []
    for mode in MODES:
        for name, turns in CORPUS:
            cases.append(pytest.param(mode, name, turns, id=f"{mode}-{name}"))
    return cases


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 100 and len({name for name, _ in CORPUS}) == len(CORPUS)
    assert all(len(turns) >= 2 for _, turns in CORPUS)


@pytest.mark.parametrize(("mode", "name", "turns"), _cases())
def test_conversation_behaves_as_in_cpython(mode: str, name: str, turns: list[str]) -> None:
    got = outcomes(mode)[name]
    if isinstance(got, BaseException):
        raise got
    expected = reference(turns)
    for number, (want, have) in enumerate(zip(expected, got, strict=True), 1):
        assert have.error == want.error, f"turn {number}: {have.error} instead of {want.error}"
        assert have.stdout == want.stdout, f"turn {number}"
        assert have.value == want.value, f"turn {number}: {have.value!r} instead of {want.value!r}"


# ------------------------------------------------------------------ new host processes

_NEW_HOST = ["class_with_methods_next_turn", "decimal_invoice", "namedtuple_records", "gather_prices"]

_TURN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from snapcell import Pool, Policy
    from tests.corpus.conversations import CORPUS, TOOLS

    store, state_file, number = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    conversations = dict(CORPUS)
    report = {}
    with Pool(store, isolation="inline", policy=Policy.process_default(), create_store=True) as pool:
        for name in sys.argv[4:]:
            turns = conversations[name]
            if number >= len(turns):
                continue
            with pool.checkout() as session:
                if name in state:
                    session.load_session(bytes.fromhex(state[name]))
                result = session.run(turns[number], external_lookup=TOOLS)
                state[name] = session.dump().hex()
            report[name] = [repr(result.value), result.stdout, result.error.exc_type if result.error else None]
    state_file.write_text(json.dumps(state))
    print(json.dumps(report))
    """
)


def test_conversations_survive_new_host_processes(tmp_path: Path) -> None:
    store, state = f"file://{tmp_path / 'store'}", tmp_path / "state.json"
    conversations = dict(CORPUS)
    expected = {name: reference(conversations[name]) for name in _NEW_HOST}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for number in range(max(len(conversations[name]) for name in _NEW_HOST)):
        done = subprocess.run(
            [sys.executable, "-c", _TURN_SCRIPT, store, str(state), str(number), *_NEW_HOST],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        for name, (value, stdout, error) in report.items():
            want = expected[name][number]
            assert (error, stdout, value) == (want.error, want.stdout, repr(want.value)), f"{name} turn {number + 1}"
