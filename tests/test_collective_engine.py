"""The two collective executors agree; contention shows with the expected factors."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import COPY, REDUCE, Round, Schedule
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import (
    ContentionDetected,
    MessageExecutor,
    TransferLog,
    VectorisedExecutor,
    _shifted_leave,
    run_collective,
)
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.engine.link_state import LinkState
from ddlsim.simulator.engine.steady_state import ULPS, magnitude, rounding


def _paths(schedule, fabric, nbytes, start=0.0):
    fast = VectorisedExecutor(fabric).run(schedule, nbytes, start)
    exact = MessageExecutor(fabric).run(schedule, nbytes, start)
    return fast, exact


@pytest.mark.parametrize(("nodes", "devices_per_node"), [(2, 1), (5, 1), (16, 1), (1, 4), (3, 4), (4, 8)])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_vectorised_equals_message_level_for_ring(switch_fabric, nodes, devices_per_node, collective):
    fabric = switch_fabric(nodes, devices_per_node)
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule(collective, nodes * devices_per_node)
    fast, exact = _paths(schedule, fabric, 8e6)
    np.testing.assert_allclose(fast, exact, rtol=1e-12)


def test_uneven_start_times_agree(switch_fabric):
    """Ranks entering at different times: both paths still agree rank by rank."""
    fabric = switch_fabric(6)
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 6)
    start = np.array([0.0, 3e-4, 1e-5, 0.0, 2e-3, 7e-4])
    fast, exact = _paths(schedule, fabric, 4e6, start)
    np.testing.assert_allclose(fast, exact, rtol=1e-12)


@pytest.mark.parametrize("algorithm", COLLECTIVE_ALGORITHMS.names())
def test_every_algorithm_same_on_both_paths(switch_fabric, algorithm):
    """Every registered all-reduce: the auto path (vectorised or its fallback) equals message level."""
    impl = COLLECTIVE_ALGORITHMS.get(algorithm)
    if "allreduce" not in impl.collectives:
        pytest.skip("no allreduce")
    devices_per_node = 2
    ranks = 8
    schedule = impl.schedule("allreduce", ranks, devices_per_node=devices_per_node)
    nodes = -(-schedule.ranks // devices_per_node)
    fabric = switch_fabric(nodes, devices_per_node)
    auto, _ = run_collective(schedule, fabric, 2e6)
    exact = MessageExecutor(fabric).run(schedule, 2e6, 0.0)
    np.testing.assert_allclose(auto, exact, rtol=1e-9)


def _one_round(pairs, ranks):
    src = np.array([a for a, _ in pairs])
    dst = np.array([b for _, b in pairs])
    rnd = Round(src, dst, np.zeros_like(src), np.ones_like(src), np.full(src.size, REDUCE))
    return Schedule("exchange", "allreduce", ranks, 1, lambda: [rnd])


def test_oversubscribed_fat_tree_slows_cross_leaf_traffic_by_its_factor():
    """4 nodes per leaf, 2 leaves, oversubscription 2: the leaf uplink carries 4 x 12 / 2 GB/s.

    All 4 nodes of leaf 0 send 100 MB to leaf 1 at once: each flow gets 12 / 2 GB/s, so the bulk
    time doubles against a full-bisection switch (latencies aside).
    """
    ib = load_link("ib_edr")
    schedule = _one_round([(i, i + 4) for i in range(4)], 8)
    times = {}
    for name, spec in {
        "switch": FabricSpec(nodes=8, devices_per_node=1, network=ib),
        "fat_tree": FabricSpec(
            nodes=8,
            devices_per_node=1,
            network=ib,
            topology="fat_tree",
            nodes_per_leaf=4,
            oversubscription=2.0,
        ),
    }.items():
        finish, path = run_collective(schedule, Fabric(spec), 100e6)
        times[name] = finish.max()
        assert path == "vectorised"  # the four flows start together: the in-round fluid path applies
        exact = MessageExecutor(Fabric(spec)).run(schedule, 100e6, 0.0)
        np.testing.assert_allclose(finish, exact, rtol=1e-9)
    bulk = 100e6 / ib.port_bandwidth_Bps
    assert times["switch"] == pytest.approx(bulk, rel=1e-3)
    assert times["fat_tree"] == pytest.approx(2 * bulk, rel=1e-3)


def test_flows_sharing_a_link_in_one_round_get_equal_shares():
    ib = load_link("ib_edr")
    fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=ib))
    schedule = _one_round([(0, 2), (1, 2)], 3)  # two flows into rank 2's NIC
    finish, path = run_collective(schedule, fabric, 1e6)
    assert path == "vectorised"
    # both share rank 2's downlink: 2 MB at the port rate, plus alpha
    alpha = fabric.hop_cost(0, 2).alpha_s
    assert finish[2] == pytest.approx(alpha + 2e6 / ib.port_bandwidth_Bps, rel=1e-9)
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1e6, 0.0), rtol=1e-12)


def _rounds(*pairs, ranks):
    rounds = [Round(np.array([a]), np.array([b]), np.array([0]), np.array([1]), np.array([REDUCE])) for a, b in pairs]
    return Schedule("rounds", "allreduce", ranks, 1, lambda: rounds)


def test_flows_of_consecutive_rounds_that_overlap_run_together():
    """Round 1: 0 -> 2; round 2: 1 -> 2. Rank 1 takes no part in round 1, so it sends in round 2 at
    once, while 0's flow still streams into rank 2's port: the two flows share that port from the
    start, B/2 each, and both arrive at alpha + 2 MB / B, as if they had been one round."""
    fabric = fabric_of(3)
    schedule = _rounds((0, 2), (1, 2), ranks=3)
    finish, path = run_collective(schedule, fabric, 1e6)
    assert path == "vectorised"
    alpha, b = fabric.hop_cost(0, 2).alpha_s, fabric.spec.network.port_bandwidth_Bps
    assert finish[0] == pytest.approx(alpha + 2e6 / b, rel=1e-12)
    assert finish[2] == pytest.approx(alpha + 2e6 / b, rel=1e-12)
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1e6, 0.0), rtol=1e-12)


def test_flows_overlapping_a_flow_two_rounds_back_go_to_the_fluid_path():
    """Round 1: 0 -> 2; round 2: 3 -> 4; round 3: 1 -> 2, sent at once by rank 1 while round 1's flow
    still streams into rank 2's port. Only the round just before is simulated with a round, so the
    executor must refuse and ``auto`` must fall back to the fluid path (``fluid_executor``)."""
    fabric = fabric_of(5)
    schedule = _rounds((0, 2), (3, 4), (1, 2), ranks=5)
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(fabric).run(schedule, 1e6, 0.0)
    finish, path = run_collective(schedule, fabric, 1e6)
    assert path == "fluid"
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1e6, 0.0), rtol=1e-12)


def test_uneven_contended_round_re_rates_as_flows_end():
    """Flows of 1 MB and 3 MB share one downlink: 2 MB cross at B/2 each, then 2 MB alone at B."""
    ib = load_link("ib_edr")
    fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=ib))
    src, dst = np.array([0, 1]), np.array([2, 2])
    rnd = Round(src, dst, np.array([0, 1]), np.array([1, 4]), np.full(2, REDUCE))
    schedule = Schedule("uneven", "allreduce", 3, 4, lambda: [rnd])
    finish, path = run_collective(schedule, fabric, 4e6)
    assert path == "vectorised"
    b = ib.port_bandwidth_Bps
    alpha = fabric.hop_cost(0, 2).alpha_s
    assert finish[0] == pytest.approx(alpha + 2e6 / b, rel=1e-9)
    assert finish[1] == pytest.approx(alpha + 4e6 / b, rel=1e-9)
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 4e6, 0.0), rtol=1e-9)


def test_torus_routes_take_the_shorter_way():
    ib = load_link("ib_edr")
    fabric = Fabric(FabricSpec(nodes=16, devices_per_node=1, network=ib, topology="torus_2d"))
    assert fabric.shape == (4, 4)
    routes = fabric.routes(np.array([0, 0, 0]), np.array([1, 3, 5]))
    hops = (routes >= 0).sum(axis=1) - 2  # minus NIC up and down
    assert hops.tolist() == [1, 1, 2]  # 0->3 wraps around: one hop, not three


@pytest.mark.parametrize("nodes, topology", [(32, "torus_2d"), (64, "torus_3d"), (97, "torus_2d")])
def test_torus_shift_routes_and_path_costs_match_the_hop_by_hop_walk(nodes, topology):
    """A round where every transfer makes the same hops per dimension (recursive doubling's XOR
    partners) takes the column-block route builder and counts its torus hops instead of looking
    each up; both must give what a mixed batch (the hop-by-hop walk) gives for the same pairs."""
    fabric = Fabric(FabricSpec(nodes=nodes, devices_per_node=1, network=load_link("ib_edr"), topology=topology))
    for bit in range(int(np.log2(nodes)) + 1):
        src = np.arange(nodes)
        dst = src ^ (1 << bit)
        src, dst = src[dst < nodes], dst[dst < nodes]
        if not src.size:
            continue
        # as many hops as torus links at least, so that the hop counting is taken, not the lookup
        src, dst = np.tile(src, 8), np.tile(dst, 8)
        assert src.size * 3 >= fabric.torus_links
        routes, alpha, bottleneck = fabric.path_properties(src, dst)
        # with a neighbour transfer added the batch no longer moves alike: the general walk
        mixed, _, _ = fabric.path_properties(np.append(src, 0), np.append(dst, 1 if dst[0] != 1 else 2))
        for row, walked in zip(routes, mixed[:-1], strict=True):  # the same links in the same order
            np.testing.assert_array_equal(row[row >= 0], walked[walked >= 0])
        valid = routes >= 0
        latency = np.where(valid, fabric.latency_s[np.where(valid, routes, 0)], 0.0).sum(axis=1)
        capacity = np.where(valid, fabric.capacity_Bps[np.where(valid, routes, 0)], np.inf).min(axis=1)
        np.testing.assert_allclose(alpha, fabric.overheads(src, dst) + latency, rtol=1e-13)
        np.testing.assert_array_equal(bottleneck, capacity)


def test_claiming_links_per_link_equals_per_hop():
    """Large batches record their senders per link (two reductions), small ones per hop: the same
    link owners, shared links and busy times either way, batch after batch."""
    fabric = Fabric(FabricSpec(nodes=16, devices_per_node=1, network=load_link("ib_edr"), topology="torus_2d"))
    rng = np.random.default_rng(7)
    per_hop, per_link = (LinkState(fabric.capacity_Bps.size, fabric.devices) for _ in range(2))
    for state in (per_hop, per_link):
        state.clock[:] = np.arange(fabric.devices, dtype=float)
    for size in (40, 3, 200, 17, 90, 400):
        links = rng.integers(0, fabric.capacity_Bps.size, size)
        senders = rng.integers(0, fabric.devices, size)
        per_hop.claim_per_hop(links, senders, None)
        per_link.claim_per_link(links, senders, None)
        np.testing.assert_array_equal(per_hop.link_sender, per_link.link_sender)
        np.testing.assert_array_equal(per_hop.busy_until, per_link.busy_until)
        assert per_hop.shared_version == per_link.shared_version
    assert (per_link.link_sender == -2).any() and (per_link.link_sender >= 0).any()


def test_a_node_count_without_a_squarish_factorisation_gets_a_partly_filled_torus():
    """97 nodes (prime) would be a 97 x 1 ring; the torus is the 10 x 10 box, nodes in its first 97
    positions, routes through the empty ones; the round path equals the message path on it."""
    ib = load_link("ib_edr")
    fabric = Fabric(FabricSpec(nodes=97, devices_per_node=1, network=ib, topology="torus_2d"))
    assert fabric.shape == (10, 10)
    assert fabric.capacity_Bps.size == 2 * 97 + 100 * 2 * 2  # NIC up and down, 4 links per position
    routes = fabric.routes(np.array([0, 90]), np.array([96, 6]))
    hops = (routes >= 0).sum(axis=1) - 2
    assert hops.tolist() == [1 + 4, 1 + 4]  # row 0 -> 9 wraps (1 hop), column 0 -> 6 the short way (4)
    assert Fabric(FabricSpec(nodes=96, devices_per_node=1, network=ib, topology="torus_2d")).shape == (12, 8)
    options = {"ring": {}, "halving_doubling": {}, "parameter_server": {"servers": 2, "placement": "colocated"}}
    for name, chosen in options.items():
        schedule = COLLECTIVE_ALGORITHMS.get(name).schedule("allreduce", 97, **chosen)
        fast, _ = run_collective(schedule, fabric, 4e6)
        exact = MessageExecutor(fabric).run(schedule, 4e6, 0.0)
        np.testing.assert_allclose(fast, exact, rtol=1e-9)


def test_loggp_serialises_a_senders_overheads():
    """Rank 0 sends 1 byte to ranks 1 and 2 in one round on a switch (o = per-message overhead).

    Plain alpha-beta: both messages start at once and share rank 0's uplink: each arrives after
    o + L + 2/B.
    LogGP: the CPU pays o for the first, then o for the second; each receiver pays o again:
    arrivals at (o + L + 1/B + o) and (2o + L + 1/B + o).
    """
    ib = load_link("ib_edr")
    schedule = _one_round([(0, 1), (0, 2)], 3)
    o, L, B = ib.per_message_overhead_s, ib.latency_s, ib.port_bandwidth_Bps
    plain = MessageExecutor(Fabric(FabricSpec(nodes=3, devices_per_node=1, network=ib))).run(schedule, 1.0, 0.0)
    loggp_fabric = Fabric(FabricSpec(nodes=3, devices_per_node=1, network=ib, loggp=True))
    loggp = MessageExecutor(loggp_fabric).run(schedule, 1.0, 0.0)
    assert plain[1] == pytest.approx(o + L + 2 / B) and plain[2] == pytest.approx(o + L + 2 / B)
    assert sorted(loggp[1:]) == pytest.approx([2 * o + L + 1 / B, 3 * o + L + 1 / B])
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(loggp_fabric).run(schedule, 1.0, 0.0)


def test_loggp_ring_both_paths_agree():
    ib = load_link("ib_edr")
    fabric = Fabric(FabricSpec(nodes=6, devices_per_node=1, network=ib, loggp=True))
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 6)
    fast, exact = _paths(schedule, fabric, 3e6)
    np.testing.assert_allclose(fast, exact, rtol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_random_setups_auto_path_equals_message_level(seed):
    """Random algorithm, node shape, NIC count, size and entry times: whichever path ``auto`` takes
    (vectorised, in-round fluid, or the fallback), the times equal message-by-message execution."""
    rng = np.random.default_rng(seed)
    names = [n for n in COLLECTIVE_ALGORITHMS.names() if "allreduce" in COLLECTIVE_ALGORITHMS.get(n).collectives]
    for name in rng.permutation(names)[:4]:
        devices_per_node = int(rng.choice([1, 2, 4]))
        nodes = int(rng.integers(2, 5))
        ranks = nodes * devices_per_node
        schedule = COLLECTIVE_ALGORITHMS.get(str(name)).schedule("allreduce", ranks, devices_per_node=devices_per_node)
        spec = FabricSpec(
            nodes=-(-schedule.ranks // devices_per_node),
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            host_link=load_link("pcie3_x16"),
            network=load_link(str(rng.choice(["ib_edr", "eth_10g"]))),
            nics_per_node=int(rng.choice([1, devices_per_node])),
        )
        fabric = Fabric(spec)
        start = np.where(rng.random(schedule.ranks) < 0.3, rng.random(schedule.ranks) * 1e-4, 0.0)
        size = float(rng.choice([4e3, 1e6, 3e7]))
        auto, _ = run_collective(schedule, fabric, size, start)
        exact = MessageExecutor(fabric).run(schedule, size, start)
        np.testing.assert_allclose(auto, exact, rtol=1e-9, err_msg=f"{name} dpn={devices_per_node} nodes={nodes}")


def test_a_group_on_chosen_fabric_ranks_times_as_on_its_own_fabric(switch_fabric):
    """A 4-rank ring over fabric ranks 1, 3, 5, 7 of an 8-node switch takes what a 4-node ring takes
    (every node has the same links), and a second group's collective after it sees the same link state."""
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 4)
    alone = VectorisedExecutor(switch_fabric(4)).run(schedule, 8e6, 0.0)
    executor = VectorisedExecutor(switch_fabric(8))
    odd = executor.run(schedule, 8e6, 0.0, members=np.array([1, 3, 5, 7]))
    even = executor.run(schedule, 8e6, 0.0, members=np.array([0, 2, 4, 6]))
    np.testing.assert_allclose(odd, alone, rtol=1e-12)
    np.testing.assert_allclose(even, alone, rtol=1e-12)
    assert executor.transfers == 2 * 6 * 4


