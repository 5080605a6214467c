"""The work a load does stays bounded: no collections while it restores."""

from __future__ import annotations

import gc
import pickle
from typing import Any

import pytest

from snapcell.checkpoint import dump_namespace, load_namespace, make_find_global
from snapcell.errors import CheckpointCorrupt


def _collections_during(action: Any) -> int:
    started = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(callback)
    try:
        action()
    finally:
        gc.callbacks.remove(callback)
    return len(started)


def test_a_load_of_many_small_containers_runs_no_garbage_collection_and_turns_it_back_on() -> None:
    rows = [{"id": i, "tags": [i, "x"]} for i in range(20_000)]
    dumped = dump_namespace({"rows": rows}, namespace={}, created_at=0.0)
    body, blobs = dumped.body, dumped.new_blobs
    find_global = make_find_global(lambda m: False)
    assert gc.isenabled()
    # The same objects made outside a load set off dozens of collections (the test's premise); a load's parse of its
    # manifest may set off one.
    assert _collections_during(lambda: pickle.loads(pickle.dumps(rows))) > 20
    loaded = []

    def load() -> None:
        loaded.append(load_namespace(body, namespace={}, find_global=find_global, blobs=blobs))

    assert _collections_during(load) <= 1
    assert loaded[0].variables["rows"] == rows
    assert gc.isenabled()
    with pytest.raises(CheckpointCorrupt):
        load_namespace(body, namespace={}, find_global=find_global)  # its frame blobs are missing
    assert gc.isenabled()


def test_a_cut_list_comes_back_whole_and_in_order() -> None:
    numbers = list(range(300_000))
    dumped = dump_namespace({"numbers": numbers, "small": [1, 2]}, namespace={}, created_at=0.0)
    (frame,) = [f for f in dumped.manifest.frames if f.names == ["numbers"]]
    assert len(frame.buffers) > 1, "the test needs the list cut into parts"
    loaded = load_namespace(
        dumped.body, namespace={}, find_global=make_find_global(lambda m: False), blobs=dumped.new_blobs
    )
    assert loaded.variables["numbers"] == numbers
    assert loaded.variables["small"] == [1, 2]
