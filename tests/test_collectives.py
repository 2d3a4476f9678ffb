"""Every collective algorithm: symbolic correctness, closed form = round semantics, bytes, bad input.

The algorithm list comes from ``COLLECTIVE_ALGORITHMS.names()``, so a new ``*_collective.py`` file
is put through the same tests without touching this one. ``VARIANTS`` adds option sets worth
covering for the algorithms that have options.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, helper_ranks
from ddlsim.algorithms.double_binary_tree_collective import dtree_parents, tree_height
from ddlsim.algorithms.schedule import FabricCosts, HopCost, Schedule, ScheduleError
from ddlsim.algorithms.selectors import LIBRARIES, select
from ddlsim.algorithms.symbolic import check_schedule
from ddlsim.registry import UnknownNameError

VARIANTS: dict[str, list[dict]] = {
    "ring": [{}, {"channels": 2}, {"channels": 3}],
    "chain": [{}, {"chunks": 3}],
    "double_binary_tree": [{}, {"chunks": 3}],
    "hierarchical": [
        {},
        {"intra": "reduce_scatter"},
        {"inner": "halving_doubling"},
        {"inner": "double_binary_tree", "intra": "reduce_scatter", "inner_options": {"chunks": 2}},
        {"inner": "parameter_server", "inner_options": {"placement": "colocated"}},
    ],
    "parameter_server": [{}, {"servers": 3}, {"placement": "colocated", "servers": 2}, {"placement": "per_node"}],
    "topk_sparse": [{}, {"density": 0.5, "value_bytes": 2}],
}
# Closed forms charge each round its slowest hop; with the non-power-of-two fold (or devices_per_node
# not a power of two) the slowest transfers of successive rounds need not chain: an upper bound there.
SLOWEST_HOP_PER_ROUND = {"recursive_doubling", "halving_doubling"}


def _shared_port_fan(name: str, options: dict, ranks: int, costs: FabricCosts | None = None) -> int:
    """How many transfers of one round can share a port when the closed form charges that sharing
    and the round semantics here (each transfer at full cost) does not, so the closed form lies
    between the two and that many times the two (the DES is exact for them:
    tests/test_des_vs_closed_form.py); 1 where no port is shared. The ring's channels send several
    pieces at once from one rank over its one intra-node port (or one NIC); the parameter server's
    workers push to every server at once, and its servers hear from every worker (its incast); the
    doubling schedules' far rounds, the torus's column rings and the hierarchical all-reduce's inner
    phase after a reduce-scatter send every device of a node across at once, through its NICs."""
    if name == "parameter_server" or options.get("inner") == "parameter_server":
        return ranks * options.get("servers", ranks)  # a round's transfers, at most all through one port
    if (name in SLOWEST_HOP_PER_ROUND or name == "torus_2d" or options.get("intra") == "reduce_scatter") and costs:
        # (hierarchical with reduce_scatter: every device of a node runs its own inner all-reduce at once)
        return -(-costs.devices_per_node // max(costs.nics_per_node, 1))
    return options.get("channels", 1)


def _check_closed(
    closed: float, reference: float, options: dict, name: str = "", ranks: int = 1, costs: FabricCosts | None = None
) -> None:
    fan = _shared_port_fan(name, options, ranks, costs)
    if fan > 1:
        assert reference * (1 - 1e-12) <= closed <= fan * reference * (1 + 1e-12)
    else:
        assert _close(closed, reference), (closed, reference)

CASES = [
    (name, collective, options)
    for name in COLLECTIVE_ALGORITHMS.names()
    for collective in COLLECTIVE_ALGORITHMS.get(name).collectives
    for options in VARIANTS.get(name, [{}])
]
IDS = [f"{n}-{c}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for n, c, o in CASES]

UNIFORM = FabricCosts.uniform(1e-6, 1e9)
TWO_LEVEL = FabricCosts(HopCost(1e-6, 100e9), HopCost(2e-6, 10e9), 4)
FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_time_s(schedule: Schedule, message_bytes: float, costs: FabricCosts) -> float:
    """The round semantics, transfer by transfer: a rank enters round k+1 once all its round-k sends
    and receives are done; a transfer starts when its sender enters the round and costs
    ``costs.between(src, dst).time(bytes)``, concurrent transfers each at full cost."""
    clock = np.zeros(schedule.ranks)
    for rnd in schedule.rounds():
        nbytes = schedule.transfer_bytes(rnd, message_bytes)
        end = clock[rnd.src] + [
            costs.between(int(s), int(d)).time(float(b)) for s, d, b in zip(rnd.src, rnd.dst, nbytes, strict=True)
        ]
        after = clock.copy()
        np.maximum.at(after, rnd.src, end)
        np.maximum.at(after, rnd.dst, end)
        clock = after
    return float(clock.max())


def _buildable(options: dict, ranks: int) -> bool:
    return not (options.get("placement") == "colocated" and options.get("servers", 1) > ranks)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def test_the_registry_has_every_algorithm():
    assert {
        "ring",
        "recursive_doubling",
        "halving_doubling",
        "binomial_tree",
        "double_binary_tree",
        "hierarchical",
        "torus_2d",
        "parameter_server",
        "topk_sparse",
        "chain",
    } <= set(COLLECTIVE_ALGORITHMS.names())


# (a) symbolic correctness -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
def test_small_rank_counts_compute_the_collective(name, collective, options):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    for ranks in range(1, 18):
        if _buildable(options, ranks):
            check_schedule(algorithm.schedule(collective, ranks, **options))


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
@FAST
@given(ranks=st.integers(1, 64))
def test_any_rank_count_up_to_64_computes_the_collective(name, collective, options, ranks):
    if _buildable(options, ranks):
        check_schedule(COLLECTIVE_ALGORITHMS.get(name).schedule(collective, ranks, **options))


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
@FAST
@given(devices_per_node=st.integers(2, 8), nodes=st.integers(1, 8))
def test_multi_device_nodes_compute_the_collective(name, collective, options, devices_per_node, nodes):
    ranks = devices_per_node * nodes
    if _buildable(options, ranks):
        schedule = COLLECTIVE_ALGORITHMS.get(name).schedule(
            collective, ranks, devices_per_node=devices_per_node, **options
        )
        check_schedule(schedule)


# (b) closed form = round semantics ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
def test_closed_form_equals_the_round_semantics(name, collective, options):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    checks = [(UNIFORM, p) for p in (1, 2, 3, 5, 6, 8, 12, 13, 16)]
    checks += [(TWO_LEVEL, p) for p in (4, 8, 16, 32)]
    if name not in SLOWEST_HOP_PER_ROUND:
        checks += [(TWO_LEVEL, p) for p in (12, 20, 24)]
    for costs, ranks in checks:
        if not _buildable(options, ranks):
            continue
        schedule = algorithm.schedule(collective, ranks, devices_per_node=costs.devices_per_node, **options)
        for message_bytes in (1e3, 1e6, 3e7):
            closed = algorithm.closed_form_s(collective, ranks, message_bytes, costs, **options)
            reference = reference_time_s(schedule, message_bytes, costs)
            _check_closed(closed, reference, options, name, ranks, costs)


# (intra, inter): the intra hop faster in both terms; and an NVLink-like intra hop whose per-message
# cost exceeds the NIC path's, so small transfers inside a node pace a round that also crosses nodes
HOP_PAIRS = {
    "intra_faster": (HopCost(1e-6, 100e9), HopCost(5e-6, 5e9)),
    "intra_slower_to_start": (HopCost(3e-6, 100e9), HopCost(1.9e-6, 12e9)),
}


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
@pytest.mark.parametrize(("hops", "message_bytes"), [("intra_faster", 2e6), ("intra_slower_to_start", 1e3)])
@FAST
@given(ranks=st.integers(1, 40), devices_per_node=st.integers(1, 9))
def test_closed_form_on_any_two_level_fabric(name, collective, options, hops, message_bytes, ranks, devices_per_node):
    """Exact everywhere, except the slowest-hop-per-round algorithms off powers of two (upper bound)."""
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    costs = FabricCosts(*HOP_PAIRS[hops], devices_per_node)
    try:
        schedule = algorithm.schedule(collective, ranks, devices_per_node=devices_per_node, **options)
    except ScheduleError:
        assert ranks % devices_per_node or not _buildable(options, ranks)
        return
    closed = algorithm.closed_form_s(collective, ranks, message_bytes, costs, **options)
    reference = reference_time_s(schedule, message_bytes, costs)
    powers = ranks & (ranks - 1) == 0 and devices_per_node & (devices_per_node - 1) == 0
    if name in SLOWEST_HOP_PER_ROUND and not powers:
        assert closed >= reference * (1 - 1e-12)
    else:
        _check_closed(closed, reference, options, name, ranks, costs)


def test_reference_semantics_on_a_three_rank_story():
    """Rank 0 -> 1 (1 s) in round 0; round 1: 2 -> 1 starts at 0 (rank 2 idle in round 0) and
    ends at 1 s, 1 -> 0 starts at 1 s and ends at 2 s; total 2 s."""
    from ddlsim.algorithms.schedule import COPY, Round

    def rounds():
        yield Round.of(0, 1, 0, 1, COPY)
        yield Round.of([2, 1], [1, 0], 0, 1, COPY)

    schedule = Schedule("story", "broadcast", 3, 1, rounds)
    assert reference_time_s(schedule, 1.0, FabricCosts.uniform(1.0, math.inf)) == 2.0


# (c) hand-derived closed forms (alpha = 1 us, beta = 1 GB/s unless said) ----------------------------


def closed(name: str, collective: str, ranks: int, message_bytes: float, costs=UNIFORM, **options) -> float:
    return COLLECTIVE_ALGORITHMS.get(name).closed_form_s(collective, ranks, message_bytes, costs, **options)


def test_recursive_doubling_hand_numbers():
    """P=8, S=1 MB: log2(8) (1e-6 + 1e-3) = 3.003e-3 s. P=6: pof2=4 plus pre- and post-step:
    (2 + 2) * 1.001e-3 = 4.004e-3 s. Allgather P=8: 3 alpha + 7/8 S/beta = 3e-6 + 0.875e-3 s."""
    assert math.isclose(closed("recursive_doubling", "allreduce", 8, 1e6), 3.003e-3)
    assert math.isclose(closed("recursive_doubling", "allreduce", 6, 1e6), 4.004e-3)
    assert math.isclose(closed("recursive_doubling", "allgather", 8, 1e6), 0.878e-3)


def test_halving_doubling_hand_numbers():
    """P=8, S=8 MB: 2 log2(8) alpha + 2 (7/8) S/beta = 6e-6 + 14e-3 = 14.006e-3 s.
    P=12: core on pof2=8 plus the fold, 2 (1e-6 + 8e-3): 14.006e-3 + 16.002e-3 = 30.008e-3 s.
    Reduce-scatter P=8, S=8 MB: 3e-6 + 7e-3 s. P=3, S=3 MB (1 MB chunks): pre-step 3.001e-3, then
    new rank 0 (rank 1) sends 1 chunk while new rank 1 (rank 2, idle so far) sends 2: max(3.001e-3
    + 1.001e-3, 2.001e-3) = 4.002e-3, post-step 1.001e-3: 5.003e-3 s."""
    assert math.isclose(closed("halving_doubling", "allreduce", 8, 8e6), 14.006e-3)
    assert math.isclose(closed("halving_doubling", "allreduce", 12, 8e6), 30.008e-3)
    assert math.isclose(closed("halving_doubling", "reduce_scatter", 8, 8e6), 7.003e-3)
    assert math.isclose(closed("halving_doubling", "reduce_scatter", 3, 3e6), 5.003e-3)


def test_binomial_tree_hand_numbers():
    """S=1 MB. Reduce P=5: heaviest path 3 -> 2 -> 0, 2 * 1.001e-3 = 2.002e-3 s (rank 4 was ready
    at 0 and arrives at 1.001e-3). Broadcast P=5: the root sends in 3 rounds: 3.003e-3 s.
    Allreduce P=8: (3 + 3) * 1.001e-3 = 6.006e-3 s. Two-level P=8, D=4, S=1 MB: reduce crosses
    nodes once (4 -> 0: 2e-6 + 1e-4) and climbs two intra edges (1e-6 + 1e-5 each): 1.24e-4 s."""
    assert math.isclose(closed("binomial_tree", "reduce", 5, 1e6), 2.002e-3)
    assert math.isclose(closed("binomial_tree", "broadcast", 5, 1e6), 3.003e-3)
    assert math.isclose(closed("binomial_tree", "allreduce", 8, 1e6), 6.006e-3)
    assert math.isclose(closed("binomial_tree", "reduce", 8, 1e6, TWO_LEVEL), 1.24e-4)


def test_double_binary_tree_hand_numbers():
    """P=8 ranks on 8 nodes, S=2 MB (1 MB per tree): height 3, 2*3 steps of 1.001e-3 = 6.006e-3 s.
    With 4 pieces: (6 + 3) steps of 1e-6 + 0.25e-3 = 2.259e-3 s. Two-level P=8, D=4, S=2 MB, C=1:
    chain 2 * 3 steps of 1e-6 + 1e6/100e9 = 11e-6 (66e-6) plus trees over 2 nodes, 2 steps of
    2e-6 + 1e6/10e9 = 102e-6 (204e-6): 270e-6 s."""
    assert math.isclose(closed("double_binary_tree", "allreduce", 8, 2e6), 6.006e-3)
    assert math.isclose(closed("double_binary_tree", "allreduce", 8, 2e6, chunks=4), 2.259e-3)
    assert math.isclose(closed("double_binary_tree", "allreduce", 8, 2e6, TWO_LEVEL), 270e-6)


def test_double_binary_trees_are_complementary():
    """NCCL's tree pair: height ceil(log2 N); for even N no node is interior in both trees."""
    assert [tree_height(n) for n in (2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 2, 3, 3, 4, 4, 5]
    a, b = dtree_parents(8)
    assert a.tolist() == [-1, 2, 4, 2, 0, 6, 4, 6] and b.tolist() == [1, 3, 1, 7, 5, 3, 5, -1]
    for nodes in (4, 8, 16, 32):
        a, b = dtree_parents(nodes)
        interior_a, interior_b = set(a[a >= 0].tolist()), set(b[b >= 0].tolist())
        assert not (interior_a & interior_b - {0, nodes - 1})


def test_hierarchical_hand_numbers():
    """P=8, D=4, S=4 MB, intra 1 us/100 GB/s, inter 2 us/10 GB/s, ring among 2 leaders:
    (floor + ceil log2 4 =) 4 intra steps of 1e-6 + 4e-5 = 164e-6, ring 2 steps of 2e-6 + 2e-4 =
    404e-6: 568e-6 s. intra="reduce_scatter": 2 * 3 steps of 1e-6 + 1e-5 = 66e-6, then the node's 4
    devices each run a ring of S/4 at once through its one NIC: 2 * (2e-6 + 4 * 5e-5) = 404e-6:
    470e-6 s (170e-6 with four NICs a node)."""
    assert math.isclose(closed("hierarchical", "allreduce", 8, 4e6, TWO_LEVEL), 568e-6)
    assert math.isclose(closed("hierarchical", "allreduce", 8, 4e6, TWO_LEVEL, intra="reduce_scatter"), 470e-6)
    four_nics = dataclasses.replace(TWO_LEVEL, nics_per_node=4)
    assert math.isclose(closed("hierarchical", "allreduce", 8, 4e6, four_nics, intra="reduce_scatter"), 170e-6)


def test_torus_2d_hand_numbers():
    """P=8 as 2 x 4, S=8 MB: 2 * 3 row steps of 1e-6 + 2e-3 plus 2 * 1 column steps of
    1e-6 + 1e-3 = 12.006e-3 + 2.002e-3 = 14.008e-3 s. Default grid of 12 ranks is 3 x 4."""
    assert math.isclose(closed("torus_2d", "allreduce", 8, 8e6), 14.008e-3)
    assert math.isclose(closed("torus_2d", "allreduce", 8, 8e6, rows=2), 14.008e-3)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", 12)
    assert schedule.num_rounds() == 2 * 3 + 2 * 2


def test_parameter_server_topk_and_chain_hand_numbers():
    """PS P=4, k=2, S=2 MB (dedicated servers): each server hears 4 shards of 1 MB at once, then
    sends 4: 2 * (1e-6 + 4e-3) = 8.002e-3 s.
    Top-k P=4, S=100 MB fp32, density 0.01: 250 000 (value, index) pairs = 2 MB per rank,
    3 ring steps: 3 * 2.001e-3 = 6.003e-3 s. Chain broadcast P=4 in 2 pieces of 1 MB:
    (3 + 1) * 1.001e-3 = 4.004e-3 s."""
    assert math.isclose(closed("parameter_server", "allreduce", 4, 2e6, servers=2), 8.002e-3)
    assert math.isclose(closed("topk_sparse", "allreduce", 4, 100e6), 6.003e-3)
    assert math.isclose(closed("chain", "broadcast", 4, 2e6, chunks=2), 4.004e-3)


# (d) bytes --------------------------------------------------------------------------------------


def _bytes_by(schedule: Schedule, message_bytes: float, side: str) -> np.ndarray:
    total = np.zeros(schedule.ranks)
    for rnd in schedule.rounds():
        np.add.at(total, getattr(rnd, side), schedule.transfer_bytes(rnd, message_bytes))
    return total


@pytest.mark.parametrize(("name", "collective", "options"), CASES, ids=IDS)
def test_bytes_scale_with_the_message(name, collective, options):
    """fp16 halves message_bytes, and every transfer halves with it."""
    schedule = COLLECTIVE_ALGORITHMS.get(name).schedule(collective, 8, devices_per_node=4, **options)
    full, half = _bytes_by(schedule, 4e6, "src"), _bytes_by(schedule, 2e6, "src")
    assert np.allclose(half, full / 2) and full.sum() > 0


def test_ring_allreduce_sends_two_p_minus_one_over_p_of_the_buffer():
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 8)
    assert np.allclose(_bytes_by(schedule, 8e6, "src"), 2 * 7 / 8 * 8e6)


