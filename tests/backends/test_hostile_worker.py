"""A compromised worker: whatever it sends, the host answers with a snapcell error, in bounded time and memory.

Part one drives the real host code (`WorkerPool`, `WorkerProcess`, `ProcessBackend`) against a fake worker
(`fake_worker.py`, started in place of ``python -s -P -m snapcell.worker._worker``) that sends malformed,
oversized and lying frames. Part two takes over a real worker from inside a script (the unrestricted policy
lets a script reach the worker's channel) and replays the attacks on a worker end to end, in process mode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapcell import Limits, Policy, Pool, ScriptError, SessionError, WorkerLost
from snapcell.backends._backend import DumpRequest, LoadRequest, RunRequest
from snapcell.backends._procbackend import ProcessBackend
from snapcell.backends._stderrtail import KEEP_BYTES, StderrTail
from snapcell.backends._workerpool import WorkerOptions, WorkerPool
from snapcell.checkpoint import DroppedVariable, Manifest

FAKE = str(Path(__file__).with_name("fake_worker.py"))
MIB = 1024 * 1024
# The host may hold this much more, at its peak, while a fake worker claims gigabytes and sends megabytes.
MEMORY_BOUND = 64 * MIB
# A hang guard, not a timing bound: far above every deadline below (the longest is a dump's 20 s + 5 s grace + 1 s),
# and below pytest-timeout's 120 s so that a hang fails its own test with a clear error.
HANG_GUARD_S = 90.0
# Deadlines no answer comes near, however loaded the machine: an attack is judged by what the host reads, not by
# how fast the fake worker makes and sends it (twelve million notes, a 200 MiB memory hog).
LIMITS = Limits(
    wall_time_s=20.0,
    grace_s=5.0,
    max_host_calls=5,
    dump_time_s=20.0,
    load_time_s=20.0,
    memory_bytes=256 * MIB,
)
# The attacks that never answer in time: only the host's deadline ends them, so it may be short (load only makes
# them later still).
DEADLINE_ATTACKS = ("reply_after_the_deadline", "stall_mid_frame", "slow_loris")
SHORT_LIMITS = dataclasses.replace(LIMITS, wall_time_s=0.5, grace_s=0.5)
LOST = (WorkerLost, None)
# What the host parsed from the body it verified (the load driver passes it), and what a lying worker says instead.
HOST_MANIFEST = Manifest(created_at=0.0, python="3.11", libraries={}, variables=[])
FORGED_MANIFEST = HOST_MANIFEST.model_copy(
    update={"dropped": [DroppedVariable(name="forged", type_name="int", reason="made up by the worker")]}
)

# attack: (error expected, a text it must contain); None when the attack gets a checked answer instead.
EXPECTED: dict[str, tuple[type[Exception], str | None] | None] = {
    "length_2_pow_40": (WorkerLost, "1,099,511,627,776-byte message"),
    "length_over_the_run_budget": (WorkerLost, "67,108,864-byte message"),
    "truncated_frame_then_eof": (WorkerLost, None),
    "garbage_json": (WorkerLost, "malformed"),
    "deep_nesting": (WorkerLost, "malformed"),
    "huge_item_count": (WorkerLost, "items"),
    "empty_containers_within_bytes": (WorkerLost, "items"),
    "wrong_op_for_the_request": (WorkerLost, "malformed"),
    "reply_to_a_request_never_sent": (WorkerLost, "malformed"),
    "unknown_error_class": (ScriptError, "bye"),
    "error_with_enormous_message": None,
    "twelve_million_notes": (WorkerLost, "-byte message"),
    "notes_over_the_count": (WorkerLost, "notes"),
    "giant_value": (WorkerLost, "-byte message"),
    "value_that_claims_plain_type_but_is_not": (WorkerLost, "unknown tag"),
    "interleaved_replies": None,
    "reply_after_the_deadline": (WorkerLost, "did not stop within"),
    "stall_mid_frame": (WorkerLost, "did not stop within"),
    "slow_loris": (WorkerLost, "did not stop within"),
    "stderr_flood_with_memoryerror": (WorkerLost, "it crashed"),
    "exit_with_a_fake_exit_code": (WorkerLost, "it crashed"),
    "closing_the_socket_mid_run": (WorkerLost, "it crashed"),
    "dies_after_filling_its_memory": (WorkerLost, "ran out of memory"),
    "blob_on_a_run_reply": (WorkerLost, "announced a 4,294,967,296-byte blob"),
    "host_call_for_a_function_not_offered": None,
    "host_calls_beyond_the_budget": (WorkerLost, "max_host_calls"),
    "host_call_with_huge_args": (WorkerLost, "host-function call where at most"),
    "host_call_args_not_a_list": (WorkerLost, "arguments"),
    "host_call_outside_a_run": (WorkerLost, "outside a run"),
    "blob_claims_more_than_it_sends": (WorkerLost, None),
    "blob_over_the_budget": (WorkerLost, "announced"),
    "blob_sizes_that_do_not_add_up": (WorkerLost, "add up"),
    "negative_blob_size": (WorkerLost, "non-negative ints"),
    "float_blob_size": (WorkerLost, "non-negative ints"),
    "bool_blob_size": (WorkerLost, "non-negative ints"),
    "duplicate_blob_refs": (WorkerLost, "named twice"),
    "blob_count_beyond_the_budget": (WorkerLost, "at most 65536"),
    "manifest_with_millions_of_items": (WorkerLost, "-byte message where at most"),
    "loaded_with_a_forged_manifest": None,
    "dumped_manifest_with_millions_of_items": (WorkerLost, "manifest holds more than"),
    "garbage_instead_of_started": (SessionError, None),
    "ready_with_a_sandbox_that_is_not_a_dict": (SessionError, "failed to start"),
}
DRIVER = {
    "host_call_outside_a_run": "dump",
    "manifest_with_millions_of_items": "load",
    "loaded_with_a_forged_manifest": "load",
    "dumped_manifest_with_millions_of_items": "dump",
    "garbage_instead_of_started": "start",
    "ready_with_a_sandbox_that_is_not_a_dict": "start",
}


def _driver(attack: str) -> str:
    if attack.startswith(("blob_", "negative_blob", "float_blob", "bool_blob", "duplicate_blob")):
        return "run" if attack == "blob_on_a_run_reply" else "dump"
    return DRIVER.get(attack, "run")


@pytest.fixture(scope="module")
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def _setting(attack: str) -> tuple[Limits, list[str]]:
    """The limits an attack runs under, and the words after the fake worker's name."""
    if attack in DEADLINE_ATTACKS:
        return SHORT_LIMITS, [attack]
    if attack == "loaded_with_a_forged_manifest":
        return LIMITS, [attack, FORGED_MANIFEST.model_dump_json()]
    if attack != "dies_after_filling_its_memory":
        return LIMITS, [attack]
    # A child's peak RSS starts at the host's (inherited across fork and exec): the fake must go well past it,
    # and past 75 % of its memory limit, for its death to be its own memory's doing.
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hog = max(200 * MIB, host_peak + 64 * MIB)
    return dataclasses.replace(LIMITS, memory_bytes=hog * 10 // 9), [attack, str(hog)]


async def _attack(attack: str, recorded: list[Any]) -> tuple[Any, int | None]:
    """Run one attack against the real host code; its outcome (or error) and the fake worker's exit status."""

    def record(*args: Any) -> int:
        recorded.append(args)
        return 1

    limits, words = _setting(attack)
    pool = WorkerPool(
        WorkerOptions(
            min_warm=0,
            max_workers=1,
            checkout_timeout_s=HANG_GUARD_S,
            worker_command=(sys.executable, "-I", FAKE, *words),
        )
    )
    backend = ProcessBackend(pool, policy=Policy(), limits=limits)
    try:
        if _driver(attack) == "start":
            return await _outcome(backend.start()), None
        await backend.start()
        worker = backend.worker
        assert worker is not None and worker.process is not None
        if _driver(attack) == "dump":
            outcome = await _outcome(
                backend.dump(DumpRequest(created_at=0.0, level=1, on_unpicklable="skip", known_blobs={}))
            )
        elif _driver(attack) == "load":
            outcome = await _outcome(backend.load(LoadRequest(body=b"body", blobs={}, manifest=HOST_MANIFEST)))
        else:
            run = backend.run(RunRequest(code="x", lookup={"record": record}, setup=False, limits=limits))
            outcome = await _outcome(run)
            if attack == "interleaved_replies":
                again = backend.run(RunRequest(code="x", lookup={}, setup=False, limits=limits))
                outcome = (outcome, await _outcome(again))
        exit_status = worker.process.poll()
        # The pool is not wedged by what happened: the session gets a new worker.
        await backend.discard()
        await backend.start()
        assert backend.worker is not None and backend.worker is not worker and not backend.worker.dead
        return outcome, exit_status
    finally:
        await pool.close()


async def _outcome(awaitable: Any) -> Any:
    try:
        return await awaitable
    except Exception as exc:
        return exc


@pytest.mark.parametrize("attack", list(EXPECTED))
def test_a_lying_worker_gets_a_clear_error_within_a_deadline_and_a_memory_bound(traced: None, attack: str) -> None:
    recorded: list[Any] = []
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    # The deadline is the host's: the stalling attacks must end in its "did not stop within" WorkerLost (below).
    outcome, exit_status = asyncio.run(asyncio.wait_for(_attack(attack, recorded), HANG_GUARD_S))
    _, peak = tracemalloc.get_traced_memory()
    assert peak - before < MEMORY_BOUND, f"the host held {(peak - before) / MIB:.0f} MiB more"
    expected = EXPECTED[attack]
    if expected is None:
        _check_answer(attack, outcome, recorded)
        return
    kind, text = expected
    assert isinstance(outcome, kind), outcome
    if text is not None:
        assert text in str(outcome), str(outcome)
    if isinstance(outcome, WorkerLost):
        # The host killed the worker itself (or saw it die): it is gone, not left running.
        assert exit_status is not None
        if attack == "dies_after_filling_its_memory":
            assert outcome.reason == "memory"  # its peak RSS, as the kernel reports it to the host
        else:
            assert outcome.reason in ("crash", "timeout")  # nothing a worker writes makes it a memory death
    if attack == "host_calls_beyond_the_budget":
        assert len(recorded) <= LIMITS.max_host_calls  # type: ignore[operator]
    elif attack.startswith("host_call"):
        assert recorded == []


def _check_answer(attack: str, outcome: Any, recorded: list[Any]) -> None:
    if attack == "error_with_enormous_message":
        # Within the run's budget, so it is read, but what the caller gets is cut to a readable size.
        assert isinstance(outcome, ScriptError) and not isinstance(outcome, WorkerLost)
        assert len(str(outcome)) < 20_000 and len(outcome.hint) < 20_000
    elif attack == "host_call_for_a_function_not_offered":
        assert outcome.error is None and outcome.value in ((1, "NameError"), [1, "NameError"])
        assert recorded == []
    elif attack == "loaded_with_a_forged_manifest":
        # The worker's account of the checkpoint (a dropped variable it made up) is not what the host keeps.
        assert outcome is HOST_MANIFEST and outcome.dropped == []
    elif attack == "interleaved_replies":
        first, second = outcome
        assert first.value == 1
        assert isinstance(second, WorkerLost) and "no request asked for" in str(second)


def test_the_fake_worker_knows_every_attack_in_the_table() -> None:
    """The table and the fake worker stay in step (an attack missing from either would not be tested)."""
    source = Path(FAKE).read_text()
    for attack in EXPECTED:
        assert f'@attack("{attack}"' in source
    assert len(EXPECTED) >= 25


def test_after_the_attacks_a_real_session_works() -> None:
    with Pool("memory://", isolation="process", min_warm_workers=0) as pool, pool.checkout() as session:
        session.feed_run("x = 20")
        checkpoint = session.dump()
        session.load_session(checkpoint)
        assert session.feed_run("x + 22") == 42
    assert _fake_workers_left() == []  # every fake worker was killed and reaped, whatever it did


def _fake_workers_left() -> list[tuple[int, str]]:
    """Processes (zombies too) still running the fake worker, with their state."""
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and FAKE.encode() in (entry / "cmdline").read_bytes():
                left.append((int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]))
        except OSError:
            continue  # gone meanwhile
    return left


