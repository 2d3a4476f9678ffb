"""Rounds checked and committed per bundle of same-route transfers (``round_bundles``) give what the
hop lists give, to the bit; per-run reductions (``round_fluid.Runs``) give what ``reduceat`` gives."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.simulator.engine.collective_engine import MessageExecutor, VectorisedExecutor
from ddlsim.simulator.engine.round_bundles import Bundles
from ddlsim.simulator.engine.round_fluid import Runs
from tests.test_collective_engine import fabric_of, schedule_of_rounds


@pytest.mark.parametrize("sizes", [[1] * 5, [2] * 6, [3] * 4, [6] * 3, [8] * 5, [12] * 2, [80] * 2, [1, 3, 2, 8, 1]])
def test_run_reductions_equal_reduceat(sizes):
    """Equal widths (folded in pairs, then position by position) and unequal ones, with ties."""
    bounds = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    runs = Runs.of_bounds(bounds, int(np.sum(sizes)))
    assert runs.width == (sizes[0] if len(set(sizes)) == 1 and sizes[0] <= 64 else 0)
    values = np.random.default_rng(len(sizes)).integers(0, 4, int(np.sum(sizes))) * 0.25
    for ufunc in (np.minimum, np.maximum):
        reduced = runs.reduce(values, ufunc)
        np.testing.assert_array_equal(reduced, ufunc.reduceat(values, bounds))
        assert not np.shares_memory(reduced, values)
    np.testing.assert_array_equal(runs.spread(np.arange(len(sizes))), np.repeat(np.arange(len(sizes)), sizes))


def test_runs_of_labels_only_where_each_label_is_one_run():
    runs = Runs.of_labels(np.array([0, 0, 1, 1, 1, 2]))
    assert runs is not None and runs.bounds.tolist() == [0, 2, 5] and runs.width == 0
    assert Runs.of_labels(np.array([0, 1, 0])) is None
    assert Runs.of_labels(np.array([0, 0, 1, 1])).width == 2


def _hops(routes):
    """(flat_links, flat_owner) of a list of routes (lists of link ids), owners in order."""
    links = np.array([link for route in routes for link in route], dtype=np.int64)
    owner = np.array([i for i, route in enumerate(routes) for _ in route], dtype=np.int64)
    return links, owner


def test_bundles_group_transfers_of_one_route_in_increasing_order():
    """Transfers 0, 2, 5 take route (3, 7); 1 and 4 route (9,); 3 none (no binding hop)."""
    routes = [[3, 7], [9], [3, 7], [], [9], [3, 7]]
    bundles = Bundles.of(*_hops(routes), len(routes), 10, halve=False)
    assert bundles is not None
    assert bundles.order.tolist() == [0, 2, 5, 1, 4]
    assert bundles.runs.bounds.tolist() == [0, 3]
    assert sorted(zip(bundles.link.tolist(), bundles.bundle.tolist(), strict=True)) == [(3, 0), (7, 0), (9, 1)]
    starts = np.array([5.0, 1.0, 4.0, 0.0, 2.0, 6.0])
    assert bundles.earliest(starts).tolist() == [4.0, 1.0]
    latest, last = bundles.latest(np.array([7.0, 3.0, 7.0, 9.0, 3.0, 6.0]))
    assert latest.tolist() == [7.0, 3.0] and last.tolist() == [2, 4]  # of equal ends the highest-numbered
    assert Bundles.of(*_hops(routes), len(routes), 10) is not None  # 5 entries where there were 8: not halved
    assert Bundles.of(*_hops([[3, 7], [3, 7], [3, 7], [9], [9]]), 5, 10) is not None  # 3 of 8


@pytest.mark.parametrize(
    "routes",
    [
        [[1, 2], [1, 3]],  # one first link, two routes
        [[1, 2], [1, 2, 4]],  # one route a prefix of the other
        [[1, 2], [1, 2], [4, 2]],  # link 2 carries two routes
        [[1, 2, 1], [1, 2, 1]],  # a route crossing a link twice
    ],
)
def test_links_carrying_two_routes_are_no_bundles(routes):
    assert Bundles.of(*_hops(routes), len(routes), 8, halve=False) is None


def _two_routes_bundles():
    routes = [[2, 5, 6]] * 3 + [[0, 1]] * 2 + [[4, 3, 7]] * 4
    bundles = Bundles.of(*_hops(routes), len(routes), 8)
    assert bundles is not None
    return bundles, len(routes)


def test_commit_per_bundle_equals_the_hop_lists():
    """Against the hop lists' commit (``LinkState.commit``, contended), checked links only,
    on random times with ties (of ends with each other and with busy times); and a flow meeting a busy
    link changes nothing."""
    bundles, transfers = _two_routes_bundles()
    links, owner = _hops([[2, 5, 6]] * 3 + [[0, 1]] * 2 + [[4, 3, 7]] * 4)
    sender = np.full(8, -2)
    sender[[1, 3]] = 0  # links with one sender: not checked
    bundles.refresh(sender, 1)
    rng = np.random.default_rng(7)
    for trial in range(40):
        start = rng.integers(0, 4, transfers) * 0.5
        ends = start + rng.integers(0, 4, transfers) * 0.5  # zero-byte flows too: ends tie busy times
        busy = rng.integers(-2, 3, 8) * 0.5
        if trial % 2:  # no flow meets its links' busy time
            busy = np.minimum(busy, start.min())
        if trial % 4 == 1:  # a bundle of zero-byte flows ending as its links were busy until
            start[:3] = ends[:3] = busy[[2, 5, 6]] = start.min()
        state = [busy.copy(), np.full(8, -1), np.full(8, -1), np.full(8, np.inf)]
        expected = [array.copy() for array in state]
        checked = sender[links] == -2
        hop_links, hop_owner = links[checked], owner[checked]
        before = expected[0][hop_links]
        met = bool(np.any(start[hop_owner] < before))
        if not met:
            np.maximum.at(expected[0], hop_links, ends[hop_owner])
            last = ends[hop_owner] >= expected[0][hop_links]
            expected[1][hop_links[last]] = 9
            expected[2][hop_links[last]] = hop_owner[last]
            expected[3][hop_links[last]] = before[last]
        assert bundles.commit(start, ends, *state, 9) is not met
        for got, want in zip(state, expected, strict=True):
            np.testing.assert_array_equal(got, want)


def _column_ring_schedule(ranks, devices_per_node):
    return COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", ranks, devices_per_node=devices_per_node)


def _compare(fabric, schedule, start, nbytes=4e6, extrapolate=(True, False)):
    """Per bundle (wherever it applies, and as it chooses) and per hop, bit for bit, executing every
    round and skipping steady runs; and the message path."""
    exact = MessageExecutor(fabric).run(schedule, nbytes, start)
    executors = []
    for skipping in extrapolate:
        bundled = VectorisedExecutor(fabric, bundles=True, extrapolate=skipping)
        hops = VectorisedExecutor(fabric, bundles=False, extrapolate=skipping)
        chosen = VectorisedExecutor(fabric, extrapolate=skipping)
        with_bundles, with_hops = bundled.run(schedule, nbytes, start), hops.run(schedule, nbytes, start)
        np.testing.assert_array_equal(with_bundles, with_hops)
        np.testing.assert_array_equal(chosen.run(schedule, nbytes, start), with_hops)
        np.testing.assert_allclose(with_bundles, exact, rtol=1e-9)
        assert hops.bundled_rounds == 0
        assert bundled.transfers == hops.transfers
        executors.append((bundled, chosen))
    return executors[0]


@pytest.mark.parametrize(
    ("nodes", "topology", "devices_per_node"),
    [(16, "torus_3d", 8), (27, "torus_3d", 2), (16, "torus_2d", 4), (12, "switch", 4), (16, "fat_tree", 4)],
)
def test_node_to_node_rings_per_bundle_time_as_the_hop_lists(nodes, topology, devices_per_node):
    """torus_2d's column ring with several devices per node (each rank to its counterpart on the next
    node: the node's devices share its port and its route), every round executed and with steady
    state, entered together, staggered and in a random order."""
    fabric = fabric_of(nodes, devices_per_node, topology=topology, nodes_per_leaf=4)
    ranks = nodes * devices_per_node
    schedule = _column_ring_schedule(ranks, devices_per_node)
    rng = np.random.default_rng(nodes)
    for start in (0.0, np.linspace(0.0, 3e-6, ranks), rng.uniform(0.0, 2e-6, ranks)):
        bundled, chosen = _compare(fabric, schedule, start)
        assert bundled.bundled_rounds > 0
        assert chosen.bundled_rounds > 0



def test_a_bundle_meeting_the_previous_rounds_flow_goes_to_its_overlap_group():
    """Round 1: rank 0 to rank 8 alone (node 0 to node 1); round 2: ranks 1..7 to 9..15, one bundle on
    the same links, sent at once while 0's flow still streams there: the bundle declines, and the hop
    lists simulate the two rounds' flows together."""
    fabric = fabric_of(4, 8)
    schedule = schedule_of_rounds([(0, 8)], [(r, r + 8) for r in range(1, 8)], ranks=32)
    bundled, _ = _compare(fabric, schedule, 0.0, extrapolate=(True,))
    assert bundled.overlapping_rounds == 1
    assert bundled.bundled_rounds == 0
    later = schedule_of_rounds(
        [(0, 8)], [(r, r + 8) for r in range(1, 8)], [(r + 8, r + 16) for r in range(8)], ranks=32
    )
    bundled, _ = _compare(fabric, later, 0.0, extrapolate=(True,))
    assert (bundled.overlapping_rounds, bundled.bundled_rounds) == (1, 1)
