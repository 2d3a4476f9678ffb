"""What a modeled fabric is made of (``FabricSpec``) and the arithmetic of its shape that needs no
links built: topologies, placements, sockets, torus extents. ``simulator.engine.fabric`` builds the
links and routes from it (numpy); the closed form reads the spec alone and starts without numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ddlsim.hardware_models.catalog import Link

TOPOLOGIES = ("switch", "fat_tree", "torus_2d", "torus_3d", "dragonfly")
PLACEMENTS = ("block", "scatter")
SWITCH_HOP_LATENCY_S = 100e-9  # one switch or router traversal (IB/OPA switch port-to-port ~90-130 ns)

# ALCF's Theta (Cray XC40) as the dragonfly's topology fields, to go with the `aries` network
# (docs/hardware.md, "Theta's dragonfly"). Sources: Alverson et al., "Cray XC Series Network", Cray white
# paper WP-Aries01-1112 (2012), and Theta's cabling as the CODES simulator ships it
# (codes-org/codes, scripts/gen-cray-topo/theta.interconnect, commit 29bd0c1e, 2016: nine groups).
# - 4 nodes a router: one Aries per four-node blade (white paper p. 14);
# - 96 routers a group: 16 blades a chassis, 6 chassis in a two-cabinet group of 384 nodes (p. 14), the
#   16 x 6 routers of every group in Theta's cabling;
# - 19 global links a group pair: the cabling joins every pair of groups by 48 optical links (4 of each
#   Aries' 10 global ports used), each 3 lanes x 12.5 Gb/s = 4.6875 GB/s (p. 21: 18.75 GB/s per four-link
#   cable), at the 64 % payload efficiency of p. 21: 48 x 4.6875 x 0.64 = 144 GB/s each way. The fabric
#   runs every link at the network's port rate (aries: 10.24 x 0.73 = 7.4752 GB/s): 144 / 7.4752 = 19.3.
THETA_DRAGONFLY: dict[str, Any] = {
    "topology": "dragonfly", "nodes_per_router": 4, "routers_per_group": 96, "dragonfly_global_links": 19,
}  # fmt: skip


class FabricError(ValueError):
    """The fabric cannot be built as asked (message says what is allowed)."""


# The FabricSpec fields that describe the topology, as Scenario and CollectiveSetup (and the CLI's
# topology flags) carry them under the same names; the links and node count come from elsewhere.
TOPOLOGY_FIELDS = (
    "nics_per_node", "topology", "oversubscription", "nodes_per_leaf", "torus_dims", "placement", "loggp",
    "sockets", "nodes_per_router", "routers_per_group", "dragonfly_global_links",
)  # fmt: skip


def topology_of(config: Any) -> dict[str, Any]:
    """``config``'s topology fields (``TOPOLOGY_FIELDS``), as FabricSpec keyword arguments."""
    return {field: getattr(config, field) for field in TOPOLOGY_FIELDS}


