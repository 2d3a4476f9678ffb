"""Contention the model must show, with the slowdown factors worked out by hand."""

import dataclasses

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.training_algorithm import AlgorithmOptions
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.engine.collective_engine import MessageExecutor, run_collective
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.scenario import Scenario

IB = load_link("ib_edr")
B = IB.port_bandwidth_Bps


def _ring_time(spec: FabricSpec, size: float) -> tuple[float, str]:
    ranks = spec.nodes * spec.devices_per_node
    schedule = COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", ranks)
    finish, path = run_collective(schedule, Fabric(spec), size)
    return float(finish.max()), path


def test_ring_on_oversubscribed_fat_tree_slows_by_the_oversubscription():
    """32 nodes, 8 per leaf (4 leaves), uplinks oversubscribed 4:1, ranks scattered over the leaves.

    Every ring hop crosses leaves, so each leaf uplink (8 x B / 4 = 2B) carries 8 flows: B/4 each.
    A step costs alpha + c/(B/4) against alpha + c/B on a full-bisection switch, with c = S/32.
    """
    size = 320e6
    switch = FabricSpec(nodes=32, devices_per_node=1, network=IB, placement="scatter")
    tree = dataclasses.replace(switch, topology="fat_tree", nodes_per_leaf=8, oversubscription=4.0)
    t_switch, _ = _ring_time(switch, size)
    t_tree, path = _ring_time(tree, size)
    assert path == "vectorised"  # eight flows per uplink, starting together: the in-round fluid path
    exact = MessageExecutor(Fabric(tree)).run(COLLECTIVE_ALGORITHMS.get("ring").schedule("allreduce", 32), size, 0.0)
    assert t_tree == pytest.approx(float(exact.max()), rel=1e-9)
    fabric = Fabric(tree)
    alpha = fabric.hop_cost(0, 1).alpha_s  # ranks 0 and 1 sit under different leaves
    chunk = size / 32
    expected_tree = 62 * (alpha + chunk / (B / 4))
    assert t_tree == pytest.approx(expected_tree, rel=1e-6)
    assert t_tree / t_switch == pytest.approx(
        expected_tree / (62 * (fabric.hop_cost(0, 1).alpha_s - 2e-7 + chunk / B)), rel=1e-3
    )
    assert 3.9 < t_tree / t_switch < 4.0


def test_block_placed_ring_is_unhurt_by_oversubscription():
    """With neighbours under one leaf, one flow per direction crosses each uplink: no slowdown beyond
    the two extra switch hops of latency."""
    switch = FabricSpec(nodes=32, devices_per_node=1, network=IB)
    tree = dataclasses.replace(switch, topology="fat_tree", nodes_per_leaf=8, oversubscription=4.0)
    t_switch, _ = _ring_time(switch, 320e6)
    t_tree, path = _ring_time(tree, 320e6)
    assert path == "vectorised"
    assert t_tree == pytest.approx(t_switch, rel=1e-3)


@pytest.mark.parametrize("servers", [1, 2])
def test_parameter_server_nic_is_the_bottleneck_as_workers_grow(servers):
    """P workers push S/k bytes each to each of k dedicated servers, then pull: every server link
    carries P x S/k bytes each way, so the collective takes about 2 P S / (k B) and doubles with P."""
    size = 100e6
    ps = COLLECTIVE_ALGORITHMS.get("parameter_server")
    times = {}
    for workers in (4, 8, 16):
        schedule = ps.schedule("allreduce", workers, servers=servers)
        fabric = Fabric(FabricSpec(nodes=schedule.ranks, devices_per_node=1, network=IB))
        finish, _ = run_collective(schedule, fabric, size)
        np.testing.assert_allclose(finish, MessageExecutor(fabric).run(schedule, size, 0.0), rtol=1e-9)
        times[workers] = float(finish[:workers].max())
        assert times[workers] == pytest.approx(2 * workers * size / (servers * B), rel=0.01)
    assert times[16] / times[8] == pytest.approx(2.0, rel=0.01)
    assert times[8] / times[4] == pytest.approx(2.0, rel=0.01)


def test_training_with_parameter_server_scales_worse_than_ring():
    base = Scenario(
        workload="resnet50",
        device="p100_sxm2",
        devices_per_node=1,
        intra_node=None,
        network="ib_edr",
        host_link=None,
        nodes=(8,),
    )
    ring = run_des(base, 8).result
    with_servers = dataclasses.replace(base, options=AlgorithmOptions(collective="parameter_server"))
    ps = run_des(with_servers, 8).result
    assert ps.iteration_s > ring.iteration_s
    exact = run_des(with_servers, 8, mode="message").result
    assert ps.iteration_s == pytest.approx(exact.iteration_s, rel=1e-9)
