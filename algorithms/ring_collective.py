"""Ring collectives (Patarasuk & Yuan 2009; the algorithm of Baidu's ring all-reduce and NCCL's ring).

P ranks in a ring r -> r+1 (mod P), the buffer cut into P chunks::

    reduce-scatter, step s = 0..P-2: rank r sends chunk (r - s) mod P to r+1, which adds it in;
        afterwards rank r holds the full sum of chunk (r + 1) mod P.
    all-gather,     step s = 0..P-2: rank r sends its newest complete chunk to r+1, which copies it.

All-reduce is reduce-scatter then all-gather: 2(P-1) steps of S/P bytes each.

Channels (option ``channels`` = C, default 1), as NCCL runs its rings: C rings at once, the buffer
cut into C*P chunks, ring c carrying chunks c, C + c, 2C + c... In ring c each node's devices are
visited in an order rotated by ``c * devices_per_node // C``, so ring c enters node n at its local
device ``c * dpn // C`` and leaves it from the device before that one: with C NICs spread evenly
over the devices (device d uses NIC ``d * nics // dpn``) every ring crosses between nodes through
its own NIC, and a node's C NICs carry C crossings at once instead of one NIC carrying them all.
Step s of every ring goes in the same round (C*P transfers). Chunks are numbered so that rank r
ends a reduce-scatter owning chunks [C r, C r + C) (and starts an allgather with them): in ring c,
the piece that ends on rank r is chunk C r + c.

NCCL (src/graph/search.cc, ``ncclTopoCompute``/``ncclTopoSearchRecNet``: each ring channel's search
starts from a network device, channel after channel taking the next NIC, and runs NIC -> the GPUs
of the node -> NIC; src/graph/connect.cc, ``ncclTopoPreset``/``connectRings``: channel c's
``ringRecv`` is the first GPU of its intra-node order and ``ringSend`` the last, and node n's
``ringSend`` feeds node n+1's ``ringRecv``; ``ncclTopoPostset`` then doubles the channels). NCCL
enters and leaves a node through the same NIC (the two GPUs nearest it); here ring c enters on NIC c
and leaves on NIC c-1, the same one crossing in and one out per NIC. NCCL's second copy of each
channel is left out: it shares the first's NIC and ports, so it changes no bandwidth.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ddlsim.algorithms.collective import (
    COLLECTIVE_ALGORITHMS,
    check_collective,
    positive_int_option,
    reject_options,
)
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


def _steps(ranks: int, first_chunk_offset: int, op: int, count: int):
    """``count`` ring steps; in step s rank r sends chunk (r + first_chunk_offset - s) mod P."""
    import numpy as np  # here, not above: the closed form's path starts without numpy

    src = np.arange(ranks, dtype=np.int64)
    dst = (src + 1) % ranks
    ops = np.full(ranks, op, dtype=np.int64)
    ones = np.ones(ranks, dtype=np.int64)
    for step in range(count):
        offset = first_chunk_offset - step
        yield Round.lazy(src, dst, ones, ops, lambda offset=offset: (src + offset) % ranks)


def channel_shift(channel: int, channels: int, devices_per_node: int) -> int:
    """How far ring ``channel`` rotates each node's devices: it enters a node at this local device."""
    return channel * devices_per_node // channels


def channel_orders(ranks: int, channels: int, devices_per_node: int):
    """(C, P) array: ring c's ranks in ring order, node by node, each node's devices rotated by
    ``channel_shift`` (modulo the node's device count, for a last node that is not full)."""
    import numpy as np

    orders = np.empty((channels, ranks), dtype=np.int64)
    for c in range(channels):
        for base in range(0, ranks, devices_per_node):
            count = min(devices_per_node, ranks - base)
            shift = channel_shift(c, channels, devices_per_node) % count
            orders[c, base : base + count] = base + (np.arange(count) + shift) % count
    return orders


def _channel_steps(orders, first_chunk_offset: int, op: int, count: int):
    """``count`` steps of C rings at once; in step s the rank at position i of ring c sends chunk
    C * order_c[(i + first_chunk_offset - s) mod P] + c (ring c's piece that rank ends up owning)."""
    import numpy as np

    channels, ranks = orders.shape
    src = orders.reshape(-1)
    dst = np.roll(orders, -1, axis=1).reshape(-1)
    ops = np.full(src.size, op, dtype=np.int64)
    ones = np.ones(src.size, dtype=np.int64)
    position = np.arange(ranks, dtype=np.int64)
    channel = np.arange(channels, dtype=np.int64)[:, None]

    def chunk_lo(offset: int):
        owner = np.take_along_axis(orders, np.broadcast_to((position + offset) % ranks, orders.shape), axis=1)
        return (channels * owner + channel).reshape(-1)

    for step in range(count):
        yield Round.lazy(src, dst, ones, ops, lambda offset=first_chunk_offset - step: chunk_lo(offset))


