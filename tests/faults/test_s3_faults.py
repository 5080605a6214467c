"""An S3 endpoint that refuses, hangs, stalls, throttles or drops connections fails each store call clearly, within
its deadline and a bounded number of attempts, never leaves half an object, and works again once it recovers.

Bounds are on work (requests sent, connections accepted), never on wall time; the 60 s guard only stops a hang.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from snapcell.errors import CheckpointNotFound, StorageError, StorageTimeout, StorageUnavailable
from snapcell.storage import AsyncStore, S3Store, storage_deadline
from tests.faults.conftest import MAX_ATTEMPTS, QUICK_DEADLINE_S, Attempts
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.integration

T = TypeVar("T")
HANG_GUARD_S = 60.0
BODY = bytes(range(256)) * 800  # 200 KiB: big enough that a response or request can be cut in the middle


def guarded(call: Callable[[], T]) -> T:
    """Run ``call`` in a thread and fail the test if it has not returned or raised within the hang guard."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed back to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    if thread.is_alive():
        pytest.fail(f"the store call hung past the {HANG_GUARD_S} s guard")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def works_again(store: S3Store, proxy: FaultProxy, key: str = "after-recovery") -> None:
    proxy.set_mode("pass")
    store.put(key, BODY)
    assert store.get(key) == BODY


