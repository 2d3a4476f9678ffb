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
            near = np.arange(ranks - 1, dtype=np.int64)  # link near -> near + 1
            for t in range(ranks - 1 + chunks - 1):
                piece = t - near if collective == "broadcast" else t - (ranks - 2 - near)
                live = (piece >= 0) & (piece < chunks)
                if collective == "broadcast":
                    yield Round.of(near[live], near[live] + 1, piece[live], piece[live] + 1, COPY)
                else:
                    yield Round.of(near[live] + 1, near[live], piece[live], piece[live] + 1, REDUCE)

        return Schedule(self.name, collective, ranks, chunks, rounds)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """A pipeline: every link once, plus C-1 more pieces through the slowest link.

        With N = ceil(P / devices_per_node) nodes, the chain crosses N-1 node boundaries:
        (P - N) t_intra + (N - 1) t_inter + (C - 1) t_slowest, t = alpha + S/(C beta).
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
        links = (ranks - nodes) * costs.intra.time(piece) + (nodes - 1) * costs.inter.time(piece)
        return links + (chunks - 1) * costs.worst(ranks).time(piece)


COLLECTIVE_ALGORITHMS.register("chain")(ChainCollective())
