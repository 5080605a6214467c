"""A checkpoint written by this Python loads under the next minor versions: data kept, definitions re-created."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from snapcell import Pool
from tests import otherpythons

KEY = "cross-version-signing-key-0123456789"
INTERPRETERS = otherpythons.INTERPRETERS

WRITE = """
import math
from datetime import date
settings = {"name": "report", "limits": (1, 2.5), "tags": {"a", "b"}, "raw": b"\\x00\\x01", "day": date(2024, 5, 1)}
rows = [{"id": i, "score": i * 1.5} for i in range(50)]
def area(r):
    return round(math.pi * r * r, 3)
class Box:
    def __init__(self, n):
        self.n = n
    def double(self):
        return Box(self.n * 2)
box = Box(4)
square = lambda v: v * v
"""

READ = (
    "(settings['name'], settings['limits'], sorted(settings['tags']), settings['raw'], settings['day'], len(rows), "
    "rows[-1], area(2), Box(3).double().n, 'box' in dir(), 'square' in dir())"
)

_CHILD = """
import json, sys
from snapcell import Pool
from tests import otherpythons
args = json.loads(sys.argv[1])
with Pool(args["store"], signing_keys=[args["key"]], isolation="inline") as pool, pool.checkout() as session:
    session.load_session(args["id"])
    result = session.run(args["cell"])
print(json.dumps({
    "value": repr(result.value),
    "error": f"{result.error.exc_type}: {result.error.exc_message}" if result.error else None,
    "notes": list(result.notes),
    "python": list(sys.version_info[:2]),
}))
"""


@pytest.fixture(scope="session")
def other_pythons() -> dict[str, Path | str]:
    """A venv with snapcell (base dependencies only) for each other interpreter present; else why not.

    Their builds started when collection finished (see `tests.otherpythons`); this waits for them.
    """
    return otherpythons.wait()


@pytest.mark.parametrize("version", sorted(INTERPRETERS))
def test_a_checkpoint_loads_under_a_newer_python(
    version: str, other_pythons: dict[str, Path | str], tmp_path: Path
) -> None:
    python = other_pythons[version]
    if isinstance(python, str):
        pytest.skip(python)
    store = tmp_path / "store"
    with (
        Pool(str(store), create_store=True, signing_keys=[KEY], isolation="inline") as pool,
        pool.checkout() as session,
    ):
        session.feed_run(WRITE)
        checkpoint_id = session.dump()
        expected = session.run(READ).value
    args = {"store": str(store), "key": KEY, "id": checkpoint_id.hex(), "cell": READ}
    env = {k: v for k, v in os.environ.items() if k not in ("SNAPCELL_SIGNING_KEY", "PYTHONPATH")}
    child = subprocess.run(
        [str(python), "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, timeout=120, env=env
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["python"] == [int(p) for p in version.split(".")]
    assert report["error"] is None, report
    *data, has_box, has_square = expected
    # Plain data comes back as it was; functions and classes are defined again from their source.
    assert report["value"] == repr((*data, False, False))
    notes = " ".join(report["notes"])
    assert "re-created from their source" in notes and "area" in notes and "Box" in notes, notes
    # What neither survives nor can be re-created is named: the instance of the old class, the lambda.
    assert "could not be restored" in notes and "box (" in notes and "square (" in notes, notes
    assert has_box and has_square
