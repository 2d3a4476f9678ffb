"""Hierarchical allreduce: inside nodes, then among nodes, then inside nodes again.

The scheme of Goyal et al. 2017 (intra-node reduce, inter-node recursive halving/doubling,
intra-node broadcast) and Jia et al. 2018 (the same with an inter-node ring). Ranks are placed in
blocks of D = ``devices_per_node``; the first device of each node is its leader::

    node 0: 0 1 2 3    node 1: 4 5 6 7        intra="reduce" (default):
            ^-reduce-'         ^-reduce-'       1. binomial reduce to the leader (0, 4)
            0 <--inner allreduce--> 4           2. allreduce among the leaders (option ``inner``)
            '-bcast->          '-bcast->        3. binomial broadcast from the leader

    intra="reduce_scatter": 1. ring reduce-scatter inside each node (device i keeps part i+1 mod D)
                            2. D concurrent inner allreduces, one per part, among the devices
                               holding that part on every node (S/D bytes each)
                            3. ring allgather inside each node

``inner`` is any other allreduce token (default ``ring``), run on one rank per node with
``inner_options``; it must not add helper ranks (dedicated parameter servers) or change the payload
(top-k). P must be a multiple of D so that every node has the same devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.binomial_tree_collective import broadcast_pairs, reduce_pairs
from ddlsim.algorithms.collective import (
    COLLECTIVE_ALGORITHMS,
    CollectiveAlgorithm,
    check_collective,
    options_key,
    reject_options,
)
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, HopCost, Round, Schedule, ScheduleError, check_ranks
from ddlsim.registry import UnknownNameError

INTRA = ("reduce", "reduce_scatter")


def _settings(ranks: int, devices_per_node: int, options: dict[str, Any]):
    inner_name = options.get("inner", "ring")
    intra = options.get("intra", "reduce")
    inner_options = dict(options.get("inner_options") or {})
    if intra not in INTRA:
        raise ScheduleError(f"hierarchical: unknown intra {intra!r}; valid: {', '.join(INTRA)}")
    try:
        inner: CollectiveAlgorithm = COLLECTIVE_ALGORITHMS.get(inner_name)
    except UnknownNameError as error:
        raise ScheduleError(f"hierarchical: inner: {error}") from None
    valid = [
        n
        for n in COLLECTIVE_ALGORITHMS.names()
        if n != "hierarchical" and "allreduce" in COLLECTIVE_ALGORITHMS.get(n).collectives
    ]
    if inner_name == "hierarchical" or "allreduce" not in inner.collectives:
        raise ScheduleError(f"hierarchical: inner must be another allreduce algorithm; valid: {', '.join(valid)}")
    if not isinstance(devices_per_node, int | np.integer) or devices_per_node < 1:
        raise ScheduleError(f"hierarchical: devices_per_node must be a positive integer, got {devices_per_node!r}")
    local = min(int(devices_per_node), ranks)
    if ranks % local:
        raise ScheduleError(
            f"hierarchical: ranks ({ranks}) must be a multiple of devices_per_node ({devices_per_node}) "
            "so that every node has the same devices"
        )
    return inner_name, inner, inner_options, intra, local, ranks // local


def _inner_schedule(inner_name: str, inner: CollectiveAlgorithm, nodes: int, options: dict[str, Any]) -> Schedule:
    schedule = inner.schedule("allreduce", nodes, devices_per_node=1, **options)
    if schedule.worker_ranks is not None or schedule.ranks != nodes:
        raise ScheduleError(
            f"hierarchical: inner {inner_name!r} adds helper ranks; use one that does not "
            "(e.g. parameter_server with placement='colocated')"
        )
    if schedule.payload_factor != 1.0 or schedule.contract is not None:
        raise ScheduleError(f"hierarchical: inner {inner_name!r} is not a dense allreduce")
    return schedule


_CHECKED_INNER: set[tuple] = set()  # (inner, nodes, options) whose schedule _inner_schedule accepted


def _check_inner(inner_name: str, inner: CollectiveAlgorithm, nodes: int, options: dict[str, Any]) -> None:
    """``_inner_schedule``'s checks, remembered: the closed form is asked once per gradient bucket,
    and an inner schedule over a million nodes costs a tenth of a second to build."""
    key = (inner_name, nodes, options_key(options))
    if key in _CHECKED_INNER:
        return
    _inner_schedule(inner_name, inner, nodes, options)
    _CHECKED_INNER.add(key)


def _per_node(pairs: Iterator[tuple[np.ndarray, np.ndarray]], ranks: int, local: int):
    """Repeat local (src, dst) pairs on every node."""
    base = np.arange(0, ranks, local, dtype=np.int64)[:, None]
    for src, dst in pairs:
        yield (base + src).ravel(), (base + dst).ravel()


def _local_ring(ranks: int, local: int, chunks_per_part: int, first: int, op: int) -> Iterator[Round]:
    """local-1 ring steps inside every node; in step s device i sends part (i + first - s) mod local.

    The steps share their src, dst, count and op arrays (as ``ring_collective`` does), so executors
    recognise them as the same round.
    """
    rank = np.arange(ranks, dtype=np.int64)
    index = rank % local
    right = rank - index + (index + 1) % local
    count = np.full(ranks, chunks_per_part, dtype=np.int64)
    ops = np.full(ranks, op, dtype=np.int64)
    for step in range(local - 1):
        yield Round.lazy(rank, right, count, ops, lambda s=step: ((index + first - s) % local) * chunks_per_part)


class _Mapped:
    """Arrays derived from the inner schedule's, computed once per inner array and then shared.

    The inner schedule's rounds share their arrays (a ring's 2(N-1) steps use one src array), so
    mapping them afresh every round would hand the executors new arrays each time and defeat their
    per-round caches; keyed on the inner array's identity (held, so the id stays valid) the mapped
    arrays come back as the same objects, round after round and call after call.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}

    def __call__(self, kind: str, array: Any, build) -> np.ndarray:
        key = (kind, id(array))
        hit = self._cache.get(key)
        if hit is None or hit[0] is not array:
            if len(self._cache) > 64:
                self._cache.clear()
            hit = (array, build(array))
            self._cache[key] = hit
        return hit[1]


