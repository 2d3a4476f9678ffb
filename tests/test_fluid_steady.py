"""The fluid path's skipping of repeated periods (``fluid_steady``) gives the times of simulating every
round, and the message path's; it declines where the state does not repeat."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.simulator.engine.collective_engine import MessageExecutor
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.fluid_steady import Snapshot, period
from tests.test_collective_engine import fabric_of, random_schedule


def _fabric(nodes, devices_per_node=1, **kwargs):
    return fabric_of(nodes, devices_per_node, nodes_per_leaf=4, **kwargs)


def _both(schedule, fabric, nbytes, start=0.0):
    skipping = FluidExecutor(fabric)
    fast = skipping.run(schedule, nbytes, start)
    every = FluidExecutor(fabric, extrapolate=False)
    slow = every.run(schedule, nbytes, start)
    assert every.skipped_rounds == 0
    assert skipping.transfers == every.transfers
    return skipping, fast, slow


@pytest.mark.parametrize(
    ("algorithm", "nodes", "devices_per_node", "topology", "options"),
    [
        # cross-leaf hops are slower: the tree's ranks leave its fill apart, its flows of consecutive
        # rounds overlap, yet the state repeats round after round
        ("double_binary_tree", 64, 1, "fat_tree", {"chunks": 24}),
        ("double_binary_tree", 16, 4, "fat_tree", {"chunks": 16}),
        ("double_binary_tree", 32, 1, "dragonfly", {"chunks": 20}),
        ("ring", 16, 1, "torus_2d", {}),
    ],
)
def test_skipped_periods_give_every_rounds_times(algorithm, nodes, devices_per_node, topology, options):
    fabric = _fabric(nodes, devices_per_node, topology=topology)
    ranks = nodes * devices_per_node
    impl = COLLECTIVE_ALGORITHMS.get(algorithm)
    schedule = impl.schedule("allreduce", ranks, devices_per_node=devices_per_node, **options)
    skipping, fast, slow = _both(schedule, fabric, 8e6)
    assert skipping.skipped_rounds > 0
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, 8e6, 0.0), rtol=1e-9)


def test_uneven_entry_times_skip_as_every_round_does():
    fabric = _fabric(32, 1, topology="fat_tree")
    schedule = COLLECTIVE_ALGORITHMS.get("double_binary_tree").schedule("allreduce", 32, chunks=24)
    rng = np.random.default_rng(7)
    start = np.where(rng.random(32) < 0.3, rng.random(32) * 2e-4, 0.0)
    _, fast, slow = _both(schedule, fabric, 8e6, start)
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, 8e6, start), rtol=1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_random_repeated_rounds_equal_the_message_path(seed):
    """Random rounds repeated up to 12 times from random entry times: skipped or not, the times are
    the message path's."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(3, 9))
    fabric = _fabric(nodes, topology=str(rng.choice(["switch", "fat_tree", "torus_2d"])), oversubscription=2.0)
    schedule = random_schedule(rng, nodes, most_rounds=4, most_repeats=12)
    start = np.where(rng.random(nodes) < 0.5, rng.random(nodes) * 3e-4, 0.0)
    _, fast, slow = _both(schedule, fabric, 8e6, start)
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, 8e6, start), rtol=1e-9)


def _snapshot(first, now, ends, left):
    empty = np.empty(0, dtype=np.int64)
    flows = (np.zeros(ends.size, dtype=np.int64), np.arange(ends.size), ends)
    progress = [(left, np.ones(left.size, dtype=bool), np.zeros(left.size), np.zeros(left.size))]
    return Snapshot(
        first, now, first + 1, flows, (empty, empty, np.empty(0)), np.zeros(left.size, dtype=np.int64), progress
    )


def test_period_only_where_the_state_repeats():
    before = _snapshot(3, 1e-3, np.array([1e-5, 2e-5]), np.array([1, 1]))
    assert period(before, _snapshot(4, 1.5e-3, np.array([1e-5, 2e-5]), np.array([1, 1]))) == pytest.approx(5e-4)
    assert period(before, _snapshot(4, 1.5e-3, np.array([1e-5, 2.1e-5]), np.array([1, 1]))) is None  # a flow ends later
    assert (
        period(before, _snapshot(4, 1.5e-3, np.array([1e-5, 2e-5]), np.array([1, 0]))) is None
    )  # a rank is further on
    assert period(before, _snapshot(3, 1.5e-3, np.array([1e-5, 2e-5]), np.array([1, 1]))) is None  # no round later


def test_a_tree_on_a_torus_drifts_so_no_tolerance_may_be_loosened(monkeypatch):
    """A pipelined tree on a 4x4 torus never repeats (``fluid_steady``: ranks off the busiest link
    drift against it by about 133 ns a round): nothing is skipped and the times are the message
    path's. Were "equal" loosened to about 0.4 us (10^12 ulps), a period would be found that is not
    one, and the times would miss by more than 1e-6."""
    fabric = _fabric(16, topology="torus_2d")
    schedule = COLLECTIVE_ALGORITHMS.get("double_binary_tree").schedule("allreduce", 16, chunks=24)
    exact = MessageExecutor(fabric).run(schedule, 8e6, 0.0)
    skipping = FluidExecutor(fabric)
    np.testing.assert_allclose(skipping.run(schedule, 8e6, 0.0), exact, rtol=1e-9)
    assert skipping.skipped_rounds == 0
    monkeypatch.setattr("ddlsim.simulator.engine.steady_state.ULPS", 1e12)
    loose = FluidExecutor(fabric)
    wrong = loose.run(schedule, 8e6, 0.0)
    assert loose.skipped_rounds > 0
    assert np.abs(wrong / exact - 1).max() > 1e-6
