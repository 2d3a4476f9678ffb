"""Uncontended costs of messages and collectives over groups of a run's ranks, without building the fabric.

``fabric_costs(spec)`` gives the hop costs of a fabric (``algorithms.schedule.FabricCosts``: an
intra-node pair and an inter-node pair) from its links' datasheets, by the same arithmetic as
``Fabric.path_properties`` (overhead + summed link latency + receive overhead under LogGP; the
bottleneck of the route's capacities), so its cost does not grow with the node count: a million
nodes cost what two do. Block placement is computed directly; a scattered placement builds the
fabric (tests hold the two to each other on every topology).

``GroupCosts`` times a collective over any group of ranks (a tensor-parallel group inside a node, a
data-parallel group across nodes) with the collective's closed form on the group's hops, laid out
over nodes as the event simulation lays it out (``RoleExecutor._devices_per_node``), and a message
between two ranks. Both the closed-form executor and the simulated trainers of large-model layouts
(whose tensor-parallel collectives run inside their compute) use it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, options_key, resolve
from ddlsim.algorithms.schedule import FabricCosts, HopCost
from ddlsim.algorithms.selectors import launch_s
from ddlsim.hardware_models.catalog import Link
from ddlsim.simulator.engine.fabric_spec import (
    SWITCH_HOP_LATENCY_S,
    FabricSpec,
    call_overhead_s,
    peer_crosses_sockets,
    torus_shape,
)


def _hop(overhead_s: float, latency_s: float, bottleneck_Bps: float, loggp: bool) -> HopCost:
    return HopCost(overhead_s * (2 if loggp else 1) + latency_s, bottleneck_Bps)


def _core(spec: FabricSpec, net: Link) -> tuple[float, float]:
    """(latency, narrowest capacity) of the core links between node 0 and the last node."""
    if spec.topology == "fat_tree":
        if spec.nodes <= spec.nodes_per_leaf:
            return 0.0, float("inf")
        return 2 * SWITCH_HOP_LATENCY_S, spec.leaf_uplink_Bps()
    if spec.topology in ("torus_2d", "torus_3d"):
        shape = _torus_shape(spec)
        # node 0 to the last node: one hop per dimension of extent >= 2 (the wrap-around way; a partly
        # filled torus, whose last node sits elsewhere, takes the fabric's own route: fabric_costs)
        hops = sum(1 for extent in shape if extent >= 2)
        return hops * SWITCH_HOP_LATENCY_S, spec.nics_per_node * net.port_bandwidth_Bps if hops else float("inf")
    return 0.0, float("inf")


def _torus_shape(spec: FabricSpec) -> tuple[int, ...]:
    return torus_shape(spec.nodes, 2 if spec.topology == "torus_2d" else 3, spec.torus_dims)


def _partial_torus(spec: FabricSpec) -> bool:
    if spec.topology not in ("torus_2d", "torus_3d") or spec.nodes < 2:
        return False
    return math.prod(_torus_shape(spec)) != spec.nodes


def fabric_costs(spec: FabricSpec) -> FabricCosts:
    """``Fabric(spec).fabric_costs()``, without the fabric's per-device arrays (block placement)."""
    if spec.placement != "block" or _partial_torus(spec) or spec.topology == "dragonfly":
        # a partial torus: its route's latencies summed as the fabric does; a dragonfly: its minimal
        # route between node 0 and the last node, as the fabric takes it
        from ddlsim.simulator.engine.fabric import Fabric  # numpy's links: only these fabrics build them

        return Fabric(spec).fabric_costs()
    intra = inter = None
    # the slowest pairs, as Fabric.fabric_costs takes them: from the node's last device, on the last
    # socket, which crosses a socket link to reach another socket's device or NIC 0's socket
    socket = spec.socket_link if spec.sockets > 1 else None
    socket_latency = socket.latency_s if socket is not None else 0.0
    socket_Bps = socket.port_bandwidth_Bps if socket is not None else float("inf")
    if spec.devices_per_node > 1:
        peer = spec.peer_link
        assert peer is not None
        crosses = peer_crosses_sockets(spec)
        bottleneck = min(peer.port_bandwidth_Bps, socket_Bps if crosses else float("inf"))
        latency = peer.latency_s + (socket_latency if crosses else 0.0)
        intra = _hop(peer.per_message_overhead_s, latency, bottleneck, spec.loggp)
    if spec.nodes > 1:
        net, host = spec.network, spec.host_link
        assert net is not None
        core_latency, core_capacity = _core(spec, net)
        # the sender, the node's last device, reaches its NIC across sockets unless that NIC is on its
        # own socket; the receiver, device 0, shares socket 0 with NIC 0
        last = spec.devices_per_node - 1
        crosses = socket is not None and spec.nic_socket(spec.device_nic(last)) != spec.device_socket(last)
        latency = net.latency_s + (host.latency_s if host else 0.0)
        latency += socket_latency if crosses else 0.0
        bottleneck = min(
            net.port_bandwidth_Bps,
            host.port_bandwidth_Bps if host else float("inf"),
            socket_Bps if crosses else float("inf"),
        )
        inter = _hop(net.per_message_overhead_s, latency + core_latency, min(bottleneck, core_capacity), spec.loggp)
        if spec.topology == "fat_tree" and spec.nodes > spec.nodes_per_leaf:
            # between two nodes of one leaf: the same path without the leaves' uplinks (fat_tree's core)
            leaf = _hop(net.per_message_overhead_s, latency, bottleneck, spec.loggp)
            return FabricCosts(intra or inter, inter, spec.devices_per_node, spec.nics_per_node,
                               leaf if spec.nodes_per_leaf > 1 else None, spec.nodes_per_leaf, core_capacity)
    intra = intra or inter or HopCost(0.0, float("inf"))
    return FabricCosts(intra, inter or intra, spec.devices_per_node, spec.nics_per_node)


