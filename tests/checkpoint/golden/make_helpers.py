"""Writes the golden checkpoint of snapcell's pickled helpers (run once, before the package layout moved; kept as is).

Its pickles name helpers by the module paths they had then (``snapcell.runner._host``, ``snapcell.runner._standins``,
``snapcell.checkpoint._pickle``, ``snapcell.checkpoint._stdvalues``): the loader and the host's scan must keep
resolving them through the alias table after any move.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snapcell import Policy, Pool
from snapcell.checkpoint import FORMAT_VERSION
from snapcell.storage import MemoryStore

KEY = "golden-checkpoint-key-0123456789"
SCRIPT = """
import asyncio, io, functools, operator, time, zoneinfo, enum, dataclasses
import numpy as np
buf = io.StringIO("hello")
buf.seek(2)
raw = io.BytesIO(b"abc")
queue = asyncio.Queue()
queue.put_nowait(1)
queue.put_nowait("two")
zone = zoneinfo.ZoneInfo("UTC")
@functools.lru_cache(maxsize=8)
def square(n):
    return n * n
square(3)
getter = operator.attrgetter("real")
caller = operator.methodcaller("upper")
nap = time.sleep
lookup = list_customers
stamps = np.array(["2024-01-01", "2024-06-30"], dtype="datetime64[D]")
class Color(enum.Enum):
    RED = 1
@dataclasses.dataclass
class Point:
    x: int
    y: int = 0
point = Point(1)
"""


def list_customers() -> list[str]:
    return ["ada", "grace"]


def main() -> None:
    folder = Path(__file__).parent / f"helpers-v{FORMAT_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
    folder.mkdir(exist_ok=True)
    store = MemoryStore("golden")
    with Pool(store, isolation="inline", policy=Policy().with_modules(["numpy"]), signing_keys=[KEY]) as pool:
        with pool.checkout() as session:
            session.feed_run(SCRIPT, external_lookup={"list_customers": list_customers})
            checkpoint_id = session.dump()
            assert session.manifest is not None and not session.manifest.dropped, session.manifest.dropped
    objects = {}
    for index, info in enumerate(sorted(store.scan(), key=lambda o: o.key)):
        name = f"object-{index}.bin"
        (folder / name).write_bytes(store.get(info.key))
        objects[info.key] = name
    meta = {"id": checkpoint_id.hex(), "key": KEY, "format_version": FORMAT_VERSION, "objects": objects}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
