"""Keeping freed memory in the process: glibc's allocator tuned for numpy arrays made and dropped
at every step.

A large simulation makes arrays of one to hundreds of MB at every instant or round (per flow, per
hop) and drops them at once. glibc's defaults return such memory to the operating system: blocks
above a threshold (128 KB at first, raised as they are freed, at most 32 MB) are mapped and unmapped
one by one, and the top of the heap is given back whenever more than twice that is free there. The
next instant then touches fresh pages, a page fault each 4 KB. Both thresholds at 1 GiB, 131,072
ranks, 100 MB all-reduce (26 Nov 2026, two runs each beside another job, load 1.6-1.8):
halving doubling on the dragonfly 246,000 -> 126,000 faults, 1.2-2.2 -> 1.0-1.2 s of system time;
the parameter server on a 2D torus (hop arrays of 190 MB) 59,000 -> 24,000 faults, 2.5-4.3 ->
1.5-2.2 s, its peak 2.02 -> 2.16 GB (freed blocks reused rather than handed back, a few % more).

Setting one alone does harm: any explicit setting turns off glibc's raising of the mapping
threshold, so with only a trim threshold every block above 128 KB is mapped afresh (2.5 million
faults, twice the time). Hence both, once, where the command line starts; the simulator itself (a
library) leaves the process's allocator alone. Elsewhere than glibc, nothing is done, and neither
where the user set either variable (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``): glibc
read it as the process started, and, as for the harness's ranks, the caller's setting wins.
"""

from __future__ import annotations

import ctypes
import os

from ddlsim.real_runs.environment import ALLOCATOR_ENV

__all__ = ["DISABLE_VARIABLE", "keep_freed_memory"]

DISABLE_VARIABLE = "DDLSIM_DEFAULT_MALLOC"  # set (to anything) to leave glibc's defaults alone

# the mallopt parameter (malloc.h) of each of the harness's allocator variables: the values are the
# ones its ranks get through the environment (``ALLOCATOR_ENV``, both 1 GiB: blocks up to 1 GiB come
# from the heap and are reused there, its top is given back only past 1 GiB free), so that
# simulations and runs share one policy
_MALLOPT = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}


def keep_freed_memory() -> bool:
    """Set glibc's allocator to keep freed memory for reuse (see the module); whether it was set
    (False off glibc, where ``DDLSIM_DEFAULT_MALLOC`` is set, or where the environment sets either
    threshold itself)."""
    if os.environ.get(DISABLE_VARIABLE) is not None or any(name in os.environ for name in ALLOCATOR_ENV):
        return False
    try:  # the interpreter's own symbols, which hold the C library's (no search for its file)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl has no mallopt; macOS, Windows)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(_MALLOPT[name], int(value)) == 1 for name, value in ALLOCATOR_ENV.items())
