"""The benchmarks' machine probe and floors: the numbers that say what this machine charges any design."""

from __future__ import annotations

import asyncio

from benchmarks._common import describe_probe, echo_process, machine_probe, python_child
from benchmarks.bench_runner import HOST_CALLS, JSON_CALLER, JsonFloor, RoundTripFloor


def test_the_probe_measures_a_round_trip_and_a_system_call_and_says_so_in_one_line() -> None:
    probe = machine_probe(round_trips=20, idle_trials=1)
    assert set(probe) == {"round_trip_us", "syscall_us", "syscall_after_idle_us"}
    assert all(value > 0 for value in probe.values())
    line = describe_probe(probe)
    assert f"process round trip {probe['round_trip_us']:.0f} us" in line
    assert "after 0.1 s idle" in line


def test_the_round_trip_floor_gets_each_frame_back_whole_and_times_each_metric() -> None:
    async def measure() -> tuple[bytes, dict[str, float]]:
        with echo_process() as sock:
            floor = RoundTripFloor(sock)
            try:
                back = await asyncio.wait_for(floor.round_trip(bytes(range(256)) * 16), 10)
                return back, await asyncio.wait_for(floor.trial(), 10)
            finally:
                floor.close()

    back, metrics = asyncio.run(measure())
    assert back == bytes(range(256)) * 16
    assert set(metrics) == {"run_1+1", "run_1+1_steady", "host_call_each"}
    assert all(seconds > 0 for seconds in metrics.values())


def test_the_json_floor_answers_each_host_call_of_a_request_and_times_the_three_metrics() -> None:
    calls: list[int] = []

    async def measure() -> dict[str, float]:
        with python_child(JSON_CALLER) as sock:
            floor = JsonFloor(sock, lookup={"f": lambda x: calls.append(x) or x + 1})
            try:
                await asyncio.wait_for(floor.request(3), 10)
                assert calls == [0, 1, 2]
                return await asyncio.wait_for(floor.trial(), 30)
            finally:
                floor.close()

    metrics = asyncio.run(measure())
    assert set(metrics) == {"run_1+1", "run_1+1_steady", "host_call_each"}
    assert all(seconds > 0 for seconds in metrics.values())
    assert len(calls) == 3 + HOST_CALLS
