"""Pause a run at a host call and resume it anywhere: by replay of its log of host calls, clocks and random sources."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import snapcell
from snapcell import Pool, ResumeDiverged, SessionError

KEY = "pause-test-key-0123456789abcdef0123456789"

# Host calls, output and random draws before the pause; more of each after it.
CELL = """
import datetime, random, secrets, time, uuid
order = fetch("o-1")
drawn = [random.random() for _ in range(3)]
token = f"{uuid.uuid4()} {secrets.token_hex(8)} {time.time()} {datetime.datetime.now()} {time.monotonic()}"
print("before the pause", token)
try:
    answer = approve(order["total"], reason="refund")
except Exception:
    answer = "swallowed"  # the pause is no Exception: this never runs
print("answered", answer)
after = [random.random() for _ in range(3)]
note(answer)
{"order": order, "answer": answer, "drawn": drawn, "after": after, "token": token}
"""


class Host:
    """Host functions that count their calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def lookup(self) -> dict[str, Any]:
        def fetch(order_id: str) -> dict[str, Any]:
            self.calls.append(("fetch", order_id))
            return {"id": order_id, "total": 42}

        def note(text: Any) -> None:
            self.calls.append(("note", text))

        return {"fetch": fetch, "note": note}


@pytest.fixture(scope="module", params=["inline", "process"])
def pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A pool over a file store another process can open (its signing key is `KEY`), one per isolation mode."""
    root = tmp_path_factory.mktemp(f"pause-{request.param}")
    with Pool(f"file://{root}", signing_keys=[KEY], isolation=request.param) as pool:
        pool.root = root  # type: ignore[attr-defined]
        yield pool


def _resume_elsewhere(root: Path, checkpoint_id: bytes, answer: Any) -> dict[str, Any]:
    """Resume a paused checkpoint in another Python process; what it reports as JSON."""
    script = textwrap.dedent(
        f"""
        import json, snapcell
        calls = []
        lookup = {{"fetch": lambda order_id: calls.append(("fetch", order_id)),
                   "note": lambda text: calls.append(("note", text))}}
        with snapcell.Pool({f"file://{root}"!r}, signing_keys=[{KEY!r}], isolation="inline") as pool:
            with pool.checkout() as session:
                session.load_session({checkpoint_id.hex()!r})
                paused = session.paused
                result = session.resume({answer!r}, external_lookup=lookup)
        print(json.dumps({{"value": result.value, "stdout": result.stdout, "status": result.status,
                           "calls": calls, "paused": [paused.name, list(paused.args), paused.kwargs]}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    reported: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reported


def test_a_paused_run_resumes_in_another_process(pool: Pool) -> None:
    host = Host()
    with pool.checkout() as session:
        session.run("base = 1")
        paused = session.run(CELL, external_lookup=host.lookup(), pausing={"approve"})
        assert paused.status == "paused" and paused.error is None and paused.value is None
        assert paused.paused == snapcell.interpreter.PausedCall(name="approve", args=(42,), kwargs={"reason": "refund"})
        assert paused.stdout.startswith("before the pause ")
        assert paused.inputs is not None
        seed = paused.inputs["seed"]
        checkpoint_id = session.dump()
    assert host.calls == [("fetch", "o-1")]

    resumed = _resume_elsewhere(pool.root, checkpoint_id, "yes")  # type: ignore[attr-defined]
    assert resumed["paused"] == ["approve", [42], {"reason": "refund"}]
    assert resumed["status"] == "ok"
    value = resumed["value"]
    assert value["order"] == {"id": "o-1", "total": 42} and value["answer"] == "yes"
    # fetch ran once in all (here, before the pause); note, after it, ran once (there).
    assert host.calls == [("fetch", "o-1")]
    assert resumed["calls"] == [["note", "yes"]]
    # The draws of one uninterrupted run with the recorded seed: the replayed ones, then the live ones.
    uninterrupted = random.Random(seed)
    assert value["drawn"] == [uninterrupted.random() for _ in range(3)]
    assert value["after"] == [uninterrupted.random() for _ in range(3)]
    # Printed once; the replay read the same uuid, secrets and clocks.
    assert resumed["stdout"] == paused.stdout + "answered yes\n"
    assert paused.stdout == f"before the pause {value['token']}\n"


def test_two_pauses_in_one_cell_an_error_answer_and_the_namespace(pool: Pool) -> None:
    host = Host()
    cell = """
import time
first = fetch("a")
stamp = time.time()
try:
    one = approve("first")
except ValueError as exc:
    one = f"refused: {exc}"
two = approve("second", stamp=stamp)
total = [first["total"], one, two]
total
"""
    with pool.checkout() as session:
        session.run("kept = 'yes'")
        first = session.run(cell, external_lookup=host.lookup(), pausing={"approve"})
        assert first.paused is not None and first.paused.args == ("first",)
        with pytest.raises(SessionError, match="paused at approve"):
            session.run("1 + 1")
        pid = session.dump()

    with pool.checkout() as session:
        session.load_session(pid)
        second = session.resume(error=ValueError("over the limit"), external_lookup=host.lookup())
        assert second.status == "paused" and second.paused is not None
        assert second.paused.args == ("second",)
        stamp = second.paused.kwargs["stamp"]
        pid = session.dump()

    with pool.checkout() as session:
        session.load_session(pid)
        done = session.resume(7, external_lookup=host.lookup())
        assert done.status == "ok", done.error
        assert done.value == [42, "refused: over the limit", 7]
        assert session.run("(kept, stamp)").value == ("yes", stamp)  # the clock read before the pauses, replayed
        assert session.paused is None
    assert host.calls == [("fetch", "a")]


def test_resume_in_the_same_session_and_at_its_first_pause(pool: Pool) -> None:
    host = Host()
    with pool.checkout() as session:
        result = session.run(CELL, external_lookup=host.lookup(), pausing={"approve"})
        assert result.status == "paused"
        done = session.resume("ok", external_lookup=host.lookup())
        assert done.status == "ok" and done.value["answer"] == "ok"
        assert done.stdout.count("before the pause") == 1 and done.stdout.startswith(result.stdout)
        assert session.run("answer").value == "ok"
    assert host.calls == [("fetch", "o-1"), ("note", "ok")]


def test_a_replay_whose_host_call_arguments_differ_diverges(pool: Pool) -> None:
    host = Host()
    # A random.Random() seeded by the OS is not replayed: the replay calls fetch with another number.
    cell = "import random\nfetch(random.Random().random())\napprove('go')"
    with pool.checkout() as session:
        assert session.run(cell, external_lookup=host.lookup(), pausing={"approve"}).status == "paused"
        pid = session.dump()
        with pytest.raises(ResumeDiverged, match="host call 1: the log has fetch") as caught:
            session.resume(True, external_lookup=host.lookup())
        assert caught.value.call_index == 0
        assert session.paused is not None and session.checkpoint_id == pid  # still paused where it was
        assert session.dump() != pid  # a paused session dumps its paused run again
    assert len(host.calls) == 1


def test_a_replay_that_ends_before_the_paused_call_diverges(pool: Pool) -> None:
    host = Host()
    with pool.checkout() as session:
        assert session.run("fetch('x')\napprove(1)", external_lookup=host.lookup(), pausing={"approve"}).paused
        pause = session._inner._paused  # the cell as a checkpoint of another version would hold it
        session._inner._paused = dataclasses.replace(pause, cell="fetch('x')\n'no approval'")
        pid = session.dump()
    with pool.checkout() as session:
        session.load_session(pid)
        with pytest.raises(ResumeDiverged, match=r"ended before the paused call approve\(\)"):
            session.resume(True, external_lookup=host.lookup())
        assert session.paused is not None
        with pytest.raises(ResumeDiverged):  # and again: the namespace went back to the cell's start
            session.resume(True, external_lookup=host.lookup())
    assert host.calls == [("fetch", "x")]


def test_fork_a_paused_checkpoint_and_resume_both(pool: Pool) -> None:
    host = Host()
    with pool.checkout() as session:
        session.run("result = None\nresult = 'yes' if approve('deploy') else 'no'", pausing={"approve"})
        pid = session.dump()
    answers = {}
    for answer in (True, False):
        with pool.checkout() as session:
            session.load_session(pid)
            assert session.resume(answer, external_lookup=host.lookup()).ok
            answers[answer] = session.run("result").value
    assert answers == {True: "yes", False: "no"}


def test_the_pause_goes_through_gather_and_tasks(pool: Pool) -> None:
    async def lookup_async(key: str) -> str:
        return key.upper()

    cell = """
import asyncio
async def step(i):
    return await look(f"k{i}")
found = await asyncio.gather(step(1), step(2))
try:
    verdict = await asyncio.gather(approve(found), step(3))
except Exception:
    verdict = "swallowed"
[found, verdict]
"""
    with pool.checkout() as session:
        paused = session.run(cell, external_lookup={"look": lookup_async, "approve": lookup_async}, pausing={"approve"})
        assert paused.status == "paused" and paused.paused is not None
        assert paused.paused.args == (["K1", "K2"],)
        done = session.resume("fine", external_lookup={"look": lookup_async, "approve": lookup_async})
        assert done.value == [["K1", "K2"], ["fine", "K3"]]


def test_resume_without_a_pause_and_bad_answers_are_refused(pool: Pool) -> None:
    with pool.checkout() as session:
        with pytest.raises(SessionError, match="nothing to resume"):
            session.resume(True)
        with pytest.raises(snapcell.ConfigError):
            session.run("1", pausing="approve")
        assert session.run("approve(1)", pausing={"approve"}).status == "paused"
        with pytest.raises(snapcell.ConfigError, match="plain data"):
            session.resume(object())
        assert session.resume(2).ok


def test_old_checkpoints_have_no_paused_field() -> None:
    manifest = snapcell.checkpoint.Manifest(created_at=1.0, python="3.11", libraries={}, variables=[])
    assert b"paused" not in manifest.to_json()


def test_a_recorded_clock_kept_in_the_namespace_is_the_live_one_after_a_load(pool: Pool) -> None:
    with pool.checkout() as session:
        session.run("base = 1")
        result = session.run("import datetime\nnow = datetime.datetime.now\nfirst = now()", pausing={"approve"})
        assert result.status == "ok", result.error
        checkpoint_id = session.dump()
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        assert session.run("now() >= first, 'recorded' in repr(now)").value == (True, False)


# Twenty strings: two hash seeds put them in one set order about never (a chance near 1 in 20!).
WORDS = [f"word-{i}" for i in range(20)]
SET_CELL = f"""
order = list({{{", ".join(map(repr, WORDS))}}})
print(order)
note(order)  # a host call whose arguments follow the set order
approve(len(order))
order
"""


# Process mode only: inline mode runs in the host process, whose hash seed was fixed when it started (the inline
# pause records none: test_an_inline_pause_records_no_hash_seed_and_a_seed_out_of_range_is_refused).
@pytest.mark.parametrize("pool", ["process"], indirect=True)
def test_a_resume_in_a_fresh_pool_orders_sets_of_strings_as_the_paused_run_did(pool: Pool) -> None:
    host = Host()
    with pool.checkout() as session:
        paused = session.run(SET_CELL, external_lookup=host.lookup(), pausing={"approve"})
        assert paused.status == "paused", paused.error
        pid = session.dump()
        assert session.manifest is not None and session.manifest.paused is not None
        seed = session.manifest.paused.hash_seed  # the paused checkpoint records the run's hash seed
    (order,) = (text for name, text in host.calls if name == "note")
    assert paused.stdout == f"{order}\n"
    assert _set_order(seed) == order  # it is the seed the run hashed with

    # A fresh pool is a host of its own: its zygote hashes strings with another seed.
    root = pool.root  # type: ignore[attr-defined]
    with Pool(f"file://{root}", signing_keys=[KEY], isolation="process", min_warm_workers=0) as fresh:
        with fresh.checkout() as session:
            assert session.feed_run(SET_CELL.splitlines()[1] + "\norder") != order  # its own workers' order
            session.load_session(pid)
            resumed = session.resume("yes", external_lookup=host.lookup())
            assert resumed.status == "ok", resumed.error
            assert resumed.value == order and resumed.stdout == paused.stdout
            assert not any("another seed" in note for note in resumed.notes), resumed.notes
            assert session.run("order").value == order
    assert host.calls == [("note", order)]  # before the pause only: the resume replayed it


def _set_order(seed: Any) -> list[str]:
    """``list`` of the cell's set in an interpreter that hashes with ``seed``."""
    done = subprocess.run(
        [sys.executable, "-c", f"import json\n{SET_CELL.splitlines()[1]}\nprint(json.dumps(order))"],
        env={"PYTHONHASHSEED": str(seed)},
        capture_output=True,
        text=True,
        check=True,
    )
    order: list[str] = json.loads(done.stdout)
    return order


def test_an_inline_pause_records_no_hash_seed_and_a_seed_out_of_range_is_refused() -> None:
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        assert session.run("approve(1)", pausing={"approve"}).status == "paused"
        session.dump()
        assert session.manifest is not None and session.manifest.paused is not None
        assert session.manifest.paused.hash_seed is None  # the host process's seed: not known, not chosen
    paused = snapcell.checkpoint.PausedRun(cell="approve(1)", log="{}", hash_seed=2**32 - 1)
    for seed in (-1, 2**32, "7", 7.0, True):
        record = paused.model_dump_json().replace(f'"hash_seed":{2**32 - 1}', f'"hash_seed":{json.dumps(seed)}')
        with pytest.raises(snapcell.CheckpointCorrupt, match=r"at paused\.hash_seed: Input should be"):
            snapcell.checkpoint.parse_manifest(
                f'{{"created_at":1.0,"python":"3.11","libraries":{{}},"variables":[],"paused":{record}}}'.encode()
            )
