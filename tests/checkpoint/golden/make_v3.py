"""Writes the format-3 golden checkpoint (run once with the release that introduced the format; kept as is)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snapcell import Policy, Pool
from snapcell.checkpoint import FORMAT_VERSION
from snapcell.storage import MemoryStore

KEY = "golden-checkpoint-key-0123456789"
SCRIPT = """
import numpy as np
class Box:
    def __init__(self, n):
        self.n = n
def area(r):
    return 3.14159 * r * r
total = 42
boxes = [Box(1), Box(2)]
same = boxes
big = np.arange(20_000)
table = {i: str(i) for i in range(3000)}
"""


def main() -> None:
    folder = Path(__file__).parent / f"v{FORMAT_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
    folder.mkdir(exist_ok=True)
    store = MemoryStore("golden")
    with Pool(store, isolation="inline", policy=Policy().with_modules(["numpy"]), signing_keys=[KEY]) as pool:
        with pool.checkout() as session:
            session.feed_run(SCRIPT)
            checkpoint_id = session.dump()
    objects = {}
    for index, info in enumerate(sorted(store.scan(), key=lambda o: o.key)):
        name = f"object-{index}.bin"
        (folder / name).write_bytes(store.get(info.key))
        objects[info.key] = name
    meta = {"id": checkpoint_id.hex(), "key": KEY, "format_version": FORMAT_VERSION, "objects": objects}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
