"""The compiled fluid loop (``fluid_compiled``) against the numpy one it continues: handed over at any
instant, it gives the same finish times to the bit and rates as many instants, on dragonflies, fat
trees and tori, folded or not, with ranks entering together or apart; and the message path's times."""

import sys

import numpy as np
import pytest

import ddlsim.simulator.engine as engine
from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.simulator.engine import fluid_compiled, fluid_executor
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.fluid_fold import find_fold
from ddlsim.simulator.engine.message_executor import MessageExecutor
from ddlsim.simulator.engine.round_structures import ScheduleRuns
from tests.test_collective_engine import fabric_of, random_schedule
from tests.test_fluid_executor import DRAGONFLY_CASES, dragonfly


def _plain_and_compiled(fabric, schedule, nbytes, start, after, fold=None):
    """(numpy to the end, handed over after ``after`` instants): times and executors; neither skips
    periods, so that both simulate every instant."""
    plain = FluidExecutor(fabric, extrapolate=False, fold=fold)
    plain.compiled_after = None
    compiled = FluidExecutor(fabric, extrapolate=False, fold=fold)
    compiled.compiled_after = after
    return plain.run(schedule, nbytes, start), plain, compiled.run(schedule, nbytes, start), compiled


@pytest.mark.parametrize(("algorithm", "ranks", "dpn", "per_router", "per_group", "global_links"), DRAGONFLY_CASES)
@pytest.mark.parametrize("after", [0, 7])
def test_handed_over_dragonfly_runs_equal_the_numpy_loop_to_the_bit(
    algorithm, ranks, dpn, per_router, per_group, global_links, after
):
    fabric = dragonfly(ranks, dpn, per_router, per_group, global_links)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=dpn)
    start = np.random.default_rng(ranks).uniform(0, 2e-6, schedule.ranks)
    plain_s, plain, compiled_s, compiled = _plain_and_compiled(fabric, schedule, 1e8, start, after)
    np.testing.assert_array_equal(compiled_s, plain_s)
    assert compiled.compiled_instants > 0
    assert compiled.instants == plain.instants
    assert compiled.transfers == plain.transfers
    assert not compiled.links.load.any() and not compiled.links.users.any()  # every flow ended


@pytest.mark.parametrize("seed", range(12))
def test_random_rounds_on_random_fabrics_equal_the_numpy_loop_and_the_message_path(seed):
    """Random rounds (several flows a rank, empty and repeated rounds, copies and reductions) on fat
    trees and tori: the compiled loop gives the numpy loop's times to the bit, the message path's to 1e-9."""
    rng = np.random.default_rng(seed)
    topology = ["fat_tree", "torus_2d", "dragonfly"][seed % 3]
    nodes = int(rng.integers(4, 17))
    options = {"nodes_per_leaf": 4} if topology == "fat_tree" else {}
    fabric = fabric_of(nodes, 1, topology=topology, **options)
    schedule = random_schedule(rng, nodes, most_rounds=6, most_repeats=3, smallest=0)
    start = rng.uniform(0, 1e-6, nodes)
    after = int(rng.integers(0, 5))
    plain_s, plain, compiled_s, compiled = _plain_and_compiled(fabric, schedule, 4e6, start, after)
    np.testing.assert_array_equal(compiled_s, plain_s)
    assert compiled.instants == plain.instants
    np.testing.assert_allclose(compiled_s, MessageExecutor(fabric).run(schedule, 4e6, start), rtol=1e-9)


def test_a_folded_run_handed_over_equals_the_numpy_loop():
    """torus_2d on a dragonfly of 128 nodes folds onto one row of 8 (``fluid_fold``): the kept ranks'
    times, handed over early, to the bit, and the message path's for every rank."""
    fabric = fabric_of(128, topology="dragonfly", nodes_per_router=2, routers_per_group=4)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", 128, rows=16)
    fold = find_fold(schedule, fabric, ScheduleRuns().get(schedule), 0.0)
    assert fold is not None and fold.copies == 16
    plain_s, _, compiled_s, compiled = _plain_and_compiled(fabric, schedule, 1e6, 0.0, 5, fold=fold)
    np.testing.assert_array_equal(compiled_s, plain_s)
    assert compiled.compiled_instants > 0
    np.testing.assert_allclose(compiled_s, MessageExecutor(fabric).run(schedule, 1e6, 0.0), rtol=1e-9)


