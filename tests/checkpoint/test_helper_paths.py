"""Checkpoints name snapcell's helpers by one stable path, ``snapcell.checkpoint.helpers``, never by a private module.

So a module that moves never changes the checkpoint format; the paths helpers had before are aliases of the stable
one (`snapcell.checkpoint._rule`), and the golden checkpoints written under them keep loading (test_fidelity.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import zstandard

import snapcell.checkpoint.helpers as helpers
from snapcell import Policy, Pool
from snapcell.checkpoint import HELPERS, Keyring, SectionKind, blob_raw_size, decode_blob, global_refusal
from snapcell.checkpoint._findglobal import make_find_global
from snapcell.checkpoint._format import Codec, parse_container
from snapcell.checkpoint._rule import MOVED_MODULES, OLDER_HELPER_PATHS, PLAIN, current_name
from snapcell.interpreter._runner import checkpoint_rule
from snapcell.storage import MemoryStore
from tests.checkpoint.golden.make_helpers import SCRIPT as GOLDEN_SCRIPT

KEY = "helper-paths-tests-signing-key-0123456789"
POLICY = Policy().with_modules(["numpy"])
RULE = checkpoint_rule(POLICY)
# A value of each kind that pickles through one of snapcell's helpers: the golden checkpoint's, and the rest.
SCRIPT = (
    GOLDEN_SCRIPT
    + """
import string
lock = asyncio.Lock()
event = asyncio.Event()
semaphore = asyncio.BoundedSemaphore(2)
condition = asyncio.Condition()
keyed_caller = operator.methodcaller("split", sep=",")
tools = (setattr, delattr, dir, vars)
formatter = string.Formatter()
stand_ins = (dataclasses.dataclass, dataclasses.replace, functools.wraps, functools.total_ordering, asyncio.run)
"""
)


def _pickles(store: MemoryStore, checkpoint_id: bytes) -> list[bytes]:
    """Every pickle the store holds for the checkpoint: its stream and dill sections, and its frame blobs."""
    keyring = Keyring([KEY])
    parsed = keyring.parse_id(checkpoint_id)
    body = keyring.verify(store.get(parsed.storage_key), parsed)
    container = parse_container(body)
    pickles = []
    frame_blobs = set()
    for section in container.sections:
        if section.kind in (SectionKind.STREAM, SectionKind.DILL):
            data = bytes(section.data)
            pickles.append(zstandard.decompress(data) if section.codec is Codec.ZSTD else data)
        elif section.kind is SectionKind.FRAME_BLOB:
            frame_blobs.add(bytes(section.data))
    for info in store.scan():
        digest = bytes.fromhex(info.key.rpartition("/")[2]) if info.key != parsed.storage_key else b""
        if digest in frame_blobs:
            stored = store.get(info.key)
            into = bytearray(blob_raw_size(stored))
            decode_blob(stored, digest=digest, into=memoryview(into))
            pickles.append(bytes(into))
            frame_blobs.discard(digest)
    assert not frame_blobs, "a frame blob the checkpoint names is not in the store"
    return pickles


def test_a_fresh_dump_names_no_snapcell_module_but_the_helpers_one() -> None:
    store = MemoryStore("helper-paths")
    with Pool(store, isolation="inline", policy=POLICY, signing_keys=[KEY]) as pool, pool.checkout() as session:
        session.feed_run(SCRIPT, external_lookup={"list_customers": lambda: ["ada"]})
        checkpoint_id = session.dump()
        assert session.manifest is not None and not session.manifest.dropped, session.manifest.dropped
        named = {name for data in _pickles(store, checkpoint_id) for name in re.findall(rb"snapcell(?:\.\w+)+", data)}
    assert named == {b"snapcell.checkpoint.helpers"}


def _snapcell_globals() -> list[tuple[str, str]]:
    """Every global of snapcell's that a checkpoint may name: the rule's helpers and the policy's stand-ins."""
    return sorted({key for key in HELPERS if key[0].startswith("snapcell")} | RULE.stand_ins)


@pytest.mark.parametrize(("module", "name"), _snapcell_globals())
def test_each_helper_a_checkpoint_may_name_lives_at_its_stable_path(module: str, name: str) -> None:
    assert module == helpers.MODULE
    helper = getattr(helpers, name)
    assert (helper.__module__, helper.__qualname__) == (helpers.MODULE, name)


def _older_paths() -> list[tuple[str, str, str]]:
    paths = [(module, old, new) for module, names in OLDER_HELPER_PATHS.items() for old, new in names.items()]
    for old_module, module in MOVED_MODULES.items():
        paths += [(old_module, old, new) for old, new in OLDER_HELPER_PATHS[module].items()]
    return paths


def _find_global() -> Any:
    return make_find_global(RULE, POLICY.find_global_overrides(), resolve=POLICY.global_resolver())


@pytest.mark.parametrize(("module", "old", "new"), _older_paths())
def test_an_older_path_of_a_helper_stands_for_that_helper_exactly(module: str, old: str, new: str) -> None:
    assert current_name(module, old) == (helpers.MODULE, new)
    assert global_refusal(module, old, RULE) == global_refusal(helpers.MODULE, new, RULE) is None
    if new == "session_namespace":
        return  # only the loader's own unpickler resolves it (to the namespace it restores)
    find_global = _find_global()
    if HELPERS.get((helpers.MODULE, new), PLAIN) == PLAIN:
        assert find_global(module, old) is find_global(helpers.MODULE, new)
    else:  # a helper whose arguments the rule checks: a checking wrapper around the helper, made on each call
        assert callable(find_global(module, old))


def test_older_paths_of_anything_else_stay_refused() -> None:
    for module in (*OLDER_HELPER_PATHS, *MOVED_MODULES):
        assert global_refusal(module, "ModuleView", RULE) is not None
        assert global_refusal(module, "_namespaces", RULE) is not None
