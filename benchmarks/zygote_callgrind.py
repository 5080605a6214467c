"""How many instructions does a zygote run from exec to "ready", and with how many modules? (cold start)

Wall time is noisy on a shared machine; callgrind's instruction count is not. The zygote is started as
`snapcell.backends._zygotehost.Zygote` starts it (``python -s -P -m snapcell.worker._zygote CTRL_FD HOST_PID``, an
empty environment but the thread limits and a hash seed, here a fixed one, ``cwd=/``) under
``valgrind --tool=callgrind``; its ready message is read, then its channel closed, so it exits without a second stage.
Needs valgrind; not run by ``python -m benchmarks``.

Usage, from the repository root: ``python -m benchmarks.zygote_callgrind [--runs N]``; prints one JSON line a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

from snapcell.wire import THREAD_ENV

RUNS = 2


def measure() -> dict[str, int | None]:
    """One zygote under callgrind: its instructions (Ir) until it exits after "ready", and its module count."""
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=no",
            f"--callgrind-out-file={os.path.join(tmp, 'callgrind.out')}",
            sys.executable,
            "-s",
            "-P",
            "-m",
            "snapcell.worker._zygote",
            str(child.fileno()),
            str(os.getpid()),
        ]
        proc = subprocess.Popen(
            command,
            pass_fds=[child.fileno()],
            env={**THREAD_ENV, "PYTHONHASHSEED": "0"},
            cwd="/",
            stderr=subprocess.PIPE,
        )
        child.close()
        try:
            ready = json.loads(host.recv(65536) or b"{}")
        finally:
            host.close()
        _, err = proc.communicate(timeout=600)
    found = re.search(rb"Collected : (\d+)", err)
    return {"instructions": int(found.group(1)) if found else None, "modules": ready.get("modules")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    for _ in range(args.runs):
        print(json.dumps({"bench": "zygote_callgrind", **measure()}), flush=True)


if __name__ == "__main__":
    main()
