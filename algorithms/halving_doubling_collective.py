"""Recursive halving and doubling: Rabenseifner's allreduce (Thakur, Rabenseifner & Gropp 2005).

Allreduce for power-of-two P = reduce-scatter by recursive halving, then allgather by recursive
doubling, as in MPICH's ``allreduce_intra_reduce_scatter_allgather``. The buffer is cut into P
chunks; in reduce-scatter round k (distance 2^k, k = 0..log2(P)-1) rank r and r XOR 2^k each keep
one half of the range they are responsible for and send the other half (S/2^(k+1) bytes), which the
partner adds in. Afterwards each rank owns one fully reduced chunk (chunk = bit-reversed rank); the
allgather retraces the rounds backwards, doubling the data each time::

    P = 4, chunks 0..3      round 0 (distance 1)     round 1 (distance 2)
    rank 0 keeps            chunks 0,1               chunk 0
    rank 1 keeps            chunks 2,3               chunk 2
    rank 2 keeps            chunks 0,1               chunk 1
    rank 3 keeps            chunks 2,3               chunk 3

Time for power-of-two P: 2 log2(P) alpha + 2 (P-1)/P S/beta.

Other P: the pre/post fold of Thakur et al. (see ``recursive_doubling_collective``): the first
2*rem ranks pair up, even ones fold their whole buffer into the odd ones, the power-of-two core
runs among pof2 "new ranks" on pof2 chunks, and a post-step copies the result back (+2 (alpha + S/beta)).

Reduce-scatter alone is MPICH's recursive halving (``reduce_scatter_intra_recursive_halving``):
distance pof2/2 first, rank r ends with chunk r; for other P the same fold, new rank i < rem standing
for ranks 2i and 2i+1 (two chunks), and a post-step handing chunk 2i back to rank 2i. Allgather alone
is recursive doubling (``recursive_doubling_collective.allgather_rounds``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.crossings import exchange_hop, fold_hop
from ddlsim.algorithms.recursive_doubling_collective import (
    allgather_rounds,
    allgather_time_s,
    first_chunk,
    fold,
    fold_pairs,
    rank_of,
)
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


def _allreduce_rounds(ranks: int) -> Iterator[Round]:
    """The rounds; the allgather at distance d reuses the reduce-scatter's src and dst arrays at d,
    so executors that cache per-round work on those arrays (routes) compute it once per distance."""
    pof2, rem = fold(ranks)
    even, odd = fold_pairs(rem)
    if rem:
        yield Round.of(even, odd, 0, pof2, REDUCE)
    newrank = np.arange(pof2, dtype=np.int64)
    src = rank_of(newrank, rem)
    partner: dict[int, np.ndarray] = {}
    reduce, copy = np.full(pof2, REDUCE, dtype=np.int64), np.full(pof2, COPY, dtype=np.int64)
    lo = np.zeros(pof2, dtype=np.int64)  # start of the range each new rank is responsible for
    size = pof2
    step = 1
    while step < pof2:  # reduce-scatter: halve the range, distance doubling
        half = size // 2
        upper = (newrank & step) != 0
        send_lo = np.where(upper, lo, lo + half)
        partner[step] = rank_of(newrank ^ step, rem)
        yield Round(src, partner[step], send_lo, send_lo + half, reduce)
        lo = np.where(upper, lo + half, lo)
        size = half
        step <<= 1
    step >>= 1
    while step >= 1:  # allgather: retrace, doubling the range
        upper = (newrank & step) != 0
        yield Round(src, partner[step], lo, lo + size, copy)
        lo = np.where(upper, lo - size, lo)
        size *= 2
        step >>= 1
    if rem:
        yield Round.of(odd, even, 0, pof2, COPY)


def _reduce_scatter_rounds(ranks: int) -> Iterator[Round]:
    pof2, rem = fold(ranks)
    even, odd = fold_pairs(rem)
    if rem:
        yield Round.of(even, odd, 0, ranks, REDUCE)
    newrank = np.arange(pof2, dtype=np.int64)
    src = rank_of(newrank, rem)
    step = pof2 // 2
    while step >= 1:
        base = newrank & ~(2 * step - 1)
        upper = (newrank & step) != 0
        # send the partner's half of the current block of new ranks
        first = np.where(upper, base, base + step)
        yield Round.of(
            src, rank_of(newrank ^ step, rem), first_chunk(first, rem), first_chunk(first + step, rem), REDUCE
        )
        step >>= 1
    if rem:
        yield Round.of(odd, even, even, even + 1, COPY)


def _halving_time_s(pof2: int, rem: int, costs: FabricCosts, bytes_of_round) -> float:
    total = 0.0
    step = 1
    while step < pof2:
        total += exchange_hop(costs, pof2, rem, step).time(bytes_of_round(step))
        step <<= 1
    return total


class HalvingDoublingCollective:
    name = "halving_doubling"
    collectives: tuple[str, ...] = ("allreduce", "reduce_scatter", "allgather")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        if collective == "allreduce":
            pof2, _ = fold(ranks)
            return Schedule(self.name, collective, ranks, pof2, lambda: _allreduce_rounds(ranks))
        if collective == "reduce_scatter":
            return Schedule(self.name, collective, ranks, ranks, lambda: _reduce_scatter_rounds(ranks))
        return Schedule(self.name, collective, ranks, ranks, lambda: allgather_rounds(ranks))

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Halving-doubling time, each round charged at its slowest hop.

        allreduce, power-of-two P: 2 log2(P) alpha + 2 (P-1)/P S/beta (round at distance 2^k moves
        S/2^(k+1) twice: once reducing, once gathering); other P add the fold, 2 (alpha + S/beta),
        with the core run on pof2. E.g. P=8, S=8 MB, alpha=1 us, beta=1 GB/s:
        6e-6 + 2 * 7/8 * 8e-3 = 14.006e-3 s; P=12 (pof2=8): 14.006e-3 + 2 * 8.001e-3 = 30.008e-3 s.
        reduce_scatter, power-of-two P: log2(P) alpha + (P-1)/P S/beta (P=8: 3e-6 + 7e-3 s); other
        P: pre-step alpha + S/beta, core rounds as charged by ``reduce_scatter_core_s``, post-step
        alpha + S/(P beta). allgather: ``recursive_doubling_collective.allgather_time_s``.
        Exact on uniform fabrics and, with block placement, for power-of-two P when devices_per_node
        is a power of two; otherwise an upper bound (see docs/collectives.md).
        """
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        pof2, rem = fold(ranks)
        pair_hop = fold_hop(costs, rem)
        if collective == "allgather":
            return allgather_time_s(ranks, message_bytes, costs)
        if collective == "allreduce":
            core = _halving_time_s(pof2, rem, costs, lambda step: message_bytes / (2 * step))
            return 2 * core + (2 * pair_hop.time(message_bytes) if rem else 0.0)
        chunk = message_bytes / ranks
        if not rem:
            return _halving_time_s(pof2, rem, costs, lambda step: step * chunk)
        return reduce_scatter_core_s(pof2, rem, chunk, costs) + pair_hop.time(chunk)


