"""Recursive doubling (Thakur, Rabenseifner & Gropp 2005, section 4; MPICH's short-message allreduce).

Power-of-two P: in round k = 0..log2(P)-1 rank r exchanges with r XOR 2^k::

    allreduce: the whole buffer both ways, each side adds it in       -> log2(P) rounds of S bytes
    allgather: everything gathered so far (2^k contributions) both ways -> log2(P) rounds, doubling

Other P use the fold of Thakur et al. (the same as MPICH): with pof2 the largest power of two
<= P and rem = P - pof2, the first 2*rem ranks pair up (2i, 2i+1); the even one hands its data to
the odd one and sits out the power-of-two core, in which rank 2i+1 acts as "new rank" i and the
ranks from 2*rem on as new ranks rem..pof2-1. A post-step sends the result back to the even ranks::

    rank      0   1   2   3   4   5        (P = 6, pof2 = 4, rem = 2)
    pre       0-->1   2-->3                 even ranks fold into odd ones
    new rank      0       1   2   3         core among 4 new ranks
    post      0<--1   2<--3                 odd ranks return the result

The folding helpers here are shared with ``halving_doubling``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.crossings import exchange_hop, fold_hop
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


def fold(ranks: int) -> tuple[int, int]:
    """(pof2, rem): the largest power of two <= ranks and how many ranks exceed it."""
    pof2 = 1 << (int(ranks).bit_length() - 1)
    return pof2, ranks - pof2


def rank_of(newrank: np.ndarray, rem: int) -> np.ndarray:
    """Actual rank of each core ("new") rank: 2n+1 for the first rem, n+rem after them."""
    return np.where(newrank < rem, 2 * newrank + 1, newrank + rem)


def first_chunk(newrank: np.ndarray | int, rem: int) -> np.ndarray:
    """First chunk of a new rank's block when rank r owns chunk r: new rank n < rem owns 2n, 2n+1."""
    n = np.asarray(newrank, dtype=np.int64)
    return n + np.minimum(n, rem)


def fold_pairs(rem: int) -> tuple[np.ndarray, np.ndarray]:
    """(even, odd) ranks of the pre/post fold step."""
    even = 2 * np.arange(rem, dtype=np.int64)
    return even, even + 1


def exchange_partners(pof2: int, rem: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) ranks of a core round whose new ranks exchange with new rank XOR ``step``."""
    newrank = np.arange(pof2, dtype=np.int64)
    return rank_of(newrank, rem), rank_of(newrank ^ step, rem)


def allgather_rounds(ranks: int) -> Iterator[Round]:
    """Recursive-doubling allgather (rank r starts with chunk r), folded for non-power-of-two P.

    Shared with ``halving_doubling`` (its allgather phase alone is this algorithm).
    """
    pof2, rem = fold(ranks)
    even, odd = fold_pairs(rem)
    if rem:
        yield Round.of(even, odd, even, even + 1, COPY)
    newrank = np.arange(pof2, dtype=np.int64)
    step = 1
    while step < pof2:
        base = newrank & ~(step - 1)
        yield Round.of(
            rank_of(newrank, rem),
            rank_of(newrank ^ step, rem),
            first_chunk(base, rem),
            first_chunk(base + step, rem),
            COPY,
        )
        step <<= 1
    if rem:
        yield Round.of(odd, even, 0, ranks, COPY)


def allgather_time_s(ranks: int, message_bytes: float, costs: FabricCosts) -> float:
    """Closed form of ``allgather_rounds``: the path of new rank 0, whose block is always the largest.

    Power-of-two P: sum_k (alpha + 2^k S/(P beta)) = log2(P) alpha + (P-1)/P S/beta. Otherwise add
    the fold: pre-step alpha + S/(P beta), core round k carries 2^k + min(rem, 2^k) chunks of S/P,
    post-step alpha + S/beta. Each round is charged at its slowest hop.
    """
    if ranks == 1:
        return 0.0
    pof2, rem = fold(ranks)
    chunk = message_bytes / ranks
    total = 0.0
    if rem:
        pair_hop = fold_hop(costs, rem)
        total += pair_hop.time(chunk) + pair_hop.time(message_bytes)
    step = 1
    while step < pof2:
        total += exchange_hop(costs, pof2, rem, step).time((step + min(rem, step)) * chunk)
        step <<= 1
    return total


class RecursiveDoublingCollective:
    name = "recursive_doubling"
    collectives: tuple[str, ...] = ("allreduce", "allgather")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        if collective == "allgather":
            return Schedule(self.name, collective, ranks, ranks, lambda: allgather_rounds(ranks))

        def rounds() -> Iterator[Round]:
            pof2, rem = fold(ranks)
            even, odd = fold_pairs(rem)
            if rem:
                yield Round.of(even, odd, 0, 1, REDUCE)
            step = 1
            while step < pof2:
                src, dst = exchange_partners(pof2, rem, step)
                yield Round.of(src, dst, 0, 1, REDUCE)
                step <<= 1
            if rem:
                yield Round.of(odd, even, 0, 1, COPY)

        return Schedule(self.name, collective, ranks, 1, rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Recursive doubling time, each round charged at its slowest hop.

        allreduce, power-of-two P: log2(P) (alpha + S/beta); otherwise (log2(pof2) + 2) (alpha + S/beta),
        the 2 being the fold's pre- and post-step. E.g. P=8, S=1 MB, alpha=1 us, beta=1 GB/s:
        3 * (1e-6 + 1e-3) = 3.003e-3 s; P=6: (2 + 2) * 1.001e-3 = 4.004e-3 s.
        allgather: see ``allgather_time_s`` (P=8: 3e-6 + 7/8 * 1e-3 = 0.878e-3 s).
        Exact on uniform fabrics and, with block placement, when devices_per_node is a power of two;
        otherwise an upper bound (the slowest transfers of successive rounds need not chain).
        """
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        if collective == "allgather":
            return allgather_time_s(ranks, message_bytes, costs)
        pof2, rem = fold(ranks)
        total = 0.0
        if rem:
            total += 2 * fold_hop(costs, rem).time(message_bytes)
        step = 1
        while step < pof2:
            total += exchange_hop(costs, pof2, rem, step).time(message_bytes)
            step <<= 1
        return total


COLLECTIVE_ALGORITHMS.register("recursive_doubling")(RecursiveDoublingCollective())
