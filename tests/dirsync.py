"""Which directories a piece of code syncs: every ``os.fsync`` of a directory, by its path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


def record_directory_syncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record the path of every directory synced from now on (whichever module calls ``os.fsync``)."""
    synced: list[Path] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def assert_made_durably(made: list[Path], synced: list[Path]) -> None:
    """Each directory in ``made`` (created by the code under test) was synced into its parent."""
    for directory in made:
        assert directory.parent in synced, f"{directory} was made but its parent was never synced"
