"""`set_tempdir`: tempfile's directory is set now, or when tempfile is first imported (a zygote's first child)."""

from __future__ import annotations

import json
import subprocess
import sys


def _probe(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, env={})
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_tempdir_is_set_when_tempfile_is_first_imported() -> None:
    result = _probe(
        "import json, sys\n"
        "from snapcell.worker._tempdir import set_tempdir\n"
        "assert 'tempfile' not in sys.modules\n"
        "finders = len(sys.meta_path)\n"
        "set_tempdir('/nonexistent/one')\n"
        "set_tempdir('/nonexistent/two')  # a second call replaces the first finder\n"
        "added = len(sys.meta_path) - finders\n"
        "import csv  # another import: not touched\n"
        "import tempfile\n"
        "print(json.dumps({'added': added, 'tempdir': tempfile.tempdir, 'left': len(sys.meta_path) - finders,\n"
        "                  'csv': csv.__spec__.loader.exec_module.__qualname__}))\n"
    )
    # Without the finder tempfile.tempdir would be None: tempfile searches (and probes) only when first asked.
    assert result == {"added": 1, "tempdir": "/nonexistent/two", "left": 0, "csv": "_LoaderBasics.exec_module"}


def test_tempdir_is_set_at_once_when_tempfile_is_imported() -> None:
    result = _probe(
        "import json, sys, tempfile\n"
        "from snapcell.worker._tempdir import set_tempdir\n"
        "finders = len(sys.meta_path)\n"
        "set_tempdir('/nonexistent/now')\n"
        "print(json.dumps({'tempdir': tempfile.tempdir, 'added': len(sys.meta_path) - finders}))\n"
    )
    assert result == {"tempdir": "/nonexistent/now", "added": 0}