class GroupCosts:
    """Closed-form seconds of collectives and messages between the ranks of a run placed in blocks of
    ``devices_per_node`` (rank r on node r // devices_per_node)."""

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self.fabric = fabric_costs(spec)
        self.devices_per_node = spec.devices_per_node
        self._layouts: dict[tuple[int, ...], int] = {}
        self._nics: dict[tuple[int, ...], int] = {}
        self._seconds: dict[tuple, float] = {}  # the same tensor's collective over the same group, asked again

    def group_layout(self, group: tuple[int, ...] | None, ranks: int) -> int:
        """Members per node of ``group`` if it fills nodes in equal consecutive blocks, else 1 (as the
        event simulation lays a group's schedule out); the run's devices per node without a group.
        Remembered per group: a layout's closed form asks for the same few groups thousands of times."""
        if group is None:
            return self.devices_per_node
        per = self._layouts.get(group)
        if per is None:
            nodes = [rank // self.devices_per_node for rank in group]
            counts = Counter(nodes)
            per = counts[min(nodes)]
            in_order = all(a <= b for a, b in itertools.pairwise(nodes))
            per = per if in_order and all(count == per for count in counts.values()) else 1
            self._layouts[group] = per
        return per

    def group_nics(self, group: tuple[int, ...] | None, per_node: int) -> int:
        """The distinct NICs the members of ``group`` on its first node attach to (all the node's NICs
        without a group; 1 for a group of one member per node, whose ring crosses through one NIC)."""
        spec = self.spec
        if group is None or per_node == 1 or spec.placement != "block":
            return spec.nics_per_node if group is None and spec.placement == "block" else 1
        nics = self._nics.get(group)
        if nics is None:  # remembered per group, as its layout is: the same groups are asked again
            per = self.devices_per_node
            node = min(group) // per
            nics = self._nics[group] = len({spec.device_nic(rank % per) for rank in group if rank // per == node})
        return nics

    def group_fabric(
        self, group: tuple[int, ...] | None, ranks: int, per_node: int, nics: int, beside: int = 1
    ) -> FabricCosts:
        """The hops a group's closed form reads: the run's, laid out as the group is (``per_node``
        members a node, through ``nics`` NICs), with a fat tree's leaves where the group's nodes
        fill them from a leaf's first node on.

        ``beside``: alike groups on the same nodes that run the same collective at the same time (a
        layout's data-parallel groups, one a tensor rank of a stage; at most as many as the node
        holds): the groups' ``nics`` NICs each, spread over the node's, carry ceil(groups x nics /
        node's NICs) of them (a NIC's rate divided among them), and the leaves' uplinks carry all."""
        fabric = self.fabric
        beside = max(min(beside, self.devices_per_node // max(per_node, 1)), 1)
        per_nic = -(-beside * nics // max(self.spec.nics_per_node, 1))
        intra, inter, leaf = fabric.intra, fabric.inter, fabric.leaf
        if per_nic > 1:
            inter = HopCost(inter.alpha_s, inter.beta_Bps / per_nic)
            leaf = HopCost(leaf.alpha_s, leaf.beta_Bps / per_nic) if leaf is not None else None
        leaf_nodes = fabric.nodes_per_leaf
        if leaf_nodes and group is not None:
            first = min(group) // self.devices_per_node
            span = -(-ranks // per_node)
            nodes = {rank // self.devices_per_node for rank in group}
            if first % leaf_nodes or len(nodes) != span or max(nodes) - first != span - 1:
                leaf_nodes = 0  # nodes not in leaf-aligned consecutive blocks: one level, as before
        if not leaf_nodes:
            return FabricCosts(intra, inter, per_node, nics)
        return FabricCosts(intra, inter, per_node, nics, leaf, leaf_nodes, fabric.uplink_Bps / beside)

    def collective_s(
        self,
        collective: str,
        algorithm: str,
        ranks: int,
        nbytes: float,
        options: dict[str, Any],
        group: tuple[int, ...] | None = None,
        beside: int = 1,
    ) -> float:
        """Closed-form seconds of ``collective`` over ``group`` (the first ``ranks`` ranks without
        one), with ``beside`` alike groups on its nodes at the same time (``group_fabric``)."""
        key = (collective, algorithm, ranks, nbytes, group, options_key(options), beside)
        seconds = self._seconds.get(key)
        if seconds is None:
            per_node = self.group_layout(group, ranks)
            nics = self.group_nics(group, per_node)
            token, chosen = resolve(algorithm, collective, nbytes, ranks, per_node, nics)
            costs = self.group_fabric(group, ranks, per_node, nics, beside)
            impl = COLLECTIVE_ALGORITHMS.get(token)
            seconds = impl.closed_form_s(collective, ranks, nbytes, costs, **{**chosen, **options})
            # a library call's launch, and a calibrated fixed cost per call, before its first transfer
            seconds += launch_s(algorithm, ranks) + call_overhead_s(self.spec, ranks, per_node)
            self._seconds[key] = seconds
        return seconds

    def message_s(self, src: int, dst: int, nbytes: float, block: int = 1) -> float:
        """One message between two ranks, one of ``block`` alike that consecutive ranks send at once,
        each to its counterpart (a pipeline stage's ranks to the next stage's). Between nodes the
        block's ranks on a node share its NICs (ceil(min(block, d) / NICs) a NIC), and between a
        fat tree's leaves the block's ranks under a leaf share its uplink."""
        d, fabric = self.devices_per_node, self.fabric
        if src // d == dst // d:
            return fabric.intra.time(nbytes)
        per_nic = -(-min(block, d) // max(self.spec.nics_per_node, 1))
        per_leaf = fabric.ranks_per_leaf
        between_leaves = bool(per_leaf) and src // per_leaf != dst // per_leaf
        hop = fabric.inter if between_leaves or not per_leaf else fabric.near
        seconds = hop.alpha_s + per_nic * nbytes / hop.beta_Bps
        if between_leaves:
            seconds = max(seconds, fabric.inter.alpha_s + min(block, per_leaf) * nbytes / fabric.uplink_Bps)
        return seconds
