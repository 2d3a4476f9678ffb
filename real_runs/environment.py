"""The environment of a real run's ranks: what ``ddlsim run`` and ``ddlsim bench`` set for every rank,
and which variables change timings (recorded in each run's ``metadata.json``).

A leaf module: the launcher sets these, the trace writer records them, and neither imports the other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# glibc malloc hands blocks above its mmap threshold (dynamic, 128 KiB at start) to fresh mmap()s and
# gives freed heap top back above its trim threshold, so a training step's activation buffers are
# mapped, page-faulted and unmapped again every step: on this project's 2-core machine that is 20-25 %
# of a resnet_small step, and how much of it a process pays depends on its allocation history (a
# microbenchmark that ran other passes first paid less than the run it was to predict). Fixed
# thresholds keep the buffers in the heap for reuse, in the runs and in the benchmarks alike.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
# what a rank's environment may set that changes its timings; recorded in each run's metadata.json
TIMING_ENV = ("OMP_NUM_THREADS", *ALLOCATOR_ENV, "MPIR_CVAR_POLLS_BEFORE_YIELD")


def rank_env(ranks: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: the repository importable, one torch thread, fixed malloc thresholds
    (``ALLOCATOR_ENV``), polite MPICH polling when the ranks outnumber the cores. Values already set
    in the caller's environment win."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    for key, value in ALLOCATOR_ENV.items():
        env.setdefault(key, value)
    if ranks > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "1")
    env.update(extra or {})
    return env
