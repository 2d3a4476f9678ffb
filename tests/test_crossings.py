"""The closed forms' hop choices (algorithms/crossings.py) against the listing of every transfer.

Each function answers "does this round (or path) cross nodes?" from a handful of transfers; here the
answer is checked against all of the round's transfers, taken from the schedules' own pair
generators, for every small shape: ranks up to 70, every node size up to 10, every round.
"""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest

from ddlsim.algorithms import crossings
from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.recursive_doubling_collective import exchange_partners, fold, fold_pairs
from ddlsim.algorithms.schedule import FabricCosts, HopCost
from ddlsim.algorithms.torus_2d_collective import _links

NODE_SIZES = range(1, 11)


def _crosses(src: np.ndarray, dst: np.ndarray, d: int) -> bool:
    return bool(np.any(src // d != dst // d))


@pytest.mark.parametrize("ranks", range(2, 71))
def test_exchange_and_fold_rounds_match_their_transfers(ranks):
    pof2, rem = fold(ranks)
    for d in NODE_SIZES:
        assert crossings.fold_crosses(rem, d) == (rem > 0 and _crosses(*fold_pairs(rem), d)), (ranks, d)
        step = 1
        while step < pof2:
            expected = _crosses(*exchange_partners(pof2, rem, step), d)
            assert crossings.exchange_crosses(pof2, rem, step, d) == expected, (ranks, d, step)
            step <<= 1


def test_exchange_rounds_match_their_transfers_past_the_period():
    """Shapes long enough that the periodic argument, not the whole listing, decides."""
    for pof2, rem, d in itertools.product((256, 1024), (0, 3, 77, 200), (3, 6, 7, 12)):
        step = 1
        while step < pof2:
            expected = _crosses(*exchange_partners(pof2, rem, step), d)
            assert crossings.exchange_crosses(pof2, rem, step, d) == expected, (pof2, rem, d, step)
            step <<= 1


def _paths_by_listing(ranks: int, d: int, broadcast: bool, per_leaf: int = 0) -> set[tuple[int, int, int]]:
    """(intra-node, inside-a-leaf, between-leaves) edge counts of every rank's path, walked edge by
    edge in pure Python (``per_leaf`` ranks under a leaf; 0: no leaf level, every crossing between)."""
    paths = set()
    masks = []
    mask = 1 << (max(ranks - 1, 0).bit_length()) >> 1
    while mask:
        masks.append(mask)
        mask >>= 1

    def level(a: int, b: int) -> int:
        if a // d == b // d:
            return 0
        return 1 if per_leaf and a // per_leaf == b // per_leaf else 2

    for r in range(ranks):
        counts = [0, 0, 0]
        if broadcast:
            for m in masks:
                holder = r & ~(2 * m - 1)
                if holder + m < ranks:
                    counts[level(holder, holder + m)] += 1
        else:
            step = 1
            while step < ranks:
                if r & step:
                    at = r & ~(step - 1)
                    counts[level(at, at - step)] += 1
                step <<= 1
        paths.add((counts[0], counts[1], counts[2]))
    return paths


@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8, 13, 16, 31, 33, 64, 70, 100])
@pytest.mark.parametrize("nodes_per_leaf", [0, 2, 3])
def test_binomial_paths_give_the_heaviest_path_for_any_hop_costs(ranks, broadcast, nodes_per_leaf):
    """With and without a fat tree's leaves (two or three nodes under each), powers of two or not."""
    for d in NODE_SIZES:
        per_leaf = nodes_per_leaf * d
        listed = _paths_by_listing(ranks, d, broadcast, per_leaf)
        paths = crossings.binomial_broadcast_paths if broadcast else crossings.binomial_reduce_paths
        found = paths(ranks, d, per_leaf)
        assert set(found) <= listed  # only real paths
        for seconds in ((1.0, 1.0, 1.0), (1.0, 3.0, 7.0), (7.0, 3.0, 1.0), (0.0, 0.0, 1.0), (1.0, 0.0, 0.0),
                        (0.0, 1.0, 0.0), (2.0, 5.0, 3.0)):  # fmt: skip
            intra_s, near_s, far_s = seconds
            leaf = HopCost(near_s, float("inf")) if nodes_per_leaf else None
            costs = FabricCosts(HopCost(intra_s, float("inf")), HopCost(far_s, float("inf")), d, 1, leaf,
                                nodes_per_leaf)  # fmt: skip
            weights = (intra_s, near_s, far_s)
            heaviest = max(sum(n * w for n, w in zip(path, weights, strict=True)) for path in listed)
            assert crossings.heaviest_path_s(found, costs, 0.0) == heaviest, (ranks, d, seconds)


@pytest.mark.parametrize("ranks", [2, 4, 6, 12, 16, 24, 30, 36, 48, 60])
def test_torus_rings_match_their_transfers(ranks):
    for rows in (r for r in range(1, ranks + 1) if ranks % r == 0):
        cols = ranks // rows
        rank, right, down, _, _ = _links(rows, cols)
        for d in NODE_SIZES:
            assert crossings.row_ring_crosses(rows, cols, d) == _crosses(rank, right, d), (rows, cols, d)
            assert crossings.column_ring_crosses(rows, cols, d) == _crosses(rank, down, d), (rows, cols, d)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "halving_doubling", "binomial_tree", "torus_2d"])
def test_a_closed_form_at_millions_of_ranks_lists_no_ranks(algorithm):
    """The closed form is asked once per gradient bucket: at 2^20 ranks and at 8 x 10^6 (which folds)
    it allocates no per-rank array (before: arrays of every rank, per round, per call; 14-36 s for a
    training step's buckets at 10^6 ranks)."""
    impl = COLLECTIVE_ALGORITHMS.get(algorithm)
    costs = FabricCosts(HopCost(1e-6, 100e9), HopCost(5e-6, 10e9), 8)
    for ranks in (1 << 20, 8 * 10**6):
        tracemalloc.start()
        try:
            for bucket in range(5):
                assert impl.closed_form_s("allreduce", ranks, 1e6 * (bucket + 1), costs) > 0
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < ranks, (algorithm, ranks, peak)  # under one byte per rank
