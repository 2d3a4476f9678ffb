"""A collective run in segments (``segments``) times as the message path does; it cuts only where the
cut is clean, and a pipelined tree's steady rounds come out as one run of identical rounds."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine import fluid_fold, round_fluid, segments
from ddlsim.simulator.engine.collective_engine import (
    ContentionDetected,
    MessageExecutor,
    VectorisedExecutor,
    run_collective,
)
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.round_structures import ScheduleRuns
from tests.test_collective_engine import fabric_of


def _fabric(nodes, devices_per_node=1, **kwargs):
    return fabric_of(nodes, devices_per_node, nodes_per_leaf=4, **kwargs)


def _tree(nodes, devices_per_node, chunks):
    impl = COLLECTIVE_ALGORITHMS.get("double_binary_tree")
    return impl.schedule("allreduce", nodes * devices_per_node, devices_per_node=devices_per_node, chunks=chunks)


class _Counting:
    """Wraps ``FluidExecutor`` where ``segments`` runs it (``fluid_fold.run_fluid``): the rounds each fluid
    simulation there was given."""

    def __init__(self, monkeypatch):
        self.rounds: list[int] = []
        counting = self

        class Fluid(FluidExecutor):
            def run(self, schedule, message_bytes, start_s, *args, **kwargs):
                counting.rounds.append(sum(1 for _ in schedule.rounds()))
                return super().run(schedule, message_bytes, start_s, *args, **kwargs)

        monkeypatch.setattr(fluid_fold, "FluidExecutor", Fluid)


def test_pipelined_tree_rounds_share_their_arrays_in_steady_state():
    """64 nodes (height 6), 24 pieces: the rounds in which every tree edge carries a piece up and one
    down hand out the same arrays, so they make one run (and the chains' steady rounds one each)."""
    runs = ScheduleRuns().get(_tree(64, 1, 24))
    assert sum(count for _, count in runs) == 2 * 6 + 24 - 1
    # rounds 11..23: from the root's height (6) plus the deepest parent's depth (5) to the last piece
    assert max(count for _, count in runs) == 24 - (6 + 5)
    chained = [count for _, count in ScheduleRuns().get(_tree(16, 4, 24)) if count > 1]
    assert len(chained) == 3  # chain reduce, trees, chain broadcast


@pytest.mark.parametrize(("nodes", "devices_per_node", "chunks"), [(16, 4, 12), (32, 2, 16)])
def test_segments_before_the_decline_go_on_the_round_path_and_equal_the_message_path(
    monkeypatch, nodes, devices_per_node, chunks
):
    """The round path declines a pipelined tree at its fill; the chain reduce before it is cut off
    cleanly (on a switch every device leaves it together) and kept on the round path, the rest is one
    fluid simulation, and the times are the message path's."""
    fabric = _fabric(nodes, devices_per_node)
    schedule = _tree(nodes, devices_per_node, chunks)
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(fabric).run(schedule, 8e6, 0.0)
    fluid = _Counting(monkeypatch)
    finish, path = run_collective(schedule, fabric, 8e6, 0.0)
    assert path == "fluid"
    total = sum(1 for rnd in schedule.rounds() if len(rnd))
    assert len(fluid.rounds) == 1
    assert fluid.rounds[0] <= total - chunks  # at least the chain reduce's steady rounds were not
    np.testing.assert_allclose(finish, run_collective(schedule, fabric, 8e6, 0.0, mode="message")[0], rtol=1e-9)


@pytest.mark.parametrize("topology", ["fat_tree", "switch"])
def test_uneven_entry_times_equal_the_message_path(topology):
    """Ranks entering at different times (a cut then may or may not be clean): the message path's times."""
    fabric = _fabric(16, 4, topology=topology)
    schedule = _tree(16, 4, 12)
    rng = np.random.default_rng(5)
    start = np.where(rng.random(64) < 0.3, rng.random(64) * 2e-4, 0.0)
    finish, _ = run_collective(schedule, fabric, 8e6, start)
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 8e6, start), rtol=1e-9)


def test_segments_decline_without_a_steady_run_and_on_loggp():
    """Nothing to cut at (no run of ``STEADY_MIN`` identical rounds), or a LogGP fabric (the fluid
    path does not model it): None, and the caller goes on as before."""
    fabric = _fabric(8)
    rnd = Round.of([0, 2], [1, 3], 0, 1, 0)
    short = Schedule("short", "allreduce", 8, 1, lambda: [rnd] * (segments.STEADY_MIN - 1))
    assert segments.run_in_segments(short, fabric, 1e6, 0.0, 10**6) is None
    loggp = _fabric(4, 4, loggp=True)
    assert segments.run_in_segments(_tree(4, 4, 12), loggp, 1e6, 0.0, 10**6) is None


def test_the_earliest_start_waits_for_what_a_rank_receives():
    """Rank 2 left the last segment early (clock 0) but sends only after rank 1's transfer to it,
    which cannot start before rank 1's clock (5): its flow starts no earlier than 5."""
    first = Round.of([1], [2], 0, 1, 0)
    then = Round.of([2], [3], 0, 1, 0)
    clock = np.array([9.0, 5.0, 0.0, 7.0])
    assert segments._earliest_start([(first, 1), (then, 3)], clock) == 5.0
    assert segments._earliest_start([(then, 1)], clock) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_components_hooked_equal_components_propagated(monkeypatch, seed):
    """Past its passes ``_components`` hooks and flattens trees: the same labels, numbered by each
    component's lowest flow, as label propagation run to the end."""
    rng = np.random.default_rng(seed)
    flows, links = int(rng.integers(5, 300)), int(rng.integers(3, 200))
    hops = int(rng.integers(flows, 3 * flows))
    owner = np.concatenate([np.arange(flows), rng.integers(0, flows, hops - flows)])
    link = rng.integers(0, links, hops)
    used, link = np.unique(link, return_inverse=True)
    if seed == 0:  # one long chain: flow i shares link i with flow i + 1
        owner = np.concatenate([np.arange(flows), np.arange(1, flows)])
        link = np.concatenate([np.arange(flows), np.arange(flows - 1)])
        used = np.arange(flows)
    monkeypatch.setattr(round_fluid, "_PROPAGATION_PASSES", 10**6)
    propagated = round_fluid._components(owner, link, flows, used.size)
    monkeypatch.setattr(round_fluid, "_PROPAGATION_PASSES", 1)
    searched = round_fluid._components(owner, link, flows, used.size)
    np.testing.assert_array_equal(searched[0], propagated[0])
    assert searched[1] == propagated[1]


@pytest.mark.parametrize(("count", "bound"), [(50, 10_000), (5_000, 10_000), (3, 4), (0, 100)])
def test_relabel_is_numpys_unique_with_inverse(count, bound):
    """``relabel`` numbers distinct link ids as ``np.unique(..., return_inverse=True)`` does: by
    sorting for a few values in a large range, by a table of the range for many."""
    values = np.random.default_rng(count).integers(0, bound, count)
    distinct, inverse = round_fluid.relabel(values, bound)
    expected, expected_inverse = np.unique(values, return_inverse=True)
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.ravel())
    np.testing.assert_array_equal(distinct[inverse], values)
