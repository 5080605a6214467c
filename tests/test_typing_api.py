"""The sync API is typed as precisely as the async one, and a type checker outside the repository can see it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parents[1] / ".mypy_cache"  # warm after .ci/run's `mypy snapcell`

CLIENT = """\
import snapcell

pool = snapcell.Pool("memory://", isolation="inline", ttl_s=60.0)
with pool.checkout(type_check=False, limits=snapcell.Limits(wall_time_s=5)) as session:
    session.feed_run("1", external_lookup={"f": print}, setup=True)
    result: snapcell.RunResult = session.run("1", skip_type_check=True)
tool = snapcell.SyncCodeTool(pool, max_answer_chars=300, lease_wait_s=1.0)

pool = snapcell.Pool("memory://", isolaton="inline")
with pool.checkout(type_chek=True) as session:
    session.feed_run("1", externl_lookup={})
    session.run("1", setpu=True)
tool = snapcell.SyncCodeTool(pool, max_answer_char=300)
"""


def test_mypy_outside_the_repository_finds_snapcell_and_its_misspelt_options(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the dev extra")
    (tmp_path / "client.py").write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(CACHE)] + ["client.py"],
        cwd=tmp_path,  # outside the repository: only the installed package can be found
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert "import-not-found" not in done.stdout, (
        "mypy cannot see the installed snapcell; install it with "
        "pip install -e . --config-settings editable_mode=compat (see the README)\n" + done.stdout
    )
    misspelt = ["isolaton", "type_chek", "externl_lookup", "setpu", "max_answer_char"]
    assert len(errors) == len(misspelt), done.stdout
    for name, line in zip(misspelt, errors, strict=True):
        assert f'Unexpected keyword argument "{name}"' in line and line.endswith("[call-arg]")