def test_topk_bytes_grow_with_ranks():
    """Each rank forwards P-1 contributions of density * S/4 * 8 bytes: 1% of 40 MB fp32 is 0.8 MB."""
    per_rank = []
    for ranks in (2, 4, 8, 16):
        schedule = COLLECTIVE_ALGORITHMS.get("topk_sparse").schedule("allreduce", ranks)
        sent = _bytes_by(schedule, 40e6, "src")
        assert np.allclose(sent, (ranks - 1) * 0.8e6)
        per_rank.append(sent[0])
    assert per_rank == sorted(per_rank) and per_rank[-1] > per_rank[0]


def test_parameter_server_link_carries_p_times_s():
    """Dedicated, one server: P x S in and P x S out; k servers share it, P x S/k each."""
    ps = COLLECTIVE_ALGORITHMS.get("parameter_server")
    schedule = ps.schedule("allreduce", 6)
    assert schedule.ranks == 7 and schedule.worker_ranks == 6
    assert _bytes_by(schedule, 1e6, "dst")[6] == pytest.approx(6e6)
    assert _bytes_by(schedule, 1e6, "src")[6] == pytest.approx(6e6)
    schedule = ps.schedule("allreduce", 6, servers=3)
    assert np.allclose(_bytes_by(schedule, 3e6, "dst")[6:], 6e6)