def test_point_to_point_transfer_costs_overhead_latency_and_bytes_over_bandwidth(switch_fabric):
    fabric = switch_fabric(3)
    network = fabric.spec.network
    executor = VectorisedExecutor(fabric)
    arrival = executor.transfer(0, 1, 1e6, 2.0)
    expected = 2.0 + network.per_message_overhead_s + network.latency_s + 1e6 / network.port_bandwidth_Bps
    assert arrival == pytest.approx(expected, rel=1e-12)
    # a second sender into rank 1's port while the first message still streams: not provably exact
    with pytest.raises(ContentionDetected):
        executor.transfer(2, 1, 1e6, 2.0)


def test_point_to_point_transfers_one_after_another_are_exact(switch_fabric):
    fabric = switch_fabric(3)
    executor = VectorisedExecutor(fabric)
    first = executor.transfer(0, 1, 1e6, 0.0)
    second = executor.transfer(2, 1, 1e6, first)
    assert second - first == pytest.approx(first, rel=1e-12)


@pytest.mark.parametrize("topology", ["switch", "fat_tree", "torus_3d"])
def test_point_to_point_routes_batched_ahead_are_the_routes_found_one_at_a_time(topology):
    """route_pairs (a program's pipeline pairs, routed in one batch before the run) leaves the
    executor as routing each pair at its first message would: the same links, alpha, bottleneck
    and overhead, and the same arrivals."""
    fabric = fabric_of(16, 4, topology=topology)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 64, 40)
    dst = (src + rng.integers(1, 64, 40)) % 64
    ahead, lazy = VectorisedExecutor(fabric), VectorisedExecutor(fabric)
    ahead.route_pairs(src, dst)
    for index, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        start = 10.0 * index  # one message at a time: nothing contends
        assert ahead.transfer(a, b, 1e6, start) == lazy.transfer(a, b, 1e6, start)
        assert ahead._pairs[(a, b)] == lazy._pairs[(a, b)]


