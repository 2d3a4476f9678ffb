"""Every registered algorithm: the DES (message by message, exact) equals its closed form where
nothing contends. Driven by the registry, so a new algorithm file is tested automatically."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import MessageExecutor, run_collective
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.executor.role_executor import RoleExecutor
from ddlsim.simulator.training.costs import fabric_costs as training_fabric_costs

CASES = [
    (name, collective)
    for name in COLLECTIVE_ALGORITHMS.names()
    for collective in COLLECTIVE_ALGORITHMS.get(name).collectives
]

# Schedules whose rounds make one rank send (or receive) several flows at once share that rank's
# port on any fabric: the double binary tree, where a rank sends in both trees in the same round
# (bounded below). The parameter server's incast shares ports too, but its closed form counts them.
INHERENTLY_CONTENDED = {"double_binary_tree"}


def _fabric(ranks: int, devices_per_node: int) -> Fabric:
    return Fabric(
        FabricSpec(
            nodes=-(-ranks // devices_per_node),
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            host_link=load_link("pcie3_x16") if devices_per_node > 1 else None,
            network=load_link("ib_edr") if ranks > devices_per_node else None,
            # one NIC per device: devices of a node crossing the network at once do not share one
            nics_per_node=devices_per_node,
        )
    )


@pytest.mark.parametrize(("name", "collective"), CASES)
@pytest.mark.parametrize(("ranks", "devices_per_node"), [(2, 1), (8, 1), (16, 1), (8, 2), (16, 4), (32, 8)])
@pytest.mark.parametrize("size", [1e3, 8e6])
def test_des_equals_closed_form(name, collective, ranks, devices_per_node, size):
    """Bandwidth-bound (8 MB) and latency-bound (1 kB): at 1 kB NVLink's per-message cost (3 us)
    exceeds the NIC path's, so a round with transfers inside and between nodes is paced inside the
    node. The closed forms charged such rounds at the inter hop and were up to 1.6x fast there."""
    if name in INHERENTLY_CONTENDED:
        pytest.skip("incast: no contention-free fabric exists")
    impl = COLLECTIVE_ALGORITHMS.get(name)
    schedule = impl.schedule(collective, ranks, devices_per_node=devices_per_node)
    fabric = _fabric(schedule.ranks, devices_per_node)
    des = MessageExecutor(fabric).run(schedule, size, 0.0)[: schedule.workers].max()
    closed = impl.closed_form_s(collective, ranks, size, fabric.fabric_costs())
    assert des == pytest.approx(closed, rel=1e-6)
    fast, _ = run_collective(schedule, fabric, size)
    np.testing.assert_allclose(fast[: schedule.workers].max(), des, rtol=1e-9)


@pytest.mark.parametrize(
    "options",
    [{}, {"servers": 3}, {"placement": "colocated", "servers": 2}, {"placement": "colocated", "servers": 8},
     {"placement": "per_node"}],
)  # fmt: skip
@pytest.mark.parametrize(
    ("ranks", "devices_per_node", "nics"),
    [(2, 1, 1), (16, 1, 1), (8, 2, 2), (16, 4, 1), (12, 4, 2), (10, 4, 2), (6, 2, 1)],
)
def test_parameter_server_closed_form_is_the_des_with_its_incast(options, ranks, devices_per_node, nics):
    """Every worker pushes a shard to every server at once: the closed form charges each round the
    busiest port (a node's NIC between nodes, a device's link inside one), as the DES shares it. It
    was S/k a round, exact on two nodes only (16 nodes of one device: 15x too fast)."""
    impl = COLLECTIVE_ALGORITHMS.get("parameter_server")
    if options.get("servers", 1) > ranks and options.get("placement") == "colocated":
        pytest.skip("more colocated servers than ranks")
    schedule = impl.schedule("allreduce", ranks, devices_per_node=devices_per_node, **options)
    fabric = Fabric(
        FabricSpec(
            nodes=-(-schedule.ranks // devices_per_node),
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
            host_link=load_link("pcie3_x16") if devices_per_node > 1 else None,
            network=load_link("ib_edr") if schedule.ranks > devices_per_node else None,
            nics_per_node=nics,
        )
    )
    des = MessageExecutor(fabric).run(schedule, 8e6, 0.0)[: schedule.workers].max()
    closed = impl.closed_form_s("allreduce", ranks, 8e6, fabric.fabric_costs(), **options)
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize(
    ("name", "collective"),
    [("halving_doubling", "allreduce"), ("halving_doubling", "allgather"), ("recursive_doubling", "allreduce"),
     ("recursive_doubling", "allgather"), ("torus_2d", "allreduce")],
)  # fmt: skip
@pytest.mark.parametrize(("ranks", "devices_per_node", "nics"), [(16, 4, 1), (32, 8, 1), (32, 8, 4), (64, 4, 2)])
def test_whole_node_rounds_share_the_nodes_nics_in_the_closed_form_as_in_the_des(
    name, collective, ranks, devices_per_node, nics
):
    """From distance devices_per_node on (the doubling schedules' far rounds, the torus's column
    rings), every device of a node sends across the network at once: the closed form charges the
    busiest NIC's ceil(d / nics) transfers, as the DES shares it. It charged one transfer: 5x too
    fast for halving-doubling (MPICH's large-message all-reduce) on 32 ranks of 8 per node with one
    NIC, 7x for recursive doubling, 4.6x for the 2D torus."""
    impl = COLLECTIVE_ALGORITHMS.get(name)
    schedule = impl.schedule(collective, ranks, devices_per_node=devices_per_node)
    fabric = Fabric(
        FabricSpec(
            nodes=ranks // devices_per_node,
            devices_per_node=devices_per_node,
            peer_link=load_link("nvlink2"),
            network=load_link("ib_edr"),
            nics_per_node=nics,
        )
    )
    des = MessageExecutor(fabric).run(schedule, 8e6, 0.0)[: schedule.workers].max()
    closed = impl.closed_form_s(collective, ranks, 8e6, fabric.fabric_costs())
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize(("ranks", "devices_per_node"), [(8, 1), (16, 1), (16, 4)])
def test_double_binary_tree_between_its_uncontended_form_and_twice_it(ranks, devices_per_node):
    """Each rank sends in both trees at once, so its two flows share its port: the DES lies above the
    uncontended closed form, and at most twice it (the two trees at half rate each)."""
    impl = COLLECTIVE_ALGORITHMS.get("double_binary_tree")
    schedule = impl.schedule("allreduce", ranks, devices_per_node=devices_per_node)
    fabric = _fabric(ranks, devices_per_node)
    des = MessageExecutor(fabric).run(schedule, 8e6, 0.0).max()
    closed = impl.closed_form_s("allreduce", ranks, 8e6, fabric.fabric_costs())
    assert closed < des <= 2 * closed


def _multi_nic_fabric(nodes: int, topology: str, nics: int = 4) -> Fabric:
    """Nodes of 8 NVLink devices with ``nics`` EDR NICs (device d on NIC d * nics // 8), as a DGX-1;
    a fat tree of 2 nodes a leaf, so 3 and 4 nodes cross leaves."""
    return Fabric(
        FabricSpec(
            nodes=nodes,
            devices_per_node=8,
            peer_link=load_link("nvlink2"),
            host_link=load_link("pcie3_x16"),
            network=load_link("ib_edr"),
            nics_per_node=nics,
            topology=topology,
            nodes_per_leaf=2,
        )
    )


@pytest.mark.parametrize("topology", ["switch", "fat_tree"])
@pytest.mark.parametrize("nodes", [2, 3, 4])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize(("channels", "size"), [(1, 64e6), (2, 64e6), (4, 64e6), (8, 64e6), (4, 1e5)])
def test_ring_channels_des_equals_closed_form_on_multi_nic_nodes(topology, nodes, collective, channels, size):
    """C rings at once, each crossing through its own NIC (8 channels: two per NIC): the DES, message
    by message and on its fast path, equals the closed form; 1e5 B: latency-bound, intra-node bound."""
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    fabric = _multi_nic_fabric(nodes, topology)
    schedule = ring.schedule(collective, nodes * 8, devices_per_node=8, channels=channels)
    des = MessageExecutor(fabric).run(schedule, size, 0.0).max()
    closed = ring.closed_form_s(collective, nodes * 8, size, fabric.fabric_costs(), channels=channels)
    assert des == pytest.approx(closed, rel=1e-9)
    fast, _ = run_collective(schedule, fabric, size)
    np.testing.assert_allclose(fast.max(), des, rtol=1e-9)


def test_four_channels_cross_four_times_faster_than_one_ring():
    """2 DGX-1-like nodes at 64 MB: one ring crosses through one 12.5 GB/s NIC; four channels use
    all four, so the bandwidth-bound allreduce takes about a quarter of the time (NCCL issue #307:
    ~12 GB/s busbw a NIC, ~47-48 GB/s with four)."""
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    fabric = _multi_nic_fabric(2, "switch")
    times = {
        c: MessageExecutor(fabric).run(ring.schedule("allreduce", 16, devices_per_node=8, channels=c), 64e6, 0.0).max()
        for c in (1, 4)
    }
    assert 3.8 < times[1] / times[4] < 4.0


class _Payload:
    def __init__(self, nbytes: float) -> None:
        self.nbytes = nbytes


def _des_allreduce(fabric: Fabric, group: tuple[int, ...], nbytes: float, algorithm: str = "nccl") -> float:
    """The DES (role executor, message by message) of one allreduce over ``group`` of the fabric's ranks."""
    ends: list[float] = []

    def program(comm):
        if comm.rank in group:
            yield comm.allreduce(_Payload(nbytes), algorithm, group=list(group))
            ends.append(comm.now())

    RoleExecutor(fabric, list(range(fabric.devices)), "message").run(program)
    return max(ends)


@pytest.mark.parametrize(
    ("group", "channels"),
    [
        (tuple(range(16)), 4),  # the whole run: 8 devices a node reach all 4 NICs
        (tuple(range(0, 16, 2)), 4),  # every other device (a data-parallel group under 2-way tensor parallelism)
        (tuple(r for r in range(16) if r % 8 < 4), 2),  # the first half of each node: NICs 0 and 1
        (tuple(range(0, 16, 8)), 1),  # one device a node: one ring, as before channels
    ],
)
def test_nccl_opens_a_channel_per_nic_the_group_reaches(group, channels):
    """The library selector learns the NICs a group's members on one node attach to, in the DES and
    in the closed form alike, and the two agree on the time of what it picks."""
    from ddlsim.simulator.training.costs import GroupCosts

    fabric = _multi_nic_fabric(2, "switch")
    costs = GroupCosts(fabric.spec)
    ranks = len(group)
    closed = costs.collective_s("allreduce", "nccl", ranks, 64e6, {}, group)
    des = _des_allreduce(fabric, group, 64e6)
    assert des == pytest.approx(closed, rel=1e-9)
    options = {"channels": channels} if channels > 1 else {}
    assert closed == pytest.approx(costs.collective_s("allreduce", "ring", ranks, 64e6, options, group) + 8.4e-6)


# (ranks, devices a node, nodes a leaf, oversubscription, NICs a node): powers of two throughout
FAT_TREES = [(16, 1, 4, 4, 1), (64, 1, 4, 2, 1), (32, 4, 2, 4, 1), (64, 4, 4, 4, 4), (32, 2, 2, 2, 2),
             (64, 8, 2, 4, 1), (64, 8, 4, 1.5, 8), (32, 1, 1, 2, 1)]  # fmt: skip
FAT_TREE_VARIANTS = {
    "ring": [{}, {"channels": 4}],
    "parameter_server": [{}, {"servers": 3}, {"placement": "colocated", "servers": 4}, {"placement": "per_node"}],
    "hierarchical": [{}, {"intra": "reduce_scatter"}, {"inner": "halving_doubling"}],
    "chain": [{}, {"chunks": 3}],
}
FAT_TREE_CASES = [
    (name, collective, options)
    for name, collective in CASES
    if name not in INHERENTLY_CONTENDED
    for options in FAT_TREE_VARIANTS.get(name, [{}])
]


@pytest.mark.parametrize(("name", "collective", "options"), FAT_TREE_CASES)
@pytest.mark.parametrize(("ranks", "devices_per_node", "nodes_per_leaf", "oversubscription", "nics"), FAT_TREES)
def test_closed_forms_share_an_oversubscribed_fat_trees_uplinks_as_the_des_does(
    name, collective, options, ranks, devices_per_node, nodes_per_leaf, oversubscription, nics
):
    """A fat tree's leaf switch joins its nodes at their NICs' rate and the other leaves through an
    uplink of nodes_per_leaf x NICs x port / oversubscription, shared by every transfer that leaves
    the leaf at once. The closed forms charged every transfer between nodes at the uplink-limited
    hop and shared nothing: recursive doubling 1.5-2.5x fast, halving-doubling 1.1-3.4x, the 2D
    torus 1.1-1.6x, a chain or a binomial tree 1.2-1.3x slow (inside a leaf they do not cross an
    uplink). The 2D torus's closed form is an upper bound within 1 % on one of these shapes."""
    impl = COLLECTIVE_ALGORITHMS.get(name)
    schedule = impl.schedule(collective, ranks, devices_per_node=devices_per_node, **options)
    spec = FabricSpec(
        nodes=-(-schedule.ranks // devices_per_node),
        devices_per_node=devices_per_node,
        peer_link=load_link("nvlink2") if devices_per_node > 1 else None,
        host_link=load_link("pcie3_x16") if devices_per_node > 1 else None,
        network=load_link("ib_edr"),
        nics_per_node=nics,
        topology="fat_tree",
        oversubscription=oversubscription,
        nodes_per_leaf=nodes_per_leaf,
    )
    fabric = Fabric(spec)
    assert training_fabric_costs(spec) == fabric.fabric_costs()  # the training path's costs, built directly
    for size in (1e3, 8e6):
        des = run_collective(schedule, fabric, size)[0][: schedule.workers].max()
        closed = impl.closed_form_s(collective, ranks, size, fabric.fabric_costs(), **options)
        if name == "torus_2d":
            assert des * (1 - 1e-9) <= closed <= 1.01 * des
        else:
            assert closed == pytest.approx(des, rel=1e-6), size