def test_colocated_server_keeps_its_own_shard_off_the_wire():
    """Colocated k=2, P=4, S=2 MB: server 0 receives shard 0 from ranks 1..3 (3 MB) and its own
    shard 1 arrives from server 1 (1 MB): 4 MB; a worker receives 2 MB."""
    schedule = COLLECTIVE_ALGORITHMS.get("parameter_server").schedule("allreduce", 4, servers=2, placement="colocated")
    assert np.allclose(_bytes_by(schedule, 2e6, "dst"), [4e6, 4e6, 2e6, 2e6])


def test_per_node_servers_sit_on_each_nodes_first_device():
    """per_node, P=8 on 2 nodes of 4, S=2 MB: servers are ranks 0 and 4 (one per host, as distributed
    TensorFlow deploys them); each receives its 1 MB shard from the 7 other workers (7 MB) and the
    other server's shard back (1 MB): 8 MB; a worker receives 2 MB."""
    schedule = COLLECTIVE_ALGORITHMS.get("parameter_server").schedule(
        "allreduce", 8, devices_per_node=4, placement="per_node"
    )
    assert schedule.ranks == 8 and schedule.worker_ranks in (None, 8)
    assert np.allclose(_bytes_by(schedule, 2e6, "dst"), [8e6, 2e6, 2e6, 2e6, 8e6, 2e6, 2e6, 2e6])
    check_schedule(schedule)