def test_point_to_point_from_a_rank_inside_a_collective_is_refused(switch_fabric):
    """A rank whose collective finishes in the future may still have flows in flight."""
    executor = VectorisedExecutor(switch_fabric(4))
    finish = executor.run(COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 4), 8e6, 0.0)
    with pytest.raises(ContentionDetected):
        executor.transfer(0, 1, 1e3, float(finish[0]) / 2)
    assert executor.transfer(0, 1, 1e3, float(finish[0])) > finish[0]


def schedule_of_rounds(*rounds, ranks, reduce=True):
    """A schedule of one round per list of (src, dst) pairs, each moving chunk 0 and reducing it in
    (``reduce``; else copying it)."""

    def make(pairs):
        src, dst = np.array(pairs).T
        return Round(src, dst, np.zeros_like(src), np.ones_like(src), np.full(src.size, REDUCE if reduce else COPY))

    built = [make(pairs) for pairs in rounds]
    return Schedule("rounds", "allreduce", ranks, 1, lambda: built)


def random_schedule(rng, ranks, *, most_rounds, most_repeats, smallest=1):
    """Up to ``most_rounds`` random rounds (any sender to any receiver, several flows per rank, 1-3
    chunks each, or from ``smallest`` = 0 empty ones too, reducing or copying), each repeated up to
    ``most_repeats`` times in a row (identical rounds: the skipping paths)."""
    rounds = []
    for _ in range(int(rng.integers(1, most_rounds + 1))):
        count = int(rng.integers(1, ranks + 1))
        src = rng.integers(0, ranks, count)
        dst = (src + rng.integers(1, ranks, count)) % ranks
        lo = rng.integers(0, 4, count)
        rnd = Round(src, dst, lo, lo + rng.integers(smallest, 4, count), rng.integers(0, 2, count))
        rounds.extend([rnd] * int(rng.integers(1, most_repeats + 1)))
    return Schedule("random", "allreduce", ranks, 8, lambda: rounds)


