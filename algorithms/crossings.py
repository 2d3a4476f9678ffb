"""Which hop a closed form charges, found without listing the P transfers of a round.

The closed forms charge a round (or one edge of a path) at the inter-node hop as soon as one of its
transfers joins two nodes, ranks placed in blocks of ``d`` (rank r on node r // d); a round that
also keeps transfers inside nodes at the slower of the two hops (``FabricCosts.mixed``). Listing the
round's transfers costs O(P), and a training step asks the closed form once per gradient bucket, so
a million ranks took seconds per step (``halving_doubling`` 14 s, ``binomial_tree`` 36 s). The
functions here look only at the transfers that can differ:

- a pattern of crossings that repeats with a period (d, or lcm(d, 2 step)) is decided by its first
  period, and the seams where one stretch of a schedule meets the next are checked one by one;
- a path's hop counts under a weighted popcount are maximised by the few candidates of
  "largest number below a bound" (the bound itself, and the bound with one set bit cleared and every
  lower bit set).

Every answer is exact: ``tests/test_crossings.py`` holds each one to the listing on every small case.
Answers are remembered per shape, since a step asks the same shape once per bucket.
"""

from __future__ import annotations

import math
from functools import cache

from ddlsim.algorithms.schedule import FabricCosts, Hop, HopCost


def hop(costs: FabricCosts, crosses: bool) -> Hop:
    """The hop a round is charged at: the intra hop if none of its transfers crosses nodes, else the
    slower of the two (``FabricCosts.mixed``: a crossing round of several devices a node keeps
    transfers inside nodes too)."""
    return costs.mixed if crosses else costs.intra


@cache
def exchange_crosses(pof2: int, rem: int, step: int, d: int) -> bool:
    """Whether a recursive-doubling/halving core round crosses nodes: new rank n exchanges with
    n XOR step, new rank n being rank 2n+1 for n < rem and n+rem after (the fold of
    ``recursive_doubling_collective``).

    A pair is (lo, lo+step) with bit ``step`` of lo clear. Both ends below rem, both at or above rem,
    or one each: in the first two stretches whether a pair crosses repeats with lo's period
    lcm(d, 2 step) (a shift by it moves both ends by whole nodes), so the stretch's first period
    decides; the mixed pairs are fewer than step. With step >= d the pair (0, step) already crosses.
    """
    if pof2 + rem <= d:
        return False
    if d == 1 or step >= d:
        return True

    def actual(n: int) -> int:
        return 2 * n + 1 if n < rem else n + rem

    period = math.lcm(d, 2 * step)
    candidates = (
        *range(0, min(rem, period)),  # both ends in the fold's stretch (and some mixed pairs)
        *range(max(rem - step, 0), rem),  # the mixed pairs
        *range(rem, min(pof2, rem + period)),  # both ends past the fold
    )
    return any(
        actual(lo) // d != actual(lo + step) // d for lo in candidates if not lo & step and lo + step < pof2
    )


def exchange_hop(costs: FabricCosts, pof2: int, rem: int, step: int) -> Hop:
    """The hop a recursive-doubling/halving core round at distance ``step`` is charged at.

    From ``step`` >= d (devices per node) every active rank's partner is on another node, so a
    node's ranks cross at once and share its NICs: the busiest NIC carries ceil(d / nics) of the
    round's transfers each way, as the DES shares it (exact for power-of-two P and d; with the fold
    some ranks idle, an upper bound). A closer round that crosses (blocks not aligned to the step) is
    charged one transfer's time on the slower hop, since its other pairs stay inside nodes."""
    d = costs.devices_per_node
    if not exchange_crosses(pof2, rem, step, d):
        return costs.intra
    return whole_node_crossing(costs) if step >= d else costs.mixed