# (e) bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COLLECTIVE_ALGORITHMS.names())
def test_unknown_option_is_rejected(name):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    collective = algorithm.collectives[0]
    with pytest.raises(ScheduleError, match=r"unknown option.*bogus.*valid"):
        algorithm.schedule(collective, 4, bogus=1)


@pytest.mark.parametrize("name", COLLECTIVE_ALGORITHMS.names())
@pytest.mark.parametrize("ranks", [0, -3])
def test_impossible_rank_counts_are_rejected(name, ranks):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    with pytest.raises(ScheduleError, match="ranks must be a positive integer"):
        algorithm.schedule(algorithm.collectives[0], ranks)


@pytest.mark.parametrize("name", COLLECTIVE_ALGORITHMS.names())
def test_unknown_and_unimplemented_collectives_are_rejected(name):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    with pytest.raises(ScheduleError, match="unknown collective 'alltoall'; valid: allreduce"):
        algorithm.schedule("alltoall", 4)
    missing = [
        c for c in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce") if c not in algorithm.collectives
    ]
    for collective in missing:
        with pytest.raises(ScheduleError, match=f"does not implement {collective}; it implements"):
            algorithm.schedule(collective, 4)


@pytest.mark.parametrize(
    ("name", "ranks", "kwargs", "message"),
    [
        (
            "torus_2d",
            12,
            {"rows": 5},
            r"rows must be a positive integer dividing ranks \(12\), got 5; "
            r"valid: 1, 2, 3, 4, 6, 12",
        ),
        ("hierarchical", 6, {"devices_per_node": 4}, r"ranks \(6\) must be a multiple of devices_per_node"),
        ("hierarchical", 8, {"inner": "nope"}, "unknown collective algorithm 'nope'; valid:"),
        ("hierarchical", 8, {"inner": "hierarchical"}, "inner must be another allreduce algorithm"),
        ("hierarchical", 8, {"inner": "parameter_server"}, "adds helper ranks"),
        ("hierarchical", 8, {"inner": "topk_sparse"}, "not a dense allreduce"),
        ("hierarchical", 8, {"intra": "scatter"}, "unknown intra 'scatter'; valid: reduce, reduce_scatter"),
        ("hierarchical", 8, {"inner_options": {"bogus": 1}}, "unknown option"),
        ("double_binary_tree", 6, {"devices_per_node": 4}, r"must be a multiple of devices_per_node"),
        ("double_binary_tree", 4, {"chunks": 0}, "chunks must be a positive integer"),
        ("chain", 4, {"chunks": 1.5}, "chunks must be a positive integer"),
        ("ring", 4, {"channels": 0}, "channels must be a positive integer"),
        ("ring", 4, {"channels": True}, "channels must be a positive integer"),
        ("parameter_server", 2, {"servers": 3, "placement": "colocated"}, "at least as many workers"),
        ("parameter_server", 2, {"placement": "remote"}, "unknown placement 'remote'; valid: dedicated"),
        ("parameter_server", 2, {"servers": 0}, "servers must be a positive integer"),
        (
            "parameter_server",
            8,
            {"placement": "per_node", "devices_per_node": 4, "servers": 3},
            "one server on each of the 2 nodes",
        ),
        ("topk_sparse", 4, {"density": 0.0}, r"density must be in \(0, 1\]"),
        ("topk_sparse", 4, {"density": 1.5}, r"density must be in \(0, 1\]"),
    ],
)
def test_bad_options_say_why(name, ranks, kwargs, message):
    algorithm = COLLECTIVE_ALGORITHMS.get(name)
    with pytest.raises(ScheduleError, match=message):
        algorithm.schedule("allreduce" if "allreduce" in algorithm.collectives else "broadcast", ranks, **kwargs)
    options = {k: v for k, v in kwargs.items() if k != "devices_per_node"}
    costs = FabricCosts(UNIFORM.intra, UNIFORM.inter, kwargs.get("devices_per_node", 1))
    with pytest.raises(ScheduleError, match=message):
        algorithm.closed_form_s(algorithm.collectives[0], ranks, 1e6, costs, **options)