def fabric_of(nodes, devices_per_node=1, **kwargs):
    return Fabric(
        FabricSpec(
            nodes=nodes,
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            network=load_link("ib_edr"),
            **kwargs,
        )
    )


@pytest.mark.parametrize(
    ("algorithm", "nodes", "devices_per_node", "topology", "uneven"),
    [
        ("ring", 96, 1, "switch", True),  # uniform advance from the first rounds on
        ("ring", 12, 8, "fat_tree", True),  # the slow hops pace everyone after a short transient
        ("topk_sparse", 8, 8, "fat_tree", True),  # cross-leaf hops 200 ns slower: the affine advance
        ("torus_2d", 16, 4, "torus_3d", True),
        # the inner ring's rounds share their arrays; uneven entry makes the leaders' flows overlap
        # the intra-node phase's (no round path), so only even entry is asked of it
        ("hierarchical", 24, 4, "switch", False),
    ],
)
def test_skipped_rounds_give_the_message_level_times(algorithm, nodes, devices_per_node, topology, uneven):
    """Runs of identical rounds are extrapolated (uniform or affine advance), not executed, and the
    per-rank times still equal message-by-message execution, with even and uneven entry times."""
    fabric = fabric_of(nodes, devices_per_node, topology=topology, nodes_per_leaf=4)
    ranks = nodes * devices_per_node
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", ranks, devices_per_node=devices_per_node)
    rng = np.random.default_rng(3)
    starts = [0.0, np.where(rng.random(ranks) < 0.2, rng.random(ranks) * 2e-4, 0.0)]
    for start in starts if uneven else starts[:1]:
        executor = VectorisedExecutor(fabric)
        fast = executor.run(schedule, 30e6, start)
        assert executor.extrapolated_rounds > 0
        exact = MessageExecutor(fabric).run(schedule, 30e6, start)
        np.testing.assert_allclose(fast, exact, rtol=1e-9)
        assert executor.transfers == sum(len(rnd) for rnd in schedule.rounds())


