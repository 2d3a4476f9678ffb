"""Synchronous parameter server as an allreduce: push gradients, servers sum, pull the sum.

The scheme of DistBelief and of Li et al. 2014 ("Scaling distributed machine learning with the
parameter server"), in its synchronous form: the buffer is sharded over k servers (``servers=k``,
shard i = chunk i, S/k bytes); in one round every worker pushes shard i to server i, which adds it
in; in the next every server sends its summed shard back to every worker::

    placement="dedicated" (default)       placement="colocated"
    workers 0..P-1, servers P..P+k-1       servers are workers 0..k-1
    w ---shard i---> P+i                   w ---shard i---> i      (w != i: own shard stays home)
    w <--sum i------ P+i                   w <--sum i------ i

    placement="per_node": one server on each node's first device (worker i x D, D devices per
    node), k = the node count, as distributed TensorFlow deploys one parameter-server task per host;
    ``servers``, if given, must be that count.

With dedicated servers the schedule has P + k ranks and ``worker_ranks = P``: the extra ranks are
relays that contribute nothing. Every server link carries P x S/k bytes in each direction: the
incast, which the DES models with shared bandwidth and the closed form by counting the bytes through
each port (a node's NIC, a device's link) in each round.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, positive_int_option, reject_options
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, HopCost, Round, Schedule, ScheduleError, check_ranks

PLACEMENTS = ("dedicated", "colocated", "per_node")


def _settings(ranks: int, options: dict[str, Any], devices_per_node: int = 1) -> tuple[int, str, int]:
    """(servers, placement, stride): server i is rank i x stride (colocated, per_node) or P + i."""
    placement = options.get("placement", "dedicated")
    if placement not in PLACEMENTS:
        raise ScheduleError(f"parameter_server: unknown placement {placement!r}; valid: {', '.join(PLACEMENTS)}")
    if placement == "per_node":
        stride = max(min(int(devices_per_node), ranks), 1)
        nodes = -(-ranks // stride)
        servers = positive_int_option("parameter_server", options, "servers", nodes)
        if servers != nodes:
            raise ScheduleError(
                f"parameter_server: placement='per_node' puts one server on each of the {nodes} nodes; "
                f"servers={servers} does not match (leave it out)"
            )
        return servers, placement, stride
    servers = positive_int_option("parameter_server", options, "servers")
    if placement == "colocated" and servers > ranks:
        raise ScheduleError(
            f"parameter_server: {servers} colocated servers need at least as many workers, got {ranks} "
            "ranks; use placement='dedicated' or servers <= ranks"
        )
    return servers, placement, 1


def _pairs(ranks: int, servers: int, placement: str, stride: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(worker, server rank, shard) for every push, in worker-major order."""
    worker = np.repeat(np.arange(ranks, dtype=np.int64), servers)
    shard = np.tile(np.arange(servers, dtype=np.int64), ranks)
    if placement == "dedicated":
        return worker, ranks + shard, shard
    server = shard * stride
    keep = worker != server  # a colocated server's own shard does not cross the wire
    return worker[keep], server[keep], shard[keep]