# selectors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("library", "collective", "message_bytes", "ranks", "devices_per_node", "token"),
    [
        ("mpich", "allreduce", 2048, 16, 1, "recursive_doubling"),
        ("mpich", "allreduce", 2049, 16, 1, "halving_doubling"),
        ("mpich", "allreduce", 4096, 2048, 1, "recursive_doubling"),  # 1024 elements < pof2 2048
        ("mpich", "allgather", 100 * 1024, 16, 1, "recursive_doubling"),
        ("mpich", "allgather", 100 * 1024, 12, 1, "ring"),
        ("mpich", "broadcast", 1e6, 4, 1, "binomial_tree"),
        ("mpich", "broadcast", 1e6, 16, 1, "chain"),
        ("nccl", "allreduce", 1e3, 8, 8, "ring"),
        ("nccl", "allreduce", 1e3, 16, 8, "double_binary_tree"),
        ("nccl", "allreduce", 600 * 1024, 16, 8, "ring"),
        ("nccl", "allreduce", 600 * 1024, 64, 8, "double_binary_tree"),
        ("nccl", "allgather", 1e3, 64, 8, "ring"),
        ("mlsl", "allreduce", 2048, 64, 1, "recursive_doubling"),
        ("mlsl", "allreduce", 1e6, 64, 1, "halving_doubling"),
        ("mlsl", "allreduce", 1e8, 64, 1, "ring"),
        ("openmpi", "allreduce", 9999, 64, 1, "recursive_doubling"),
        ("openmpi", "allreduce", 10_000, 64, 1, "ring"),
        # gloo: ring at every size (its allreduce.cc's unspecified algorithm), binomial broadcast
        ("gloo", "allreduce", 8, 64, 1, "ring"),
        ("gloo", "allreduce", 1e8, 64, 8, "ring"),
        ("gloo", "allgather", 1e3, 16, 1, "ring"),
        ("gloo", "broadcast", 1e8, 16, 1, "binomial_tree"),
        ("gloo", "reduce", 1e6, 16, 1, "chain"),
    ],
)
def test_selector_rules(library, collective, message_bytes, ranks, devices_per_node, token):
    assert select(library, collective, message_bytes, ranks, devices_per_node)[0] == token