def test_affine_advance_equals_round_by_round_on_a_long_transient():
    """512 ranks of top-k on a fat tree, 8 per node, 2 nodes per leaf: the transient lasts hundreds
    of rounds. Executing every round (no extrapolation) must give the same times."""
    fabric = fabric_of(64, 8, topology="fat_tree", nodes_per_leaf=2)
    schedule = COLLECTIVE_ALGORITHMS.get("topk_sparse").schedule("allreduce", 512, devices_per_node=8)
    skipping = VectorisedExecutor(fabric)
    fast = skipping.run(schedule, 100e6, 0.0)
    assert skipping.extrapolated_rounds > 400
    every = VectorisedExecutor(fabric, extrapolate=False)
    slow = every.run(schedule, 100e6, 0.0)
    assert every.extrapolated_rounds == 0
    np.testing.assert_allclose(fast, slow, rtol=1e-12)
    assert skipping.transfers == every.transfers == 511 * 512


def test_ring_transient_on_a_3d_torus_equals_round_by_round():
    """A ring of 512 ranks on a 3D torus: the hops that leave a row are slower, and the round path
    executes its transient round by round (the shift rounds' ``_shifted_leave``, the steady-state
    check that reuses its passes) before skipping the rest. The times are those of executing every
    round, and most rounds are still skipped."""
    from ddlsim.simulator.collective_sim import CollectiveSetup

    setup = CollectiveSetup(devices_per_node=1, topology="torus_3d", network="ib_edr")
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 512, devices_per_node=1)
    fabric = setup.fabric(512, 100e6)
    skipping = VectorisedExecutor(fabric)
    fast = skipping.run(schedule, 100e6, 0.0)
    every = VectorisedExecutor(fabric, extrapolate=False)
    slow = every.run(schedule, 100e6, 0.0)
    assert skipping.extrapolated_rounds > 900 and every.extrapolated_rounds == 0
    assert skipping.transfers == every.transfers == 2 * 511 * 512
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


