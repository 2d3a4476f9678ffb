"""The host model of the harness: reduction cost (gamma), core sharing, and the harness validation.

``tests/data/harness_bench.csv`` is a reduced copy (time rows of ring, recursive_doubling,
binomial_tree and mpich at 64 KB, 1 MB, 4 MB, 16 MB, and ping-pong) of the rows written on the
project's 2-core machine by::

    ddlsim bench -n 4 --benchmarks ping_pong,collectives \\
        --algorithms ring,recursive_doubling,halving_doubling,binomial_tree \\
        --collective-sizes 64KB,256KB,1MB,4MB,8MB,16MB --repeats 30 --out runs/bench
"""

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.hardware_models.profile import LinkFit, Profile, parse_profile, profile_to_toml
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import load_measurements, split_by_scale
from ddlsim.simulator.cli.validate_command import validate_rows
from ddlsim.simulator.engine.collective_engine import MessageExecutor, VectorisedExecutor, run_collective
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec

HARNESS = Path(__file__).parent / "data" / "harness_bench.csv"
# held-out median |error| reached on this file (20.3 %, see docs/calibration.md) plus a small margin;
# short of the 10 %: two identical runs of the bench differ by 12.5 % (median) at 4 ranks
HARNESS_MEDIAN_LIMIT = 0.22


def _star(ranks: int, reduce_Bps: float = math.inf) -> Fabric:
    return Fabric(FabricSpec(nodes=ranks, devices_per_node=1, network=load_link("ib_edr"), reduce_Bps=reduce_Bps))


def test_receiver_of_a_reduce_pays_gamma_and_the_sender_does_not():
    """Binomial reduce on 2 ranks: rank 1 sends S to rank 0, which adds it in.

    hop = alpha + S / beta; rank 0 ends at hop + S / reduce_Bps, rank 1 at hop.
    """
    schedule = COLLECTIVE_ALGORITHMS.get("binomial_tree").schedule("reduce", 2)
    size = 8e6
    free = VectorisedExecutor(_star(2)).run(schedule, size, 0.0)
    for executor in (VectorisedExecutor, MessageExecutor):
        finish = executor(_star(2, reduce_Bps=4e9)).run(schedule, size, 0.0)
        hop = free.max()
        assert finish[0] == pytest.approx(hop + size / 4e9, rel=1e-12)
        assert finish[1] == pytest.approx(hop, rel=1e-12)


def test_copy_transfers_pay_no_reduction():
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allgather", 4)
    free = VectorisedExecutor(_star(4)).run(schedule, 4e6, 0.0)
    slow = VectorisedExecutor(_star(4, reduce_Bps=1e9)).run(schedule, 4e6, 0.0)
    np.testing.assert_array_equal(free, slow)


@pytest.mark.parametrize("seed", range(6))
def test_random_setups_with_gamma_agree_on_both_paths(seed):
    """Every all-reduce, random rank count, start times and gamma: vectorised (or its fallback) = message level."""
    rng = np.random.default_rng(seed)
    for algorithm in COLLECTIVE_ALGORITHMS.names():
        impl = COLLECTIVE_ALGORITHMS.get(algorithm)
        if "allreduce" not in impl.collectives:
            continue
        ranks = int(rng.integers(2, 9))
        schedule = impl.schedule("allreduce", ranks)
        fabric = _star(schedule.ranks, reduce_Bps=float(rng.uniform(1e9, 2e10)))
        start = rng.uniform(0, 1e-4, schedule.ranks)
        size = float(rng.uniform(1e4, 1e7))
        auto, _ = run_collective(schedule, fabric, size, start)
        exact = MessageExecutor(fabric).run(schedule, size, start)
        np.testing.assert_allclose(auto, exact, rtol=1e-9)


def test_ranks_beyond_the_cores_stretch_alpha_and_beta():
    """4 ranks on 2 cores: each gets half a core, so alpha doubles and beta halves; 2 ranks: unchanged."""
    fit = LinkFit((), (10e-6,), (4e9,), "test", reduce_Bps=8e9, cores=2.0)
    link = load_link("local_shm")
    assert fit.apply(link, 1e6, host_ranks=2).per_message_overhead_s == pytest.approx(10e-6)
    stretched = fit.apply(link, 1e6, host_ranks=4)
    assert stretched.per_message_overhead_s == pytest.approx(20e-6)
    assert stretched.port_bandwidth_Bps == pytest.approx(2e9)
    assert fit.stretch(3) == pytest.approx(1.5)


def test_profile_round_trips_reduce_and_cores(tmp_path):
    fit = LinkFit((1e6,), (1e-5, 2e-5), (3e9, 2e9), "test", reduce_Bps=8e9, cores=2.0)
    profile = Profile(links={"local_shm@local_cpu": fit})

    back = parse_profile(tomllib.loads(profile_to_toml(profile)), tmp_path / "p.toml")
    assert back.links["local_shm@local_cpu"] == fit
    plain = Profile(links={"local_shm": LinkFit()})
    parsed = parse_profile(tomllib.loads(profile_to_toml(plain)), tmp_path / "q.toml")
    assert math.isinf(parsed.links["local_shm"].cores)


def test_harness_held_out_median_error_stays_under_the_reached_figure():
    rows = load_measurements([HARNESS])
    calibration, _ = split_by_scale(rows)
    profile = calibrate(calibration, bootstrap=0).profile
    _, summary = validate_rows(rows, {row.id for row in calibration}, profile, 0.10, 0.9)
    assert summary["median_ape"] <= HARNESS_MEDIAN_LIMIT, summary
