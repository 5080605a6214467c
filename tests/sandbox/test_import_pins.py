"""A forked worker pins its import roots without walking every module its zygote imported."""

from __future__ import annotations

import json
import subprocess
import sys

_PIN = """
import json, os, sys
from snapcell.sandbox import _privileges
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


def _probe(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter and return the JSON object it prints."""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


def _pin(import_after_warm: bool) -> dict[str, object]:
    return _probe(_PIN.format(import_after_warm=import_after_warm))


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


_REPIN = """
import json, os, sys
from snapcell.sandbox import _privileges
import email
_privileges.warm_import_paths()
first = _privileges.pin_import_paths()
{between}


class Watched(list):
    def __setitem__(self, index, value):
        writes.append(index)
        super().__setitem__(index, value)


writes = []
packages = [m for m in list(sys.modules.values()) if isinstance(getattr(m, "__path__", None), list)]
for module in packages:
    module.__path__ = Watched(module.__path__)
sys.path = Watched(sys.path)
opened = []
real_open = os.open
os.open = lambda *args, **kwargs: (opened.append(args[0]), real_open(*args, **kwargs))[1]
scanned = []
real_is_package = _privileges._is_package
_privileges._is_package = lambda name, module: (scanned.append(name), real_is_package(name, module))[1]
cache = sys.path_importer_cache
second = _privileges.pin_import_paths()
import email.mime.text
print(json.dumps({{
    "first": first,
    "second": second,
    "opened": opened,
    "writes": len(writes),
    "scanned": len(scanned),
    "same_cache": sys.path_importer_cache is cache,
    "file": sys.modules["email.mime.text"].__file__,
}}))
"""


def _repin(between: str) -> dict[str, object]:
    return _probe(_REPIN.format(between=between))


def test_a_second_pin_opens_nothing_rewrites_nothing_and_keeps_the_finder_cache() -> None:
    # As a zygote's child: the zygote pinned, nothing was imported since.
    result = _repin("")
    assert result["first"] and result["second"] == result["first"]  # the inherited roots, to be kept open
    assert result["opened"] == [] and result["writes"] == 0 and result["scanned"] == 0
    assert result["same_cache"] is True
    assert str(result["file"]).startswith("/proc/self/fd/")


def test_a_pin_after_imports_through_pinned_roots_opens_and_rewrites_nothing() -> None:
    # Packages imported after the first pin are found through its roots: their paths are pinned already.
    result = _repin("import xml.dom, json.decoder")
    assert result["scanned"] > 0  # the modules were walked (something was imported)...
    assert result["opened"] == [] and result["writes"] == 0  # ...but nothing needed a root or a rewrite
    assert result["same_cache"] is True


def test_a_pin_after_a_new_import_root_pins_only_that() -> None:
    # A package found through a path added after the first pin gets a root of its own, and only its list changes.
    between = (
        "import tempfile, pathlib\n"
        "extra = pathlib.Path(tempfile.mkdtemp())\n"
        "(extra / 'lateroot').mkdir()\n"
        "(extra / 'lateroot' / '__init__.py').write_text('')\n"
        "sys.path.append(str(extra))\n"
        "import lateroot"
    )
    code = _REPIN.format(between=between).replace(
        '"file":', '"late": list(sys.modules["lateroot"].__path__), "path": list(sys.path), "file":'
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert len(result["opened"]) == 1 and len(result["second"]) == len(result["first"]) + 1
    new_fd = (set(result["second"]) - set(result["first"])).pop()
    assert result["late"] == [f"/proc/self/fd/{new_fd}/lateroot"]
    assert result["path"][-1] == f"/proc/self/fd/{new_fd}"
    assert result["same_cache"] is False  # finders of the old real paths are no longer consulted


def test_a_zygote_child_finds_its_read_paths_by_its_pinned_sys_path() -> None:
    # The zygote pins after its warm-up computed Landlock's read paths for the real sys.path; its children ask by the
    # pinned one, and must find them computed (not expand sysconfig's paths again, nor lose site-packages).
    code = (
        "import json, sys, sysconfig\n"
        "from snapcell.sandbox import _privileges\nfrom snapcell.worker import _workersetup\n"
        "_workersetup.warm_read_paths()\n"
        "before = _workersetup._read_paths()\n"
        "unpinned = tuple(sys.path)\n"
        "_privileges.pin_import_paths()\n"
        "_workersetup.warm_read_paths(unpinned)\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError('sysconfig expanded again')\n"
        "sysconfig.get_paths = refuse\n"
        "pinned = any(p.startswith('/proc/self/fd/') for p in sys.path)\n"
        "print(json.dumps([before, _workersetup._read_paths(), pinned]))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    before, after, pinned = json.loads(out)
    assert pinned and after == before and any("site-packages" in p for p in after)
