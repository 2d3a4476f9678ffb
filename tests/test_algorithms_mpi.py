"""Launcher: the training-algorithm MPI bodies (``tests/mpi/test_algorithms_body.py``) on 2 and 4 ranks.

Every algorithm runs for real through the same role program as in the simulator, with real torch
models and data; on 2 ranks also the staleness trend of the statistical-efficiency model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("torch")
pytest.importorskip("sklearn")

from tests.test_real_mpi import TIMEOUT_S, mpi_env, mpiexec

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks, bodies", [(2, 2), (4, 2)])
def test_algorithms_under_mpiexec(ranks, bodies):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "tests.mpi.test_algorithms_body"]
    done = subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.count(f"ok on {ranks} ranks") == bodies, done.stdout
