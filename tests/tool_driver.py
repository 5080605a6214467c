"""Child process for the multi-process `CodeTool` tests: run turns on one conversation, then exit.

Usage: python -m tests.tool_driver STORE_URL HEADS_URL CONVERSATION TAG TURNS [ENDPOINT]
The signing key comes from SNAPCELL_SIGNING_KEY; S3 credentials are the moto test ones.
With TURNS = 0 it runs one turn that calls ``ready()`` and then spins, so the parent can kill it mid-turn.
"""

from __future__ import annotations

import os
import sys

from snapcell import Pool, SyncCodeTool
from snapcell.heads import S3Heads, SQLiteHeads
from snapcell.storage import S3Config, S3Store, open_store
from tests.s3server import TEST_CREDENTIALS, TEST_REGION

APPEND = "try:\n    entries\nexcept NameError:\n    entries = []\nentries.append({tag!r})\nlen(entries)"


def ready() -> None:
    os.write(1, b"ready\n")  # not print: an inline run captures sys.stdout


def main(argv: list[str]) -> int:
    store_url, heads_url, conversation, tag, turns = argv[:5]
    if store_url.startswith("s3://"):
        config = S3Config(endpoint_url=argv[5], region_name=TEST_REGION, **TEST_CREDENTIALS)
        store = open_store(store_url, s3=config)
        assert isinstance(store, S3Store)
        heads: object = S3Heads(store)
    else:
        store = open_store(store_url, create=True)
        heads = SQLiteHeads(heads_url.removeprefix("sqlite://"))
    with Pool(store, isolation="inline") as pool:
        tool = SyncCodeTool(pool, heads=heads, tools={"ready": ready}, lease_ttl_s=1.0, lease_wait_s=60)
        if int(turns) == 0:
            tool.run_code(conversation, "ready()\nwhile True:\n    pass")
        for _ in range(int(turns)):
            tool.run_code(conversation, APPEND.format(tag=tag))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
