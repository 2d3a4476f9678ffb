"""Double binary tree allreduce, as NCCL 2.4 builds it (Sanders, Speck & Träff 2009; NCCL's trees.cc).

Two binary trees span the nodes; each carries half of the buffer, reduced up its tree and broadcast
back down. The trees are complementary: tree B is tree A mirrored (r -> N-1-r, N even) or shifted by
one (r -> r+1 mod N, N odd), so a node that is a leaf in one tree is interior in the other and every
node sends and receives about the same amount in total. Tree A is NCCL's in-order tree on node ids
(root 0 with the single child 2^floor(log2(N-1)); the parent of r clears r's lowest set bit and sets
the next one up, or just clears it if that falls outside the nodes)::

    N = 8, tree A          tree B (mirrored)
    0                      7
     \\                     /
      4                   3
     / \\                 / \\
    2   6               5   1
   / \\ / \\             / \\ / \\
  1  3 5  7            6  4 2  0

Within a node (``devices_per_node`` > 1) the devices form a chain ending at the node's first device,
the node's representative in the trees, as in NCCL. Phases: chain reduce, trees (reduce up and
broadcast down), chain broadcast. With ``chunks=C`` each tree's half is cut into C pieces that are
pipelined through each phase (NCCL pipelines; the default C=1 is the textbook unpipelined tree).
The root turns each piece around as soon as it is reduced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, positive_int_option, reject_options
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, ScheduleError, check_ranks


def btree_parents(nodes: int) -> np.ndarray:
    """NCCL's tree A over ``nodes`` ids: parent of each id, -1 for the root 0."""
    rank = np.arange(nodes, dtype=np.int64)
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    up = np.where(up >= nodes, rank ^ bit, up)
    up[0] = -1
    return up