def test_a_pipelined_tree_that_never_repeats_goes_on_compiled_by_default(monkeypatch):
    """A pipelined tree on a 4x4 torus finds no period (``fluid_steady``): after ``compiled_after``
    instants without one, the default executor hands over, and the times stay the message path's.
    A run that keeps a transfer log is never handed over."""
    monkeypatch.setattr(fluid_executor, "COMPILED_AFTER", 200)
    fabric = fabric_of(16, 1, topology="torus_2d")
    schedule = COLLECTIVE_ALGORITHMS.get("double_binary_tree").schedule("allreduce", 16, chunks=24)
    executor = FluidExecutor(fabric)
    times = executor.run(schedule, 8e6, 0.0)
    assert executor.skipped_rounds == 0
    assert 0 < executor.compiled_instants < executor.instants
    assert executor.instants - executor.compiled_instants == 200
    np.testing.assert_allclose(times, MessageExecutor(fabric).run(schedule, 8e6, 0.0), rtol=1e-9)


def test_a_run_too_large_to_hand_over_stays_in_numpy(monkeypatch):
    monkeypatch.setattr(fluid_compiled, "MAX_PLACES", 10)
    fabric = dragonfly(64, 1, 2, 4, 1)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", 64)
    executor = FluidExecutor(fabric, extrapolate=False)
    executor.compiled_after = 0
    plain = FluidExecutor(fabric, extrapolate=False)
    plain.compiled_after = None
    np.testing.assert_array_equal(executor.run(schedule, 1e8, 0.0), plain.run(schedule, 1e8, 0.0))
    assert executor.compiled_instants == 0


@pytest.mark.parametrize(("algorithm", "ranks"), [("torus_2d", 64), ("double_binary_tree", 64), ("ring", 32)])
def test_handed_over_late_in_a_later_run_of_rounds_equal_the_numpy_loop(algorithm, ranks):
    """Handed over a third, two thirds of the way and at the last instant (later runs of identical
    rounds: the earlier ones are not rebuilt), the times are the numpy loop's to the bit."""
    fabric = dragonfly(ranks, 1, 2, 4, 1)
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks)
    start = np.random.default_rng(ranks).uniform(0, 2e-6, ranks)
    plain_s, plain, _, _ = _plain_and_compiled(fabric, schedule, 1e8, start, None)
    for after in (plain.instants // 3, 2 * plain.instants // 3, plain.instants - 1):
        _, _, compiled_s, compiled = _plain_and_compiled(fabric, schedule, 1e8, start, after)
        np.testing.assert_array_equal(compiled_s, plain_s)
        assert compiled.compiled_instants == plain.instants - after


def test_without_numba_the_numpy_loop_goes_on(monkeypatch):
    """Where the compiled loop cannot be loaded (numba missing: its import fails), a run that would
    hand over goes on in numpy, with the same times."""
    fabric = dragonfly(64, 1, 2, 4, 1)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", 64)
    plain_s, _, compiled_s, _ = _plain_and_compiled(fabric, schedule, 1e8, 0.0, 0)
    monkeypatch.setitem(sys.modules, "ddlsim.simulator.engine.fluid_compiled", None)  # import -> ImportError
    monkeypatch.delattr(engine, "fluid_compiled", raising=False)
    executor = FluidExecutor(fabric, extrapolate=False)
    executor.compiled_after = 0
    np.testing.assert_array_equal(executor.run(schedule, 1e8, 0.0), compiled_s)
    np.testing.assert_array_equal(plain_s, compiled_s)
    assert executor.compiled_instants == 0 and executor.instants > 0
