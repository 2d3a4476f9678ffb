"""The modeled fabric: directed links (full duplex = two links) and vectorised routes.

::

    node n                                      switch / fat tree / torus
    +--------------------------------+
    | dev0 --peer--+                 |
    | dev1 --peer--+ (NVLink/PCIe    |
    |  ...         |  switch, star)  |
    | dev0 --host--+--> NIC j ===nic_up/nic_down===> core links ===> NIC of node m
    +--------------------------------+

* Inside a node devices meet in a star: each device has a ``peer`` port (up and down) on the
  intra-node link. GPUs reach the NIC over their ``host`` link (PCIe); when the intra-node link is
  PCIe itself, peer and host ports are the same links, so NIC traffic and peer traffic contend.
* Between nodes a transfer goes host up, NIC up, core links, NIC down, host down.
* ``sockets`` > 1 splits a node's devices into that many equal consecutive groups, one per CPU
  socket; a device's traffic to and from a NIC on another socket also crosses the ``socket_link``
  (one link per ordered pair of sockets; NIC j of the node's ``nics_per_node`` sits on socket
  j * sockets // nics_per_node), and so does traffic between devices on different sockets when the
  intra-node link is PCIe (``peer_crosses_sockets``; NVLink joins the devices directly).
* Topologies: ``switch`` (one non-blocking switch), ``fat_tree`` (two levels; each leaf has one
  aggregated uplink of nodes_per_leaf x NIC bandwidth / oversubscription), ``torus_2d`` and
  ``torus_3d`` (dimension-order routing along the shorter way round, one link per direction), and
  ``dragonfly`` (Kim, Dally, Scott and Abts, ISCA 2008; Cray XC's Aries, HPE Slingshot):
  ``nodes_per_router`` nodes on a router, ``routers_per_group`` routers joined all to all by local
  links, every pair of groups joined by global links (``dragonfly_global_links`` per pair, bundled
  into one link each way), each link the network's port bandwidth; minimal routing: local hop to
  the router that holds the global link to the destination group, the global link, local hop to
  the destination router (``_dragonfly``).

Every transfer's uncontended cost is ``overhead + sum(latencies) + bytes / min(capacities)``;
the same arithmetic gives the closed forms' hop costs, so DES and closed form agree exactly.
Two effects only the executors apply (the closed forms assume they are absent): the receiver's
reduction time ``bytes / reduce_Bps`` of REDUCE transfers (``FabricSpec.reduce_Bps``, default
inf), and, built into the links by ``simulator.collective_sim.CollectiveSetup``, the stretch of a
CPU-driven transport when a host runs more ranks than it has cores.

What the fabric is made of (``FabricSpec``, topologies, torus extents) is in
``simulator.engine.fabric_spec``, which the closed form reads without building links or importing numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ddlsim.algorithms.schedule import REDUCE, FabricCosts, HopCost
from ddlsim.simulator.engine.fabric_spec import (
    SWITCH_HOP_LATENCY_S,
    FabricError,
    FabricSpec,
    peer_crosses_sockets,
    torus_positions,
    torus_shape,
)


@dataclass(frozen=True)
class TorusRound:
    """A batch of transfers that leave their nodes and make the same hops in each torus dimension,
    routed as arcs rather than link by link (``Fabric.torus_round``).

    Transfer i crosses the links ``edges[i]`` (NIC and host links), and in each dimension d with
    ``hops[d]`` > 0 the ``hops[d]`` consecutive links of that dimension from node ``starts[d][i]``,
    in direction + where ``plus[d][i]`` (link (node, d, 0) leads to the next coordinate), else -.
    """

    edges: np.ndarray
    hops: tuple[int, ...]
    starts: list[np.ndarray]
    plus: list[np.ndarray]
    alpha_s: np.ndarray
    bottleneck_Bps: np.ndarray


@dataclass(frozen=True)
class PathCosts:
    """What ``Fabric.path_costs`` gives per transfer: routes (padded with -1), alpha (overheads and
    latency), the slowest link, and the link latencies summed one by one along the route (None where
    a uniform torus's were counted instead: equal up to rounding, not to the bit)."""

    routes: np.ndarray
    alpha_s: np.ndarray
    bottleneck_Bps: np.ndarray
    latency_s: np.ndarray | None


class Fabric:
    """Directed links as arrays; ``route`` and ``cost`` work on arrays of (src, dst) device ranks."""

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self.devices = spec.nodes * spec.devices_per_node
        capacity: list[np.ndarray] = []
        latency: list[np.ndarray] = []
        self._blocks: list[tuple[int, str]] = []  # (first link id, label) of each block, for names
        self._next = 0

        def block(count: int, cap: float, lat: float, label: str) -> np.ndarray:
            start = self._next
            capacity.append(np.full(count, cap, dtype=np.float64))
            latency.append(np.full(count, lat, dtype=np.float64))
            self._blocks.append((start, label))
            self._next += count
            return np.arange(start, start + count)

        d = self.devices
        self.host_up = self.host_down = None
        if spec.host_link is not None:
            host = spec.host_link
            self.host_up = block(d, host.port_bandwidth_Bps, host.latency_s / 2, "host_up")
            self.host_down = block(d, host.port_bandwidth_Bps, host.latency_s / 2, "host_down")
        self.peer_up = self.peer_down = None
        if spec.peer_link is not None:
            peer = spec.peer_link
            if spec.host_link is not None and peer.token == spec.host_link.token:
                self.peer_up, self.peer_down = self.host_up, self.host_down
            else:
                self.peer_up = block(d, peer.port_bandwidth_Bps, peer.latency_s / 2, "peer_up")
                self.peer_down = block(d, peer.port_bandwidth_Bps, peer.latency_s / 2, "peer_down")
        self.socket_links = None  # id of (node, from socket, to socket); the diagonal is never used
        if spec.sockets > 1:
            assert spec.socket_link is not None
            link, count = spec.socket_link, spec.nodes * spec.sockets * spec.sockets
            self.socket_links = block(count, link.port_bandwidth_Bps, link.latency_s, "socket")
        self.nic_up = self.nic_down = None
        self.core_hops = 0
        if spec.network is not None and spec.nodes > 1:
            net = spec.network
            nics = spec.nodes * spec.nics_per_node
            self.nic_up = block(nics, net.port_bandwidth_Bps, net.latency_s / 2, "nic_up")
            self.nic_down = block(nics, net.port_bandwidth_Bps, net.latency_s / 2, "nic_down")
            if spec.topology == "fat_tree":
                leaves = -(-spec.nodes // spec.nodes_per_leaf)
                uplink = spec.leaf_uplink_Bps()
                self.leaf_up = block(leaves, uplink, SWITCH_HOP_LATENCY_S, "leaf_up")
                self.leaf_down = block(leaves, uplink, SWITCH_HOP_LATENCY_S, "leaf_down")
                self.core_hops = 2
            elif spec.topology == "dragonfly":
                routers = -(-spec.nodes // spec.nodes_per_router)
                self.dragonfly_groups = groups = -(-routers // spec.routers_per_group)
                a = spec.routers_per_group
                port = spec.nics_per_node * net.port_bandwidth_Bps
                # local link id of (group, from router, to router), both in the group; global link
                # id of (from group, to group); the diagonals are never used
                self.local_links = block(groups * a * a, port, SWITCH_HOP_LATENCY_S, "local")
                self.global_links = block(
                    groups * groups, spec.dragonfly_global_links * port, SWITCH_HOP_LATENCY_S, "global"
                )
                self.core_hops = 3
            elif spec.topology in ("torus_2d", "torus_3d"):
                dimensions = 2 if spec.topology == "torus_2d" else 3
                self.shape = torus_shape(spec.nodes, dimensions, spec.torus_dims)
                # link id of (position, dim, direction): direction 0 = +1, 1 = -1; a partly filled torus
                # has links at its empty positions too
                self.torus_links = count = torus_positions(self.shape) * dimensions * 2
                self.torus_base = block(
                    count, spec.nics_per_node * net.port_bandwidth_Bps, SWITCH_HOP_LATENCY_S, "torus"
                )[0]
                self.core_hops = sum(extent // 2 for extent in self.shape)
        self.device_of_rank = self._placement()
        self.capacity_Bps = np.concatenate(capacity) if capacity else np.empty(0)
        self.latency_s = np.concatenate(latency) if latency else np.empty(0)
        self.max_hops = 4 + self.core_hops + (2 if self.socket_links is not None else 0)
        self.redundant = self._redundant_links()

    def link_name(self, link: int) -> str:
        """``label[i]`` of link id ``link`` (e.g. ``nic_up[3]``), for messages and traces."""
        starts = [start for start, _ in self._blocks]
        index = int(np.searchsorted(starts, link, side="right")) - 1
        start, label = self._blocks[index]
        return f"{label}[{link - start}]"

    @property
    def link_names(self) -> list[str]:
        """Every link's name, built on demand (a million-device fabric would otherwise pay for it)."""
        return [self.link_name(link) for link in range(self.capacity_Bps.size)]

    def _redundant_links(self) -> np.ndarray:
        """Links whose capacity constraint is implied by others, so they can never bind (bool per link).

        A fat-tree leaf uplink carries only flows that leave through a NIC uplink under that leaf, so
        its load is at most the sum of those NICs' capacities; when its own capacity is at least that
        sum (oversubscription 1, the default) its constraint ``load <= capacity`` follows from the NIC
        constraints (a cut argument). Dropping an implied constraint leaves the set of feasible rate
        vectors unchanged, hence the max-min fair allocation, each flow's bottleneck rate and every
        finish time too; and two flows can then never contend on that link, so the executors may leave
        it out of their overlap checks and rate computations. The same holds for the downlinks.
        """
        redundant = np.zeros(self.capacity_Bps.size, dtype=bool)
        spec = self.spec
        if spec.topology == "fat_tree" and self.nic_up is not None:
            nics_under = (
                np.bincount(np.arange(spec.nodes) // spec.nodes_per_leaf, minlength=self.leaf_up.size)
                * spec.nics_per_node
            )
            nic_Bps = self.capacity_Bps[self.nic_up[0]]
            implied = self.capacity_Bps[self.leaf_up] >= nics_under * nic_Bps
            redundant[self.leaf_up[implied]] = True
            redundant[self.leaf_down[implied]] = True
        return redundant

    # --- placement -------------------------------------------------------------------------------
    def _placement(self) -> np.ndarray | None:
        """Device of each rank; None for block placement (the identity)."""
        spec = self.spec
        if spec.placement == "block":
            return None
        rank = np.arange(self.devices)
        k, local = rank % spec.nodes, rank // spec.nodes
        node = k
        if spec.topology == "fat_tree" and spec.nodes % spec.nodes_per_leaf == 0:
            leaves = spec.nodes // spec.nodes_per_leaf
            node = (k % leaves) * spec.nodes_per_leaf + k // leaves
        return node * spec.devices_per_node + local

    def devices_of(self, ranks: np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.size and (ranks.max() >= self.devices or ranks.min() < 0):
            raise FabricError(f"a transfer names a rank outside the fabric's {self.devices} devices")
        return ranks if self.device_of_rank is None else self.device_of_rank[ranks]

    def _rank_of(self, device: int) -> int:
        """The rank placed on ``device``."""
        if self.device_of_rank is None:
            return device
        return int(np.flatnonzero(self.device_of_rank == device)[0])

    def node_of(self, device: np.ndarray) -> np.ndarray:
        return device // self.spec.devices_per_node

    def nic_of(self, device: np.ndarray) -> np.ndarray:
        spec = self.spec
        return self.node_of(device) * spec.nics_per_node + spec.device_nic(device % spec.devices_per_node)

    # --- routing ---------------------------------------------------------------------------------
    def routes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Link ids of each transfer's path between ranks, shape (transfers, hops), padded with -1.

        ``hops`` is the longest path among these transfers (at most ``max_hops``), so a batch of
        neighbour transfers on a large torus costs a few columns, not the torus diameter.
        """
        return self._route_table(src, dst)[0]

    def _route_table(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
        """(``routes``, the first column of the torus links, each transfer's torus hops): the hops
        only where every transfer leaves its node on a torus and the nodes have one socket (else None)."""
        src = self.devices_of(src)
        dst = self.devices_of(dst)
        routes, first, hops = self._device_routes(src, dst)
        if self.socket_links is None:
            return routes, first, hops
        return self._cross_sockets(routes, src, dst), first + 1, None

    def _socket_link(self, node: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The link from socket ``a`` to socket ``b`` of ``node``, -1 where a == b."""
        assert self.socket_links is not None
        sockets = self.spec.sockets
        return np.where(a != b, self.socket_links[0] + (node * sockets + a) * sockets + b, -1)

    def _cross_sockets(self, routes: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """``routes`` with two more columns: the socket link a transfer crosses on its way out (between
        the two sockets of an intra-node pair, or from the sender's socket to its NIC's) and on its
        way in (from the receiver's NIC's socket to the receiver's), -1 where it stays on one socket."""
        spec = self.spec
        count, width = routes.shape
        node_s, node_d = self.node_of(src), self.node_of(dst)
        local_s, local_d = src % spec.devices_per_node, dst % spec.devices_per_node
        sock_s, sock_d = spec.device_socket(local_s), spec.device_socket(local_d)
        same = node_s == node_d
        nic_socket_s = spec.nic_socket(spec.device_nic(local_s))
        nic_socket_d = spec.nic_socket(spec.device_nic(local_d))
        out = np.full((count, width + 2), -1, dtype=np.int64)
        rows = np.flatnonzero(same)
        if rows.size:  # peer up, socket link (peer traffic over PCIe only), peer down
            out[rows, 0] = routes[rows, 0]
            if peer_crosses_sockets(spec):
                out[rows, 1] = self._socket_link(node_s[rows], sock_s[rows], sock_d[rows])
            out[rows, 2] = routes[rows, 1]
        rows = np.flatnonzero(~same)
        if rows.size:  # [host up], socket link out, NIC up ... NIC down, socket link in, [host down]
            h = 1 if self.host_up is not None else 0
            inner = routes[rows]
            out[rows, :h] = inner[:, :h]
            out[rows, h] = self._socket_link(node_s[rows], sock_s[rows], nic_socket_s[rows])
            out[rows, h + 1 : width + 1 - h] = inner[:, h : width - h]
            out[rows, width + 1 - h] = self._socket_link(node_d[rows], nic_socket_d[rows], sock_d[rows])
            out[rows, width + 2 - h :] = inner[:, width - h :]
        return out

    def _device_routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
        """``_route_table`` between device ids, sockets left out."""
        same = self.node_of(src) == self.node_of(dst)
        cross = np.flatnonzero(~same)
        core = np.empty((0, 0), dtype=np.int64)
        hops = None
        if cross.size:
            assert self.nic_up is not None and self.nic_down is not None
            core, hops = self._core(self.node_of(src[cross]), self.node_of(dst[cross]))
        host = self.host_up is not None
        width = 2 if not cross.size else 2 + 2 * host + core.shape[1]
        if cross.size == src.size:  # every transfer leaves its node: whole columns, no row lists
            out, first = self._leaving_routes(src, dst, core)
            return out, first, hops
        out = np.full((src.size, width), -1, dtype=np.int64)
        if cross.size < src.size:
            assert self.peer_up is not None and self.peer_down is not None
            rows = np.flatnonzero(same)
            out[rows, 0] = self.peer_up[src[rows]]
            out[rows, 1] = self.peer_down[dst[rows]]
        if cross.size:
            assert self.nic_up is not None and self.nic_down is not None
            s, t = src[cross], dst[cross]
            column = 0
            if host:
                assert self.host_up is not None
                out[cross, 0] = self.host_up[s]
                column = 1
            out[cross, column] = self.nic_up[self.nic_of(s)]
            column += 1
            out[cross, column : column + core.shape[1]] = core
            column += core.shape[1]
            out[cross, column] = self.nic_down[self.nic_of(t)]
            if host:
                assert self.host_down is not None
                out[cross, column + 1] = self.host_down[t]
        return out, 0, None

    def _leaving_routes(self, src: np.ndarray, dst: np.ndarray, core: np.ndarray) -> tuple[np.ndarray, int]:
        """(routes, first core column) of transfers that all leave their nodes: [host up], NIC up,
        ``core`` (links between the NICs, one row per transfer), NIC down, [host down]."""
        assert self.nic_up is not None and self.nic_down is not None
        host = self.host_up is not None
        out = np.empty((src.size, 2 + 2 * host + core.shape[1]), dtype=np.int64)
        column = 0
        if host:
            assert self.host_up is not None
            out[:, 0] = self.host_up[src]
            column = 1
        out[:, column] = self.nic_up[self.nic_of(src)]
        out[:, column + 1 : column + 1 + core.shape[1]] = core
        out[:, column + 1 + core.shape[1]] = self.nic_down[self.nic_of(dst)]
        if host:
            assert self.host_down is not None
            out[:, -1] = self.host_down[dst]
        return out, column + 1

    def _core(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Links between the NICs of nodes a[i] and b[i] (a != b), padded with -1, and on a torus
        each transfer's number of torus hops (None elsewhere)."""
        spec = self.spec
        if spec.topology == "fat_tree":
            la, lb = a // spec.nodes_per_leaf, b // spec.nodes_per_leaf
            far = la != lb
            # transfers that stay under one leaf keep -1 (padding) in these two columns
            columns = [np.where(far, self.leaf_up[la], -1), np.where(far, self.leaf_down[lb], -1)]
            return np.stack(columns, axis=1), None
        if spec.topology in ("torus_2d", "torus_3d"):
            return self._torus(a, b)
        if spec.topology == "dragonfly":
            return self._dragonfly(a, b), None
        return np.empty((a.size, 0), dtype=np.int64), None

    def _dragonfly(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Minimal dragonfly routes between the NICs of nodes a[i] and b[i]: (local hop, global link,
        local hop), -1 where a hop is not taken. Group g's global link to group h sits on router
        (h - g - 1) mod G mod routers_per_group of g (the links of a group spread over its routers in
        turn), so the route leaves the source group from there and enters the destination group at
        the router that holds the link back."""
        spec = self.spec
        routers, groups = spec.routers_per_group, self.dragonfly_groups
        ra, rb = a // spec.nodes_per_router, b // spec.nodes_per_router
        ga, gb = ra // routers, rb // routers
        exit_router = ga * routers + (gb - ga - 1) % groups % routers
        entry_router = gb * routers + (ga - gb - 1) % groups % routers
        same_group = ga == gb
        out_from, out_to = ra, np.where(same_group, rb, exit_router)
        in_from, in_to = entry_router, rb

        def local(group: np.ndarray, start: np.ndarray, end: np.ndarray, used: np.ndarray) -> np.ndarray:
            link = self.local_links[0] + (group * routers + start % routers) * routers + end % routers
            return np.where(used & (start != end), link, -1)

        columns = [
            local(ga, out_from, out_to, np.ones_like(same_group)),
            np.where(same_group, -1, self.global_links[0] + ga * groups + gb),
            local(gb, in_from, in_to, ~same_group),
        ]
        return np.stack(columns, axis=1)

    def _torus(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dimension-order routes, the shorter way round in each dimension (ties go +).

        Link id of (node, dim, direction) is torus_base + (node * dims + dim) * 2 + direction
        (direction 0 = +1, 1 = -1). In dimension d the route walks from the node that already has
        b's coordinates in the dimensions before d and a's from d on. Coordinates are computed once
        per transfer; per hop only an add, a modulo and a multiply-add remain.
        """
        shape = self.shape
        dims = len(shape)
        coord_a, hops, plus, strides, starts_at = self._torus_walk(a, b)
        total = np.sum(hops, axis=0)
        width = int(total.max()) if a.size else 0
        if a.size and all(count.min() == count.max() for count in hops):
            return self._torus_alike(coord_a, hops, plus, strides, starts_at, width), total
        out = np.full(a.size * width, -1, dtype=np.int64)  # flat (transfer, hop) matrix
        done = np.arange(a.size, dtype=np.int64) * width  # where each transfer's next hop goes
        for d, extent in enumerate(shape):
            count = hops[d]
            rows = np.flatnonzero(count)
            if rows.size:
                n = count[rows]
                index = np.arange(int(n.sum()), dtype=np.int64)  # hop k of row i is entry starts[i] + k
                starts = np.cumsum(n) - n
                sign = np.where(plus[d][rows], 1, -1)
                base = starts_at[d][rows] - coord_a[d][rows] * strides[d]  # the node with coordinate 0 here
                # per row: the link id at coordinate 0, the coordinate of hop 0 relative to the entry index
                first = self.torus_base + 2 * d + np.where(plus[d][rows], 0, 1) + 2 * dims * base
                coordinate = np.repeat(sign, n) * index
                coordinate += np.repeat(coord_a[d][rows] - sign * starts, n)
                coordinate %= extent
                coordinate *= 2 * dims * strides[d]
                coordinate += np.repeat(first, n)
                index += np.repeat(done[rows] - starts, n)
                out[index] = coordinate
                done += count
        return out.reshape(a.size, width), total

    def _torus_walk(self, a: np.ndarray, b: np.ndarray):
        """(coordinates of a, hops and whether they go + per dimension, strides, and per dimension
        the node the route leaves from there: b's coordinates before that dimension, a's from it on)
        of dimension-order routes from node a[i] to node b[i], the shorter way round (ties go +)."""
        shape = self.shape
        dims = len(shape)
        strides = [math.prod(shape[i + 1 :]) for i in range(dims)]
        coord_a = [(a // strides[d]) % shape[d] for d in range(dims)]
        coord_b = [(b // strides[d]) % shape[d] for d in range(dims)]
        hops, plus = [], []
        for d, extent in enumerate(shape):
            forward = (coord_b[d] - coord_a[d]) % extent
            go_plus = forward <= extent - forward
            hops.append(np.where(go_plus, forward, extent - forward))
            plus.append(go_plus)
        starts_at, current = [], a
        for d in range(dims):
            starts_at.append(current)
            current = current + (coord_b[d] - coord_a[d]) * strides[d]
        return coord_a, hops, plus, strides, starts_at

    def torus_round(self, src: np.ndarray, dst: np.ndarray) -> TorusRound | None:
        """The routes of a batch of transfers (ranks) as arcs, without a link per hop, where every
        transfer leaves its node and makes the same number of hops in each torus dimension (a round
        of recursive doubling), the torus links are all alike and nodes have one socket; else None.

        Costs are ``path_properties``' to the bit: counted where it counts (a batch with at least
        as many hops as torus links), else from the routes (a small batch: cheap to build).
        """
        spec = self.spec
        if spec.topology not in ("torus_2d", "torus_3d") or self.nic_up is None or self.socket_links is not None:
            return None
        uniform = self._uniform_torus()
        devices_s, devices_d = self.devices_of(src), self.devices_of(dst)
        a, b = self.node_of(devices_s), self.node_of(devices_d)
        if uniform is None or not src.size or np.any(a == b):
            return None
        _, hops, plus, _, starts = self._torus_walk(a, b)
        if any(count.min() != count.max() for count in hops):
            return None
        counts = tuple(int(count[0]) for count in hops)
        edges, _ = self._leaving_routes(devices_s, devices_d, np.empty((src.size, 0), dtype=np.int64))
        if src.size * (edges.shape[1] + sum(counts)) >= self.torus_links:
            bottleneck, latency = self._counted_costs(edges, np.full(src.size, sum(counts)), uniform)
            alpha = self._alpha(src, dst, latency)
        else:
            _, alpha, bottleneck = self.path_properties(src, dst)
        return TorusRound(edges, counts, starts, plus, alpha, bottleneck)

    def _torus_alike(self, coord_a, hops, plus, strides, starts_at, width: int) -> np.ndarray:
        """``_torus``'s routes when every transfer makes the same number of hops in each dimension (a
        shift on the torus, as in every round of recursive doubling): column blocks of a
        (transfers, hops) grid, no per-hop index arithmetic."""
        dims = len(self.shape)
        out = np.empty((coord_a[0].size, width), dtype=np.int64)
        column = 0
        for d, extent in enumerate(self.shape):
            n = int(hops[d][0])
            if n:
                base = starts_at[d] - coord_a[d] * strides[d]  # the node with coordinate 0 here
                first = self.torus_base + 2 * d + np.where(plus[d], 0, 1) + 2 * dims * base
                block = np.where(plus[d], 1, -1)[:, None] * np.arange(n, dtype=np.int64)
                block += coord_a[d][:, None]
                block %= extent
                block *= 2 * dims * strides[d]
                block += first[:, None]
                out[:, column : column + n] = block
                column += n
        return out

    # --- costs -----------------------------------------------------------------------------------
    def overheads(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        spec = self.spec
        same = self.node_of(self.devices_of(src)) == self.node_of(self.devices_of(dst))
        intra = spec.peer_link.per_message_overhead_s if spec.peer_link is not None else 0.0
        inter = spec.network.per_message_overhead_s if spec.network is not None else 0.0
        return np.where(same, intra, inter)

    def receive_overheads(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Receiver CPU overhead per message: the send overhead again under LogGP, else none."""
        overhead = self.overheads(src, dst)
        return overhead if self.spec.loggp else np.zeros_like(overhead)

    def reduce_times(self, nbytes: np.ndarray, op) -> np.ndarray | None:
        """Seconds the receiver of each transfer spends reducing it in (bytes / reduce_Bps for
        REDUCE transfers, 0 for COPY); None when reduction is free."""
        if math.isinf(self.spec.reduce_Bps):
            return None
        reduces = np.broadcast_to(np.asarray(op), np.shape(nbytes)) == REDUCE
        return np.where(reduces, nbytes / self.spec.reduce_Bps, 0.0)

    def latencies(self, routes: np.ndarray) -> np.ndarray:
        valid = routes >= 0
        return np.where(valid, self.latency_s[np.where(valid, routes, 0)], 0.0).sum(axis=1)

    def path_properties(self, src: np.ndarray, dst: np.ndarray):
        """(routes, alpha_s, bottleneck_Bps) of each transfer.

        alpha = send overhead + summed link latency + receive overhead (zero unless LogGP).
        """
        costs = self.path_costs(src, dst)
        return costs.routes, costs.alpha_s, costs.bottleneck_Bps

    def path_costs(self, src: np.ndarray, dst: np.ndarray) -> PathCosts:
        """``path_properties`` and the summed link latency it took alpha from: the fluid path's
        ``latency_s`` (``fluid_executor``) to the bit where it was summed link by link, not counted."""
        routes, first, hops = self._route_table(src, dst)
        uniform = None
        # the check reads every torus link once: worth it only for a batch with at least as many hops
        if hops is not None and routes.size >= self.torus_links:
            uniform = self._uniform_torus()
        if uniform is None or hops is None:
            valid = routes >= 0
            bottleneck = np.where(valid, self.capacity_Bps[np.where(valid, routes, 0)], np.inf).min(axis=1)
            latency = self.latencies(routes)
        else:  # torus links all alike: count them rather than look each up (131,072 ranks: 10^8 hops)
            core_width = routes.shape[1] - 2 * first
            edge = np.concatenate([routes[:, :first], routes[:, first + core_width :]], axis=1)
            bottleneck, latency = self._counted_costs(edge, hops, uniform)
            return PathCosts(routes, self._alpha(src, dst, latency), bottleneck, None)
        return PathCosts(routes, self._alpha(src, dst, latency), bottleneck, latency)

    def _alpha(self, src: np.ndarray, dst: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """alpha of transfers whose routes sum to ``latency``: send overhead + latency + receive overhead."""
        return self.overheads(src, dst) + latency + self.receive_overheads(src, dst)

    def _counted_costs(self, edge: np.ndarray, hops: np.ndarray, uniform: tuple[float, float]):
        """(bottleneck, summed latency) of routes made of the links ``edge`` (a row per transfer)
        and ``hops`` torus links of the one ``uniform`` (capacity, latency)."""
        capacity, hop_latency = uniform
        bottleneck = self.capacity_Bps[edge].min(axis=1)
        bottleneck = np.where(hops > 0, np.minimum(bottleneck, capacity), bottleneck)
        return bottleneck, self.latency_s[edge].sum(axis=1) + hops * hop_latency

    def _uniform_torus(self) -> tuple[float, float] | None:
        """(capacity, latency) shared by every torus link, or None where they differ."""
        links = slice(self.torus_base, self.torus_base + self.torus_links)
        capacity, latency = self.capacity_Bps[links], self.latency_s[links]
        if capacity.min() != capacity.max() or latency.min() != latency.max():
            return None
        return float(capacity[0]), float(latency[0])

    def hop_cost(self, src: int, dst: int) -> HopCost:
        _, alpha, beta = self.path_properties(np.array([src]), np.array([dst]))
        return HopCost(float(alpha[0]), float(beta[0]))

    def fabric_costs(self) -> FabricCosts:
        """Hop costs for closed forms: an intra-node pair and an inter-node pair.

        One socket per node: ranks (0, 1) and (0, first device of the last node); exact for the single
        switch, where every inter-node path costs the same. Several sockets: the slowest pairs, from
        the node's last device (on the last socket: a socket link to device 0's socket and to NIC 0's),
        the hop that paces a ring.
        """
        dpn = self.spec.devices_per_node
        # one socket: ranks 0 and 1 (any two devices of a node), rank 0 to the last node's first device
        first, last, sender, receiver = 0, 1, 0, self.devices - dpn
        if self.spec.sockets > 1:  # the same devices named by their ranks, under any placement
            first, receiver = self._rank_of(0), self._rank_of(self.devices - dpn)
            last = sender = self._rank_of(dpn - 1)
        inter = self.hop_cost(sender, receiver) if self.spec.nodes > 1 else None
        intra = self.hop_cost(first, last) if dpn > 1 else None
        intra = intra or inter or HopCost(0.0, math.inf)
        spec = self.spec
        if spec.topology != "fat_tree" or spec.nodes <= spec.nodes_per_leaf:
            return FabricCosts(intra, inter or intra, dpn, spec.nics_per_node)
        # leaves: the same sender to node 1's first device, under its leaf when leaves hold two nodes
        near = self.hop_cost(sender, self._rank_of(dpn) if spec.sockets > 1 else dpn)
        assert inter is not None
        leaf = near if spec.nodes_per_leaf > 1 else None
        return FabricCosts(intra, inter, dpn, spec.nics_per_node, leaf, spec.nodes_per_leaf, spec.leaf_uplink_Bps())