def dtree_parents(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents in tree A and in its complement B (mirror for even ``nodes``, shift for odd)."""
    a = btree_parents(nodes)
    ids = np.arange(nodes, dtype=np.int64)
    if nodes % 2 == 0:
        pa = a[nodes - 1 - ids]
        b = np.where(pa < 0, -1, nodes - 1 - pa)
    else:
        pa = a[(ids - 1) % nodes]
        b = np.where(pa < 0, -1, (pa + 1) % nodes)
    return a, b


def depths_and_heights(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth (edges from the root) and height (edges down to the deepest leaf) of every node."""
    n = parents.size
    depth = np.zeros(n, dtype=np.int64)
    cur = parents.copy()
    while (cur >= 0).any():
        live = cur >= 0
        depth[live] += 1
        cur[live] = parents[cur[live]]
    height = np.zeros(n, dtype=np.int64)
    for level in range(int(depth.max()) if n else 0, 0, -1):
        child = np.flatnonzero(depth == level)
        np.maximum.at(height, parents[child], height[child] + 1)
    return depth, height


def tree_height(nodes: int) -> int:
    """Height of NCCL's tree over ``nodes`` ids, ceil(log2(nodes)) (the complement has the same shape)."""
    return int(depths_and_heights(btree_parents(nodes))[0].max()) if nodes > 1 else 0


def _tree_rounds(parents: np.ndarray, chunks: int, offset: int) -> list[list[tuple]]:
    """Per round, the (src, dst, chunk, op) arrays of one pipelined tree: reduce up, broadcast down.

    A node of height h sends piece c up in round c + h; the root (height H) has piece c complete
    after round c + H - 1, and a node at depth d sends piece c down in round c + H + d.
    """
    depth, height = depths_and_heights(parents)
    root = int(np.flatnonzero(parents < 0)[0])
    top = int(height[root])
    child = np.flatnonzero(parents >= 0)
    rounds: list[list[tuple]] = [[] for _ in range(2 * top + chunks - 1)]
    for t in range(len(rounds)):
        piece = t - height[child]
        up = (piece >= 0) & (piece < chunks)
        if up.any():
            rounds[t].append((child[up], parents[child[up]], piece[up] + offset, REDUCE))
        piece = t - top - depth[parents[child]]
        down = (piece >= 0) & (piece < chunks)
        if down.any():
            rounds[t].append((parents[child[down]], child[down], piece[down] + offset, COPY))
    return rounds


def _chain_rounds(ranks: int, local: int, chunks: int, reduce: bool) -> Iterator[Round]:
    """Pipelined chains inside every node; both trees' pieces travel together, two transfers each."""
    links = local - 1
    base = np.arange(0, ranks, local, dtype=np.int64)
    previous = None
    for t in range(links + chunks - 1):
        position = np.arange(1, local, dtype=np.int64)  # link from position-1 to position
        piece = t - (links - position) if reduce else t - (position - 1)
        live = (piece >= 0) & (piece < chunks)
        far = (base[:, None] + position[live][None, :]).ravel()
        near = far - 1
        lo = np.tile(piece[live], base.size)
        src, dst = (far, near) if reduce else (near, far)
        previous = _sharing(
            previous,
            np.concatenate([src, src]),
            np.concatenate([dst, dst]),
            np.concatenate([lo, lo + chunks]),
            np.full(2 * src.size, REDUCE if reduce else COPY),
        )
        yield previous


def _sharing(previous: Round | None, src: np.ndarray, dst: np.ndarray, lo: np.ndarray, op: np.ndarray) -> Round:
    """The round of these one-piece transfers, handing out ``previous``'s src, dst, chunk count and op
    arrays where they are equal: a pipeline's steady state repeats the same transfers with the next
    pieces, and executors recognise repeated rounds by these arrays (``ScheduleRuns``)."""
    if (
        previous is not None
        and np.array_equal(previous.src, src)
        and np.array_equal(previous.dst, dst)
        and np.array_equal(previous.op, op)
    ):
        return Round(previous.src, previous.dst, lo, lo + 1, previous.op, chunk_count=previous.chunk_count)
    return Round.of(src, dst, lo, lo + 1, op)


def _local_size(ranks: int, devices_per_node: int) -> int:
    local = min(devices_per_node, ranks)
    if ranks % local:
        raise ScheduleError(
            f"double_binary_tree: ranks ({ranks}) must be a multiple of devices_per_node "
            f"({devices_per_node}) so that every node has the same chain, or fit in one node"
        )
    return local


class DoubleBinaryTreeCollective:
    name = "double_binary_tree"
    collectives: tuple[str, ...] = ("allreduce",)
    options = ("chunks",)

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        chunks = positive_int_option(self.name, options, "chunks")
        local = _local_size(ranks, devices_per_node)
        nodes = ranks // local

        def rounds() -> Iterator[Round]:
            if local > 1:
                yield from _chain_rounds(ranks, local, chunks, reduce=True)
            if nodes > 1:
                tree_a, tree_b = dtree_parents(nodes)
                per_tree = [_tree_rounds(tree_a, chunks, 0), _tree_rounds(tree_b, chunks, chunks)]
                previous = None
                for t in range(max(len(r) for r in per_tree)):
                    parts = [p for r in per_tree if t < len(r) for p in r[t]]
                    src = np.concatenate([p[0] for p in parts]) * local
                    dst = np.concatenate([p[1] for p in parts]) * local
                    lo = np.concatenate([p[2] for p in parts])
                    op = np.concatenate([np.full(p[0].size, p[3]) for p in parts])
                    previous = _sharing(previous, src, dst, lo, op)
                    yield previous
            if local > 1:
                yield from _chain_rounds(ranks, local, chunks, reduce=False)

        return Schedule(self.name, collective, ranks, 2 * chunks, rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Pipelined chain + double tree: every step moves one piece of S/(2C) bytes.

        With D = min(devices_per_node, P) devices per node, N = P/D nodes, H = ceil(log2 N) the
        trees' height (root 0 has a single child) and C pieces: 2 (D-1 + C-1) intra-node steps (chain
        reduce and broadcast, when D > 1) plus 2H + C - 1 inter-node steps (trees, when N > 1), each
        alpha + S/(2C beta) at its hop. E.g. P=8, D=1, S=2 MB, C=1, alpha=1 us, beta=1 GB/s: H=3,
        6 * (1e-6 + 1e-3) = 6.006e-3 s; with C=4: 9 * (1e-6 + 0.25e-3) = 2.259e-3 s.
        Exact: all transfers of a phase cross the same kind of hop and carry the same bytes, so the
        phase runs in lock step.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        chunks = positive_int_option(self.name, options, "chunks")
        local = _local_size(ranks, costs.devices_per_node)
        nodes = ranks // local
        piece = message_bytes / (2 * chunks)
        total = 0.0
        if local > 1:
            total += 2 * (local - 1 + chunks - 1) * costs.intra.time(piece)
        if nodes > 1:
            total += (2 * (nodes - 1).bit_length() + chunks - 1) * costs.inter.time(piece)  # H = ceil(log2 N)
        return total


COLLECTIVE_ALGORITHMS.register("double_binary_tree")(DoubleBinaryTreeCollective())
