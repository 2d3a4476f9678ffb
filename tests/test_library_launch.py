"""A library's launch latency (issue 13: collective libraries' real behaviour): a call through the
``nccl`` selector enters its schedule NCCL's 8.4 us later in every executor; an explicit algorithm
token pays nothing."""

import pytest

from ddlsim.algorithms.selectors import launch_s
from ddlsim.hardware_models.catalog import load_link
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.engine.fabric import Fabric, FabricSpec
from ddlsim.simulator.executor.role_executor import RoleExecutor
from ddlsim.simulator.training.costs import GroupCosts

NCCL_BASE_LATENCY_S = 8.4e-6  # NVIDIA/nccl src/graph/tuning.cc: baseLat, Ring / Simple


class Payload:
    def __init__(self, nbytes: float) -> None:
        self.nbytes = nbytes


def _spec() -> FabricSpec:
    pcie = load_link("pcie3_x16")
    return FabricSpec(nodes=2, devices_per_node=4, peer_link=pcie, host_link=pcie, network=load_link("ib_edr"))


def test_only_libraries_pay_a_launch():
    assert launch_s("nccl", 2) == NCCL_BASE_LATENCY_S
    assert launch_s("ring", 2) == launch_s("mpich", 2) == launch_s("nccl", 1) == 0.0


def _finish(algorithm: str, mode: str) -> list[float]:
    """Every rank of 2 x 4 GPUs runs one 64 MB all-reduce after a rank-dependent compute."""
    ends: list[float] = []

    def program(comm):
        yield comm.compute(_Work(1e-4 * comm.rank))
        yield comm.allreduce(Payload(64e6), algorithm)
        ends.append(comm.now())

    RoleExecutor(Fabric(_spec()), list(range(8)), mode).run(program)
    return sorted(ends)


class _Work:
    name = "work"

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s

    def run(self):
        return None


@pytest.mark.parametrize("mode", ["vectorised", "message"])
def test_des_enters_a_library_call_its_launch_later(mode):
    """nccl picks the ring at 64 MB on two nodes: the same transfers, each rank's entry moved by the launch."""
    ring, nccl = _finish("ring", mode), _finish("nccl", mode)
    assert nccl == pytest.approx([end + NCCL_BASE_LATENCY_S for end in ring], rel=1e-12, abs=1e-12)


def test_closed_form_adds_the_launch_once_per_call():
    costs = GroupCosts(_spec())
    ring = costs.collective_s("allreduce", "ring", 8, 64e6, {})
    assert costs.collective_s("allreduce", "nccl", 8, 64e6, {}) == pytest.approx(ring + NCCL_BASE_LATENCY_S)
    assert costs.collective_s("allreduce", "nccl", 1, 64e6, {}) == costs.collective_s("allreduce", "ring", 1, 64e6, {})


def _time_us(capsys, algorithm: str) -> float:
    argv = ["collective", "--algorithm", algorithm, "--collective", "allreduce", "--message-bytes", "400KB",
            "--ranks", "2", "--devices-per-node", "2", "--intra-node", "pcie3_x16"]  # fmt: skip
    assert main(argv) == 0
    return float(capsys.readouterr().out.strip().splitlines()[-1].split()[3])


def test_collective_command_shows_the_launch_of_a_library(capsys):
    """One node, two PCIe GPUs, 400 kB: nccl's ring is the ring plus 8.4 us; the ring is two steps of
    (1 us latency + 4.7 us per message + 200 kB at 12.0 GB/s)."""
    ring = _time_us(capsys, "ring")
    pcie = load_link("pcie3_x16")
    assert ring == pytest.approx(2 * (1.0 + 4.7 + 200e3 / pcie.port_bandwidth_Bps * 1e6), abs=0.01)
    assert _time_us(capsys, "nccl") == pytest.approx(ring + 8.4, abs=0.02)


def test_results_name_the_launch(capsys, tmp_path):
    """results.csv carries the launch as its own column, and the table's header says it is included."""
    argv = ["collective", "--algorithm", "nccl", "--ranks", "8", "--devices-per-node", "8", "--intra-node", "pcie3_x16",
            "--message-bytes", "1MB", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert "times include nccl's launch, 8.4 us a call" in capsys.readouterr().out
    header, row = (tmp_path / "results.csv").read_text().splitlines()
    assert dict(zip(header.split(","), row.split(","), strict=True))["launch_s"] == "8.4e-06"
