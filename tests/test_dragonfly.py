"""The dragonfly topology (issue 13: Theta's Cray Aries network): minimal routes link by link, a ring
the closed form times exactly, a group pair's global link shared, and the flags."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.engine.collective_engine import MessageExecutor, run_collective
from ddlsim.simulator.engine.fabric import SWITCH_HOP_LATENCY_S, Fabric, FabricSpec
from ddlsim.simulator.engine.fabric_spec import THETA_DRAGONFLY
from ddlsim.simulator.training.costs import fabric_costs
from tests.test_sockets import concurrent_ends

EDR = load_link("ib_edr")
ARIES = load_link("aries")


def _fabric(nodes: int = 64, **changes) -> Fabric:
    """2 nodes a router, 4 routers a group: 8 nodes a group, 8 groups for 64 nodes."""
    fields = dict(nodes=nodes, devices_per_node=1, network=EDR, topology="dragonfly", nodes_per_router=2,
                  routers_per_group=4)  # fmt: skip
    return Fabric(FabricSpec(**(fields | changes)))


def _names(fabric: Fabric, src: int, dst: int) -> list[str]:
    return [fabric.link_name(int(link)) for link in fabric.routes(np.array([src]), np.array([dst]))[0] if link >= 0]


def test_minimal_routes_by_hand():
    fabric = _fabric()
    assert fabric.dragonfly_groups == 8
    assert _names(fabric, 0, 1) == ["nic_up[0]", "nic_down[1]"]  # one router
    # same group, routers 0 -> 1: local link of (group 0, router 0, router 1) = 0 * 16 + 0 * 4 + 1
    assert _names(fabric, 0, 2) == ["nic_up[0]", "local[1]", "nic_down[2]"]
    # group 0 -> 1: group 0's link to group 1 sits on router (1 - 0 - 1) mod 8 mod 4 = 0 (the sender's),
    # group 1's link back on router (0 - 1 - 1) mod 8 mod 4 = 2: local (group 1, 2 -> 0) = (1 * 4 + 2) * 4 + 0
    assert _names(fabric, 0, 8) == ["nic_up[0]", "global[1]", "local[24]", "nic_down[8]"]
    # node 63 (group 7, router 3) -> node 0: out via group 7's router (0 - 7 - 1) mod 8 mod 4 = 0, in at
    # group 0's router (7 - 0 - 1) mod 8 mod 4 = 2, then on to router 0
    assert _names(fabric, 63, 0) == ["nic_up[63]", "local[124]", "global[56]", "local[8]", "nic_down[0]"]


def test_a_ring_runs_as_its_closed_form():
    """Consecutive nodes: each group pair's global link carries one flow each way, so nothing shares a
    link and the ring waits for its slowest hop (three router hops between groups)."""
    fabric = _fabric()
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    schedule = ring.schedule("allreduce", 64)
    des = MessageExecutor(fabric).run(schedule, 8e6, 0.0).max()
    slowest = EDR.per_message_overhead_s + EDR.latency_s + 3 * SWITCH_HOP_LATENCY_S + 8e6 / 64 / EDR.port_bandwidth_Bps
    assert des == pytest.approx(2 * 63 * slowest, rel=1e-9)
    assert ring.closed_form_s("allreduce", 64, 8e6, fabric.fabric_costs()) == pytest.approx(des, rel=1e-9)
    fast, path = run_collective(schedule, fabric, 8e6)
    assert path == "vectorised" and fast.max() == pytest.approx(des, rel=1e-9)


@pytest.mark.parametrize("name", ["recursive_doubling", "halving_doubling", "double_binary_tree"])
def test_round_path_equals_message_path_under_global_contention(name):
    """Partners in other groups share their group pair's one global link: slower than the closed form,
    and the round path proves (or falls back to) the message path's times."""
    fabric = _fabric()
    impl = COLLECTIVE_ALGORITHMS.get(name)
    schedule = impl.schedule("allreduce", 64)
    des = MessageExecutor(fabric).run(schedule, 8e6, 0.0).max()
    fast, _path = run_collective(schedule, fabric, 8e6)
    assert fast.max() == pytest.approx(des, rel=1e-9)
    assert des > impl.closed_form_s("allreduce", 64, 8e6, fabric.fabric_costs())