@dataclass(frozen=True)
class FabricSpec:
    """What the fabric is made of; ``nodes`` x ``devices_per_node`` devices."""

    nodes: int
    devices_per_node: int
    peer_link: Link | None = None
    host_link: Link | None = None
    network: Link | None = None
    nics_per_node: int = 1
    # CPU sockets the node's devices are split over (equal consecutive groups) and the link between
    # two sockets as device traffic sees it (GPU peer traffic across QPI: NCCL's figure, not QPI's)
    sockets: int = 1
    socket_link: Link | None = None
    topology: str = "switch"
    oversubscription: float = 1.0
    nodes_per_leaf: int = 16
    # dragonfly: nodes on one router, routers in one all-to-all group, global links between two groups
    # (Cray XC / Aries: 4 nodes a router, 96 routers a group; a group pair's links vary by system size)
    nodes_per_router: int = 4
    routers_per_group: int = 16
    dragonfly_global_links: int = 1
    torus_dims: tuple[int, ...] | None = None
    # LogGP-style CPU overheads (Alexandrov et al. 1995): the per-message overhead o is paid on the
    # sender's CPU before the message and on the receiver's CPU after it, and a rank's CPU handles
    # one message at a time. Off: o is paid once per message, concurrently for a rank's messages.
    loggp: bool = False
    # How collective ranks map to devices. block: rank r on node r // devices_per_node (what
    # launchers do by default). scatter: consecutive ranks on different nodes, and on a fat tree
    # under different leaves, as a scheduler that ignores topology may place them.
    placement: str = "block"
    # Reduction cost (the gamma of Thakur, Rabenseifner and Gropp 2005, "Optimization of collective
    # communication operations in MPICH", gamma = 1 / reduce_Bps): the receiver of a REDUCE transfer
    # spends bytes / reduce_Bps adding it into its buffer after it arrives. inf = free (the closed
    # forms' assumption, and the default).
    reduce_Bps: float = math.inf

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise FabricError(f"unknown topology {self.topology!r}; valid: {', '.join(TOPOLOGIES)}")
        if self.placement not in PLACEMENTS:
            raise FabricError(f"unknown placement {self.placement!r}; valid: {', '.join(PLACEMENTS)}")
        for name in ("nodes", "devices_per_node", "nics_per_node", "nodes_per_leaf", "sockets", "nodes_per_router",
                     "routers_per_group", "dragonfly_global_links"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise FabricError(f"{name} must be a positive integer, got {value!r}")
        if not self.reduce_Bps > 0:
            raise FabricError(f"reduce_Bps must be > 0 bytes/s (inf = free reduction), got {self.reduce_Bps!r}")
        if not self.oversubscription >= 1.0:
            raise FabricError(f"oversubscription must be >= 1 (1 = full bisection), got {self.oversubscription!r}")
        if self.nics_per_node > self.devices_per_node:
            raise FabricError(
                f"nics_per_node ({self.nics_per_node}) must not exceed devices_per_node ({self.devices_per_node})"
            )
        if self.devices_per_node > 1 and self.peer_link is None:
            raise FabricError("devices_per_node > 1 needs an intra-node link")
        if self.devices_per_node % self.sockets:
            raise FabricError(
                f"{self.devices_per_node} devices per node do not split evenly over {self.sockets} sockets"
            )
        if self.sockets > 1 and self.socket_link is None:
            raise FabricError("sockets > 1 needs a socket link (the link between two sockets)")
        if self.nodes > 1 and self.network is None:
            raise FabricError("more than one node needs a network")

    def device_socket(self, local):
        """The socket of a node's device number ``local`` (an int or an array)."""
        return local // (self.devices_per_node // self.sockets)

    def device_nic(self, local):
        """The NIC of a node that its device number ``local`` uses (an int or an array)."""
        return local * self.nics_per_node // self.devices_per_node

    def nic_socket(self, nic):
        """The socket of a node's NIC number ``nic`` (an int or an array)."""
        return nic * self.sockets // self.nics_per_node

    def leaf_uplink_Bps(self) -> float:
        """A fat tree leaf's uplink rate each way: its nodes' NIC ports over the oversubscription."""
        assert self.network is not None
        return self.nodes_per_leaf * self.nics_per_node * self.network.port_bandwidth_Bps / self.oversubscription


def call_overhead_s(spec: FabricSpec, ranks: int, per_node: int) -> float:
    """The fixed cost of one collective call over ``ranks`` ranks, ``per_node`` of them on each node:
    the calibrated per-call cost (``Link.call_overhead_s``) of the node's link if the group has
    several ranks on a node, plus the network's if it spans nodes. 0 for one rank, and on datasheets."""
    if ranks <= 1:
        return 0.0
    seconds = 0.0
    if per_node > 1 and spec.peer_link is not None:
        seconds += spec.peer_link.call_overhead_s
    if ranks > per_node and spec.network is not None:
        seconds += spec.network.call_overhead_s
    return seconds


def peer_crosses_sockets(spec: FabricSpec) -> bool:
    """Whether traffic between devices on different sockets crosses the socket link: yes over PCIe
    (peer transfers run through the CPUs' root complexes), no over a direct device link (NVLink)."""
    peer = spec.peer_link
    if spec.sockets == 1 or peer is None:
        return False
    return peer.token.startswith("pcie") or (spec.host_link is not None and peer.token == spec.host_link.token)


def torus_shape(nodes: int, dimensions: int, dims: tuple[int, ...] | None) -> tuple[int, ...]:
    """The torus extents: ``dims`` if given (their product must equal ``nodes``), else near-cubic.

    Without ``dims``: the factorisation of ``nodes`` closest to a cube; when ``nodes`` has none that
    is not elongated (a longest extent over twice the cube's side, e.g. 131,073 = 43,691 x 3), the
    smallest near-cubic box that holds them, partly filled: nodes take the first positions in
    row-major order and the empty positions' links still route, as on a machine with empty slots.
    """
    if dims is not None:
        if len(dims) != dimensions or math.prod(dims) != nodes:
            raise FabricError(f"torus dimensions {'x'.join(map(str, dims))} do not hold {nodes} nodes in {dimensions}D")
        return tuple(dims)
    shape: list[int] = []
    remaining = nodes
    for left in range(dimensions, 0, -1):
        target = round(remaining ** (1.0 / left))
        best = max(d for d in range(1, remaining + 1) if remaining % d == 0 and d <= max(target, 1)) or 1
        shape.append(best)
        remaining //= best
    shape.sort(reverse=True)
    side = math.ceil(nodes ** (1.0 / dimensions))
    if shape[0] <= 2 * side:
        return tuple(shape)
    box: list[int] = []
    remaining = nodes
    for left in range(dimensions, 0, -1):
        extent = math.ceil(remaining ** (1.0 / left) - 1e-9)
        box.append(extent)
        remaining = -(-remaining // extent)
    return tuple(sorted(box, reverse=True))


def torus_positions(shape: tuple[int, ...]) -> int:
    """Positions (switches) of a torus of ``shape``, filled or not."""
    return math.prod(shape)
