"""The MPI test bodies again, over torch.distributed's gloo backend: every registered collective,
point-to-point and the Comm executor behave the same on both backends (issue 4)."""

import sys
from pathlib import Path

import pytest

from tests.mpi.gloo_ranks import run_gloo_ranks

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("ranks", [2, 3])
def test_bodies_on_gloo(ranks):
    command = [sys.executable, "-m", "tests.mpi.run_bodies", "--backend", "gloo",
               "point_to_point", "collectives", "comm_executor"]  # fmt: skip
    processes, outputs = run_gloo_ranks(ranks, command, 240, cwd=REPO)
    for rank, (process, out) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank}:\n{out[-3000:]}"
    assert "collectives: ok on" in outputs[0]