class HierarchicalCollective:
    name = "hierarchical"
    collectives: tuple[str, ...] = ("allreduce",)
    options = ("inner", "intra", "inner_options")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        inner_name, inner, inner_options, intra, local, nodes = _settings(ranks, devices_per_node, options)
        inner_schedule = _inner_schedule(inner_name, inner, nodes, inner_options)
        inner_chunks = inner_schedule.num_chunks
        mapped = _Mapped()
        index = np.arange(local, dtype=np.int64)[:, None]
        offset = ((index + 1) % local) * inner_chunks  # device i owns part i+1 after the local ring

        def leader_rounds() -> Iterator[Round]:
            for src, dst in _per_node(reduce_pairs(local), ranks, local):
                yield Round.of(src, dst, 0, inner_chunks, REDUCE)
            for rnd in inner_schedule.rounds():
                yield Round.lazy(
                    mapped("leader", rnd.src, lambda a: a * local),
                    mapped("leader", rnd.dst, lambda a: a * local),
                    rnd.chunk_count,
                    rnd.op,
                    lambda rnd=rnd: rnd.chunk_lo,
                )
            for src, dst in _per_node(broadcast_pairs(local), ranks, local):
                yield Round.of(src, dst, 0, inner_chunks, COPY)

        def scatter_rounds() -> Iterator[Round]:
            yield from _local_ring(ranks, local, inner_chunks, 0, REDUCE)
            for rnd in inner_schedule.rounds():
                yield Round.lazy(
                    mapped("device", rnd.src, lambda a: (a * local + index).ravel()),
                    mapped("device", rnd.dst, lambda a: (a * local + index).ravel()),
                    mapped(
                        f"tile{rnd.src.size}",
                        rnd.chunk_count,
                        lambda a, n=rnd.src.size: np.tile(np.broadcast_to(a, n), local),
                    ),
                    mapped(
                        f"tile{rnd.src.size}", rnd.op, lambda a, n=rnd.src.size: np.tile(np.broadcast_to(a, n), local)
                    ),
                    lambda rnd=rnd: (rnd.chunk_lo + offset).ravel(),
                )
            yield from _local_ring(ranks, local, inner_chunks, 1, COPY)

        if intra == "reduce":
            return Schedule(self.name, collective, ranks, inner_chunks, leader_rounds)
        return Schedule(self.name, collective, ranks, local * inner_chunks, scatter_rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Intra phases on the intra-node hop plus the inner allreduce's closed form on the inter hop.

        intra="reduce": (floor(log2 D) + ceil(log2 D)) (alpha_intra + S/beta_intra) + T_inner(N, S).
        intra="reduce_scatter": 2 (D-1) (alpha_intra + S/(D beta_intra)) + T_inner(N, S/D), the D
        inner all-reduces of a node at once, ceil(D / nics) of them through each NIC.
        N = P/D nodes; T_inner is the inner algorithm's closed form on the fabric between nodes (a fat
        tree's leaves included).
        E.g. P=8, D=4, S=4 MB, ring inner, intra 1 us / 100 GB/s, inter 2 us / 10 GB/s: reduce
        variant (2 + 2) * (1e-6 + 40e-6) + 2 * (2e-6 + 200e-6) = 0.568e-3 s.
        Exact: every node runs the same intra phases in lock step, so all leaders start the inner
        allreduce together and all inner links cross nodes.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        inner_name, inner, inner_options, intra, local, nodes = _settings(ranks, costs.devices_per_node, options)
        _check_inner(inner_name, inner, nodes, inner_options)
        # the leaders, one a node; with reduce_scatter all D ranks of a node lead, each running its
        # own inner all-reduce at once: a NIC carries ceil(D / nics) of their transfers and a leaf's
        # uplink D times as many as one inner all-reduce sends through it
        sharing = local if intra == "reduce_scatter" else 1
        per_nic = -(-sharing // max(costs.nics_per_node, 1))
        near, far = (HopCost(hop.alpha_s, hop.beta_Bps / per_nic) for hop in (costs.near, costs.inter))
        leaf = near if costs.leaf is not None else None
        between_nodes = FabricCosts(near, far, 1, 1, leaf, costs.nodes_per_leaf, costs.uplink_Bps / sharing)
        if intra == "reduce":
            hops = (local.bit_length() - 1) + (local - 1).bit_length()  # floor + ceil of log2(D)
            inner_s = inner.closed_form_s("allreduce", nodes, message_bytes, between_nodes, **inner_options)
            return hops * costs.intra.time(message_bytes) + inner_s
        part = message_bytes / local
        inner_s = inner.closed_form_s("allreduce", nodes, part, between_nodes, **inner_options)
        return 2 * (local - 1) * costs.intra.time(part) + inner_s


COLLECTIVE_ALGORITHMS.register("hierarchical")(HierarchicalCollective())
