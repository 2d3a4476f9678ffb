"""Two CPU sockets per node: which transfers cross the socket link, what a ring pays for it, and how a
user asks for it (issue 13: cross-socket PCIe)."""

import numpy as np
import pytest
import simpy

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.engine.collective_engine import MessageExecutor, run_collective
from ddlsim.simulator.engine.fabric import Fabric, FabricError, FabricSpec
from ddlsim.simulator.engine.flow_network import FlowNetwork
from ddlsim.simulator.training.costs import fabric_costs

PCIE, QPI, NVLINK, FDR = (load_link(token) for token in ("pcie3_x16", "qpi", "nvlink2", "ib_fdr"))


def _spec(nodes: int = 1, peer=PCIE, **changes) -> FabricSpec:
    fields = dict(nodes=nodes, devices_per_node=8, peer_link=peer, host_link=PCIE, network=FDR if nodes > 1 else None,
                  sockets=2, socket_link=QPI)  # fmt: skip
    return FabricSpec(**(fields | changes))


def _names(fabric: Fabric, src: int, dst: int) -> list[str]:
    routes = fabric.routes(np.array([src]), np.array([dst]))[0]
    return [fabric.link_name(int(link)) for link in routes if link >= 0]


def test_qpi_carries_what_nccl_assumes_across_sockets():
    assert QPI.port_bandwidth_Bps == pytest.approx(8e9, rel=1e-3)  # NCCL 2.4 topo.h: QPI_WIDTH 8 (GB/s)
    assert QPI.port_bandwidth_Bps < PCIE.port_bandwidth_Bps


def test_pcie_peers_on_two_sockets_cross_the_socket_link_once():
    fabric = Fabric(_spec())
    sockets = fabric.socket_links
    assert sockets is not None
    assert _names(fabric, 0, 3) == ["host_up[0]", "host_down[3]"]  # devices 0-3: socket 0
    # socket link ids run (node, from, to): node 0's 0 -> 1 is the second, 1 -> 0 the third
    assert _names(fabric, 3, 4) == ["host_up[3]", "socket[1]", "host_down[4]"]
    assert _names(fabric, 7, 0) == ["host_up[7]", "socket[2]", "host_down[0]"]
    _, alpha, beta = fabric.path_properties(np.array([3]), np.array([4]))
    assert beta[0] == QPI.port_bandwidth_Bps
    assert alpha[0] == pytest.approx(PCIE.per_message_overhead_s + PCIE.latency_s + QPI.latency_s)


def test_nvlink_peers_do_not_cross_sockets_but_their_nic_traffic_does():
    fabric = Fabric(_spec(nodes=2, peer=NVLINK))
    assert _names(fabric, 3, 4) == ["peer_up[3]", "peer_down[4]"]  # NVLink joins the GPUs directly
    # one NIC per node, on socket 0: device 7 (socket 1) reaches it across the sockets, and the
    # receiver's side crosses again into device 12 (node 1, socket 1)
    assert _names(fabric, 7, 12) == [
        "host_up[7]",
        "socket[2]",
        "nic_up[0]",
        "nic_down[1]",
        "socket[5]",
        "host_down[12]",
    ]
    assert _names(fabric, 0, 8) == ["host_up[0]", "nic_up[0]", "nic_down[1]", "host_down[8]"]


def test_one_nic_per_socket_keeps_each_socket_on_its_own_nic():
    fabric = Fabric(_spec(nodes=2, nics_per_node=2))
    assert _names(fabric, 7, 12) == ["host_up[7]", "nic_up[1]", "nic_down[3]", "host_down[12]"]


def test_ring_over_two_sockets_is_paced_by_the_socket_link():
    """8 PCIe GPUs, 4 per socket: the ring's two crossings run in opposite directions, so nothing
    shares a link, and every step waits for the QPI hop: 2 (n - 1) (alpha + S / n / 8 GB/s)."""
    ranks, size = 8, 64e6
    ring = COLLECTIVE_ALGORITHMS.get("ring")
    schedule = ring.schedule("allreduce", ranks, devices_per_node=8)
    fabric = Fabric(_spec())
    des = MessageExecutor(fabric).run(schedule, size, 0.0).max()
    alpha = PCIE.per_message_overhead_s + PCIE.latency_s + QPI.latency_s
    by_hand = 2 * (ranks - 1) * (alpha + size / ranks / QPI.port_bandwidth_Bps)
    assert des == pytest.approx(by_hand, rel=1e-9)
    assert ring.closed_form_s("allreduce", ranks, size, fabric.fabric_costs()) == pytest.approx(des, rel=1e-9)
    fast, _ = run_collective(schedule, fabric, size)
    assert fast.max() == pytest.approx(des, rel=1e-9)
    one_socket = Fabric(_spec(sockets=1, socket_link=None))
    assert MessageExecutor(one_socket).run(schedule, size, 0.0).max() < 0.7 * des


