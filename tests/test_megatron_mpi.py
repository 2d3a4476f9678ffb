"""Launcher: megatron layouts trained for real on 2 and 4 MPI ranks (``tests/mpi/test_megatron_body.py``).

Tensor, pipeline (plain and interleaved) and data parallelism with ZeRO 1-3 split one GPT over the
ranks; with the same global batch every layout's losses equal one rank's (the weights are drawn
whole and sliced, the data of a global micro-batch is the same wherever it runs), to float32
rounding. The loss also goes down. And ``ddlsim run --algorithm megatron`` writes its traces and
results as for any other algorithm.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("torch")

from tests.test_real_mpi import TIMEOUT_S, mpi_env, mpiexec

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def single_rank_losses():
    from ddlsim.real_runs.transport import MpiTransport
    from tests.mpi.test_megatron_body import losses_of

    return losses_of(MpiTransport(), {})


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_layout_trains_the_same_network_as_one_rank(ranks, single_rank_losses):
    from tests.mpi.test_megatron_body import LAYOUTS

    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "tests.mpi.test_megatron_body"]
    done = subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    runs = {row["layout"]: row["losses"] for row in map(json.loads, done.stdout.splitlines())}
    assert set(runs) == {name for name, (size, _) in LAYOUTS.items() if size == ranks}
    for name, losses in runs.items():
        assert losses == pytest.approx(single_rank_losses, rel=2e-5), name
    assert single_rank_losses[-1] < 0.9 * single_rank_losses[0]


def test_the_run_command_trains_a_layout_and_traces_it(tmp_path):
    from ddlsim.simulator.records import read_csv

    out = tmp_path / "run"
    command = [sys.executable, "-m", "ddlsim", "run", "-n", "4", "--algorithm", "megatron", "--tp", "2", "--pp", "2",
               "--zero-stage", "1", "--micro-batch", "2", "--global-batch", "8", "--updates", "4",
               "--learning-rate", "0.003", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "trained gpt_tiny on synthetic token sequences with megatron, 4 ranks" in done.stdout
    rows = read_csv(out / "results.csv")
    assert len(rows) == 4 and all(float(row["iteration_s"]) > 0 for row in rows)
    traces = sorted(path.name for path in out.glob("trace.rank*.jsonl"))
    assert traces == [f"trace.rank{rank}.jsonl" for rank in range(4)]
    names = {json.loads(line)["op"] for line in (out / "trace.rank0.jsonl").read_text().splitlines()[1:]}
    assert {"forward", "backward", "allreduce", "send", "update"} <= names
