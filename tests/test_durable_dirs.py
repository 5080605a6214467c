"""Every store that makes a directory or a file for durable state syncs the new entry into its parent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from snapcell.conversation import Conversation, FileConversationStore
from snapcell.heads import SQLiteHeads
from snapcell.storage import open_store
from tests.dirsync import assert_made_durably, record_directory_syncs


def _sqlite_heads(root: Path) -> list[Path]:
    SQLiteHeads(root / "a" / "b" / "heads.db").close()
    return [root / "a", root / "a" / "b", root / "a" / "b" / "heads.db"]


def _conversations(root: Path) -> list[Path]:
    store = FileConversationStore(root / "a" / "conversations")
    store.save_sync(Conversation(id="c1"))
    return [root / "a", root / "a" / "conversations", store.path("c1")]


def _local_store(root: Path) -> list[Path]:
    open_store(f"file://{root}/a/store", create=True)
    return [root / "a", root / "a" / "store"]


@pytest.mark.parametrize("make", [_sqlite_heads, _conversations, _local_store], ids=lambda f: f.__name__.strip("_"))
def test_a_new_directory_or_file_of_durable_state_is_synced_into_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[Path], list[Path]]
) -> None:
    synced = record_directory_syncs(monkeypatch)
    made = make(tmp_path)
    assert all(path.exists() for path in made)
    assert_made_durably(made, synced)
