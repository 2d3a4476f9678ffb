"""Torus rounds as arcs (``round_arcs``, ``Fabric.torus_round``) give what the hop lists give."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.simulator.engine.collective_engine import ContentionDetected, MessageExecutor, VectorisedExecutor
from ddlsim.simulator.engine.round_arcs import ArcRound
from tests.test_collective_engine import fabric_of, schedule_of_rounds


def _torus(nodes, topology="torus_2d", devices_per_node=1, **kwargs):
    return fabric_of(nodes, devices_per_node, topology=topology, **kwargs)


def _alike_batches(fabric):
    """Batches of transfers (ranks) that make the same hops per dimension: recursive doubling's XOR
    partners (both ways round in one batch), and every node to the one a fixed offset away in each
    dimension (one way round; offsets past half an extent go -), within the nodes of a partly filled
    torus; each small and tiled (the costs are then looked up, or counted)."""
    spec, shape = fabric.spec, fabric.shape
    dpn = spec.devices_per_node
    ranks = np.arange(fabric.devices)
    batches = []
    for bit in range(dpn.bit_length() - 1, int(np.log2(fabric.devices)) + 1):
        dst = ranks ^ (1 << bit)
        batches.append((ranks[dst < fabric.devices], dst[dst < fabric.devices]))
    coords = np.stack(np.unravel_index(np.arange(spec.nodes), shape), axis=1)
    for offset in ([1] * len(shape), [extent - 1 for extent in shape], [extent // 2 for extent in shape]):
        target = np.ravel_multi_index(tuple(((coords + offset) % shape).T), shape)
        keep = target < spec.nodes
        batches.append((np.flatnonzero(keep) * dpn, target[keep] * dpn))
    for src, dst in batches:
        if src.size:
            yield src, dst
            yield np.tile(src, 8), np.tile(dst, 8)


def _hops(fabric, src, dst):
    """(link, transfer) of every hop of the materialised routes."""
    routes = fabric.routes(src, dst)
    valid = routes >= 0
    return routes[valid], np.nonzero(valid)[0]


@pytest.mark.parametrize(
    ("nodes", "topology", "devices_per_node"),
    [(32, "torus_2d", 1), (97, "torus_2d", 1), (64, "torus_3d", 1), (100, "torus_3d", 1), (16, "torus_2d", 4)],
)
def test_arc_reductions_equal_those_over_the_hops(nodes, topology, devices_per_node):
    """Per link over the flows that cross it and per flow over the links it crosses (max, min, count),
    and the costs, on full and partly filled 2D and 3D tori, each way round."""
    fabric = _torus(nodes, topology, devices_per_node)
    rng = np.random.default_rng(nodes)
    links_total = fabric.capacity_Bps.size
    seen = 0
    for src, dst in _alike_batches(fabric):
        torus = fabric.torus_round(src, dst)
        if fabric.node_of(src).tolist() == fabric.node_of(dst).tolist() or torus is None:
            continue  # inside nodes, or (XOR on a partly filled torus) not alike
        seen += 1
        _, alpha, bottleneck = fabric.path_properties(src, dst)
        np.testing.assert_array_equal(torus.alpha_s, alpha)
        np.testing.assert_array_equal(torus.bottleneck_Bps, bottleneck)
        arcs = ArcRound(fabric, torus)
        links, owner = _hops(fabric, src, dst)
        np.testing.assert_array_equal(
            arcs.covering(np.ones(src.size, dtype=np.int64), np.add, 0), np.bincount(links, minlength=links_total)
        )
        per_flow, per_link = rng.random(src.size), rng.random(links_total)
        for ufunc, identity in ((np.maximum, -np.inf), (np.minimum, np.inf)):
            expected = np.full(links_total, identity)
            ufunc.at(expected, links, per_flow[owner])
            np.testing.assert_array_equal(arcs.covering(per_flow, ufunc, identity), expected)
            expected = np.full(src.size, identity)
            ufunc.at(expected, owner, per_link[links])
            np.testing.assert_array_equal(arcs.along(per_link, ufunc), expected)
    assert seen >= 4


def test_only_alike_rounds_leaving_their_nodes_are_arcs():
    fabric = _torus(16, devices_per_node=2)
    assert fabric.torus_round(np.array([0, 2]), np.array([2, 4])) is not None  # one hop each, the same way
    assert fabric.torus_round(np.array([0, 2]), np.array([2, 6])) is None  # one hop and two
    assert fabric.torus_round(np.array([0, 2]), np.array([1, 4])) is None  # 0 -> 1 stays in node 0
    assert _torus(16, topology="fat_tree").torus_round(np.array([0]), np.array([2])) is None


def _compare(fabric, schedule, start, nbytes=4e6):
    """The round path with torus rounds as arcs, as hop lists and as it chooses (the large rounds as
    arcs), bit for bit, and the message path."""
    arcs, hops = VectorisedExecutor(fabric, arcs=True), VectorisedExecutor(fabric, arcs=False)
    with_arcs, with_hops = arcs.run(schedule, nbytes, start), hops.run(schedule, nbytes, start)
    np.testing.assert_array_equal(with_arcs, with_hops)
    np.testing.assert_array_equal(VectorisedExecutor(fabric).run(schedule, nbytes, start), with_hops)
    np.testing.assert_allclose(with_arcs, MessageExecutor(fabric).run(schedule, nbytes, start), rtol=1e-9)
    assert hops.arc_rounds == 0
    return arcs


def test_groups_of_a_larger_run_share_the_link_state_as_arcs_too():
    """Recursive doubling over the first four rows of an 8 x 8 torus, then over the last four, entered
    at once or while the first still runs (one executor: the second group's flows are checked against
    the first's), with arcs and with hop lists; over the even nodes then the odd ones, whose routes
    cross each other's links, both refuse the overlap."""
    fabric = _torus(64)
    schedule = COLLECTIVE_ALGORITHMS.get("recursive_doubling").schedule("allreduce", 32)
    for groups, later, refused in (
        ((np.arange(32), np.arange(32, 64)), 0.0, False),
        ((np.arange(32), np.arange(32, 64)), 0.5, False),
        ((np.arange(0, 64, 2), np.arange(1, 64, 2)), 0.5, True),
    ):
        finishes = []
        for arcs in (True, False):
            executor = VectorisedExecutor(fabric, arcs=arcs)
            first = executor.run(schedule, 4e6, 0.0, members=groups[0])
            assert (executor.arc_rounds > 0) == arcs
            if refused:
                with pytest.raises(ContentionDetected):
                    executor.run(schedule, 4e6, float(first.max()) * later, members=groups[1])
                continue
            finishes.append((first, executor.run(schedule, 4e6, float(first.max()) * later, members=groups[1])))
        for with_arcs, with_hops in zip(*finishes, strict=True):
            np.testing.assert_array_equal(with_arcs, with_hops)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "halving_doubling"])