@pytest.mark.parametrize("ranks", [1, 2, 7, 64])
def test_shifted_leave_is_the_rolled_maximum_to_the_bit(ranks):
    """``_shifted_leave`` writes max(end, roll(end + reduce_s, shift)) without the temporaries: the
    same bits for every shift, with no reduction, a scalar one and one per transfer."""
    rng = np.random.default_rng(ranks)
    end = rng.random(ranks)
    for shift in range(1, max(ranks, 2)):
        for reduce_s in (None, np.asarray(0.25), rng.random(ranks)):
            received = end if reduce_s is None else end + reduce_s
            expected = np.maximum(end, np.roll(received, shift))
            got = _shifted_leave(end, reduce_s, shift)
            assert got.view(np.int64).tolist() == expected.view(np.int64).tolist()


def test_magnitude_is_the_largest_abs_to_the_bit():
    """``steady_state.magnitude`` (the tolerance's scale, taken without np.abs's temporary) is
    ``np.abs(a).max()`` for mixed signs, all-negative, signed zeros and infinities."""
    rng = np.random.default_rng(3)
    for a in (rng.normal(size=100), -rng.random(10), np.array([-0.0, 0.0]), np.array([-np.inf, 1.0]), np.array([2.5])):
        assert magnitude(a) == float(np.abs(a).max())
        np.testing.assert_equal(rounding(a), ULPS * float(np.spacing(max(float(np.abs(a).max()), 1e-300))))
    assert magnitude(np.array([])) == 0.0


@pytest.mark.parametrize("algorithm", ["double_binary_tree", "torus_2d", "recursive_doubling", "halving_doubling"])
def test_full_bisection_leaf_links_left_out_change_nothing(algorithm):
    """On a fat tree with oversubscription 1 the leaf links are redundant (their constraint follows
    from the NICs'): leaving them out gives the times of the full computation (message path, every
    link in), and keeps the double binary tree and the 2D torus on the round path."""
    fabric = fabric_of(32, 2, topology="fat_tree", nodes_per_leaf=4)
    assert fabric.redundant.sum() == 2 * 8  # up and down link of each of the 8 leaves
    schedule = COLLECTIVE_ALGORITHMS.get(algorithm).schedule("allreduce", 64, devices_per_node=2)
    finish, path = run_collective(schedule, fabric, 20e6)
    assert path == "vectorised"
    full = fabric_of(32, 2, topology="fat_tree", nodes_per_leaf=4)
    full.redundant[:] = False
    exact = MessageExecutor(full).run(schedule, 20e6, 0.0)
    np.testing.assert_allclose(finish, exact, rtol=1e-9)


def test_oversubscribed_leaf_links_are_not_redundant():
    assert not fabric_of(32, 1, topology="fat_tree", nodes_per_leaf=4, oversubscription=2.0).redundant.any()
    # the last leaf holds 2 nodes only: its links are 4 NICs wide, still at least its NICs' sum
    assert fabric_of(10, 1, topology="fat_tree", nodes_per_leaf=4).redundant.sum() == 6