def reduce_scatter_core_s(pof2: int, rem: int, chunk_bytes: float, costs: FabricCosts) -> float:
    """Fold pre-step plus core of recursive-halving reduce-scatter for P = pof2 + rem, rem > 0.

    New ranks < rem stand for two ranks, so blocks are uneven. At distance d a new rank sends the
    other half of its block; along the critical path that block is block 0, and the other half
    holds d + min(rem, d) chunks for a rank in the upper half (bit d set), d + clamp(rem - d, 0, d)
    for one in the lower half. A path starting at new rank x pays the fold's pre-step (alpha + S/beta)
    only if x < rem, so the time is the longest of: x = pof2-1 (every bit set, no pre-step) and the
    few largest x < rem (x = rem-1, and rem-1 with one set bit cleared and all lower bits set).
    E.g. P=3, S=3 MB, alpha=1 us, beta=1 GB/s: x=1 costs 2.001e-3; x=0 costs 3.001e-3 + 1.001e-3,
    so the core with pre-step is 4.002e-3 s and the post-step adds 1.001e-3 s.
    """
    costs_of_round = []
    step = pof2 // 2
    while step >= 1:
        round_hop = exchange_hop(costs, pof2, rem, step)
        upper = round_hop.time((step + min(rem, step)) * chunk_bytes)
        lower = round_hop.time((step + min(max(rem - step, 0), step)) * chunk_bytes)
        costs_of_round.append((step, upper, lower))
        step >>= 1

    def path(x: int) -> float:
        return sum(upper if x & step else lower for step, upper, lower in costs_of_round)

    pair_hop = fold_hop(costs, rem)
    pre = pair_hop.time(chunk_bytes * (pof2 + rem))
    top = rem - 1
    starts = [top] + [(top & ~bit) | (bit - 1) for bit in (1 << k for k in range(top.bit_length())) if top & bit]
    return max(path(pof2 - 1), pre + max(path(x) for x in starts))


COLLECTIVE_ALGORITHMS.register("halving_doubling")(HalvingDoublingCollective())