def test_refused_connections_fail_each_call_naming_operation_and_key(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("refuse")
    attempts.clear()
    for name, call in [("get", lambda: faulty_store.get("kept")), ("put", lambda: faulty_store.put("new", BODY))]:
        attempts.clear()
        with pytest.raises(StorageUnavailable) as info:
            guarded(call)
        message = str(info.value)
        assert f"S3 {name} of" in message and ("'kept'" in message or "'new'" in message)
        assert "connect" in message.lower()  # the cause: botocore's "Could not connect to the endpoint URL"
        assert 1 <= len(attempts.sent) <= MAX_ATTEMPTS
    works_again(faulty_store, proxy)
    assert faulty_store.get("kept") == BODY
    with pytest.raises(CheckpointNotFound):
        faulty_store.get("new")


def test_a_hanging_endpoint_times_out_within_the_deadline(
    faulty_store: S3Store, quick_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("hang")
    attempts.clear()
    with pytest.raises(StorageUnavailable) as info:
        guarded(lambda: quick_store.get("kept"))
    error = info.value
    assert isinstance(error, StorageTimeout) and isinstance(error, TimeoutError)
    assert error.operation == "get" and error.key == "kept" and error.timeout_s == QUICK_DEADLINE_S
    assert "Read timeout" in str(error) or "ReadTimeout" in str(error)
    # Each attempt waits a third of the deadline's share (1.2 s / 3 * 2/3) for an answer, so all three fit.
    assert 1 <= error.attempts <= MAX_ATTEMPTS
    assert proxy.requests == len(attempts.sent) == error.attempts
    works_again(faulty_store, proxy)


def test_a_hanging_put_leaves_no_object(
    faulty_store: S3Store, quick_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    proxy.set_mode("hang")
    attempts.clear()
    with pytest.raises(StorageTimeout, match="put of 'k'"):
        guarded(lambda: quick_store.put("k", BODY))
    assert 1 <= len(attempts.sent) <= MAX_ATTEMPTS
    proxy.set_mode("pass")
    with pytest.raises(CheckpointNotFound):
        faulty_store.get("k")
    works_again(faulty_store, proxy, "k")


def test_slow_answers_within_the_read_timeout_succeed(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    proxy.set_mode("delay", delay_s=0.3)
    attempts.clear()
    faulty_store.put("slow", BODY)
    assert faulty_store.get("slow") == BODY
    assert [o.key for o in faulty_store.scan()] == ["slow"]


def test_answers_slower_than_the_deadline_allows_time_out(
    faulty_store: S3Store, quick_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("delay", delay_s=30.0)
    attempts.clear()
    with pytest.raises(StorageTimeout) as info:
        guarded(lambda: quick_store.get("kept"))
    assert info.value.operation == "get" and 1 <= len(attempts.sent) <= MAX_ATTEMPTS
    assert proxy.connections == len(attempts.sent)
    works_again(faulty_store, proxy)


def test_throttling_is_retried_then_reported_with_its_code(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("slowdown")
    attempts.clear()
    with pytest.raises(StorageUnavailable) as info:
        guarded(lambda: faulty_store.get("kept"))
    assert "SlowDown" in str(info.value) and "get of 'kept'" in str(info.value)
    assert f"after {MAX_ATTEMPTS} attempt" in str(info.value)
    assert proxy.requests == len(attempts.sent) == MAX_ATTEMPTS
    with pytest.raises(StorageUnavailable, match="SlowDown"):
        guarded(lambda: faulty_store.put("new", BODY))
    proxy.set_mode("slowdown", times=1)  # one throttled answer, then S3 recovers: the retry succeeds
    attempts.clear()
    assert faulty_store.get("kept") == BODY
    assert len(attempts.sent) == 2
    works_again(faulty_store, proxy)
    with pytest.raises(CheckpointNotFound):
        faulty_store.get("new")


def test_a_get_cut_mid_body_is_fetched_again_or_fails_clearly(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("cut", cut_after_bytes=len(BODY) // 3, times=1)
    attempts.clear()
    assert faulty_store.get("kept") == BODY  # the first body was cut off; the second came whole
    assert proxy.connections == 2
    proxy.set_mode("cut", cut_after_bytes=len(BODY) // 3)
    attempts.clear()
    with pytest.raises(StorageUnavailable, match="get of 'kept'"):
        guarded(lambda: faulty_store.get("kept"))
    assert 1 <= len(attempts.sent) <= MAX_ATTEMPTS
    works_again(faulty_store, proxy)


def test_a_put_whose_answer_is_lost_succeeds_when_its_own_bytes_are_stored(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    # S3 stores the object, then the connection drops before the answer: the retry finds the key taken (412).
    proxy.set_mode("cut", cut_after_bytes=10, times=1)
    attempts.clear()
    faulty_store.put("k", BODY)
    assert len(attempts.sent) >= 2
    proxy.set_mode("pass")
    assert faulty_store.get("k") == BODY


def test_a_put_cut_mid_request_leaves_no_object(faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts) -> None:
    proxy.set_mode("cut_request", cut_after_bytes=len(BODY) // 2)
    attempts.clear()
    with pytest.raises(StorageUnavailable, match="put of 'k'"):
        guarded(lambda: faulty_store.put("k", BODY))
    assert 1 <= len(attempts.sent) <= MAX_ATTEMPTS
    proxy.set_mode("pass")
    with pytest.raises(CheckpointNotFound):
        faulty_store.get("k")
    assert list(faulty_store.scan()) == []
    works_again(faulty_store, proxy, "k")


def test_a_multipart_put_cut_mid_part_leaves_no_object_and_no_upload(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    big = bytes(range(256)) * (11 * 4096)  # 11 MiB: three parts of the 5 MiB minimum
    config = dataclasses.replace(faulty_store.config, multipart_threshold_bytes=5 << 20, multipart_part_bytes=5 << 20)
    store = S3Store(faulty_store.bucket, faulty_store.prefix, client=faulty_store.client, config=config)
    proxy.set_mode("cut_request", cut_after_bytes=2 << 20)
    attempts.clear()
    with pytest.raises(StorageUnavailable, match="put \\(part 1\\) of 'big'"):
        guarded(lambda: store.put("big", big))
    proxy.set_mode("pass")
    with pytest.raises(CheckpointNotFound):
        store.get("big")
    uploads = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads", [])
    assert uploads == []  # aborted, not left to the lifecycle rule
    store.close()


def test_a_caller_deadline_tighter_than_the_store_s_wins(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    proxy.set_mode("hang")
    attempts.clear()

    async def turn() -> bytes:
        return await AsyncStore(faulty_store).get("kept", timeout_s=0.5)

    with pytest.raises(StorageTimeout) as info:
        guarded(lambda: asyncio.run(turn()))
    assert info.value.operation == "get" and info.value.key == "kept"
    assert len(attempts.sent) == 1  # the deadline left no room for a second attempt
    attempts.clear()
    with storage_deadline(0.05):
        time.sleep(0.1)
        with pytest.raises(StorageTimeout) as expired:
            faulty_store.get("kept")
    assert expired.value.attempts == 0 and attempts.sent == []  # nothing is sent once the deadline has passed
    works_again(faulty_store, proxy)


def test_every_fault_is_a_storage_error_never_a_botocore_one(
    faulty_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    faulty_store.put("kept", BODY)
    for mode, options in [("refuse", {}), ("cut", {"cut_after_bytes": 10})]:
        proxy.set_mode(mode, **options)  # type: ignore[arg-type]
        calls: list[Callable[[], object]] = [
            lambda: faulty_store.get("kept"),
            lambda: list(faulty_store.scan()),
            lambda: faulty_store.delete("kept"),
            lambda: faulty_store.touch("kept"),
        ]
        for call in calls:
            with pytest.raises(StorageError) as info:
                guarded(call)
            assert info.value.__cause__ is not None  # raised from the real error
    works_again(faulty_store, proxy)


def test_a_dump_to_a_hanging_store_fails_in_bounded_requests_and_the_session_survives(
    faulty_store: S3Store, quick_store: S3Store, proxy: FaultProxy, attempts: Attempts
) -> None:
    from snapcell import Pool

    with Pool(quick_store, isolation="inline", signing_keys=["faults-test-signing-key-0123456789"]) as pool:
        with pool.checkout() as session:
            session.feed_run("x = 41")
            proxy.set_mode("hang")
            attempts.clear()
            with pytest.raises(StorageTimeout) as info:
                guarded(session.dump)
            assert info.value.operation == "put" and 1 <= len(attempts.sent) <= MAX_ATTEMPTS
            proxy.set_mode("pass")
            checkpoint_id = session.dump()  # the session is unchanged and dumps once the store answers
        with pool.checkout() as session:
            session.load_session(checkpoint_id)
            assert session.feed_run("x + 1") == 42
