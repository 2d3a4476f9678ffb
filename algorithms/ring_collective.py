"""Ring collectives (Patarasuk & Yuan 2009; the algorithm of Baidu's ring all-reduce and NCCL's ring).

P ranks in a ring r -> r+1 (mod P), the buffer cut into P chunks::

    reduce-scatter, step s = 0..P-2: rank r sends chunk (r - s) mod P to r+1, which adds it in;
        afterwards rank r holds the full sum of chunk (r + 1) mod P.
    all-gather,     step s = 0..P-2: rank r sends its newest complete chunk to r+1, which copies it.

All-reduce is reduce-scatter then all-gather: 2(P-1) steps of S/P bytes each.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, check_ranks


def _steps(ranks: int, first_chunk_offset: int, op: int, count: int):
    """``count`` ring steps; in step s rank r sends chunk (r + first_chunk_offset - s) mod P."""
    import numpy as np  # here, not above: the closed form's path starts without numpy

    src = np.arange(ranks, dtype=np.int64)
    dst = (src + 1) % ranks
    ops = np.full(ranks, op, dtype=np.int64)
    ones = np.ones(ranks, dtype=np.int64)
    for step in range(count):
        offset = first_chunk_offset - step
        yield Round.lazy(src, dst, ones, ops, lambda offset=offset: (src + offset) % ranks)


class RingCollective:
    name = "ring"
    collectives: tuple[str, ...] = ("allreduce", "reduce_scatter", "allgather")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options)
        check_ranks(self.name, ranks)
        steps = ranks - 1

        def rounds():
            if collective in ("allreduce", "reduce_scatter"):
                yield from _steps(ranks, 0, REDUCE, steps)
            if collective == "allreduce":
                yield from _steps(ranks, 1, COPY, steps)
            if collective == "allgather":
                yield from _steps(ranks, 0, COPY, steps)

        owned = tuple(((r + 1) % ranks, (r + 1) % ranks + 1) for r in range(ranks))
        return Schedule(self.name, collective, ranks, ranks, rounds, owned_chunks=owned)

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Ring time: every step moves S/P bytes over every hop, so the slowest hop paces all steps.

        allreduce: 2(P-1) * (alpha + S/(P beta)); reduce_scatter and allgather: (P-1) * (...).
        E.g. P=4, S=4 MB, alpha=1 us, beta=1 GB/s: 6 * (1e-6 + 1e6/1e9) = 6.006e-3 s.
        """
        check_collective(self, collective)
        steps = (ranks - 1) * (2 if collective == "allreduce" else 1)
        return steps * costs.worst(ranks).time(message_bytes / ranks) if ranks > 1 else 0.0


COLLECTIVE_ALGORITHMS.register("ring")(RingCollective())
