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
relays that contribute nothing. Every server link carries P x S/k bytes in each direction, the
incast the DES models with shared bandwidth; the uncontended closed form ignores it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, positive_int_option, reject_options
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, ScheduleError, check_ranks

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
        """Push then pull of one shard: 2 (alpha + S/(k beta)), uncontended (no incast).

        The hop is inter-node as soon as some worker and some server sit on different nodes (servers
        placed after the workers when dedicated). E.g. P=4, k=2, S=2 MB, alpha=1 us, beta=1 GB/s:
        2 * (1e-6 + 1e-3) = 2.002e-3 s. Colocated with P=1: nothing crosses the wire, 0 s.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        servers, placement, _ = _settings(ranks, options, costs.devices_per_node)
        if placement != "dedicated" and ranks == 1:
            return 0.0
        last = ranks + servers - 1 if placement == "dedicated" else ranks - 1
        hop = costs.inter if last // costs.devices_per_node > 0 else costs.intra
        return 2 * hop.time(message_bytes / servers)


COLLECTIVE_ALGORITHMS.register("parameter_server")(ParameterServerCollective())
