"""Microbenchmark arithmetic (nccl-tests' definitions) and a small ``ddlsim bench`` end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlsim.real_runs.microbench import (
    LAYER_COLUMNS,
    MEASUREMENT_COLUMNS,
    Stats,
    bus_bandwidth_Bps,
    power_sizes,
    slowest_steps,
)
from ddlsim.simulator.records import read_csv

REPO = Path(__file__).resolve().parents[1]


def test_bus_bandwidth_follows_nccl_tests():
    """16 MB in 10 ms is algbw 1.6 GB/s; on 4 ranks all-reduce busbw = 1.6 x 2*3/4 = 2.4 GB/s,
    all-gather and reduce-scatter 1.6 x 3/4 = 1.2 GB/s, broadcast 1.6 GB/s."""
    assert bus_bandwidth_Bps("allreduce", 16e6, 4, 0.01) == pytest.approx(2.4e9)
    assert bus_bandwidth_Bps("allgather", 16e6, 4, 0.01) == pytest.approx(1.2e9)
    assert bus_bandwidth_Bps("reduce_scatter", 16e6, 4, 0.01) == pytest.approx(1.2e9)
    assert bus_bandwidth_Bps("broadcast", 16e6, 4, 0.01) == pytest.approx(1.6e9)


def test_sizes_and_spread():
    assert power_sizes(1, 64 * 2**20)[:3] == [1, 4, 16] and power_sizes(1, 64 * 2**20)[-1] == 64 * 2**20
    stats = Stats.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (stats.median_s, stats.min_s, stats.max_s, stats.repeats) == (3.0, 1.0, 100.0, 5)
    assert "q1=2 q3=4" in stats.notes()


def test_a_step_is_timed_as_its_slowest_rank():
    """Step 0: rank 1 is slowest (1 + 5); step 1: rank 0 (4 + 4), though rank 1's backward is longer."""
    forward, backward = slowest_steps([([1.0, 4.0], [2.0, 4.0]), ([1.0, 1.0], [5.0, 5.0])])
    assert (forward, backward) == ([1.0, 4.0], [5.0, 4.0])


@pytest.mark.slow
@pytest.mark.mpi
def test_bench_writes_measurement_rows(tmp_path):
    pytest.importorskip("mpi4py")
    pytest.importorskip("torch")
    env = {**os.environ, "MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "ddlsim", "bench", "-n", "2", "--out", str(tmp_path),
               "--benchmarks", "ping_pong,streaming_bandwidth,collectives,layers", "--p2p-max-bytes", "1KiB",
               "--collective-sizes", "4KiB", "--algorithms", "ring,binomial_tree", "--repeats", "2", "--warmup", "1",
               "--models", "small_cnn", "--batch-sizes", "4"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rows = read_csv(tmp_path / "measurements.csv")
    assert tuple(rows[0]) == MEASUREMENT_COLUMNS
    collective = {(r["collective"], r["algorithm"]) for r in rows if r["kind"] == "collective"}
    assert {("allreduce", "ring"), ("reduce_scatter", "ring"), ("broadcast", "binomial_tree"),
            ("allreduce", "mpich")} <= collective  # fmt: skip
    assert {r["collective"] for r in rows if r["kind"] == "point_to_point"} == {"ping_pong", "streaming_bandwidth"}
    for row in rows:
        assert float(row["value"]) > 0 and row["device"] == "local_cpu" and row["network"] == "local_shm"
        assert row["metric"] in ("time_s", "bus_bandwidth_Bps") and "spread" in row["notes"]
    layers = read_csv(tmp_path / "layers.csv")
    assert tuple(layers[0]) == LAYER_COLUMNS
    assert {r["phase"] for r in layers} == {"forward", "backward"}
    # the whole training step, timed as well: repeats after warm-up, all of the model's gradient bytes
    total = {r["phase"]: r for r in layers if r["layer"] == "total"}
    assert set(total) == {"forward", "backward"} and {r["repeats"] for r in total.values()} == {"2"}
    per_layer = sum(int(r["parameter_bytes"]) for r in layers if r["layer"] != "total" and r["phase"] == "forward")
    assert int(total["forward"]["parameter_bytes"]) == per_layer > 0
