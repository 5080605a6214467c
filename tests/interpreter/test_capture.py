"""Output capture holds bounded memory however much a script prints, and in however small pieces."""

from __future__ import annotations

import tracemalloc

from snapcell import Limits, Pool
from snapcell.interpreter._capture import TailBuffer

MB = 1_000_000
CAP = 500_000  # max_output_bytes of these runs, characters kept per stream

# 100 MB printed: 150,000 small writes (each a new string, as in a print per item), then 1 MB lines.
SMALL = 150_000
FLOOD = f"""
for i in range({SMALL}):
    print(f'{{i}}', end='')
for i in range(100):
    print(str(i % 10) * 999_999)
'done'
"""


def test_memory_stays_bounded_while_100_mb_are_printed() -> None:
    printed = sum(len(str(i)) for i in range(SMALL)) + 100 * 1_000_000
    assert printed > 100 * MB
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        session.run("1")  # warm: first-run allocations are not the capture's
        tracemalloc.start()
        try:
            result = session.run(FLOOD, limits=Limits(max_output_bytes=CAP, wall_time_s=None))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.error is None and result.value == "done"
    header, kept = result.stdout.split("\n", 1)
    assert len(result.stdout) == CAP and kept == "9" * (len(kept) - 1) + "\n"  # the note is inside the cap
    assert header == f"[... {printed - len(kept)} earlier characters of output were dropped ...]"
    # Up to twice the cap plus slack is held between trims, and the script makes 1 MB strings; the small
    # writes kept one object each would take ~9 MB.
    assert peak < 5 * MB, f"capture held {peak / MB:.1f} MB while 100 MB were printed with a 0.5 MB cap"


def test_tiny_writes_are_held_in_few_objects() -> None:
    buffer = TailBuffer(CAP)
    letters = [chr(97 + i) * 3 for i in range(26)]
    tracemalloc.start()
    try:
        for i in range(SMALL):
            buffer.write(letters[i % 26][:2])  # a new two-character string per write, like print(x, end='')
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 0.3 MB of text kept as 150,000 separate strings would take ~9 MB.
    assert peak < 2 * MB, f"{peak / MB:.1f} MB for 0.3 MB of text"
    assert buffer.getvalue() == "".join(letters[i % 26][:2] for i in range(SMALL))
    assert buffer.dropped_bytes == 0


def test_one_write_longer_than_the_cap_keeps_its_tail() -> None:
    buffer = TailBuffer(10)
    buffer.write("abc")
    buffer.write("0123456789" * 3 + "END")
    assert buffer.getvalue() == "3456789END"  # a cap too small for the note keeps the tail alone
    buffer.write("!")
    assert buffer.getvalue() == "456789END!" and buffer.dropped_bytes == 27


def test_no_cap_keeps_everything() -> None:
    buffer = TailBuffer(None)
    for i in range(20_000):
        buffer.write(f"{i},")
    assert buffer.getvalue() == "".join(f"{i}," for i in range(20_000)) and buffer.dropped_bytes == 0


def test_a_flood_of_small_writes_trims_once_per_32_kib_not_once_per_write(monkeypatch) -> None:
    # What keeps a flood cheap is counted, not timed: trimming the buffer back to its cap is amortized.
    trims: list[int] = []
    trim = TailBuffer._trim

    def counted(self: TailBuffer) -> None:
        trims.append(1)
        trim(self)

    monkeypatch.setattr(TailBuffer, "_trim", counted)
    with Pool("memory://", isolation="inline") as pool, pool.checkout() as session:
        result = session.run("for i in range(10**6):\n    print(i)", limits=Limits(max_output_bytes=1000))
    printed = sum(len(str(i)) + 1 for i in range(10**6))  # 2,000,000 writes: the number, then the newline
    assert result.error is None
    header, kept = result.stdout.split("\n", 1)
    assert len(result.stdout) == 1000 and kept.endswith("999998\n999999\n")
    assert header == f"[... {printed - len(kept)} earlier characters of output were dropped ...]"
    # ~105 with the 64 KiB of slack between trims (plus one per stream when the run's output is read).
    assert len(trims) <= printed // (32 * 1024) + 2, f"{len(trims)} trims for {printed:,} characters"