class ParameterServerCollective:
    name = "parameter_server"
    collectives: tuple[str, ...] = ("allreduce",)
    options = ("servers", "placement")

    def helper_ranks(self, ranks: int, **options: Any) -> int:
        """Relay ranks the schedule adds to ``ranks`` workers: the dedicated servers (none colocated)."""
        if options.get("placement") == "per_node":
            return 0  # its server count follows the nodes, which the schedule checks
        servers, placement, _ = _settings(ranks, options)
        return servers if placement == "dedicated" else 0

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        servers, placement, stride = _settings(ranks, options, devices_per_node)
        worker, server, shard = _pairs(ranks, servers, placement, stride)

        def rounds() -> Iterator[Round]:
            if worker.size:
                yield Round.of(worker, server, shard, shard + 1, REDUCE)
                yield Round.of(server, worker, shard, shard + 1, COPY)

        dedicated = placement == "dedicated"
        return Schedule(
            self.name,
            collective,
            ranks + servers if dedicated else ranks,
            servers,
            rounds,
            worker_ranks=ranks if dedicated else None,
        )

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Push then pull, each a round of every shard transfer at once, each port shared by the
        transfers through it (the incast the event simulation has): per round, alpha plus the busiest
        port's bytes over its rate, a node's NIC for the shards that cross nodes and a device's own
        link for those that stay inside a node. The pull reverses the push, so the two rounds cost
        the same (full duplex: a port's busier direction paces it).

        E.g. 4 nodes of one device, colocated, k = 4, S = 100 MB, 10 GbE (1.18 GB/s): each node
        sends 3 shards of 25 MB and receives 3, 75 MB / 1.18 GB/s = 63.6 ms a round, 127 ms in all.
        Two nodes: one shard each way, S/2 a round. Colocated with P=1: nothing crosses the wire, 0 s.
        Counted per node and per server, not per transfer: a million nodes of 8 in 0.4 s.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        servers, placement, stride = _settings(ranks, options, costs.devices_per_node)
        if placement != "dedicated" and ranks == 1:
            return 0.0
        if placement == "dedicated":
            server = np.arange(ranks, ranks + servers, dtype=np.int64)
        else:
            server = np.arange(servers, dtype=np.int64) * stride
        return 2 * _round_s(ranks, server, message_bytes / servers, costs)


def _round_s(workers: int, server: np.ndarray, nbytes: float, costs: FabricCosts) -> float:
    """The push round: every worker (ranks 0..workers-1, in blocks of ``devices_per_node``) sends
    ``nbytes`` to every server rank but itself, all at once; alpha plus the busiest port's bytes over
    its rate. Ports: between nodes, the NIC at each end (a node's devices spread over its
    ``nics_per_node`` NICs; out and in apart) at the inter-node rate; inside a node, each end's own
    link at the intra-node rate. Arrays per node and per server only (a million nodes of 8: 8 MB)."""
    per_node = costs.devices_per_node
    nodes = int(max(workers - 1, int(server.max()))) // per_node + 1
    node_of_server = server // per_node
    servers_on = np.bincount(node_of_server, minlength=nodes)  # servers on each node
    workers_on = np.clip(workers - np.arange(nodes, dtype=np.int64) * per_node, 0, per_node)
    # the most workers one NIC of a node carries when its first `count` devices work, per count
    local = costs.nic(np.arange(per_node, dtype=np.int64))
    most = np.array([np.bincount(local[:count]).max() if count else 0 for count in range(per_node + 1)])
    # between nodes: a NIC sends its workers' shards to the servers off their node and receives its
    # servers' shards from the workers off theirs
    sent = float((most[workers_on] * (len(server) - servers_on)).max())
    received = float(np.bincount(costs.nic(server), weights=workers - workers_on[node_of_server]).max())
    between = max(sent, received)
    # inside a node: a worker's shards to its node's other servers (one fewer if it serves, unless a
    # worker of the node does not), a server's from its node's other workers
    serving = np.bincount(node_of_server[server < workers], minlength=nodes)  # servers that also work
    out = int(np.where(workers_on > 0, servers_on - (serving >= workers_on), 0).max())
    into = int((workers_on[node_of_server] - (server < workers)).max())
    inside = max(out, into)
    network = costs.inter
    seconds = 0.0
    if costs.nodes_per_leaf:  # a fat tree's leaves: NICs at the port's rate, the uplinks apart
        leaf = np.arange(nodes, dtype=np.int64) // costs.nodes_per_leaf
        workers_in = np.bincount(leaf, weights=workers_on)
        servers_in = np.bincount(leaf[node_of_server], minlength=len(workers_in))
        # each worker's shards to the servers off its leaf, each server's from the workers off it
        leaving = float(np.maximum(workers_in * (len(server) - servers_in), servers_in * (workers - workers_in)).max())
        if leaving > 0:
            seconds = float(costs.inter.alpha_s + leaving * nbytes / costs.uplink_Bps)
        # the NICs at the port's rate, with the latency between leaves if a shard crosses them
        network = HopCost((costs.inter if leaving > 0 else costs.near).alpha_s, costs.near.beta_Bps)
    if between > 0:
        seconds = max(seconds, float(network.alpha_s + between * nbytes / network.beta_Bps))
    if inside > 0:
        seconds = max(seconds, float(costs.intra.alpha_s + inside * nbytes / costs.intra.beta_Bps))
    return seconds


COLLECTIVE_ALGORITHMS.register("parameter_server")(ParameterServerCollective())
