"""The package's public names are imported on first use, so a worker process does not import the host's side.

Importing the worker is what a zygote does before its first fork: it must not build what only a dump needs.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import snapcell

INIT = Path(snapcell.__file__)
# Every package face whose names are imported on first use.
LAZY_FACES = sorted(
    ".".join(path.parent.relative_to(INIT.parent.parent).parts)
    for path in INIT.parent.rglob("__init__.py")
    if path != INIT and "_EXPORTS" in path.read_text()
)


def test_every_public_name_resolves_to_the_object_in_its_module() -> None:
    exports = snapcell._EXPORTS
    assert sorted(n for names in exports.values() for n in names) == sorted(n for n in snapcell.__all__)
    for module, names in exports.items():
        for name in names:
            assert getattr(snapcell, name) is getattr(importlib.import_module(module), name), name
    assert set(snapcell.__all__) <= set(dir(snapcell))


def test_the_type_checkers_imports_match_the_lazy_table() -> None:
    tree = ast.parse(INIT.read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported: dict[str, tuple[str, ...]] = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        imported[node.module] = (*imported.get(node.module, ()), *(alias.name for alias in node.names))
    assert imported == snapcell._EXPORTS


def test_subpackages_and_unknown_names() -> None:
    assert snapcell.storage is importlib.import_module("snapcell.storage")
    try:
        snapcell.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_the_worker_imports_none_of_the_hosts_side() -> None:
    probe = (
        "import json, sys\n"
        "import snapcell.worker._worker, snapcell.worker._zygote, snapcell.sandbox._sandbox\n"
        "from snapcell.checkpoint import _format\nfrom snapcell.checkpoint.scan import _scan\n"
        "built = sorted(name for name in dir(_format) if getattr(getattr(_format, name), '__pydantic_complete__', 0))\n"
        "compiled = _scan._group_patterns.cache_info().currsize\n"
        "snapcell.worker._worker._warm_up()  # a run, a dump and a load\n"
        "after = [_format.Manifest.__pydantic_complete__, _format.BlobRef.__pydantic_complete__]\n"
        "after.append(_scan._group_patterns.cache_info().currsize)\n"
        "print(json.dumps([sorted(sys.modules), built, compiled, after]))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    modules, built, compiled, after = json.loads(done.stdout)
    assert "snapcell.worker._worker" in modules
    host_side = {"snapcell.pool", "snapcell.session", "snapcell.tool", "snapcell.storage", "snapcell.cli", "sqlite3"}
    assert not set(modules) & host_side, sorted(set(modules) & host_side)
    # No checkpoint model schema built and no scan pattern compiled at import; the warm-up builds them, the blob
    # reference's too (a session's first dump of a large frame would otherwise build it).
    assert built == [] and compiled == 0, (built, compiled)
    assert after == [True, True, 1]


def test_a_zygote_imports_neither_pydantic_nor_asyncio_before_its_first_fork() -> None:
    # What `_zygote.main` imports before it says "ready": the checkpoint code and asyncio come after the first fork.
    probe = (
        "import json, sys\n"
        "import snapcell.worker._zygote\n"
        "from snapcell.sandbox import _privileges\nfrom snapcell.worker import _worker\n"
        "_privileges.warm_import_paths()\n"
        "deferred = ('pydantic', 'asyncio', 'cloudpickle', 'dill', 'zstandard', 'snapcell.checkpoint._format')\n"
        "print(json.dumps([name for name in deferred if name in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == []


_RUN_DUMP_COROUTINE = (
    "import json, sys\n"
    "from snapcell.limits import Limits\n"
    "from snapcell.policy._policy import Policy\n"
    "from snapcell.worker._loopfree import finish_without_loop, runs_without_loop\n"
    "from snapcell.interpreter._runner import Runner\n"
    "from snapcell.worker._worker import _NoHost\n"
    "runner = Runner(policy=Policy(), limits=Limits(wall_time_s=None))\n"
    "cell = 'x = 1 + 1\\nx'\n"
    "free = runs_without_loop(runner, cell)\n"
    "first = finish_without_loop(runner.run(cell, bridge=_NoHost(), host_names=()))\n"
    "after_run = [m for m in ('asyncio', 'pydantic') if m in sys.modules]\n"
    "dumped = runner.dump(created_at=0.0)\n"
    "after_dump = 'pydantic' in sys.modules\n"
    "import asyncio\n"
    "again = runs_without_loop(runner, 'y = 2')\n"
    "waits = 'import asyncio\\nawait asyncio.sleep(0)\\nx + 1'\n"
    "coro = asyncio.run(runner.run(waits, bridge=_NoHost(), host_names=()))\n"
    "print(json.dumps([free, first.value, after_run, after_dump, len(dumped.body) > 0, again, coro.value]))"
)


def test_a_first_run_imports_neither_and_a_dump_and_a_coroutine_cell_follow() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", _RUN_DUMP_COROUTINE], capture_output=True, text=True, check=True, timeout=60
    )
    free, value, after_run, after_dump, dumped, again, coro = json.loads(done.stdout)
    assert free and value == 2 and after_run == []
    assert after_dump and dumped  # the checkpoint code comes with the first dump
    assert not again  # asyncio is imported now (the probe did): every later run uses the loop
    assert coro == 3


@pytest.mark.parametrize("package", LAZY_FACES)
def test_a_subpackages_lazy_names_match_its_type_checker_imports_and_resolve(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported: dict[str, tuple[str, ...]] = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        imported[node.module] = (*imported.get(node.module, ()), *(alias.name for alias in node.names))
    exports = module._EXPORTS
    assert imported == exports
    assert sorted(n for names in exports.values() for n in names) == sorted(module.__all__)
    for where, names in exports.items():
        for name in names:
            assert getattr(module, name) is getattr(importlib.import_module(where), name), name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(module, "no_such_name")  # noqa: B009


def test_run_cancelled_is_defined_on_first_use_as_a_cancelled_error_named_in_errors() -> None:
    import asyncio
    import pickle

    from snapcell import errors
    from snapcell.errors import RunCancelled

    assert errors.RunCancelled is RunCancelled and issubclass(RunCancelled, asyncio.CancelledError)
    assert RunCancelled.__module__ == "snapcell.errors" and "RunCancelled" in errors.__all__
    assert pickle.loads(pickle.dumps(RunCancelled)) is RunCancelled
    with pytest.raises(AttributeError, match="NoSuchError"):
        errors.NoSuchError  # noqa: B018