def test_contended_flows_starting_apart_run_as_a_fluid():
    """Ranks 0 and 1 send 1 MB to rank 2, entering 1e-5 s apart (B: port rate, a: alpha).

    0 streams alone until 1's flow starts, then both share rank 2's downlink at B/2, then 1 alone:
    0 moves x = B * 1e-5 bytes alone and its remaining 1e6 - x at B/2, so it ends at
    1e-5 + 2 (1e6 - x) / B after its flow start; 1 ends (1e6 + 1e6) / B after 0's flow start."""
    fabric = fabric_of(3)
    b = fabric.spec.network.port_bandwidth_Bps
    schedule = _one_round([(0, 2), (1, 2)], 3)
    start = np.array([0.0, 1e-5, 0.0])
    finish, path = run_collective(schedule, fabric, 1e6, start)
    assert path == "vectorised"
    o = fabric.spec.network.per_message_overhead_s
    alpha = fabric.hop_cost(0, 2).alpha_s
    x = b * 1e-5
    assert finish[0] == pytest.approx(alpha + 1e-5 + 2 * (1e6 - x) / b, rel=1e-9)
    assert finish[1] == pytest.approx(o + 2e6 / b + (alpha - o), rel=1e-9)
    np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, 1e6, start), rtol=1e-12)


@pytest.mark.parametrize("size", [1e6, 50e6])
def test_rounds_overlapping_the_round_before_are_simulated_with_it(size):
    """A 2D-torus all-reduce of 96 single-device nodes (8 rows of 12) on a fat tree with 16 nodes per
    leaf: rows that straddle leaves lag by 200 ns per cross-leaf hop, so at a phase change a rank's
    first flow into a port meets the last flow of the previous phase still streaming there. That
    round is simulated together with the round before (not handed to the message path), and every
    time equals message-by-message execution."""
    fabric = fabric_of(96, topology="fat_tree", nodes_per_leaf=16)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", 96, rows=8)
    executor = VectorisedExecutor(fabric)
    fast = executor.run(schedule, size, 0.0)
    assert executor.overlapping_rounds > 0
    np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, size, 0.0), rtol=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_random_rounds_on_random_fabrics_equal_message_level(seed):
    """Random rounds (any sender to any receiver, several flows per rank, random sizes) from random
    entry times on a random fabric: whatever the round path does (bottleneck rates, in-round fluid,
    flows simulated with the round before, skipped rounds) or hands to the message path, the times
    equal message-by-message execution."""
    rng = np.random.default_rng(seed)
    devices_per_node = int(rng.choice([1, 2]))
    nodes = int(rng.integers(3, 9))
    ranks = nodes * devices_per_node
    fabric = fabric_of(
        nodes,
        devices_per_node,
        topology=str(rng.choice(["switch", "fat_tree", "torus_2d"])),
        nodes_per_leaf=2,
        oversubscription=float(rng.choice([1.0, 2.0])),
    )
    schedule = random_schedule(rng, ranks, most_rounds=6, most_repeats=3)
    start = np.where(rng.random(ranks) < 0.5, rng.random(ranks) * 3e-4, 0.0)
    fast, _ = run_collective(schedule, fabric, 8e6, start)
    np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, 8e6, start), rtol=1e-9)


