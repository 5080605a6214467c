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

import snapcell

INIT = Path(snapcell.__file__)


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
        "import snapcell.runner._worker, snapcell.runner._zygote, snapcell.runner._sandbox\n"
        "from snapcell.checkpoint import _format, _scan\n"
        "built = sorted(name for name in dir(_format) if getattr(getattr(_format, name), '__pydantic_complete__', 0))\n"
        "compiled = _scan._group_patterns.cache_info().currsize\n"
        "snapcell.runner._worker._warm_up()  # a run, a dump and a load\n"
        "after = [_format.Manifest.__pydantic_complete__, _format.BlobRef.__pydantic_complete__]\n"
        "after.append(_scan._group_patterns.cache_info().currsize)\n"
        "print(json.dumps([sorted(sys.modules), built, compiled, after]))"
    )
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    modules, built, compiled, after = json.loads(done.stdout)
    assert "snapcell.runner._worker" in modules
    host_side = {"snapcell.pool", "snapcell.session", "snapcell.tool", "snapcell.storage", "snapcell.cli", "sqlite3"}
    assert not set(modules) & host_side, sorted(set(modules) & host_side)
    # No checkpoint model schema built and no scan pattern compiled at import; the warm-up builds them, the blob
    # reference's too (a session's first dump of a large frame would otherwise build it).
    assert built == [] and compiled == 0, (built, compiled)
    assert after == [True, True, 1]
