"""Captured output is held to its cap exactly, the note of what was dropped included."""

from __future__ import annotations

import pytest

from snapcell.interpreter._capture import TailBuffer


@pytest.mark.parametrize("limit", [80, 100, 1000, 64 * 1024])
@pytest.mark.parametrize("written", [1, 999, 10_000, 200_000])
def test_the_kept_output_and_its_note_fit_the_cap(limit: int, written: int) -> None:
    buffer = TailBuffer(limit)
    for index in range(written):
        buffer.write(f"{index % 10}")
    text = buffer.getvalue()
    assert len(text) <= limit
    if written > limit:
        note, _, kept = text.partition("\n")
        assert note.startswith("[... ") and int(note.split()[1]) == written - len(kept)
        assert kept == "".join(f"{i % 10}" for i in range(written - len(kept), written))  # the tail, in order
    else:
        assert text == "".join(f"{i % 10}" for i in range(written))


def test_a_cap_smaller_than_the_note_still_holds() -> None:
    buffer = TailBuffer(10)
    buffer.write("x" * 100)
    assert len(buffer.getvalue()) <= 10