def test_a_transfer_log_keeps_the_traced_senders_and_counts_the_rest():
    """A 64-rank ring all-reduce: 2 x 63 rounds of 64 transfers. A log limited to senders 0..3 holds
    only theirs (4 per round, at most), yet counts all 8064; the steady-state shortcut still runs
    (the log is no reason to execute every round) and the skipped transfers are counted as such."""
    fabric = fabric_of(64)
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 64)
    log = TransferLog(max_sender=4)
    executor = VectorisedExecutor(fabric)
    times = executor.run(schedule, 64e6, 0.0, log=log)
    np.testing.assert_allclose(times, VectorisedExecutor(fabric, extrapolate=False).run(schedule, 64e6, 0.0))
    logged = np.concatenate(log.src)
    assert logged.max() < 4 and logged.size <= 4 * (log.total // 64)
    assert executor.extrapolated_rounds > 0 and log.extrapolated == 64 * executor.extrapolated_rounds
    assert log.total + log.extrapolated == 2 * 63 * 64


@pytest.mark.parametrize(("topology", "nodes", "longest"), [("torus_2d", 2048, 1), ("torus_3d", 512, 2)])
def test_torus_2d_on_a_torus_of_single_device_nodes_steps_between_neighbours(topology, nodes, longest):
    """torus_2d's grid follows the torus (``grid_on_torus``; on a 2D torus it is the default grid,
    rows >= cols): every transfer of both rings crosses at most one node (2D: 64 x 32) or two (3D:
    8 x 8 x 8, where a row runs through two extents); the most square grids (32 x 64, 16 x 32) step
    two and four nodes."""
    from ddlsim.simulator.collective_sim import CollectiveSetup, grid_on_torus

    setup = CollectiveSetup(devices_per_node=1, network="ib_edr", topology=topology)
    options = grid_on_torus(setup, "torus_2d", nodes)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", nodes, **options)
    fabric = setup.fabric(nodes)
    hops = 0
    for rnd in schedule.rounds():
        routes, _ = fabric._core(np.asarray(rnd.src), np.asarray(rnd.dst))
        hops = max(hops, int((routes >= 0).sum(axis=1).max()))
    assert hops == longest


@pytest.mark.parametrize(
    ("collective", "nodes", "devices_per_node", "topology", "extra"),
    [
        ("broadcast", 64, 1, "switch", {}),
        ("reduce", 64, 1, "switch", {"reduce_Bps": 20e9}),
        ("broadcast", 16, 8, "fat_tree", {"nodes_per_leaf": 2}),
        ("reduce", 36, 1, "torus_2d", {"loggp": True, "reduce_Bps": 5e9}),
    ],
)
def test_an_unpipelined_chain_runs_as_one_relay_with_the_round_by_round_times(
    collective, nodes, devices_per_node, topology, extra
):
    """An unpipelined chain (one transfer per round, each sent on by the rank it reached) is executed
    as one relay: the same times to the bit as executing every round, and the message path's."""
    fabric = fabric_of(nodes, devices_per_node, topology=topology, **extra)
    ranks = nodes * devices_per_node
    schedule = COLLECTIVE_ALGORITHMS.get("chain").schedule(collective, ranks)
    rng = np.random.default_rng(5)
    for start in (0.0, np.where(rng.random(ranks) < 0.3, rng.random(ranks) * 1e-3, 0.0)):
        relay = VectorisedExecutor(fabric)
        fast = relay.run(schedule, 8e6, start)
        assert relay.relayed_rounds == ranks - 1 == relay.transfers
        every = VectorisedExecutor(fabric, extrapolate=False)
        assert np.array_equal(fast, every.run(schedule, 8e6, start))
        assert every.relayed_rounds == 0
        np.testing.assert_allclose(fast, MessageExecutor(fabric).run(schedule, 8e6, start), rtol=1e-9)
    logs = [TransferLog(max_sender=ranks // 2), TransferLog(max_sender=ranks // 2)]  # a trace's transfers
    VectorisedExecutor(fabric).run(schedule, 8e6, 0.0, logs[0])
    VectorisedExecutor(fabric, extrapolate=False).run(schedule, 8e6, 0.0, logs[1])
    assert logs[0].total == logs[1].total == ranks - 1
    for column in ("src", "dst", "nbytes", "start_s", "end_s"):
        assert np.array_equal(np.concatenate(getattr(logs[0], column)), np.concatenate(getattr(logs[1], column)))


def test_a_relay_after_another_collective_keeps_the_link_state_and_its_proof():
    """A chain after a ring all-reduce on one executor: entered after the ring's flows ended, it
    relays and gives the round-by-round times (and leaves the same state for a third collective; the
    rings' steady-state shortcut rounds differently in the last bits);
    entered while they are still in flight, neither path can prove it and both say so."""
    fabric = fabric_of(8, 4, topology="fat_tree", nodes_per_leaf=2)
    ring = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 32, devices_per_node=4)
    chain = COLLECTIVE_ALGORITHMS.get("chain").schedule("broadcast", 32)
    order = np.random.default_rng(2).permutation(32)  # the chain visits the ranks out of order

    def three(executor):
        after_ring = executor.run(ring, 4e6, 0.0)
        after_chain = executor.run(chain, 4e6, after_ring, members=order)
        return after_ring, after_chain, executor.run(ring, 4e6, float(after_chain.max()))

    relayed, every = VectorisedExecutor(fabric), VectorisedExecutor(fabric, extrapolate=False)
    for fast, slow in zip(three(relayed), three(every), strict=True):
        np.testing.assert_allclose(fast, slow, rtol=1e-12)
    assert relayed.relayed_rounds == 31 and every.relayed_rounds == 0
    for executor in (VectorisedExecutor(fabric), VectorisedExecutor(fabric, extrapolate=False)):
        executor.run(ring, 4e6, 0.0)
        with pytest.raises(ContentionDetected):
            executor.run(chain, 4e6, 0.0, members=order)
        assert executor.relayed_rounds == 0
