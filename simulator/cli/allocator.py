"""Keeping freed memory in the process: glibc's allocator tuned for numpy arrays made and dropped
at every step.

A large simulation makes arrays of one to tens of MB at every instant (per flow, per hop) and
drops them at once. glibc's defaults return such memory to the operating system: blocks above a
threshold (128 KB at first, raised as they are freed, at most 32 MB) are mapped and unmapped one by
one, and the top of the heap is given back whenever more than twice that is free there. The next
instant then touches fresh pages, a page fault each 4 KB: the halving-doubling all-reduce on a
dragonfly of 131,072 ranks took 246,000 page faults and 1.0-1.6 s of system time in a 7.7-8.0 s
run; with the three settings below, 156,000 and 0.6-0.9 s (same peak memory, 1.24 GB).

Setting one of them alone does harm: any explicit setting turns off glibc's raising of the
mapping threshold, so with only a trim threshold every large array is mapped afresh (2.5 million
faults, twice the time). Hence all three, once, where the command line starts; the simulator
itself (a library) leaves the process's allocator alone. Elsewhere than glibc, nothing is done.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["DISABLE_VARIABLE", "keep_freed_memory"]

DISABLE_VARIABLE = "DDLSIM_DEFAULT_MALLOC"  # set (to anything) to leave glibc's defaults alone

# mallopt parameters (malloc.h) and the values set
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = (
    (_M_MMAP_THRESHOLD, 32 << 20),  # glibc's largest: blocks up to 32 MB come from the heap, reused
    (_M_TRIM_THRESHOLD, 1 << 30),  # give the heap's top back only past 1 GB free
    (_M_TOP_PAD, 256 << 20),  # and grow it 256 MB at a time
)


def keep_freed_memory() -> bool:
    """Set glibc's allocator to keep freed memory for reuse (see the module); whether it was set
    (False off glibc, or where ``DDLSIM_DEFAULT_MALLOC`` is set)."""
    if os.environ.get(DISABLE_VARIABLE) is not None:
        return False
    try:  # the interpreter's own symbols, which hold the C library's (no search for its file)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl has no mallopt; macOS, Windows)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(parameter, value) == 1 for parameter, value in _SETTINGS)
