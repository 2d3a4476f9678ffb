"""The command line's allocator setting (``simulator/cli/allocator.py``): freed arrays are reused,
not handed back to the operating system and faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# a process that makes and drops arrays of 1.6 to 24 MB fifty times (as a simulation's instants do)
# and prints its minor page faults over them; "tuned": after keep_freed_memory()
_CHURN = """
import resource, sys
import numpy as np
from ddlsim.simulator.cli.allocator import keep_freed_memory
set_ = keep_freed_memory() if sys.argv[1] == "tuned" else False
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    arrays = [np.ones(n) for n in (1_000_000, 3_000_000, 200_000, 2_000_000)]
    del arrays
print(set_, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _churn(mode: str, **env: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], env={**os.environ, **env}, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_arrays_are_reused_rather_than_faulted_in_again() -> None:
    was_set, tuned = _churn("tuned")
    _, plain = _churn("plain")
    assert was_set == "True"
    # glibc's defaults: about 68,000 faults here (pages handed back and touched afresh); kept: about 2,400
    assert tuned * 5 < plain


def test_the_variable_leaves_the_defaults_alone() -> None:
    was_set, _ = _churn("tuned", DDLSIM_DEFAULT_MALLOC="1")
    assert was_set == "False"


def test_a_threshold_the_user_set_wins() -> None:
    """glibc reads ``MALLOC_TRIM_THRESHOLD_`` (and the mapping one) as the process starts: where the
    user set one, the command line leaves the allocator as they asked, as the harness does for its ranks."""
    was_set, _ = _churn("tuned", MALLOC_TRIM_THRESHOLD_="131072")
    assert was_set == "False"
    was_set, _ = _churn("tuned", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    assert was_set == "False"