@pytest.mark.parametrize(
    ("message_bytes", "ranks", "devices_per_node", "pieces"),
    [
        # depth 8 - 1 + log2(2) = 8: 512 -> 128 KiB (fewer than 64 chunks), -> 64 KiB (fewer than 32),
        # -> 32 KiB (fewer than 8): 200 kB per tree in ceil(200000 / 32768) = 7 pieces
        (400_000, 16, 8, 7),
        # depth 7 + 5 = 12: 4 MiB per tree, 512 -> 128 KiB (32 < 96 chunks) -> 64 KiB (32 < 48); 64
        (8 * 1024 * 1024, 256, 8, 64),
        # depth 0 + 10 = 10: 32 MiB per tree is 64 chunks of 512 KiB, fewer than 80 -> 256 KiB: 128
        (64 * 1024 * 1024, 1024, 1, 128),
        # 64 MiB per tree: 128 chunks of 512 KiB already reach 80, no shrink
        (128 * 1024 * 1024, 1024, 1, 128),
        (1e3, 16, 8, 1),
    ],
)
def test_nccl_tree_pieces_follow_nccls_chunk_rule(message_bytes, ranks, devices_per_node, pieces):
    """Hand-applied NCCL enqueue.cc rule (two channels, one per tree)."""
    token, options = select("nccl", "allreduce", message_bytes, ranks, devices_per_node)
    assert (token, options) == ("double_binary_tree", {"chunks": pieces})


