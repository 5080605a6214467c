"""`SQLiteHeads` parses a head's recorded turns once per text: a turn's lease, head write and the next turn's lease
read what the last of them wrote, and a lease writes the turns' texts back as it read them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from snapcell.heads import SQLiteHeads, TurnRecord, _sqlite
from snapcell.heads import _heads as heads_module

A = b"a" * 32


@pytest.fixture
def heads(tmp_path: Path) -> Any:
    store = SQLiteHeads(tmp_path / "heads.sqlite3")
    yield store
    store.close()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Each parse of a head's turns from their texts."""
    calls: list[object] = []
    real = heads_module.turns_from_json

    def counted(value: object, states: object = None) -> tuple[TurnRecord, ...]:
        calls.append(value)
        return real(value, states)

    monkeypatch.setattr(_sqlite, "turns_from_json", counted)
    return calls


def _turn(heads: SQLiteHeads, conversation: str, n: int) -> str:
    taken, head = heads.acquire_lease_and_get(conversation, "me", 30)
    assert taken
    checkpoint = bytes([n]) * 32
    turn = TurnRecord(f"turn-{n}", f"answer {n}", checkpoint_id=checkpoint, started_from=head and head.checkpoint_id)
    return heads.compare_and_set(
        conversation, head and head.version, checkpoint, owner="me", release_lease=True, turn=turn
    )


def _texts(path: Path, conversation: str) -> tuple[str, str, str]:
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT turns, turn_states, history FROM heads WHERE conversation_id = ?", (conversation,)
        ).fetchone()
    return row[0], row[1], row[2]


def test_turn_after_turn_the_recorded_turns_are_never_parsed_again(heads: SQLiteHeads, parses: list[object]) -> None:
    for n in range(5):
        _turn(heads, "c", n)
    assert parses == []  # every read found what the write before it wrote (the first: a lease made the row)
    assert [t.turn_id for t in heads.get("c").turns] == [f"turn-{n}" for n in reversed(range(5))]  # type: ignore[union-attr]


def test_a_lease_writes_the_turns_back_as_it_read_them(heads: SQLiteHeads, monkeypatch: pytest.MonkeyPatch) -> None:
    _turn(heads, "c", 1)
    before = _texts(heads.path, "c")
    encoded: list[object] = []
    monkeypatch.setattr(_sqlite, "turns_to_json", lambda turns: encoded.append(turns) or [])
    assert heads.acquire_lease("c", "someone", 30)
    heads.release_lease("c", "someone")
    assert _texts(heads.path, "c") == before
    assert encoded == []  # its texts as read, not the turns written out again


def test_a_head_another_process_rewrote_reads_as_rewritten(heads: SQLiteHeads, tmp_path: Path) -> None:
    _turn(heads, "c", 1)
    other = SQLiteHeads(heads.path)  # another process's store: its own parsed turns
    try:
        _turn(other, "c", 2)
        assert [t.turn_id for t in heads.get("c").turns] == ["turn-2", "turn-1"]  # type: ignore[union-attr]
        with sqlite3.connect(heads.path) as db:  # and one edited by hand
            db.execute(
                "UPDATE heads SET turns = ?, turn_states = ? WHERE conversation_id = 'c'", ('[["x", null]]', "{}")
            )
        assert heads.get("c").turns == (TurnRecord("x"),)  # type: ignore[union-attr]
    finally:
        other.close()


def test_it_keeps_a_bounded_number_of_heads_and_no_long_ones(
    heads: SQLiteHeads, parses: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(_sqlite._PARSED_HEADS + 5):
        _turn(heads, f"c{n}", n)
    assert len(heads._parsed._by_text) == _sqlite._PARSED_HEADS
    parses.clear()
    heads.get("c0")  # the oldest, gone
    assert len(parses) == 1

    monkeypatch.setattr(_sqlite, "_PARSED_TEXT_CHARS", 10)
    parses.clear()
    _turn(heads, "long", 1)
    heads.get("long")
    heads.get("long")
    assert len(parses) == 2  # each get: too long to keep