def concurrent_ends(fabric: Fabric, routes: np.ndarray, nbytes: float) -> list[float]:
    """When each of ``routes`` finishes ``nbytes`` started together on the fabric's flow network."""
    env = simpy.Environment()
    network = FlowNetwork(env, fabric.capacity_Bps, fabric.redundant)
    ends: list[float] = []

    def send(links):
        yield network.transfer(links, nbytes)
        ends.append(env.now)

    for links in routes:
        env.process(send(links))
    env.run()
    return ends


def test_two_transfers_into_the_other_socket_share_its_link():
    """Devices 0 and 1 both send to socket 1 at once: their flows halve the QPI link between them."""
    fabric = Fabric(_spec())
    ends = concurrent_ends(fabric, fabric.routes(np.array([0, 1]), np.array([4, 5])), 80e6)
    assert ends == pytest.approx([2 * 80e6 / QPI.port_bandwidth_Bps] * 2, rel=1e-9)


@pytest.mark.parametrize("nodes", [1, 2, 64])
@pytest.mark.parametrize("peer", [PCIE, NVLINK])
@pytest.mark.parametrize("topology", ["switch", "fat_tree"])
@pytest.mark.parametrize("nics", [1, 2, 4])
def test_closed_form_costs_match_the_fabric(nodes, peer, topology, nics):
    spec = _spec(nodes=nodes, peer=peer, topology=topology, nodes_per_leaf=4, nics_per_node=nics)
    assert fabric_costs(spec) == Fabric(spec).fabric_costs()


def test_bad_socket_counts_are_refused():
    with pytest.raises(FabricError, match="do not split evenly over 3 sockets"):
        _spec(sockets=3)
    with pytest.raises(FabricError, match="needs a socket link"):
        _spec(socket_link=None)


COLLECTIVE = ["collective", "--algorithm", "ring", "--collective", "allreduce", "--message-bytes", "64MB",
              "--ranks", "8", "--devices-per-node", "8", "--intra-node", "pcie3_x16"]  # fmt: skip


def _busbw(capsys, extra: list[str]) -> float:
    assert main([*COLLECTIVE, *extra]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1].split()
    return float(line[5])  # ranks, size (two words), time, algbw, busbw


def test_collective_command_takes_sockets(capsys):
    assert _busbw(capsys, ["--sockets", "2", "--socket-link", "qpi"]) == pytest.approx(8.0, rel=0.01)
    assert _busbw(capsys, []) == pytest.approx(PCIE.port_bandwidth_Bps / 1e9, rel=0.01)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sockets", "3", "--socket-link", "qpi"], "--sockets 3 does not divide --devices-per-node 8 evenly"),
        (["--sockets", "2"], "--sockets > 1 needs --socket-link"),
        (["--sockets", "2", "--socket-link", "ib_edr"], "is a network, not an intra-node link"),
        (["--sockets", "9", "--socket-link", "qpi"], "--sockets"),
    ],
)
def test_bad_socket_options_exit_2_with_one_line(capsys, extra, message):
    try:
        code = main([*COLLECTIVE, *extra])
    except SystemExit as exit:  # argparse's own checks (a count out of range) exit from inside
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_training_des_equals_the_closed_form_across_sockets(tmp_path, capsys):
    """Bucketed sync SGD on 8 PCIe GPUs over two sockets, one and two nodes: the event simulation and
    the closed form agree (nothing contends), and the crossing costs iteration time."""
    args = ["simulate", "--workload", "alexnet", "--device", "titanx_pascal", "--devices-per-node", "8",
            "--intra-node", "pcie3_x16", "--network", "ib_fdr", "--nodes", "1,2"]  # fmt: skip
    sockets = ["--sockets", "2", "--socket-link", "qpi"]
    times = {}
    for name, extra in (("des", sockets), ("analytic", sockets), ("one_socket", [])):
        executor = "analytic" if name == "analytic" else "des"
        assert main([*args, *extra, "--executor", executor, "--out", str(tmp_path / name)]) == 0
        lines = (tmp_path / name / "results.csv").read_text().splitlines()
        column = lines[0].split(",").index("iteration_s")
        times[name] = [float(line.split(",")[column]) for line in lines[1:]]
    capsys.readouterr()
    assert times["des"] == pytest.approx(times["analytic"], rel=1e-9)
    assert all(two > one for two, one in zip(times["des"], times["one_socket"], strict=True))