def test_nccl_tree_pipelines_small_messages():
    """0.4 MB over 2 nodes of 8: the tree NCCL runs (7 pieces a tree) beats the same tree unpipelined
    by most of its depth, and stays above one piece's trip plus the bytes over the slowest link."""
    costs = FabricCosts(HopCost(1e-6, 10e9), HopCost(2e-6, 10e9), 8)
    token, options = select("nccl", "allreduce", 400_000, 16, 8)
    pipelined = closed(token, "allreduce", 16, 400_000, costs, **options)
    whole = closed(token, "allreduce", 16, 400_000, costs)
    assert pipelined < 0.5 * whole
    assert pipelined > 2 * 200_000 / 10e9


def test_every_selection_builds_a_schedule():
    for library in LIBRARIES.names():
        for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
            for message_bytes in (8, 3000, 1e5, 1e6, 1e8):
                layouts = ((1, 1, 1), (6, 1, 1), (16, 1, 1), (12, 4, 2), (64, 8, 4), (10, 4, 4))
                for ranks, devices_per_node, nics in layouts:
                    token, options = select(library, collective, message_bytes, ranks, devices_per_node, nics)
                    algorithm = COLLECTIVE_ALGORITHMS.get(token)
                    algorithm.schedule(collective, ranks, devices_per_node=devices_per_node, **options)


def test_selector_bad_input():
    valid = "gloo, mlsl, mpich, nccl, openmpi"
    with pytest.raises(UnknownNameError, match=f"unknown collective library 'bcube'; valid: {valid}"):
        select("bcube", "allreduce", 1e6, 8, 1)
    with pytest.raises(ScheduleError, match="unknown collective 'alltoall'"):
        select("nccl", "alltoall", 1e6, 8, 1)
    with pytest.raises(ScheduleError, match="ranks must be a positive integer"):
        select("nccl", "allreduce", 1e6, 0, 1)
    with pytest.raises(ScheduleError, match="nics_per_node must be a positive integer, got 0"):
        select("nccl", "allreduce", 1e6, 16, 8, 0)


# scale ------------------------------------------------------------------------------------------


def test_4096_ranks_generate_lazily_and_fast():
    """First rounds of every schedule at 4096 ranks (8 per node) in well under a second each."""
    for name, collective, options in CASES:
        start = time.perf_counter()
        schedule = COLLECTIVE_ALGORITHMS.get(name).schedule(collective, 4096, devices_per_node=8, **options)
        rounds = schedule.rounds()
        for _ in range(3):
            next(rounds, None)
        assert time.perf_counter() - start < 1.0, (name, collective, options)


@pytest.mark.parametrize("name", COLLECTIVE_ALGORITHMS.names())
@pytest.mark.parametrize(
    "options", [{}, {"servers": 3, "placement": "dedicated"}, {"servers": 2, "placement": "colocated"}]
)
def test_helper_ranks_without_building_the_schedule(name, options):
    """helper_ranks (what a training plan asks, at any scale) is what the schedule adds to the workers."""
    impl = COLLECTIVE_ALGORITHMS.get(name)
    if options and name != "parameter_server":
        pytest.skip("options of the parameter server only")
    if "allreduce" not in impl.collectives:
        pytest.skip("no allreduce")
    for ranks in (4, 8):
        schedule = impl.schedule("allreduce", ranks, **options)
        assert helper_ranks(name, ranks, **options) == schedule.ranks - ranks


