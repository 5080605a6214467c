"""A forked worker pins its import roots without walking every module its zygote imported."""

from __future__ import annotations

import json
import subprocess
import sys

_PIN = """
import json, os, sys
from snapcell.runner import _privileges
import email
_privileges.warm_import_paths()
if {import_after_warm}:
    import xml.dom
before_pin = len(sys.modules)
calls = []
real = _privileges._is_package
_privileges._is_package = lambda name, module: (calls.append(name), real(name, module))[1]
_privileges.pin_import_paths()
import email.mime.text
print(json.dumps({{
    "scanned": len(calls),
    "modules": before_pin,
    "email": list(sys.modules["email"].__path__),
    "xml": list(getattr(sys.modules.get("xml"), "__path__", [])),
    "file": sys.modules["email.mime.text"].__file__,
    "unpinned": [p for p in sys.path_importer_cache if not p.startswith("/proc/self/fd/") and os.path.isdir(p)],
}}))
"""


def _pin(import_after_warm: bool) -> dict[str, object]:
    code = _PIN.format(import_after_warm=import_after_warm)
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_pinning_takes_the_warm_package_list_when_nothing_was_imported_since() -> None:
    result = _pin(False)
    assert result["scanned"] == 0
    assert all(str(p).startswith("/proc/self/fd/") for p in result["email"])  # type: ignore[attr-defined]
    assert str(result["file"]).startswith("/proc/self/fd/")
    # No finder of a real path is consulted any more: a fresh cache, not the one built before the pins.
    assert result["unpinned"] == []


def test_pinning_walks_every_module_when_one_was_imported_after_the_warm_up() -> None:
    result = _pin(True)
    assert result["scanned"] == result["modules"]
    assert result["xml"] and all(str(p).startswith("/proc/self/fd/") for p in result["xml"])  # type: ignore[attr-defined]
