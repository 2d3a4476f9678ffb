"""Top-k sparsified allreduce: every rank's top-k (value, index) pairs reach every rank by a ring allgather.

Gradient sparsification as in Aji & Heafield 2017 and Lin et al. 2018 (Deep Gradient Compression),
with the allgather exchange those works and Horovod's sparse path use: sparse contributions from
different ranks have different indices and cannot be summed on the way, so each rank's contribution
travels whole, and the bytes per rank grow with P (unlike a dense ring allreduce).

Each rank keeps ``density`` x (S / ``value_bytes``) elements and sends a value and a 4-byte index for
each. The schedule is a ring allgather of P contributions (chunk r = rank r's contribution);
``payload_factor`` = P x density x (value_bytes + 4) / value_bytes makes ``transfer_bytes`` of one
chunk equal one contribution. Symbolically it is checked as an allgather (``contract``): every rank
ends holding every rank's contribution, which it then sums locally.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.schedule import COPY, FabricCosts, Round, Schedule, ScheduleError, check_ranks

INDEX_BYTES = 4


def _settings(options: dict[str, Any]) -> tuple[float, int]:
    density = options.get("density", 0.01)
    value_bytes = options.get("value_bytes", 4)
    if isinstance(density, bool) or not isinstance(density, int | float) or not 0 < density <= 1:
        raise ScheduleError(f"topk_sparse: density must be in (0, 1], got {density!r}")
    if isinstance(value_bytes, bool) or not isinstance(value_bytes, int) or value_bytes < 1:
        raise ScheduleError(f"topk_sparse: value_bytes must be a positive integer, got {value_bytes!r}")
    return float(density), value_bytes


def contribution_bytes(message_bytes: float, density: float = 0.01, value_bytes: int = 4) -> float:
    """Bytes of one rank's sparse contribution: density x elements x (value + index bytes)."""
    return density * message_bytes / value_bytes * (value_bytes + INDEX_BYTES)


class TopkSparseCollective:
    name = "topk_sparse"
    collectives: tuple[str, ...] = ("allreduce",)
    options = ("density", "value_bytes")

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        density, value_bytes = _settings(options)

        def rounds() -> Iterator[Round]:
            src = np.arange(ranks, dtype=np.int64)
            dst = (src + 1) % ranks
            one, ops = np.ones(ranks, dtype=np.int64), np.full(ranks, COPY, dtype=np.int64)
            for step in range(ranks - 1):  # rank r forwards the contribution it received last
                yield Round.lazy(src, dst, one, ops, lambda s=step: (src - s) % ranks)

        factor = ranks * contribution_bytes(1.0, density, value_bytes)
        return Schedule(self.name, collective, ranks, ranks, rounds, payload_factor=factor, contract="allgather")

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Ring allgather of P contributions of B = density S (v+4)/v bytes: (P-1) (alpha + B/beta).

        Every step is paced by the slowest hop in the ring. E.g. P=4, S=100 MB of fp32 (v=4),
        density 0.01, alpha=1 us, beta=1 GB/s: B = 2 MB, 3 * (1e-6 + 2e-3) = 6.003e-3 s.
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        density, value_bytes = _settings(options)
        if ranks == 1:
            return 0.0
        return (ranks - 1) * costs.worst(ranks).time(contribution_bytes(message_bytes, density, value_bytes))


COLLECTIVE_ALGORITHMS.register("topk_sparse")(TopkSparseCollective())
