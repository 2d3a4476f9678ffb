"""The numbers a closed form needs, without building the fabric: hop costs and the training costs.

``fabric_costs(spec)`` gives the uncontended hop costs of a fabric (``algorithms.schedule.FabricCosts``:
an intra-node pair and an inter-node pair) from its links' datasheets, by the same arithmetic as
``Fabric.path_properties`` (overhead + summed link latency + receive overhead under LogGP; the
bottleneck of the route's capacities), so its cost does not grow with the node count: a million
nodes cost what two do. Block placement is computed directly; a scattered placement builds the
fabric (tests hold the two to each other on every topology).

``ClosedFormCosts`` is the ``TrainingCosts`` a training algorithm's closed form asks: a worker's
trainer (the simulation's own cost model, without noise) and the closed-form time of a collective.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, resolve
from ddlsim.algorithms.gradient_buckets import StepProfile
from ddlsim.algorithms.schedule import FabricCosts, HopCost
from ddlsim.algorithms.training_algorithm import TrainingAlgorithm
from ddlsim.hardware_models.catalog import Link
from ddlsim.simulator.engine.fabric import SWITCH_HOP_LATENCY_S, Fabric, FabricSpec, torus_shape
from ddlsim.simulator.scenario import Scenario
from ddlsim.simulator.training.trainers import SimTrainer, layer_times


def _hop(overhead_s: float, latency_s: float, bottleneck_Bps: float, loggp: bool) -> HopCost:
    return HopCost(overhead_s * (2 if loggp else 1) + latency_s, bottleneck_Bps)


def _core(spec: FabricSpec, net: Link) -> tuple[float, float]:
    """(latency, narrowest capacity) of the core links between node 0 and the last node."""
    if spec.topology == "fat_tree":
        if spec.nodes <= spec.nodes_per_leaf:
            return 0.0, float("inf")
        uplink = spec.nodes_per_leaf * spec.nics_per_node * net.port_bandwidth_Bps / spec.oversubscription
        return 2 * SWITCH_HOP_LATENCY_S, uplink
    if spec.topology in ("torus_2d", "torus_3d"):
        shape = torus_shape(spec.nodes, 2 if spec.topology == "torus_2d" else 3, spec.torus_dims)
        # node 0 to the last node: one hop per dimension of extent >= 2 (the wrap-around way)
        hops = sum(1 for extent in shape if extent >= 2)
        return hops * SWITCH_HOP_LATENCY_S, spec.nics_per_node * net.port_bandwidth_Bps if hops else float("inf")
    return 0.0, float("inf")


def fabric_costs(spec: FabricSpec) -> FabricCosts:
    """``Fabric(spec).fabric_costs()``, without the fabric's per-device arrays (block placement)."""
    if spec.placement != "block":
        return Fabric(spec).fabric_costs()
    intra = inter = None
    if spec.devices_per_node > 1:
        peer = spec.peer_link
        assert peer is not None
        intra = _hop(peer.per_message_overhead_s, peer.latency_s, peer.port_bandwidth_Bps, spec.loggp)
    if spec.nodes > 1:
        net, host = spec.network, spec.host_link
        assert net is not None
        core_latency, core_capacity = _core(spec, net)
        latency = net.latency_s + core_latency + (host.latency_s if host else 0.0)
        bottleneck = min(net.port_bandwidth_Bps, core_capacity, host.port_bandwidth_Bps if host else float("inf"))
        inter = _hop(net.per_message_overhead_s, latency, bottleneck, spec.loggp)
    intra = intra or inter or HopCost(0.0, float("inf"))
    return FabricCosts(intra, inter or intra, spec.devices_per_node)


class ClosedFormCosts:
    """The ``TrainingCosts`` of one scenario point (``algorithms.training_algorithm``)."""

    def __init__(self, scenario: Scenario, algorithm: TrainingAlgorithm, fabric_nodes: int) -> None:
        self.worker = SimTrainer(scenario, layer_times(scenario), algorithm.momentum)
        self.step: StepProfile = self.worker.profile
        self.devices_per_node = scenario.devices_per_node
        self.fabric = fabric_costs(scenario.fabric_spec(fabric_nodes))

    def collective_s(
        self, collective: str, algorithm: str, ranks: int, nbytes: float, options: dict[str, Any]
    ) -> float:
        token, chosen = resolve(algorithm, collective, nbytes, ranks, self.devices_per_node)
        impl = COLLECTIVE_ALGORITHMS.get(token)
        return impl.closed_form_s(collective, ranks, nbytes, self.fabric, **{**chosen, **options})
