"""The benchmarks' machine probe: the numbers printed beside every table, to compare runs on different machines."""

from __future__ import annotations

from benchmarks._common import describe_probe, machine_probe


def test_the_probe_measures_a_round_trip_and_a_system_call_and_says_so_in_one_line() -> None:
    probe = machine_probe(round_trips=20, idle_trials=1)
    assert set(probe) == {"round_trip_us", "syscall_us", "syscall_after_idle_us"}
    assert all(value > 0 for value in probe.values())
    line = describe_probe(probe)
    assert f"process round trip {probe['round_trip_us']:.0f} us" in line
    assert "after 0.1 s idle" in line
