"""What a zygote imports before it says ready: each module there delays every new pool's first result.

The modules a first run does not need come later: in the zygote's second stage (for later children), or in a
child when its script first needs them. A first child must still carry values of those modules both ways.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from snapcell import AsyncPool, Policy
from snapcell.backends._zygotehost import Zygote
from snapcell.worker._zygote import _recv_fds

# Measured with CPython 3.11: 148 modules at ready, of which 6 are package faces (interpreter, policy, wire, sandbox,
# worker, _support: a few names each, imported on first use) and 3 small modules split out so that imports run one
# way (policy._ticks, wire._zygote, _support._version). A new module-level import on the worker's path shows up
# here; re-measure when CI moves to another Python.
MAX_MODULES_AT_READY = 150
# Never before ready: the heavy modules, the checkpoint code, and what a first run of "1+1" does not use.
NOT_BEFORE_READY = (
    "asyncio",
    "numpy",
    "pandas",
    "pydantic",
    "cloudpickle",
    "dill",
    "zstandard",
    "snapcell.checkpoint",
    "snapcell.storage",
    "snapcell.pool",
    "snapcell.session",
    "snapcell.sandbox._sandbox",
    "logging",
    "traceback",
    "pickle",
    "decimal",
    "datetime",
    "base64",
    "tempfile",
    "sysconfig",
    "socket",  # its enums; the zygote and its children use the C type, `_socket.socket`
    "selectors",
    # `dataclasses` compiles each class's methods and imports `inspect` (see `snapcell._support._record`);
    # copy, dis, random
    "dataclasses",
    "inspect",
    "dis",
    "copy",
    "random",
    "shutil",  # and with it bz2 and lzma: a workspace removes directories with it, never on a first run
    "bz2",
    "lzma",
)


def test_a_zygote_says_ready_with_a_bounded_number_of_modules() -> None:
    async def main() -> int:
        zygote = Zygote((), cwd="/", env={})
        await zygote.start()
        try:
            return zygote.modules_at_ready
        finally:
            await zygote.close()

    modules = asyncio.run(main())
    assert 0 < modules <= MAX_MODULES_AT_READY, f"the zygote imported {modules} modules before ready"


def test_the_zygote_imports_no_heavy_or_later_module_before_ready() -> None:
    # What the zygote runs before it says ready (`import_worker`), in a fresh interpreter started as a zygote is.
    probe = (
        "import json, sys\n"
        "from snapcell.worker import _zygote\n"
        "_zygote.import_worker()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True, env={})
    loaded = set(json.loads(out.stdout))
    assert "snapcell.worker._worker" in loaded  # the probe did import the worker
    early = sorted(m for m in loaded if any(m == name or m.startswith(name + ".") for name in NOT_BEFORE_READY))
    assert early == []


def echo(*values: Any) -> list[Any]:
    return list(values)


def test_a_first_child_carries_dates_decimals_and_bytes_it_imports_on_demand() -> None:
    script = (
        "import sys\n"
        "had = [m for m in ('datetime', 'decimal') if m in sys.modules]\n"
        "import datetime, decimal\n"
        "when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))\n"
        "values = (when, datetime.date(2024, 1, 2), datetime.timedelta(days=3), decimal.Decimal('1.25'))\n"
        "values += (b'\\x00\\xff',)\n"
        "[had, values, echo(*values)]"
    )

    async def main() -> Any:
        # Unrestricted, to look at sys.modules; the zygote's first fork: before its second stage imports anything.
        async with AsyncPool("memory://", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
            async with pool.checkout() as session:
                return await session.feed_run(script, external_lookup={"echo": echo})

    had, values, echoed = asyncio.run(main())
    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    expected = (when, datetime.date(2024, 1, 2), datetime.timedelta(days=3), decimal.Decimal("1.25"), b"\x00\xff")
    assert had == []  # none imported before the script: the values below were recognised on demand
    assert values == expected
    assert echoed == list(expected)  # to the host function (arguments) and back (its reply)


def test_the_zygote_receives_descriptors_as_socket_recv_fds_does() -> None:
    host, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        for sent in ([r, w], [w], [r, w, r]):  # the last holds more than the zygote takes: the rest are cut off
            socket.send_fds(host, [b"F"], sent)
            data, fds = _recv_fds(zygote, 16, 2)
            socket.send_fds(host, [b"F"], sent)
            expected, expected_fds, _, _ = socket.recv_fds(zygote, 16, 2)
            try:
                assert data == expected == b"F"
                files = [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in sent[:2]]
                assert [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in fds] == files
                assert len(expected_fds) == len(fds)
            finally:
                for fd in fds + expected_fds:
                    os.close(fd)
    finally:
        os.close(r)
        os.close(w)
        host.close()
        zygote.close()


def test_the_second_stage_is_asked_for_only_after_the_first_forks_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapcell.backends import _workerpool, _zygotehost

    requests: list[int] = []  # the zygotes whose second stage was asked for
    real = _zygotehost.Zygote._request_preload

    def request(self: _zygotehost.Zygote) -> None:
        requests.append(self.pid)
        real(self)

    monkeypatch.setattr(_zygotehost.Zygote, "_request_preload", request)

    async def first_result(wait_for_request: bool) -> tuple[Any, bool]:
        async with AsyncPool("memory://", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
            async with pool.checkout() as session:
                value = await session.feed_run("1 + 1")
            (shared,) = _workerpool._SHARED[asyncio.get_running_loop()].values()
            assert shared.zygote is not None
            pending = shared.zygote._preload_timer is not None
            deadline = asyncio.get_running_loop().time() + 60
            while wait_for_request and not requests and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            return value, pending

    monkeypatch.setattr(_zygotehost, "_PRELOAD_DELAY_S", 3600.0)
    assert asyncio.run(first_result(False)) == (2, True)
    assert requests == []  # the first session had its first result with no second stage asked for beside it
    monkeypatch.setattr(_zygotehost, "_PRELOAD_DELAY_S", 0.0)
    assert asyncio.run(first_result(True))[0] == 2
    assert len(requests) == 1  # asked for by the timer the first fork set, once


def test_a_first_childs_first_run_imports_neither_random_nor_tempfile() -> None:
    # Written without the word "import", so that the run needs no event loop (see `_loopfree`), as a first `1 + 1`.
    probe = (
        "b = __builtins__\n"
        "modules = (b if isinstance(b, dict) else vars(b))['__imp' + 'ort__']('sys').modules\n"
        "[m for m in ('random', 'tempfile') if m in modules]"
    )
    later = "import tempfile, random\n(tempfile.tempdir, tempfile.gettempdir() == tempfile.tempdir, random.random())"

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncPool("memory://", policy=Policy.unrestricted(), min_warm_workers=0) as pool:
            async with pool.checkout() as one, pool.checkout() as two:
                return await one.feed_run(probe), await one.feed_run(later), await two.feed_run(later)

    early, (where, same, draw), (_, _, other) = asyncio.run(main())
    assert early == []
    assert where is not None and where.endswith("/tmp") and same  # set by the worker when the script imported it
    assert draw != other  # imported after the fork: seeded from the OS in each child