@pytest.mark.parametrize("links", [1, 4])
def test_a_group_pairs_global_links_are_shared(links):
    """The 8 nodes of group 0 send to group 1 at once: 8 flows through the pair's global links."""
    fabric = _fabric(dragonfly_global_links=links)
    ends = concurrent_ends(fabric, fabric.routes(np.arange(8), np.arange(8) + 8), 10e6)
    share = links * EDR.port_bandwidth_Bps / 8
    assert ends == pytest.approx([10e6 / min(share, EDR.port_bandwidth_Bps)] * 8, rel=1e-9)


@pytest.mark.parametrize("nodes", [8, 64, 100])
def test_closed_form_costs_match_the_fabric(nodes):
    fabric = _fabric(nodes=nodes)
    assert fabric_costs(fabric.spec) == fabric.fabric_costs()


def test_collective_command_takes_a_dragonfly(capsys):
    argv = ["collective", "--algorithm", "ring", "--ranks", "64", "--message-bytes", "8MB", "--network", "ib_edr",
            "--topology", "dragonfly", "--nodes-per-router", "2", "--routers-per-group", "4"]  # fmt: skip
    assert main(argv) == 0
    assert "ring on dragonfly" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--routers-per-group", "0"])
    assert exit_.value.code == 2
    assert "--routers-per-group must be in [1, 4096]" in capsys.readouterr().err


# --- Theta: the `aries` network on THETA_DRAGONFLY (docs/hardware.md, "Theta's dragonfly") ---------------


def _theta(nodes: int) -> Fabric:
    return Fabric(FabricSpec(nodes=nodes, devices_per_node=1, network=ARIES, **THETA_DRAGONFLY))


def test_theta_blades_and_groups():
    """Four nodes share an Aries (a blade); 384 nodes (two cabinets) share a group; 2048 nodes take six."""
    assert _theta(2048).dragonfly_groups == 6
    fabric = _theta(768)
    assert _names(fabric, 0, 3) == ["nic_up[0]", "nic_down[3]"]
    assert _names(fabric, 0, 4) == ["nic_up[0]", "local[1]", "nic_down[4]"]
    kinds = [name.split("[")[0] for name in _names(fabric, 383, 767)]
    assert kinds == ["nic_up", "local", "global", "local", "nic_down"]
    assert not any(name.startswith("global") for name in _names(fabric, 0, 383))


def test_a_theta_group_pair_carries_what_its_optical_cables_do():
    """All 384 nodes of group 0 send to group 1 at once: together they get 19 links at aries' port rate,
    142 GB/s, within 2 % of Theta's 48 optical links x 4.6875 GB/s x 64 % payload (144 GB/s); one flow
    alone runs at its NIC's 10.24 GB/s x 0.73."""
    fabric = _theta(768)
    ends = concurrent_ends(fabric, fabric.routes(np.arange(384), np.arange(384) + 384), 10e6)
    assert 384 * 10e6 / max(ends) == pytest.approx(19 * ARIES.port_bandwidth_Bps, rel=1e-9)
    assert 384 * 10e6 / max(ends) == pytest.approx(48 * 3 * 12.5e9 / 8 * 0.64, rel=0.02)
    (alone,) = concurrent_ends(fabric, fabric.routes(np.array([0]), np.array([384])), 10e6)
    assert 10e6 / alone == pytest.approx(10.24e9 * 0.73, rel=1e-9)


def test_a_ring_over_2048_theta_nodes_by_hand():
    """2 x 2047 steps, each 0.5 us of MPI software + 0.8 us (Aries put) + 3 router hops x 100 ns (the hops
    between groups) + a 2048th of 100 MB at 7.4752 GB/s; closed form and schedule agree."""
    fabric, nbytes = _theta(2048), 100e6
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    by_hand = 2 * 2047 * (0.5e-6 + 0.8e-6 + 3 * 100e-9 + nbytes / 2048 / 7.4752e9)
    assert ring.closed_form_s("allreduce", 2048, nbytes, fabric_costs(fabric.spec)) == pytest.approx(by_hand, rel=1e-9)
    fast, path = run_collective(ring.schedule("allreduce", 2048), fabric, nbytes)
    assert path == "vectorised" and fast.max() == pytest.approx(by_hand, rel=1e-9)