# ring channels ------------------------------------------------------------------------------------


def test_ring_channels_leave_each_node_through_their_own_nic():
    """2 nodes of 8, 4 channels: ring c enters a node at device 2c and leaves from device 2c - 1
    (7, 1, 3, 5: NICs 3, 0, 1, 2 of 4), every rank sends one piece per ring in each round."""
    from ddlsim.algorithms.ring_collective import channel_orders

    orders = channel_orders(16, 4, 8)
    assert orders[1].tolist() == [2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9]
    leaving = sorted(int(order[7]) * 4 // 8 for order in orders)
    assert leaving == [0, 1, 2, 3]
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 16, devices_per_node=8, channels=4)
    assert schedule.num_chunks == 64 and schedule.num_rounds() == 30
    for rnd in schedule.rounds():
        assert np.bincount(rnd.src, minlength=16).tolist() == [4] * 16
        assert np.bincount(rnd.dst, minlength=16).tolist() == [4] * 16


def test_ring_channels_hand_numbers():
    """P=16 on 2 nodes of 8 with 4 NICs, S=64 MB, 4 channels: pieces of 1 MB; a step is the slower of
    one piece through a NIC (2 us + 1e6 / 10e9 = 102 us) and device 0's four pieces through its
    intra-node port (1 us + 4e6 / 100e9 = 41 us): 30 x 102 us = 3.06 ms. One ring: its 4 MB pieces all
    cross through one NIC, 30 x (2 us + 400 us) = 12.06 ms."""
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    costs = FabricCosts(HopCost(1e-6, 100e9), HopCost(2e-6, 10e9), 8, 4)
    assert ring.closed_form_s("allreduce", 16, 64e6, costs, channels=4) == pytest.approx(3.06e-3, rel=1e-12)
    assert ring.closed_form_s("allreduce", 16, 64e6, costs) == pytest.approx(12.06e-3, rel=1e-12)
    # 8 channels on 4 NICs: two pieces of 0.5 MB share each NIC, no gain over 4
    assert ring.closed_form_s("allreduce", 16, 64e6, costs, channels=8) == pytest.approx(3.06e-3, rel=1e-12)


@pytest.mark.parametrize("ranks", [2, 5, 16])
def test_ring_channels_over_one_port_buy_nothing(ranks):
    """One device and one NIC a node: every channel crosses through the same port, so C channels of
    S/C take what one ring of S takes."""
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    for channels in (2, 4):
        with_channels = ring.closed_form_s("allreduce", ranks, 3e7, UNIFORM, channels=channels)
        assert with_channels == pytest.approx(ring.closed_form_s("allreduce", ranks, 3e7, UNIFORM), rel=1e-12)


@pytest.mark.parametrize(
    ("collective", "message_bytes", "ranks", "devices_per_node", "nics", "choice"),
    [
        ("allreduce", 64e6, 16, 8, 4, ("ring", {"channels": 4})),  # 2 DGX-1: one ring per EDR NIC
        ("allreduce", 64e6, 32, 8, 8, ("ring", {"channels": 8})),  # DGX A100: 8 HDR NICs
        ("reduce_scatter", 64e6, 16, 8, 4, ("ring", {"channels": 4})),
        ("allgather", 1e3, 16, 8, 2, ("ring", {"channels": 2})),
        ("allreduce", 64e6, 16, 1, 1, ("ring", {})),  # one device a node: one ring, as before
        ("allreduce", 64e6, 8, 8, 4, ("ring", {})),  # one node: no NIC crossed
        ("allreduce", 64e6, 12, 8, 4, ("ring", {})),  # a node not filled: no whole-node blocks
        ("allreduce", 64e6, 16, 8, 1, ("ring", {})),  # one NIC
        ("allreduce", 1e3, 16, 8, 4, ("double_binary_tree", {"chunks": 1})),  # the tree rule is untouched
    ],
)
def test_nccl_opens_a_ring_channel_per_nic(collective, message_bytes, ranks, devices_per_node, nics, choice):
    assert select("nccl", collective, message_bytes, ranks, devices_per_node, nics) == choice
    assert select("mpich", collective, message_bytes, ranks, devices_per_node, nics) == select(
        "mpich", collective, message_bytes, ranks, devices_per_node
    )
