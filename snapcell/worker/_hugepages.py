"""Huge pages for a zygote's heap, so that each fork has fewer page-table entries to copy.

A fork copies one page-table entry for each resident anonymous page of its parent (about 14,000 for a zygote that
has imported pandas: 56 MB) and takes a reference on each page; the child's exit drops them again. Collapsed into
2 MiB pages (``MADV_COLLAPSE``, Linux 6.1+), an aligned 2 MiB range costs a fork one entry instead of 512. A child
that writes to such a page still copies 4 KiB of it: the kernel splits a shared huge page on a write fault.

Only ranges already (almost) fully resident are collapsed, so the zygote grows by little, and the mappings' own
huge-page setting is left alone: nothing allocated later, in the zygote or a child, gets huge pages unless the
system's setting says so.
"""

from __future__ import annotations

import ctypes
import mmap

__all__ = ["collapse_resident_heap"]

_MADV_COLLAPSE = 25
_HUGE = 1 << 21
# A range is collapsed when at least this share of its small pages is resident (the rest is filled with zeros).
_MIN_RESIDENT = 0.9

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def _anonymous_ranges(maps_file: str) -> list[tuple[int, int]]:
    """The private, writable, anonymous mappings (the heap, malloc's and the allocator's arenas) of this process."""
    ranges = []
    with open(maps_file) as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or fields[1] != "rw-p" or fields[4] != "0":
                continue
            if len(fields) > 5 and fields[5] != "[heap]":
                continue  # the stack, vdso/vvar, named mappings
            start, end = (int(part, 16) for part in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def _resident_share(address: int, vector: ctypes.Array[ctypes.c_ubyte]) -> float:
    if _libc.mincore(address, _HUGE, vector) != 0:
        return 0.0
    return sum(byte & 1 for byte in vector) / len(vector)


def collapse_resident_heap(maps_file: str = "/proc/self/maps") -> int:
    """Collapse this process's resident anonymous memory into huge pages, 2 MiB range by 2 MiB range, where possible.

    Returns:
        The bytes collapsed: 0 where the kernel cannot (before Linux 6.1, huge pages disabled, no free huge page).
        Never raises for what the kernel refuses.
    """
    vector = (ctypes.c_ubyte * (_HUGE // mmap.PAGESIZE))()
    collapsed = 0
    try:
        ranges = _anonymous_ranges(maps_file)
    except OSError:
        return 0
    for start, end in ranges:
        address = (start + _HUGE - 1) & ~(_HUGE - 1)
        while address + _HUGE <= end:
            if _resident_share(address, vector) >= _MIN_RESIDENT and _libc.madvise(address, _HUGE, _MADV_COLLAPSE) == 0:
                collapsed += _HUGE
            address += _HUGE
    return collapsed
