"""Pipelined chain broadcast and reduce: the ring without its closing link, as NCCL broadcasts.

Ranks form a chain 0 -> 1 -> ... -> P-1 (root 0). The buffer is cut into ``chunks`` = C pieces
(default 1, no pipelining); in round t rank i forwards piece t - i, so the chain fills, streams
and drains in P - 1 + C - 1 rounds::

    round      0    1    2    3           (P = 4, C = 2)
    0 -> 1     p0   p1
    1 -> 2          p0   p1
    2 -> 3               p0   p1

Reduce runs the same chain towards rank 0 (piece t - (P-1-i) leaves rank i, which adds in what it
received). NCCL's ring broadcast is this pipeline; MPICH uses it for long messages only as part of
scatter + allgather, so it is offered here as the pipelined alternative to ``binomial_tree``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, positive_int_option, reject_options
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


class ChainCollective:
    name = "chain"
    collectives: tuple[str, ...] = ("broadcast", "reduce")
    options = ("chunks",)

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        chunks = positive_int_option(self.name, options, "chunks")

        def rounds() -> Iterator[Round]:
            # round t streams piece t - d over the link d hops from the root (d = near, or ranks - 2 -
            # near for reduce), for the at most ``chunks`` links with 0 <= t - d < chunks: only those
            # are built (a round costs its live links, not the chain's length)
            last = ranks - 2
            for t in range(ranks - 1 + chunks - 1):
                if collective == "broadcast":  # link near -> near + 1, near hops from the root
                    near = np.arange(max(t - chunks + 1, 0), min(t, last) + 1, dtype=np.int64)
                    piece = t - near
                    yield Round(near, near + 1, piece, piece + 1, np.full(near.size, COPY, dtype=np.int64))
                else:  # link near + 1 -> near, last - near hops from the chain's far end
                    near = np.arange(max(last - t, 0), min(last - t + chunks - 1, last) + 1, dtype=np.int64)
                    piece = t - (last - near)
                    yield Round(near + 1, near, piece, piece + 1, np.full(near.size, REDUCE, dtype=np.int64))

        return Schedule(self.name, collective, ranks, chunks, rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """A pipeline: every link once, plus C-1 more pieces through the slowest link.

        With N = ceil(P / devices_per_node) nodes, the chain crosses N-1 node boundaries:
        (P - N) t_intra + (N - 1) t_inter + (C - 1) t_slowest, t = alpha + S/(C beta); under a fat
        tree's L leaves, N - L of the node boundaries are inside a leaf (t_leaf) and L - 1 between them.
        Uniform fabric: (P - 1 + C - 1) (alpha + S/(C beta)). E.g. P=4, C=2, S=2 MB, alpha=1 us,
        beta=1 GB/s: 4 * (1e-6 + 1e-3) = 4.004e-3 s.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        chunks = positive_int_option(self.name, options, "chunks")
        if ranks == 1:
            return 0.0
        piece = message_bytes / chunks
        nodes = -(-ranks // costs.devices_per_node)
        leaves = -(-nodes // costs.nodes_per_leaf) if costs.nodes_per_leaf else nodes
        links = (ranks - nodes) * costs.intra.time(piece) + (nodes - leaves) * costs.near.time(piece)
        links += (leaves - 1) * costs.inter.time(piece)
        return links + (chunks - 1) * costs.worst(ranks).time(piece)


COLLECTIVE_ALGORITHMS.register("chain")(ChainCollective())
