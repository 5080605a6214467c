"""Standard-library values kept as plain data: asyncio primitives and queues, StringIO/BytesIO, ZoneInfo.

Each survives a turn (dumped in one worker, loaded in a fresh one) in both isolation modes, also inside containers
and script objects, and a value two variables share stays one value. Their helpers take plain data that the rule
checks: a hand-written stream that calls one with wrong-typed, oversized or hostile arguments is refused by the
host's scan and by the loader (a checkpoint signed directly with the key), while the same stream with honest
arguments loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from snapcell import Policy, Pool
from snapcell.checkpoint import Keyring
from snapcell.checkpoint._stdvalues import MODULE, value_call_refusal
from snapcell.checkpoint.scan import scan_pickle
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore

from .helpers import KEY, crafted_body, sign_and_store

RULE = checkpoint_rule(Policy())


@pytest.fixture(scope="module", params=["inline", "process"])
def pool_and_store(request: pytest.FixtureRequest) -> Iterator[tuple[Pool, MemoryStore]]:
    store = MemoryStore()
    with Pool(store, signing_keys=[KEY], isolation=request.param) as pool:
        yield pool, store


@pytest.fixture
def pool(pool_and_store: tuple[Pool, MemoryStore]) -> Pool:
    return pool_and_store[0]


def next_turn(pool: Pool, first: str, second: str) -> Any:
    """Run ``first``, dump, load the checkpoint in a fresh session (a new worker in process mode), run ``second``."""
    with pool.checkout() as session:
        session.feed_run(first)
        checkpoint_id = session.dump()
        assert session.manifest is not None and session.manifest.dropped == [], session.manifest.dropped
    with pool.checkout() as session:
        session.load_session(checkpoint_id)
        result = session.run(second)
    assert result.error is None, result.error
    assert not result.notes, result.notes
    return result.value


# ------------------------------------------------------------------ round trips


def test_semaphores_keep_their_value_and_bound(pool: Pool) -> None:
    first = (
        "import asyncio\nsem = asyncio.Semaphore(3)\nbounded = asyncio.BoundedSemaphore(2)\n"
        "async def take():\n    await sem.acquire()\n    await bounded.acquire()\nawait take()"
    )
    second = (
        "async def use():\n    async with sem:\n        inner = sem.locked()\n    return inner\n"
        "async def over():\n    bounded.release()\n    try:\n        bounded.release()\n"
        "    except ValueError:\n        return 'bounded'\n"
        "(await use(), await use(), sem.locked(), bounded.locked(), await over())"
    )
    # sem: 2 left, so one acquire does not lock it; bounded: 1 left of 2, one release fills it, the next one fails.
    assert next_turn(pool, first, second) == (False, False, False, False, "bounded")


def test_an_exhausted_semaphore_stays_exhausted(pool: Pool) -> None:
    first = "import asyncio\nsem = asyncio.Semaphore(1)\nasync def take():\n    await sem.acquire()\nawait take()"
    assert next_turn(pool, first, "sem.locked(), sem.release(), sem.locked()") == (True, None, False)


def test_locks_and_events_keep_their_state(pool: Pool) -> None:
    first = (
        "import asyncio\nheld = asyncio.Lock()\nfree = asyncio.Lock()\n"
        "flag = asyncio.Event()\nquiet = asyncio.Event()\n"
        "async def hold():\n    await held.acquire()\nawait hold()\nflag.set()"
    )
    second = (
        "async def use():\n    async with free:\n        return free.locked()\n"
        "held.release()\n(held.locked(), await use(), free.locked(), flag.is_set(), quiet.is_set(), await flag.wait())"
    )
    assert next_turn(pool, first, second) == (False, True, False, True, False, True)


def test_a_condition_keeps_its_lock_shared(pool: Pool) -> None:
    first = "import asyncio\nlock = asyncio.Lock()\ncond = asyncio.Condition(lock)\nown = asyncio.Condition()"
    second = (
        "async def use():\n    async with cond:\n        a = lock.locked()\n        cond.notify_all()\n"
        "    async with own:\n        b = own.locked()\n    return a, b\nawait use()"
    )
    assert next_turn(pool, first, second) == (True, True)


def test_queues_keep_kind_maxsize_items_and_unfinished_tasks(pool: Pool) -> None:
    first = (
        "import asyncio\nfifo = asyncio.Queue(5)\nlifo = asyncio.LifoQueue()\nprio = asyncio.PriorityQueue()\n"
        "for n in [3, 1, 2]:\n    fifo.put_nowait(n)\n    lifo.put_nowait(n)\n    prio.put_nowait((n, f'job-{n}'))\n"
        "fifo.get_nowait()\nfifo.task_done()\nempty = asyncio.Queue()"
    )
    second = (
        "async def drain(q):\n    out = []\n    while not q.empty():\n        out.append(await q.get())\n"
        "        q.task_done()\n    await q.join()\n    return out\n"
        "(fifo.maxsize, fifo.qsize(), type(lifo).__name__, await drain(fifo), await drain(lifo), await drain(prio),"
        " empty.qsize(), await empty.join())"
    )
    value = next_turn(pool, first, second)
    assert value == (5, 2, "LifoQueue", [1, 2], [2, 1, 3], [(1, "job-1"), (2, "job-2"), (3, "job-3")], 0, None)


def test_a_queue_with_unfinished_tasks_is_not_joined(pool: Pool) -> None:
    first = "import asyncio\nq = asyncio.Queue()\nq.put_nowait('a')\nq.get_nowait()"
    second = (
        "async def joined():\n    try:\n        await asyncio.wait_for(q.join(), 0.01)\n        return True\n"
        "    except TimeoutError:\n        return False\n"
        "before = await joined()\nq.task_done()\n(before, await joined())"
    )
    assert next_turn(pool, first, second) == (False, True)


def test_string_and_bytes_buffers_keep_text_position_and_newline_mode(pool: Pool) -> None:
    first = (
        "import io\nlog = io.StringIO()\nlog.write('first\\n')\nraw = io.StringIO('a\\r\\nb', newline='')\n"
        "raw.seek(1)\nuni = io.StringIO('x\\r\\ny', newline=None)\ndata = io.BytesIO(b'\\x00\\x01\\x02')\n"
        "data.seek(1)\nempty = io.StringIO()"
    )
    second = (
        "log.write('second\\n')\n"
        "(log.getvalue(), raw.tell(), raw.read(), uni.getvalue(), data.tell(), data.read(), data.getvalue(),"
        " empty.getvalue())"
    )
    value = next_turn(pool, first, second)
    assert value == ("first\nsecond\n", 1, "\r\nb", "x\ny", 1, b"\x01\x02", b"\x00\x01\x02", "")


def test_zones_and_zoned_datetimes_survive(pool: Pool) -> None:
    first = (
        "from zoneinfo import ZoneInfo\nimport datetime\nberlin = ZoneInfo('Europe/Berlin')\n"
        "meeting = datetime.datetime(2024, 7, 1, 9, 30, tzinfo=ZoneInfo('America/New_York'))\n"
        "zones = {'utc': ZoneInfo('UTC'), 'list': [berlin]}"
    )
    second = (
        "(str(berlin), meeting.isoformat(), meeting.astimezone(berlin).hour, zones['list'][0] is berlin,"
        " datetime.datetime(2024, 1, 1, 12, tzinfo=zones['utc']).isoformat())"
    )
    value = next_turn(pool, first, second)
    assert value == ("Europe/Berlin", "2024-07-01T09:30:00-04:00", 15, True, "2024-01-01T12:00:00+00:00")


def test_shared_and_nested_values_stay_shared(pool: Pool) -> None:
    first = (
        "import asyncio, io\nq = asyncio.Queue()\nalias = q\njobs = {'queue': q, 'log': io.StringIO('x')}\n"
        "class Worker:\n    def __init__(self, queue, log):\n        self.queue = queue\n        self.log = log\n"
        "w = Worker(q, jobs['log'])\nsem = asyncio.Semaphore(1)\npair = [sem, (sem,)]"
    )
    second = (
        "q.put_nowait('job')\nw.log.write('y')\n"
        "(alias is q, jobs['queue'] is q, w.queue is q, w.log is jobs['log'], jobs['log'].getvalue(),"
        " alias.qsize(), pair[0] is pair[1][0] is sem)"
    )
    assert next_turn(pool, first, second) == (True, True, True, True, "y", 1, True)


def test_unkept_variants_are_still_dropped_and_named(pool: Pool) -> None:
    """A closed buffer and a queue holding a generator cannot be kept: dropped alone, named, the rest kept."""
    with pool.checkout() as session:
        session.feed_run(
            "import io, asyncio\nclosed = io.StringIO('t')\nclosed.close()\nq = asyncio.Queue()\n"
            "q.put_nowait(i for i in range(2))\nkept = io.StringIO('k')"
        )
        session.dump()
        assert session.manifest is not None
        assert sorted(d.name for d in session.manifest.dropped) == ["closed", "q"]
        assert "kept" in {v.name for v in session.manifest.variables}


# ------------------------------------------------------------------ crafted streams


def _s(text: str) -> bytes:
    raw = text.encode()
    return (b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + len(raw).to_bytes(4, "little")) + raw


def _helper(name: str) -> bytes:
    return _s(MODULE) + _s(name) + b"\x93"


def _call(func: bytes, *args: bytes) -> bytes:
    return func + b"(" + b"".join(args) + b"tR"


def _int(n: int) -> bytes:
    return b"J" + n.to_bytes(4, "little", signed=True)


def _list(*items: bytes) -> bytes:
    return b"](" + b"".join(items) + b"e"


def _bytes(data: bytes) -> bytes:
    return b"C" + bytes([len(data)]) + data


def _stream(body: bytes) -> bytes:
    return b"\x80\x05" + body + b"."


def _semaphore(spec: bytes) -> bytes:
    return _call(_helper("rebuild_semaphore"), spec)


# Per helper: an honest call (it must load), then hostile ones: wrong types, oversized numbers, and arguments that
# an unchecked helper would act on (a queue kind naming another asyncio class, a position past the end, a
# condition around a semaphore, more items than the queue's maxsize).
CALLS: dict[str, tuple[bytes, dict[str, bytes]]] = {
    "lock": (
        _call(_helper("rebuild_lock"), _s("locked")),
        {
            "number spec": _call(_helper("rebuild_lock"), _int(1)),
            "unknown spec": _call(_helper("rebuild_lock"), _s("locked; open")),
            "extra argument": _call(_helper("rebuild_lock"), _s("locked"), _s("unlocked")),
        },
    ),
    "event": (
        _call(_helper("rebuild_event"), _s("set")),
        {"bytes spec": _call(_helper("rebuild_event"), _bytes(b"set")), "no argument": _call(_helper("rebuild_event"))},
    ),
    "semaphore": (
        _semaphore(_s("BoundedSemaphore:1/2")),
        {
            "oversized value": _semaphore(_s("Semaphore:99999999999")),
            "above 2**31": _semaphore(_s("Semaphore:4294967296")),
            "value above its bound": _semaphore(_s("BoundedSemaphore:5/2")),
            "signed value": _semaphore(_s("Semaphore:+3")),
            "long spec": _semaphore(_s("Semaphore:" + "0" * 100)),
        },
    ),
    "condition": (
        _call(_helper("rebuild_condition"), _call(_helper("rebuild_lock"), _s("unlocked"))),
        {
            "around a semaphore": _call(_helper("rebuild_condition"), _semaphore(_s("Semaphore:1"))),
            "around a string": _call(_helper("rebuild_condition"), _s("lock")),
        },
    ),
    "queue": (
        _call(_helper("rebuild_queue"), _s("PriorityQueue:2:1"), _list(_int(1), _int(2))),
        {
            "another asyncio class": _call(_helper("rebuild_queue"), _s("Semaphore:0:0"), _list()),
            "more items than maxsize": _call(_helper("rebuild_queue"), _s("Queue:1:0"), _list(_int(1), _int(2))),
            "items in a dict": _call(_helper("rebuild_queue"), _s("Queue:0:0"), b"}"),
            "items in a string": _call(_helper("rebuild_queue"), _s("Queue:0:0"), _s("abc")),
            "oversized unfinished count": _call(_helper("rebuild_queue"), _s("Queue:0:9999999999"), _list()),
        },
    ),
    "stringio": (
        _call(_helper("rebuild_stringio"), _s("crlf:1"), _s("ab")),
        {
            "position past the end": _call(_helper("rebuild_stringio"), _s("lf:1000000"), _s("ab")),
            "unknown newline": _call(_helper("rebuild_stringio"), _s("nl:0"), _s("ab")),
            "bytes for text": _call(_helper("rebuild_stringio"), _s("lf:0"), _bytes(b"ab")),
        },
    ),
    "bytesio": (
        _call(_helper("rebuild_bytesio"), _s("2"), _bytes(b"ab")),
        {
            "position past the end": _call(_helper("rebuild_bytesio"), _s("3"), _bytes(b"ab")),
            "text for bytes": _call(_helper("rebuild_bytesio"), _s("0"), _s("ab")),
            "number spec": _call(_helper("rebuild_bytesio"), _int(0), _bytes(b"ab")),
        },
    ),
    "zoneinfo": (
        _call(_helper("rebuild_zoneinfo"), _s("Europe/Berlin")),
        {
            "a path out of the tz database": _call(_helper("rebuild_zoneinfo"), _s("../../etc/passwd")),
            "an absolute path": _call(_helper("rebuild_zoneinfo"), _s("/etc/localtime")),
            "an oversized key": _call(_helper("rebuild_zoneinfo"), _s("A/" * 100 + "B")),
            "a number": _call(_helper("rebuild_zoneinfo"), _int(1)),
        },
    ),
}
HOSTILE = sorted((helper, case) for helper, (_honest, cases) in CALLS.items() for case in cases)
# Arguments the scanner cannot see (numbers, containers, objects made in the stream) are checked at load only.
LOAD_ONLY = {
    ("condition", "around a semaphore"),
    ("queue", "more items than maxsize"),
    ("queue", "items in a dict"),
    ("stringio", "bytes for text"),
    ("bytesio", "position past the end"),
}


@pytest.mark.parametrize("helper", sorted(CALLS))
def test_an_honest_call_passes_the_scan_and_loads(pool_and_store: tuple[Pool, MemoryStore], helper: str) -> None:
    data = _stream(CALLS[helper][0])
    assert scan_pickle(data, RULE) is None
    result = _load_crafted(*pool_and_store, data)
    assert result.value is True, result.notes


@pytest.mark.parametrize(("helper", "case"), [c for c in HOSTILE if c not in LOAD_ONLY])
def test_the_scan_refuses_hostile_arguments(helper: str, case: str) -> None:
    refusal = scan_pickle(_stream(CALLS[helper][1][case]), RULE)
    assert refusal is not None and refusal.module == MODULE, refusal


@pytest.mark.parametrize(("helper", "case"), HOSTILE)
def test_the_loader_refuses_hostile_arguments_even_when_signed(
    pool_and_store: tuple[Pool, MemoryStore], helper: str, case: str
) -> None:
    result = _load_crafted(*pool_and_store, _stream(CALLS[helper][1][case]))
    assert result.value is False
    (note,) = [n for n in result.notes if "could not be restored" in n]
    assert "x (" in note and "refused" in note, note


def _load_crafted(pool: Pool, store: MemoryStore, data: bytes) -> Any:
    checkpoint = sign_and_store(store, Keyring([KEY]), crafted_body(data))
    with pool.checkout() as session:
        session.load_session(checkpoint)
        return session.run("'x' in dir()")


def test_the_rule_bounds_every_number_and_checks_the_content_it_is_given() -> None:
    assert value_call_refusal("asyncio semaphore spec", ("Semaphore:2147483647",)) is None
    assert value_call_refusal("asyncio semaphore spec", ("Semaphore:2147483648",)) is not None
    assert value_call_refusal("asyncio queue spec and items", ("Queue:0:0", (1, 2))) is not None  # a tuple
    assert value_call_refusal("StringIO spec and text", ("lf:2", "ab")) is None
    assert value_call_refusal("StringIO spec and text", ("lf:3", "ab")) is not None
    assert value_call_refusal("zoneinfo key", ("Etc/GMT+5",)) is None
    assert value_call_refusal("zoneinfo key", ("Europe/../Berlin",)) is not None


def test_a_policy_without_the_module_refuses_its_values() -> None:
    """A checkpoint cannot hand a script an asyncio lock, a StringIO or a zone that its policy keeps it from making."""
    narrow = checkpoint_rule(Policy(allowed_modules=frozenset({"json"})))
    for helper, (honest, _cases) in CALLS.items():
        assert scan_pickle(_stream(honest), RULE) is None, helper
        refusal = scan_pickle(_stream(honest), narrow)
        assert refusal is not None and "policy does not allow" in refusal.reason, (helper, refusal)


def test_each_helper_checks_its_arguments_itself() -> None:
    """The second layer: called by any route, a helper refuses what the rule refuses (the loader checks first)."""
    import asyncio

    from snapcell.checkpoint import _stdvalues as helpers

    hostile: list[tuple[Any, tuple[Any, ...]]] = [
        (helpers.rebuild_lock, ("locked; open",)),
        (helpers.rebuild_event, (b"set",)),
        (helpers.rebuild_semaphore, ("BoundedSemaphore:5/2",)),
        (helpers.rebuild_condition, (asyncio.Semaphore(1),)),
        (helpers.rebuild_queue, ("Queue:1:0", [1, 2])),
        (helpers.rebuild_stringio, ("lf:9", "ab")),
        (helpers.rebuild_bytesio, ("3", b"ab")),
        (helpers.rebuild_zoneinfo, ("../../etc/passwd",)),
    ]
    for helper, args in hostile:
        with pytest.raises(TypeError, match="refused"):
            helper(*args)
