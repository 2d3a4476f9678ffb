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

from ddlsim.algorithms.schedule import FabricCosts, Hop


def hop(costs: FabricCosts, crosses: bool, crosses_leaves: bool | None = None) -> Hop:
    """The hop a round of one transfer a rank is charged at: the intra hop if none of its transfers
    crosses nodes, else the slower of it and the network hop (``FabricCosts.mixed``: a crossing round
    of several devices a node keeps transfers inside nodes too). Under a fat tree's leaves, a round
    none of whose transfers leaves its leaf (``crosses_leaves`` False) is charged at the hop inside a
    leaf; None: assume one does."""
    if not crosses:
        return costs.intra
    if crosses_leaves is not False or not costs.ranks_per_leaf:
        return costs.mixed
    return costs.mixed_in_leaf


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
    some ranks idle, an upper bound). Under a fat tree's leaves the same holds one level up: from the
    ranks of a leaf on, every transfer leaves its leaf and shares the leaf's uplink with all of them
    (``FabricCosts.crossing``). A closer round that crosses (blocks not aligned to the step) is
    charged one transfer's time on the slower hop, since its other pairs stay inside nodes."""
    d = costs.devices_per_node
    if not exchange_crosses(pof2, rem, step, d):
        return costs.intra
    if step < d:
        return costs.mixed
    per_leaf = costs.ranks_per_leaf
    leaving = per_leaf if per_leaf and exchange_crosses(pof2, rem, step, per_leaf) else 0
    return whole_node_crossing(costs, leaving)


