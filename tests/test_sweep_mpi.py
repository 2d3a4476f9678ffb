"""Sweeps under mpiexec with mpi4py.futures give byte-identical results to a serial run."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec")


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec on PATH (pip install mpich)")
def test_mpi_pool_matches_serial(tmp_path):
    argv = ["simulate", "--nodes", "1,2,4", "--per-device-batch", "16"]
    env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    mpi = subprocess.run(
        [
            MPIEXEC,
            "-n",
            "3",
            sys.executable,
            "-m",
            "mpi4py.futures",
            "-m",
            "ddlsim.simulator.cli.main",
            *argv,
            "--executor-pool",
            "mpi",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "mpi"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert mpi.returncode == 0, mpi.stderr[-2000:]
    serial = subprocess.run(
        [sys.executable, "-m", "ddlsim", *argv, "--executor-pool", "serial", "--out", str(tmp_path / "serial")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert serial.returncode == 0, serial.stderr
    assert (tmp_path / "mpi" / "results.csv").read_bytes() == (tmp_path / "serial" / "results.csv").read_bytes()
