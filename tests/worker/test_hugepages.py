"""The zygote's resident heap is collapsed into huge pages; sparse ranges are left alone."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

_COLLAPSE = """
import ctypes, json, mmap
from snapcell.worker._hugepages import collapse_resident_heap

SIZE = 16 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

def private_mapping():
    area = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return area, ctypes.addressof(ctypes.c_char.from_buffer(area))

def huge_kb(address):
    block = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                block = start <= address < end
            elif block and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0

def resident_pages(address):
    vector = (ctypes.c_ubyte * (SIZE // mmap.PAGESIZE))()
    libc.mincore(address, SIZE, vector)
    return sum(byte & 1 for byte in vector)

dense, dense_at = private_mapping()
dense.write(b"x" * SIZE)  # every page resident
sparse, sparse_at = private_mapping()
for offset in range(0, SIZE, 1 << 20):
    sparse[offset] = 1  # one page in 256 resident
collapsed = collapse_resident_heap()
probe = 0
if collapsed == 0:  # why: a kernel without MADV_COLLAPSE says EINVAL
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    aligned = (dense_at + (2 << 20) - 1) & ~((2 << 20) - 1)
    probe = 0 if libc.madvise(aligned, 2 << 20, 25) == 0 else ctypes.get_errno()
print(json.dumps({
    "probe_errno": probe,
    "collapsed": collapsed,
    "dense_huge_kb": huge_kb(dense_at),
    "sparse_resident": resident_pages(sparse_at),
    "dense_intact": dense[:4] == b"xxxx" and dense[-4:] == b"xxxx",
}))
"""


def test_resident_ranges_are_collapsed_and_sparse_ones_are_not() -> None:
    out = subprocess.run([sys.executable, "-I", "-c", _COLLAPSE], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    if result["collapsed"] == 0 and result["probe_errno"] == errno.EINVAL:
        pytest.skip("this kernel does not collapse memory into huge pages (MADV_COLLAPSE, Linux 6.1+, THP enabled)")
    # The dense 16 MiB mapping holds at least 7 aligned 2 MiB ranges, each now one huge page.
    assert result["dense_huge_kb"] >= 7 * 2048
    assert result["dense_intact"]
    # The sparse one stays as it was: 16 resident pages, not 7 huge pages' worth of zeros.
    assert result["sparse_resident"] == 16