class RingCollective:
    name = "ring"
    collectives: tuple[str, ...] = ("allreduce", "reduce_scatter", "allgather")
    options = ("channels",)

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        channels = positive_int_option(self.name, options, "channels")
        steps = ranks - 1
        if channels > 1:
            return self._channels(collective, ranks, channels, devices_per_node)

        def rounds():
            if collective in ("allreduce", "reduce_scatter"):
                yield from _steps(ranks, 0, REDUCE, steps)
            if collective == "allreduce":
                yield from _steps(ranks, 1, COPY, steps)
            if collective == "allgather":
                yield from _steps(ranks, 0, COPY, steps)

        # who owns which chunk matters only to a reduce-scatter's contract; listing it for every rank
        # of a million-rank all-reduce cost a hierarchical closed form a second
        owned = (
            tuple(((r + 1) % ranks, (r + 1) % ranks + 1) for r in range(ranks))
            if collective == "reduce_scatter"
            else None
        )
        return Schedule(self.name, collective, ranks, ranks, rounds, owned_chunks=owned)

    def _channels(self, collective: str, ranks: int, channels: int, devices_per_node: int) -> Schedule:
        steps = ranks - 1
        per_node = max(1, devices_per_node)

        def rounds():
            orders = channel_orders(ranks, channels, per_node)
            if collective in ("allreduce", "reduce_scatter"):  # position i ends owning its own piece
                yield from _channel_steps(orders, -1, REDUCE, steps)
            if collective in ("allreduce", "allgather"):  # position i starts holding its own piece
                yield from _channel_steps(orders, 0, COPY, steps)

        contract = collective in ("reduce_scatter", "allgather")
        mine = tuple((channels * r, channels * (r + 1)) for r in range(ranks)) if contract else None
        return Schedule(
            self.name,
            collective,
            ranks,
            channels * ranks,
            rounds,
            owned_chunks=mine if collective == "reduce_scatter" else None,
            initial_chunks=mine if collective == "allgather" else None,
        )

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Ring time: every step moves S/P bytes over every hop, so the slowest hop paces all steps.

        allreduce: 2(P-1) * (alpha + S/(P beta)); reduce_scatter and allgather: (P-1) * (...).
        E.g. P=4, S=4 MB, alpha=1 us, beta=1 GB/s: 6 * (1e-6 + 1e6/1e9) = 6.006e-3 s.
        A step is ``channel_step_s`` (one channel: the slowest hop present, ``FabricCosts.worst``, and
        a fat tree's uplink where the ring leaves a leaf).
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        channels = positive_int_option(self.name, options, "channels")
        if ranks == 1:
            return 0.0
        steps = (ranks - 1) * (2 if collective == "allreduce" else 1)
        return steps * channel_step_s(ranks, message_bytes, costs, channels)


def channel_step_s(ranks: int, message_bytes: float, costs: FabricCosts, channels: int) -> float:
    """One step of C rings at once, each moving b = S/(C P): its slowest hop kind, with its sharers.

    A device sends one piece per ring. The pieces that stay in the node share the device's own
    intra-node port: k_intra = C on a device where no ring leaves the node, C minus the rings that
    leave from it elsewhere. The pieces that leave the node go through the leaving device's NIC:
    k_inter = the most rings that leave through one device or one NIC (1 when the rings' exit devices
    sit on C distinct NICs). step = max(intra.time(k_intra b), inter.time(k_inter b)), b = S/(C P).
    NICs: ``costs.nics_per_node``, device d on NIC d * nics // devices_per_node. Exact for whole
    nodes; the intra and inter paths are assumed to be separate links (NVLink beside PCIe to the NIC)
    and the core between nodes not to bind (a shared core is contention: the DES shows it).
    E.g. 2 nodes of 8, 4 NICs, 4 channels: rings leave from devices 7, 1, 3, 5 (NICs 3, 0, 1, 2),
    k_inter = 1 and k_intra = 4 (device 0 sends intra in every ring): a step is
    max(intra.time(S/16), inter.time(S/64)).
    """
    per_node = costs.devices_per_node
    piece = message_bytes / (channels * ranks)
    if ranks <= per_node:  # one node: every piece stays in it
        return costs.intra.time(channels * piece)
    between_leaves = costs.spans_leaves(ranks)
    network = costs.inter if between_leaves else costs.near
    # under a fat tree's leaves, each ring crosses each leaf boundary once a direction: C pieces share
    # the leaf's uplink (it paces the step where the uplink is narrower than C NIC ports' worth)
    uplink = costs.inter.alpha_s + channels * piece / costs.uplink_Bps if between_leaves else 0.0
    if per_node == 1:  # one device a node: every ring leaves through it
        return max(network.time(channels * piece), uplink)
    exits = [(channel_shift(c, channels, per_node) - 1) % per_node for c in range(channels)]
    by_device = Counter(exits)
    by_nic = Counter(costs.nic(device) for device in exits)
    k_inter = max(max(by_device.values()), max(by_nic.values()))
    k_intra = channels - (min(by_device.values()) if len(by_device) == per_node else 0)
    inter = max(network.time(k_inter * piece), uplink)
    return max(inter, costs.intra.time(k_intra * piece)) if k_intra else inter


COLLECTIVE_ALGORITHMS.register("ring")(RingCollective())
