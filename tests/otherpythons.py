"""Venvs of the other Python versions on this machine, for the cross-version checkpoint tests.

Building them (a venv and a ``pip install`` of snapcell's dependencies each) takes tens of seconds, so it starts as
soon as collection shows the run includes those tests (see ``pytest_collection_finish`` in ``conftest.py``) and goes
on while the rest of the suite runs; the tests wait for it. The builds die with the run, and their directory is
removed when it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

__all__ = ["INTERPRETERS", "REPO", "start", "stop", "wait"]

REPO = Path(__file__).resolve().parents[1]
INTERPRETERS = {
    "3.12": Path("/root/.pyenv/versions/3.12.1/bin/python3.12"),
    "3.13": Path("/root/.pyenv/versions/3.13.0/bin/python3.13"),
}

_root: Path | None = None
_started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
_found: dict[str, Path | str] = {}


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _make_venv(python: Path, where: Path) -> subprocess.Popen[bytes]:
    """A venv with snapcell's base dependencies (no extras) and this repository's snapcell on its path.

    The repository goes in by a .pth file, as an editable install would: building a wheel in an isolated build
    environment for each interpreter would double the time this takes.
    """
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    quoted = " ".join(f"'{d}'" for d in dependencies)
    pth = f"$('{where}/bin/python' -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/snapcell-repo.pth"
    command = (
        f"'{python}' -m venv '{where}' && exec '{where}/bin/pip' install -q --disable-pip-version-check {quoted} "
        f"&& echo '{REPO}' > \"{pth}\""
    )
    return subprocess.Popen(
        ["sh", "-c", command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent,
        start_new_session=True,  # one process group: `stop` ends pip and what it started
    )


def start() -> None:
    """Start building a venv for each other interpreter present (once; in parallel, pip's cache makes each fast)."""
    global _root
    if _root is not None:
        return
    _root = Path(tempfile.mkdtemp(prefix="snapcell-test-venvs-"))
    for version, python in INTERPRETERS.items():
        if not python.exists():
            _found[version] = f"Python {version} is not installed at {python}"
        elif sys.version_info[:2] == tuple(int(p) for p in version.split(".")):
            _found[version] = f"this is Python {version} already"
        else:
            _started[version] = (_make_venv(python, _root / version), _root / version)


def wait() -> dict[str, Path | str]:
    """Each version's venv python, or why there is none; starts the builds if nothing did.

    Raises:
        AssertionError: A build failed (its stderr is in the message).
    """
    start()
    while _started:
        version, (process, where) = _started.popitem()
        _, stderr = process.communicate(timeout=600)
        if process.returncode != 0:
            _found[version] = f"could not make a venv for Python {version}:\n{stderr.decode()[-3000:]}"
            raise AssertionError(_found[version])
        _found[version] = where / "bin" / "python"
    failed = [why for why in _found.values() if isinstance(why, str) and why.startswith("could not make")]
    if failed:
        raise AssertionError(failed[0])
    return dict(_found)


def stop() -> None:
    """End the builds still running and remove the venvs."""
    global _root
    for process, _ in _started.values():
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _started.clear()
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
        _root = None
    _found.clear()
