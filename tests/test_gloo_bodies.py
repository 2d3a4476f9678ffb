"""The MPI test bodies again, over torch.distributed's gloo backend: every registered collective,
point-to-point and the Comm executor behave the same on both backends (issue 4)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("ranks", [2, 3])
def test_bodies_on_gloo(ranks):
    port = _free_port()
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")  # fmt: skip
        command = [sys.executable, "-m", "tests.mpi.run_bodies", "--backend", "gloo",
                   "point_to_point", "collectives", "comm_executor"]  # fmt: skip
        processes.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=240)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for rank, (process, out) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank}:\n{out[-3000:]}"
    assert "collectives: ok on" in outputs[0]