# ---------------------------------------------------------------- the attacks on a worker, end to end

UNRESTRICTED = Policy.unrestricted()
# Process-mode limits; three host calls a run. The hang tests wait for the dump and load limits, so these are no
# longer than a loaded machine needs for the small dumps and loads the same sessions make (a quarter of
# dump_time_s bounds each frame's trial restore).
E2E_LIMITS = Limits(wall_time_s=10.0, grace_s=1.0, dump_time_s=4.0, load_time_s=4.0, max_host_calls=3)
# Current RSS of the host may grow this much over an attack that claims (or sends) far more.
RSS_BOUND = 64 * MIB

# The worker's module is __main__ in a spawned worker and snapcell.worker._worker in one forked from a zygote.
_SEND = """
import gc, sys
channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "_send_lock"))
worker = sys.modules[type(channel).__module__]
payload = {payload}
with channel._send_lock:
    channel._sock.sendall(worker.FRAME.pack({length}, 0) + payload)
"""


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def plain_pool() -> Iterator[Pool]:
    """A process-mode pool with the default policy: the script only defines classes, as any model may."""
    with Pool("memory://", isolation="process", limits=E2E_LIMITS, min_warm_workers=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def hijack_pool() -> Iterator[Pool]:
    """A process-mode pool whose scripts may reach the worker's own objects, to play a compromised worker."""
    with Pool("memory://", isolation="process", policy=UNRESTRICTED, limits=E2E_LIMITS, min_warm_workers=1) as pool:
        yield pool


def _lost_and_restored(pool: Pool, attack: str, match: str) -> WorkerLost:
    """Run ``attack`` in a session with a checkpoint; it must lose the worker, and the session must go on."""
    rss_before = _rss()
    with pool.checkout() as session:
        session.feed_run("kept = 'from the checkpoint'")
        session.dump()
        with pytest.raises(WorkerLost, match=match) as lost:
            session.feed_run(attack)
        assert session.feed_run("kept") == "from the checkpoint"
    assert _rss() - rss_before < RSS_BOUND
    return lost.value


def test_a_reply_frame_longer_than_the_run_budget_is_refused_unread(hijack_pool: Pool) -> None:
    # 200 MiB really sent: under the old fixed cap of 256 MiB, it was read, buffered and decoded whole.
    attack = _SEND.format(payload='b\'{"op":"ran","stdout":"\' + b\'x\' * (200 * 2**20)', length="len(payload)")
    lost = _lost_and_restored(hijack_pool, attack, "-byte message where at most")
    assert lost.reason == "crash"


def test_a_ran_reply_with_twelve_million_notes_is_refused(hijack_pool: Pool) -> None:
    payload = 'b\'{"op":"ran","notes":[\' + b\'"",\' * 12_000_000 + b\'""]}\''
    attack = _SEND.format(payload=payload, length="len(payload)")
    _lost_and_restored(hijack_pool, attack, "-byte message where at most")


def test_an_oversized_value_comes_back_as_its_repr_with_a_note(hijack_pool: Pool) -> None:
    with hijack_pool.checkout() as session:
        big = session.run("'v' * (8 * 2**20)")
        many = session.run("list(range(1_000_000))")
        fine = session.run("list(range(1000))")
    for result in (big, many):
        assert result.error is None and result.value is None
        assert result.value_repr is not None and len(result.value_repr) < 17 * 1024  # capped as before
        assert any("max_value_bytes" in note for note in result.notes), result.notes
    assert fine.value == list(range(1000))


def test_host_call_arguments_over_the_value_limit_fail_in_the_script(hijack_pool: Pool) -> None:
    seen: list[int] = []

    def record(data: object) -> int:
        seen.append(len(data))  # type: ignore[arg-type]
        return 1

    with hijack_pool.checkout() as session:
        result = session.run("record('a' * (2 * 2**20))", external_lookup={"record": record})
        assert result.error is not None and result.error.limit == "max_value_bytes"  # type: ignore[attr-defined]
        assert session.feed_run("record('small')", external_lookup={"record": record}) == 1
    assert seen == [5]


def test_host_calls_beyond_max_host_calls_are_refused_by_the_host(hijack_pool: Pool) -> None:
    calls: list[int] = []

    def record(n: int) -> int:
        calls.append(n)
        return n

    # The script switches off the worker's own count, as a compromised worker would.
    attack = (
        "import gc\n"
        "from snapcell.interpreter._host import CallCounter\n"
        "bridge = next(o for o in gc.get_objects() if type(o).__name__ == 'WorkerBridge')\n"
        "bridge._counter = CallCounter(None)\n"
        "for n in range(20):\n"
        "    record(n)\n"
    )
    rss_before = _rss()
    with hijack_pool.checkout() as session:
        with pytest.raises(WorkerLost, match="max_host_calls"):
            session.feed_run(attack, external_lookup={"record": record})
        assert session.feed_run("record(99)", external_lookup={"record": record}) == 99
    assert calls == [0, 1, 2, 99]
    assert _rss() - rss_before < RSS_BOUND


def test_memoryerror_written_to_stderr_does_not_make_an_out_of_memory_death(hijack_pool: Pool) -> None:
    # 32 MiB of "MemoryError" on the real stderr, then an exit: a crash, and only the tail is read.
    attack = "import os\nfor _ in range(512):\n    os.write(2, b'MemoryError\\n' * 5000)\nos._exit(1)"
    lost = _lost_and_restored(hijack_pool, attack, "crashed")
    assert lost.reason == "crash"


# Reserve 250 MiB behind fd 2 (on a file, that is the host's disk, at once), write 16 MiB through it, then die.
_STDERR_FLOOD = """
import os
try:
    os.posix_fallocate(2, 0, 250 * 2**20)
    reserved = "250 MiB reserved"
except OSError as exc:
    reserved = exc.errno
for _ in range(256):
    os.write(2, b"x" * 65536)
os.write(2, b"the worker's last words")
reserved
"""


def test_a_workers_stderr_costs_the_host_no_disk_and_its_tail_is_kept(
    hijack_pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="snapcell")
    with hijack_pool.checkout() as session:
        worker = session._inner._backend.worker
        assert worker is not None and worker.pid is not None and worker._stderr is not None
        # What the worker's fd 2 is, as the host sees it: a pipe, not a file on any disk of the host.
        assert os.readlink(f"/proc/{worker.pid}/fd/2").startswith("pipe:")
        reserved = session.feed_run(_STDERR_FLOOD)
        assert reserved != "250 MiB reserved" and isinstance(reserved, int), reserved
        assert worker._stderr.kept_bytes <= 2 * KEEP_BYTES + 64 * 1024  # 16 MiB went through; the tail stays
        assert worker._stderr.tail().endswith("the worker's last words")
        with pytest.raises(WorkerLost, match="crashed"):
            session.feed_run("import os\nos.write(2, b'x' * 10**6 + b'and its dying ones')\nos._exit(3)")
    # The host still says how a dead worker's stderr ended (in its log).
    ends = [r.getMessage() for r in caplog.records if "its stderr ends with" in r.getMessage()]
    assert ends and ends[-1].endswith("and its dying ones"), ends[-1:]


# A compromised worker's dump: the script puts its own ``forge`` (defined before this text) in the dump path of every
# Runner of the worker process. The host checks what arrives; a worker that sent a forgery is not trusted again.
_FORGE_DUMP = """
import gc
_runner = next(o for o in gc.get_objects() if type(o).__name__ == "Runner")
_real_dump = type(_runner).dump

def _forged_dump(self, **options):
    return forge(_real_dump(self, **options))

type(_runner).dump = _forged_dump
"""

# A body of one format-2 stream, in place of what the worker dumped.
_CRAFTED = """
def forge(dumped):
    from snapcell.checkpoint import Dumped, Manifest, VariableInfo, pack_container
    from snapcell.checkpoint._format import Codec, Header, SectionKind

    stream = make_stream()
    info = VariableInfo(name="x", type_name="str", size_bytes=len(stream), serializer="cloudpickle")
    manifest = Manifest(created_at=0.0, python="3", libraries={}, variables=[info])
    body = pack_container(Header(format_version=2), manifest, [(SectionKind.STREAM, Codec.RAW, len(stream), stream)])
    return Dumped(body=bytearray(body), manifest=manifest)
"""

# The stream that cost the host 0.4 s a repeat: a memoized 20,000-part dotted name, named again 1,000 times.
_LONG_NAME_STREAM = """
def make_stream():
    def text(value):
        raw = value.encode()
        return b"X" + len(raw).to_bytes(4, "little") + raw

    head = b"\\x80\\x04" + text("datetime") + b"\\x94" + text("datetime" + ".max" * 20_000) + b"\\x94" + b"00"
    return head + b"h\\x00h\\x01\\x93" * 1000 + b"0" * 1000 + b"N."
"""

# getattr('{0.__init__.__globals__[_os].environ}', 'format')(random.Random): the host's environment, read at an
# inline load of what a process-mode pool signed.
_FORMAT_STREAM = """
def make_stream():
    def text(value):
        raw = value.encode()
        return b"\\x8c" + bytes([len(raw)]) + raw

    def name(module, qualname):
        return text(module) + text(qualname) + b"\\x93"

    read = name("builtins", "getattr") + text("{0.__init__.__globals__[_os].environ}") + text("format") + b"\\x86R"
    return b"\\x80\\x04" + read + name("random", "Random") + b"\\x85R."
"""


def _a_forged_dump_is_refused(pool: Pool, forge: str, error: type[Exception], match: str) -> None:
    """Dump with ``forge`` in the worker's dump path: refused, nothing stored, the session and the next one work."""
    rss_before = _rss()
    with pool.checkout() as session:
        session.feed_run("kept = 'from the checkpoint'")
        session.dump()
        stored = sorted(info.key for info in pool.store.scan())
        session.feed_run(forge + _FORGE_DUMP)
        with pytest.raises(error, match=match):
            session.dump()
        assert sorted(info.key for info in pool.store.scan()) == stored  # nothing stored or signed
        assert session.feed_run("kept") == "from the checkpoint"
    with pool.checkout() as session:  # the next session works
        session.feed_run("n = 41")
        session.dump()
        assert session.feed_run("n + 1") == 42
    assert _rss() - rss_before < RSS_BOUND


def test_a_compromised_workers_dump_naming_another_conversations_blob_is_refused(hijack_pool: Pool) -> None:
    with hijack_pool.checkout() as other:  # another conversation's secret, stored as a blob
        other.feed_run("import numpy as np\nsecret = np.full(100_000, 7)")
        other.dump()
        assert other.manifest is not None and other.manifest.blobs
        stolen = [ref.model_dump() for ref in other.manifest.blobs]
    forge = f"""
STOLEN = {stolen!r}

def forge(dumped):
    from snapcell.checkpoint import BlobRef, Dumped, pack_container, parse_container

    container = parse_container(dumped.body)
    refs = [*container.manifest.blobs, *(BlobRef.model_validate(ref) for ref in STOLEN)]
    manifest = container.manifest.model_copy(update={{"blobs": refs}})
    sections = [(s.kind, s.codec, s.raw_size, s.data) for s in container.sections]
    body = pack_container(container.header, manifest, sections)
    return Dumped(body=body, manifest=manifest, new_blobs=dumped.new_blobs, refresh=dumped.refresh)
"""
    _a_forged_dump_is_refused(hijack_pool, forge, WorkerLost, "never loaded or wrote")


def test_a_compromised_workers_dump_that_would_stall_the_hosts_scan_is_refused_at_once(
    hijack_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcell.checkpoint import _rule
    from snapcell.errors import CheckpointRefused

    walks: list[str] = []
    real = _rule.inspect.getattr_static

    def counting(obj: object, attr: str, *default: object) -> object:
        walks.append(attr)
        return real(obj, attr, *default)

    monkeypatch.setattr(_rule.inspect, "getattr_static", counting)  # the host's walks of dotted names
    _a_forged_dump_is_refused(hijack_pool, _LONG_NAME_STREAM + _CRAFTED, CheckpointRefused, "too long")
    assert len(walks) <= 64, len(walks)  # the host's work: a few dotted names walked, not 20,000 parts 1,000 times


def test_a_compromised_workers_dump_calling_a_raw_formatter_is_never_signed(hijack_pool: Pool) -> None:
    from snapcell.errors import CheckpointRefused

    _a_forged_dump_is_refused(hijack_pool, _FORMAT_STREAM + _CRAFTED, CheckpointRefused, "format|getattr")


def test_a_spawned_workers_stderr_costs_the_host_no_disk_either() -> None:
    """The spawn path (no zygote) hands its worker a stderr of its own making: it must be the drained pipe too."""

    async def main() -> tuple[str, Any, int]:
        workers = WorkerPool(WorkerOptions(min_warm=0, max_workers=1, checkout_timeout_s=HANG_GUARD_S, zygote=False))
        backend = ProcessBackend(workers, policy=UNRESTRICTED, limits=E2E_LIMITS)
        try:
            await backend.start()
            worker = backend.worker
            assert worker is not None and worker.process is not None and worker.pid is not None
            assert worker._stderr is not None
            fd2 = os.readlink(f"/proc/{worker.pid}/fd/2")
            result = await backend.run(RunRequest(code=_STDERR_FLOOD, lookup={}, setup=False, limits=E2E_LIMITS))
            return fd2, result.value, worker._stderr.kept_bytes
        finally:
            await backend.discard()
            await workers.close()

    fd2, reserved, kept = asyncio.run(main())
    assert fd2.startswith("pipe:"), fd2
    assert reserved != "250 MiB reserved" and isinstance(reserved, int), reserved
    assert kept <= 2 * KEEP_BYTES + 64 * 1024


def test_a_stderr_tail_keeps_the_end_of_what_was_written() -> None:
    async def main() -> tuple[str, int]:
        tail = StderrTail()
        tail.watch()
        writer = os.fdopen(tail.write_fd, "wb", buffering=0)
        tail.write_fd = -1  # the writer owns it now
        try:
            for n in range(200):  # 200 chunks of 32 KiB, read as they come
                writer.write(b"%05d" % n + b"." * (32 * 1024 - 5))
                await asyncio.sleep(0)
            writer.write(b"the end")
        finally:
            writer.close()
        text = tail.tail(KEEP_BYTES)  # reads what is still in the pipe, to its end
        kept = tail.kept_bytes
        tail.close()
        assert tail.tail(10) == text[-10:]  # what was kept stays readable after close
        return text, kept

    text, kept = asyncio.run(main())
    assert len(text) == KEEP_BYTES and text.endswith("the end")
    assert "00199" in text and "00100" not in text
    assert kept <= 2 * KEEP_BYTES + 64 * 1024


_LOOPS_AT_DUMP = """
class Stuck:
    def __reduce__(self):
        while True:
            pass
stuck = Stuck()
"""

_C_LEVEL_AT_DUMP = """
class Busy:
    def __reduce__(self):
        return (int, (sum(range(10**15)),))
busy = Busy()
"""

# The dump restores each new frame to check it (with a class of its own, as a load makes); a __setstate__ that loops
# only in another worker passes that check and hangs only at load.
# Restores at once in the worker that dumps it (its trial restore draws the first number after seed 7) and loops in
# any other: a new worker draws from its own reseeded stream. (Comparing class ids is not enough: children forked from
# one zygote lay out their heaps alike, so a class re-created at load can land at the address it had.)
_LOOPS_AT_LOAD = """
import random
random.seed(7)
class Sleeper:
    def __getstate__(self):
        return {"n": 1}
    def __setstate__(self, state):
        while random.random() != Sleeper.expect:
            pass
Sleeper.expect = random.Random(7).random()
sleeper = Sleeper()
"""

_LOOPS_AT_TRIAL = """
class Sleeper:
    def __getstate__(self):
        return {"n": 1}
    def __setstate__(self, state):
        while True:
            pass
sleeper = Sleeper()
kept = [1, 2]
"""


def test_a_value_whose_restore_hangs_is_dropped_at_dump_and_named(plain_pool: Pool) -> None:
    with plain_pool.checkout() as session:
        session.feed_run(_LOOPS_AT_TRIAL)
        checkpoint = session.dump()
        manifest = session.manifest
    assert manifest is not None
    (dropped,) = manifest.dropped
    assert dropped.name == "sleeper" and "did not finish" in dropped.reason
    with plain_pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("kept, 'sleeper' in dir()") == ([1, 2], False)


@pytest.mark.parametrize("cell", [_LOOPS_AT_DUMP, _C_LEVEL_AT_DUMP], ids=["python-loop", "c-level-loop"])
def test_a_dump_that_hangs_is_stopped_and_the_session_restored(plain_pool: Pool, cell: str) -> None:
    pool = plain_pool
    with pool.checkout() as session:
        session.feed_run("kept = [1, 2]")
        session.dump()
        session.feed_run(cell)
        # The host's deadline stopped it (a C-level loop cannot stop itself; without that deadline it never returns).
        with pytest.raises(
            WorkerLost, match=r"dump did not finish within Limits\.dump_time_s \(plus grace_s: 5 s\)"
        ) as lost:
            session.dump()
        assert lost.value.reason == "timeout"
        # Restored from the last good checkpoint: the stuck object is gone, and dumping works again.
        assert session.feed_run("kept") == [1, 2]
        name = "stuck" if "stuck" in cell else "busy"
        gone = session.run(name).error
        assert gone is not None and gone.exc_type == "NameError"
        checkpoint = session.dump()
    with pool.checkout() as session:
        session.load_session(checkpoint)
        assert session.feed_run("kept") == [1, 2]


def test_a_checkpoint_that_hangs_at_load_is_reported_and_the_session_goes_on(plain_pool: Pool) -> None:
    pool = plain_pool
    with pool.checkout() as session:
        session.feed_run("good = 1")
        good = session.dump()
        session.feed_run(_LOOPS_AT_LOAD)
        bad = session.dump()
    with pool.checkout() as session:
        with pytest.raises(
            WorkerLost, match=r"load of the checkpoint did not finish within Limits\.load_time_s \(plus"
        ) as lost:
            session.load_session(bad)
        assert lost.value.reason == "timeout"
        assert session.feed_run("1 + 1") == 2  # the conversation is not stuck
        session.load_session(good)
        assert session.feed_run("good") == 1
