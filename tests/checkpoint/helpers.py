"""Shared pieces of the checkpoint tests: a fixed key, a child interpreter that loads a checkpoint, crafted bodies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from snapcell import Policy, Pool, RunResult
from snapcell.checkpoint import Dumped, Keyring, Manifest, VariableInfo
from snapcell.checkpoint._format import Codec, Header, SectionKind, pack_container
from snapcell.errors import CheckpointRefused
from snapcell.storage import MemoryStore

KEY = "checkpoint-tests-signing-key-0123456789"
OTHER_KEY = "another-signing-key-for-wrong-key-tests"
MODULES = ("numpy", "pandas")
DATA_POLICY = Policy().with_modules(MODULES)

# Runs in a fresh interpreter: load the checkpoint, run each cell, print every result as JSON.
_CHILD = """
import json, os, sys
from snapcell import Policy, Pool
args = json.loads(sys.argv[1])
policy = Policy().with_modules(args["modules"])
pool = Pool(args["store"], signing_keys=[args["key"]], policy=policy, isolation="inline")
with pool, pool.checkout() as session:
    session.load_session(args["id"])
    results = []
    for cell in args["cells"]:
        r = session.run(cell)
        results.append({
            "value": r.value,
            "error": r.error.exc_type if r.error else None,
            "message": r.error.exc_message if r.error else None,
            "traceback": r.error.traceback_text if r.error else None,
            "notes": list(r.notes),
            "pid": os.getpid(),
        })
print(json.dumps(results, default=repr))
"""


def load_in_child(
    store: str, checkpoint_id: bytes, cells: Sequence[str], *, key: str = KEY, modules: Sequence[str] = MODULES
) -> list[dict[str, Any]]:
    """Load ``checkpoint_id`` in a fresh interpreter, run ``cells`` there and return one result dict per cell."""
    args = {"store": store, "key": key, "id": checkpoint_id.hex(), "cells": list(cells), "modules": list(modules)}
    env = {k: v for k, v in os.environ.items() if k != "SNAPCELL_SIGNING_KEY"}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, timeout=120, env=env
    )
    if child.returncode != 0:
        raise AssertionError(f"child interpreter failed ({child.returncode}):\n{child.stderr}")
    results: list[dict[str, Any]] = json.loads(child.stdout.strip().splitlines()[-1])
    return results


CANARY: list[str] = []


def canary(tag: str = "unpickled") -> str:
    """Records that an unpickler ran it; crafted checkpoints call it on load."""
    CANARY.append(tag)
    return tag


class _Trap:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return canary, ("unpickled",)


def crafted_body(
    stream: bytes | None = None, *, header: Header | None = None, raw_size: int | None = None
) -> bytearray:
    """An unsigned body with one stream section holding ``x`` (by default a pickle that calls `canary`).

    The header says format 2 (one stream for every variable) unless given: the stream is a bare pickle.
    """
    import pickle

    if stream is None:
        stream = pickle.dumps(_Trap(), protocol=5)
    manifest = Manifest(
        created_at=0.0,
        python="3",
        libraries={},
        variables=[VariableInfo(name="x", type_name="str", size_bytes=len(stream), serializer="cloudpickle")],
    )
    section = (SectionKind.STREAM, Codec.RAW, len(stream) if raw_size is None else raw_size, stream)
    return pack_container(header or Header(format_version=2), manifest, [section])


def sign_and_store(store: Any, keyring: Keyring, body: bytes | bytearray, *, now: float | None = None) -> bytes:
    """Sign ``body`` under a fresh ID of ``keyring``, put it in ``store`` and return the ID."""
    cid = keyring.new_id(now)
    store.put(cid.storage_key, bytes(keyring.sign(bytes(body), cid)))
    return cid.raw


def refused_dump(body: bytes | bytearray) -> tuple[CheckpointRefused, list[Any]]:
    """Dump a session whose worker (here: a backend returning ``body``) sends crafted bytes; the refusal raised
    and what the store holds afterwards."""
    store = MemoryStore()
    with Pool(store, signing_keys=[KEY], isolation="inline") as pool, pool.checkout() as session:
        manifest = Manifest(created_at=0.0, python="3", libraries={}, variables=[])

        async def hostile_dump(_request: Any) -> Dumped:
            return Dumped(bytearray(body), manifest)

        session._inner._backend.dump = hostile_dump  # type: ignore[method-assign]
        with pytest.raises(CheckpointRefused) as caught:
            session.dump()
    return caught.value, list(store.scan())


def load_signed(pool: Any, store: Any, body: bytes | bytearray) -> RunResult:
    """Sign ``body`` with `KEY` as if the host had, load it in a session of ``pool`` and ask whether ``x`` exists."""
    checkpoint = sign_and_store(store, Keyring([KEY]), body)
    with pool.checkout() as session:
        session.load_session(checkpoint)
        result: RunResult = session.run("'x' in dir()")
    return result