@pytest.mark.parametrize(
    ("nodes", "topology", "devices_per_node"), [(64, "torus_2d", 1), (64, "torus_3d", 1), (16, "torus_2d", 4)]
)
def test_torus_rounds_as_arcs_time_as_the_hop_lists(algorithm, nodes, topology, devices_per_node):
    """Recursive doubling and halving-doubling, ranks entering together, staggered (contended flows then
    start apart: those rounds go hop by hop) and in a random order."""
    fabric = _torus(nodes, topology, devices_per_node)
    ranks = fabric.devices
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks)
    for start in (0.0, np.linspace(0.0, 3e-6, ranks), np.random.default_rng(3).uniform(0.0, 2e-6, ranks)):
        executor = _compare(fabric, schedule, start)
        assert executor.arc_rounds > 0



def test_a_round_overlapping_an_arc_round_is_simulated_with_its_hops():
    """Round 1: 0 -> 2 (as arcs); round 2: 1 -> 2, sent at once while 0's flow still streams through
    link (1, +) and into rank 2's port: the overlap group needs round 1's hop lists, rebuilt."""
    fabric = _torus(16)
    executor = _compare(fabric, schedule_of_rounds([(0, 2)], [(1, 2)], ranks=16), 0.0, 1e6)
    assert (executor.arc_rounds, executor.overlapping_rounds) == (1, 1)


def test_rounds_whose_links_carry_flows_of_different_shares_go_hop_by_hop():
    """On a ring of 16 (the 2 x 16 torus' row 0), 3 hops + from 0, 1 and from 3, 4, 5: link 3 carries
    1 (at most 2 flows on its links: half a link) and 3 (3 flows on link 5: a third). The rates then
    come from the fluid, not from the shares: the round declines the arcs."""
    fabric = _torus(32, torus_dims=(2, 16))
    schedule = schedule_of_rounds([(0, 3), (1, 4), (3, 6), (4, 7), (5, 8)], ranks=32)
    executor = _compare(fabric, schedule, 0.0)
    assert executor.arc_rounds == 0
    even = schedule_of_rounds([(0, 3), (1, 4), (4, 7), (5, 8), (6, 9)], ranks=32)  # two groups apart: 1/2 and 1/3
    assert _compare(fabric, even, 0.0).arc_rounds == 1