def whole_node_crossing(costs: FabricCosts, leaving: int = 0) -> Hop:
    """The network hop of a round in which every device of a node sends across the network at once:
    the node's NICs carry ceil(d / nics) transfers each (devices spread evenly over them), each
    direction on its own, so one transfer takes that many times its bytes' time; ``leaving`` of each
    leaf's transfers also share its uplink (0: none leaves a leaf, or no leaf level)."""
    shared = -(-costs.devices_per_node // max(costs.nics_per_node, 1))
    return costs.crossing(shared, leaving)


def fold_crosses(rem: int, d: int) -> bool:
    """Whether the fold's pairs (2i, 2i+1), i < rem, cross nodes: 2i+1 must be a multiple of d, which
    takes an odd d and i = (d-1)/2 < rem (d = 1: every pair)."""
    return rem > 0 and d % 2 == 1 and (d - 1) // 2 < rem


def fold_hop(costs: FabricCosts, rem: int) -> Hop:
    """The hop of the fold's pre- and post-step (pairs (2i, 2i+1), i < rem): the intra hop unless a
    pair crosses nodes (``fold_crosses``), then the slower of it and the network hop (inside a leaf
    unless a pair also crosses leaves)."""
    per_leaf = costs.ranks_per_leaf
    return hop(costs, fold_crosses(rem, costs.devices_per_node), fold_crosses(rem, per_leaf) if per_leaf else None)


def _weighted_popcount_candidates(bound: int) -> tuple[int, ...]:
    """Numbers among which any nonnegatively weighted popcount over [0, bound] peaks: bound, and bound
    with one set bit cleared and all bits below it set."""
    bits = (1 << k for k in range(bound.bit_length()))
    return (bound, *((bound & ~bit) | (bit - 1) for bit in bits if bound & bit))


def _levels(d: int, per_leaf: int) -> tuple[int, int]:
    """Node and leaf block sizes of ranks placed in blocks (a leaf level of 0: the node's size, so
    that nothing counts as crossing within a leaf)."""
    return d, per_leaf or d


@cache
def binomial_reduce_paths(ranks: int, d: int, per_leaf: int = 0) -> tuple[tuple[int, int, int], ...]:
    """(intra-node, inside-a-leaf, between-leaves) edges of the leaf-to-root paths of a binomial
    reduce over ``ranks`` that can be the heaviest, whatever the hops cost (``per_leaf``: ranks under
    one leaf switch, 0 without a leaf level: every inter-node edge then counts as between leaves).

    Rank r climbs one edge per set bit, lowest first, from ``at`` (r with the lower bits cleared) to
    at - bit. With d and the leaf's ranks powers of two that edge stays in the node iff the bit is
    below d, and in the leaf iff it is below the leaf's ranks: a weighted popcount. Otherwise every
    path is counted (O(P log P), once per shape)."""
    node, leaf = _levels(d, per_leaf)
    if node & (node - 1) == 0 and leaf & (leaf - 1) == 0:
        node_bits, leaf_bits = node - 1, leaf - 1
        candidates = _weighted_popcount_candidates(ranks - 1)
        return tuple(sorted({
            (bin(r & node_bits).count("1"), bin(r & leaf_bits & ~node_bits).count("1"), bin(r & ~leaf_bits).count("1"))
            for r in candidates
        }))  # fmt: skip
    import numpy as np  # only for the rare non-power-of-two node or leaf size

    rank = np.arange(ranks, dtype=np.int64)
    counts = np.zeros((ranks, 3), dtype=np.int64)
    step = 1
    while step < ranks:
        at = rank & ~(step - 1)
        climbs = (rank & step) != 0
        level = _level(at, at - step, node, leaf, per_leaf)
        for index in range(3):
            counts[:, index] += climbs & (level == index)
        step <<= 1
    return tuple(sorted({tuple(int(c) for c in row) for row in np.unique(counts, axis=0)}))  # type: ignore[misc]


def _level(a, b, node: int, leaf: int, per_leaf: int):
    """0 where ranks a and b share a node, 1 where they share a leaf only, 2 otherwise (arrays)."""
    import numpy as np

    same_leaf = (a // leaf == b // leaf) if per_leaf else np.zeros(np.shape(a), dtype=bool)
    return np.where(a // node == b // node, 0, np.where(same_leaf, 1, 2))


@cache
def binomial_broadcast_paths(ranks: int, d: int, per_leaf: int = 0) -> tuple[tuple[int, int, int], ...]:
    """(intra-node, inside-a-leaf, between-leaves) sends on the root-to-leaf paths of a binomial
    broadcast that can be the heaviest: every holder on r's way sends once per remaining round.

    With d and the leaf's ranks powers of two a send at distance ``mask`` stays in the node iff
    mask < d and in the leaf iff mask is below its ranks, whoever sends, and the root sends in every
    round, so the root's path (all rounds) is the heaviest. Otherwise every path is counted
    (O(P log P), once per shape)."""
    from ddlsim.algorithms.binomial_tree_collective import broadcast_masks  # here: it imports this module

    masks = list(broadcast_masks(ranks))
    node, leaf = _levels(d, per_leaf)
    if node & (node - 1) == 0 and leaf & (leaf - 1) == 0:
        within = sum(1 for m in masks if m < node)
        far = sum(1 for m in masks if m >= leaf) if per_leaf else len(masks) - within
        return ((within, len(masks) - within - far, far),)
    import numpy as np  # only for the rare non-power-of-two node or leaf size

    rank = np.arange(ranks, dtype=np.int64)
    counts = np.zeros((ranks, 3), dtype=np.int64)
    for m in masks:
        holder = rank & ~(2 * m - 1)
        sends = holder + m < ranks
        level = _level(holder, holder + m, node, leaf, per_leaf)
        for index in range(3):
            counts[:, index] += sends & (level == index)
    return tuple(sorted({tuple(int(c) for c in row) for row in np.unique(counts, axis=0)}))  # type: ignore[misc]


def heaviest_path_s(paths: tuple[tuple[int, int, int], ...], costs: FabricCosts, nbytes: float) -> float:
    """The longest of ``paths`` (intra-node, inside-a-leaf, between-leaves edges), each edge moving
    ``nbytes``."""
    intra, near, far = costs.intra.time(nbytes), costs.near.time(nbytes), costs.inter.time(nbytes)
    return max(a * intra + b * near + c * far for a, b, c in paths)


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