def whole_node_crossing(costs: FabricCosts) -> HopCost:
    """The inter-node hop of a round in which every device of a node sends across the network at once:
    the node's NICs carry ceil(d / nics) transfers each (devices spread evenly over them), each
    direction on its own, so one transfer takes that many times its bytes' time."""
    shared = -(-costs.devices_per_node // max(costs.nics_per_node, 1))
    if shared <= 1:
        return costs.inter
    return HopCost(costs.inter.alpha_s, costs.inter.beta_Bps / shared)


def fold_crosses(rem: int, d: int) -> bool:
    """Whether the fold's pairs (2i, 2i+1), i < rem, cross nodes: 2i+1 must be a multiple of d, which
    takes an odd d and i = (d-1)/2 < rem (d = 1: every pair)."""
    return rem > 0 and d % 2 == 1 and (d - 1) // 2 < rem


def _weighted_popcount_candidates(bound: int) -> tuple[int, ...]:
    """Numbers among which any nonnegatively weighted popcount over [0, bound] peaks: bound, and bound
    with one set bit cleared and all bits below it set."""
    bits = (1 << k for k in range(bound.bit_length()))
    return (bound, *((bound & ~bit) | (bit - 1) for bit in bits if bound & bit))


@cache
def binomial_reduce_paths(ranks: int, d: int) -> tuple[tuple[int, int], ...]:
    """(intra-node edges, inter-node edges) of the leaf-to-root paths of a binomial reduce over
    ``ranks`` that can be the heaviest, whatever the two hops cost.

    Rank r climbs one edge per set bit, lowest first, from ``at`` (r with the lower bits cleared) to
    at - bit. With d a power of two 2^j that edge crosses nodes iff the bit is >= d: the path has
    popcount(r mod d) intra and popcount(r >> j) inter edges, a weighted popcount. Other d: every
    path is counted (O(P log P), once per shape)."""
    if d & (d - 1) == 0:
        shift = d.bit_length() - 1
        candidates = _weighted_popcount_candidates(ranks - 1)
        return tuple(sorted({(bin(r & (d - 1)).count("1"), bin(r >> shift).count("1")) for r in candidates}))
    import numpy as np  # only for the rare non-power-of-two node size

    rank = np.arange(ranks, dtype=np.int64)
    intra, inter = np.zeros(ranks, dtype=np.int64), np.zeros(ranks, dtype=np.int64)
    step = 1
    while step < ranks:
        at = rank & ~(step - 1)
        climbs = (rank & step) != 0
        crosses = at // d != (at - step) // d
        inter += climbs & crosses
        intra += climbs & ~crosses
        step <<= 1
    return tuple(sorted({(int(a), int(b)) for a, b in np.unique(np.stack([intra, inter], axis=1), axis=0)}))


@cache
def binomial_broadcast_paths(ranks: int, d: int) -> tuple[tuple[int, int], ...]:
    """(intra-node sends, inter-node sends) on the root-to-leaf paths of a binomial broadcast that can
    be the heaviest: every holder on r's way sends once per remaining round.

    With d a power of two a send at distance ``mask`` crosses iff mask >= d, whoever sends, and the
    root sends in every round, so the root's path (all rounds) is the heaviest. Other d: every path
    is counted (O(P log P), once per shape)."""
    from ddlsim.algorithms.binomial_tree_collective import broadcast_masks  # here: it imports this module

    masks = list(broadcast_masks(ranks))
    if d & (d - 1) == 0:
        inter = sum(1 for m in masks if m >= d)
        return ((len(masks) - inter, inter),)
    import numpy as np  # only for the rare non-power-of-two node size

    rank = np.arange(ranks, dtype=np.int64)
    intra, inter_count = np.zeros(ranks, dtype=np.int64), np.zeros(ranks, dtype=np.int64)
    for m in masks:
        holder = rank & ~(2 * m - 1)
        sends = holder + m < ranks
        crosses = holder // d != (holder + m) // d
        inter_count += sends & crosses
        intra += sends & ~crosses
    pairs = np.unique(np.stack([intra, inter_count], axis=1), axis=0)
    return tuple(sorted({(int(a), int(b)) for a, b in pairs}))


def heaviest_path_s(paths: tuple[tuple[int, int], ...], costs: FabricCosts, nbytes: float) -> float:
    """The longest of ``paths`` (intra edges, inter edges), each edge moving ``nbytes``."""
    intra, inter = costs.intra.time(nbytes), costs.inter.time(nbytes)
    return max(a * intra + b * inter for a, b in paths)


@cache
def row_ring_crosses(rows: int, cols: int, d: int) -> bool:
    """Whether a ring around each row of a rows x cols grid (rank i*cols + j) crosses nodes: some row
    spans two nodes. Row i's span repeats with i's period d / gcd(cols, d), so d rows decide."""
    return cols > 1 and any(i * cols // d != ((i + 1) * cols - 1) // d for i in range(min(rows, d)))


@cache
def column_ring_crosses(rows: int, cols: int, d: int) -> bool:
    """Whether a ring down each column (rank r to r + cols, the last row back to row 0) crosses nodes.
    With cols >= d the pair (0, cols) crosses; otherwise the pairs r -> r + cols repeat with r's
    period d, and the cols wrap-around pairs are checked one by one."""
    if rows < 2:
        return False
    if cols >= d:
        return True
    ranks = rows * cols
    down = any(r // d != (r + cols) // d for r in range(min(ranks - cols, d)))
    return down or any(((rows - 1) * cols + j) // d != j // d for j in range(cols))
