"""Binomial trees rooted at rank 0: reduce, broadcast, and allreduce = reduce + broadcast.

The textbook MPI algorithms (MPICH's ``reduce_intra_binomial`` and ``bcast_intra_binomial``; Thakur,
Rabenseifner & Gropp 2005, section 2). The parent of rank r is r with its lowest set bit cleared::

    reduce, round k = 0, 1, ...: every rank whose lowest set bit is 2^k sends its partial sum to
                                 r - 2^k, which adds it in (children before parents)
    broadcast, mask = 2^(K-1) .. 1 (K = ceil(log2 P)): every rank that is a multiple of 2*mask
                                 sends the buffer to r + mask (if that rank exists)

    P = 8:   0 <-- 1      0 <-- 2      0 <-- 4          (reduce: rounds 0, 1, 2; also 2 <-- 3,
                                                          4 <-- 5, 6 <-- 7, 4 <-- 6)

The whole buffer travels on every edge. A rank forwards as soon as its own children have arrived,
so the reduce takes as long as the heaviest leaf-to-root path (floor(log2 P) hops on a uniform
fabric), while in the broadcast the root sends once per round (ceil(log2 P) hops).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.crossings import binomial_broadcast_paths, binomial_reduce_paths, heaviest_path_s
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


def reduce_pairs(ranks: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(children, parents) of each binomial reduce round over ranks 0..ranks-1 (root 0)."""
    step = 1
    while step < ranks:
        src = np.arange(step, ranks, 2 * step, dtype=np.int64)
        yield src, src - step
        step <<= 1


def broadcast_masks(ranks: int) -> Iterator[int]:
    """The broadcast's round distances: the largest power of two below ``ranks``, halving to 1."""
    mask = 1 << (max(ranks - 1, 0).bit_length()) >> 1
    while mask >= 1:
        yield mask
        mask >>= 1


def broadcast_pairs(ranks: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(parents, children) of each binomial broadcast round over ranks 0..ranks-1 (root 0)."""
    for mask in broadcast_masks(ranks):
        src = np.arange(0, ranks - mask, 2 * mask, dtype=np.int64)
        yield src, src + mask


def reduce_time_s(ranks: int, nbytes: float, costs: FabricCosts) -> float:
    """Heaviest path to the root: rank r climbs one edge per set bit of r, lowest bit first.

    Uniform fabric: floor(log2 P) (alpha + S/beta). E.g. P=5, S=1 MB, alpha=1 us, beta=1 GB/s: the
    paths 3 -> 2 -> 0 and 1 -> 0, 4 -> 0 give 2 * 1.001e-3 = 2.002e-3 s (not 3 rounds: rank 4 sends
    in round 2 but was ready at time 0). Two-level fabrics: each edge at its own hop
    (``crossings.binomial_reduce_paths``).
    """
    return heaviest_path_s(binomial_reduce_paths(ranks, costs.devices_per_node, costs.ranks_per_leaf), costs, nbytes)


def broadcast_time_s(ranks: int, nbytes: float, costs: FabricCosts) -> float:
    """Heaviest path from the root: every rank on the way to r sends once per remaining round.

    Uniform fabric: ceil(log2 P) (alpha + S/beta), the root sending in every round. E.g. P=5:
    3 * 1.001e-3 = 3.003e-3 s for S=1 MB, alpha=1 us, beta=1 GB/s.
    """
    return heaviest_path_s(binomial_broadcast_paths(ranks, costs.devices_per_node, costs.ranks_per_leaf), costs, nbytes)


class BinomialTreeCollective:
    name = "binomial_tree"
    collectives: tuple[str, ...] = ("allreduce", "reduce", "broadcast")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)

        def rounds() -> Iterator[Round]:
            if collective in ("reduce", "allreduce"):
                for src, dst in reduce_pairs(ranks):
                    yield Round.of(src, dst, 0, 1, REDUCE)
            if collective in ("broadcast", "allreduce"):
                for src, dst in broadcast_pairs(ranks):
                    yield Round.of(src, dst, 0, 1, COPY)

        return Schedule(self.name, collective, ranks, 1, rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Binomial tree time: heaviest root path of the reduce plus that of the broadcast.

        Uniform fabric: reduce floor(log2 P) (alpha + S/beta), broadcast ceil(log2 P) (alpha + S/beta),
        allreduce the sum. E.g. P=8, S=1 MB, alpha=1 us, beta=1 GB/s: allreduce 6 * 1.001e-3 =
        6.006e-3 s. Two-level fabrics: each edge of the path at its own hop, so exact for any
        devices_per_node (power-of-two devices_per_node: the bits below log2(devices_per_node) are
        intra-node edges).
        """
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        total = 0.0
        if collective in ("reduce", "allreduce"):
            total += reduce_time_s(ranks, message_bytes, costs)
        if collective in ("broadcast", "allreduce"):
            total += broadcast_time_s(ranks, message_bytes, costs)
        return total


COLLECTIVE_ALGORITHMS.register("binomial_tree")(BinomialTreeCollective())
