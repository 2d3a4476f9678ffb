"""The MPI test bodies (``tests/mpi/bodies.py``): with one rank here, with 2, 3 and 4 under mpiexec.

Each body is written once as a function of a transport. Plain pytest runs it on a one-rank
``COMM_WORLD``; the ``mpiexec`` tests run ``python -m tests.mpi.run_bodies`` on N ranks, which
aborts the job on any rank's failure, so exit status 0 means every body passed on every rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.mpi.bodies import BODIES  # noqa: E402

pytestmark = pytest.mark.mpi
TIMEOUT_S = 240


def mpi_env() -> dict[str, str]:
    """Kind to a small machine: MPICH ranks yield the CPU while polling; torch uses one thread."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        "MPIR_CVAR_POLLS_BEFORE_YIELD": "1",
        "OMP_NUM_THREADS": "1",
    }


def mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec (pip install 'ddlsim[real]' installs the mpich wheel's)")
    return found


@pytest.fixture(scope="module")
def world():
    from ddlsim.real_runs.transport import MpiTransport

    return MpiTransport()


@pytest.mark.parametrize("name", sorted(BODIES))
def test_body_on_one_rank(world, name):
    BODIES[name](world)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_bodies_under_mpiexec(ranks):
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "tests.mpi.run_bodies"]
    done = subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.count(f"ok on {ranks} ranks") == len(BODIES), done.stdout


@pytest.mark.slow
def test_collectives_on_eight_ranks():
    """Up to 8 ranks, oversubscribed: every registered algorithm still equals the library."""
    command = [mpiexec(), "-n", "8", sys.executable, "-m", "tests.mpi.run_bodies", "collectives"]
    done = subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
