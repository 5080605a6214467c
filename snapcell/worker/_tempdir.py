"""A worker's directory for temporary files: `tempfile.tempdir`, set now or when tempfile is first imported.

A worker sets it rather than leave it to tempfile's own search, which probes each candidate by writing a file (and
so fails under ``Limits.max_file_bytes=0`` or a full scratch directory). A zygote's first child has not imported
tempfile, which costs it ~2% of a cold start with `random`, which tempfile imports: a finder first in
``sys.meta_path`` sets the directory when tempfile is first imported, by the script or by snapcell, then steps aside.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["set_tempdir"]


def set_tempdir(path: str) -> None:
    """Make ``path`` tempfile's directory: now, if tempfile is imported, or when it is."""
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        vars(tempfile)["tempdir"] = path
        return
    for finder in list(sys.meta_path):  # a finder of an earlier call, if tempfile was not imported since
        if isinstance(finder, _SetOnImport):
            sys.meta_path.remove(finder)
    sys.meta_path.insert(0, _SetOnImport(path))


class _SetOnImport:
    """Finds nothing itself: when tempfile is imported, it takes the spec from the finders after it, and wraps the
    spec's own loader so that the module gets its ``tempdir`` as soon as it has run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "tempfile":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:  # the finders after this one, as the import would have asked them
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or isinstance(spec.loader, type):
            return spec  # a built-in or frozen tempfile (never in CPython): left to its own search
        loader, directory = spec.loader, self.path
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            vars(module)["tempdir"] = directory

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader: no other import changes
        return spec
