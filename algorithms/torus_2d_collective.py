"""2D-torus allreduce (Mikami et al. 2018, "Massively distributed SGD: ImageNet/ResNet-50 training in
a flash"): ranks in a grid of ``rows`` x ``cols`` (rank r at row r // cols, column r % cols)::

    cols = 4 ->   0  1  2  3      1. reduce-scatter along each row (ring, S/cols per step)
                  4  5  6  7      2. allreduce along each column of the piece a rank owns (ring)
                  8  9 10 11      3. allgather along each row (ring, S/cols per step)

The buffer is cut into cols parts of rows chunks each (P chunks, part p = chunks p*rows..). After
step 1 the rank in column i owns part (i+1) mod cols; step 2 reduces that part across the rows in
chunks of S/P. Option ``rows`` (must divide P); by default a row is one node (cols =
devices_per_node, when that is > 1 and divides P) so rows stay inside nodes and columns cross them,
otherwise the factorisation nearest to a square (rows >= cols).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS, check_collective, reject_options
from ddlsim.algorithms.crossings import column_ring_crosses, hop, row_ring_crosses, whole_node_crossing
from ddlsim.algorithms.schedule import COPY, REDUCE, FabricCosts, Round, Schedule, ScheduleError, check_ranks


def default_rows(ranks: int, devices_per_node: int) -> int:
    """Rows of the default grid: one node per row if that tiles P, else the most square factorisation
    with rows >= cols: a row then runs along the torus's last (fastest-varying, shortest) extent, as
    ``simulator.engine.fabric.torus_shape`` lays a non-square torus out, so both rings stay neighbours
    on a 2D torus of the same shape (131,072 = 512 x 256)."""
    if 1 < devices_per_node < ranks and ranks % devices_per_node == 0:
        return ranks // devices_per_node
    return ranks // max(d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0)


def grid(ranks: int, devices_per_node: int, options: dict[str, Any]) -> tuple[int, int]:
    """(rows, cols) for ``ranks`` ranks, validating the ``rows`` option."""
    rows = options.get("rows")
    if rows is None:
        rows = default_rows(ranks, devices_per_node)
    if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1 or ranks % rows:
        divisors = ", ".join(str(d) for d in range(1, ranks + 1) if ranks % d == 0)
        raise ScheduleError(
            f"torus_2d: rows must be a positive integer dividing ranks ({ranks}), got {rows!r}; valid: {divisors}"
        )
    return int(rows), ranks // int(rows)


def _links(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rank, row neighbour, column neighbour, column, row) arrays of the grid."""
    rank = np.arange(rows * cols, dtype=np.int64)
    row, col = rank // cols, rank % cols
    return rank, row * cols + (col + 1) % cols, ((row + 1) % rows) * cols + col, col, row


def _rounds(rows: int, cols: int) -> Iterator[Round]:
    """Lazy rounds sharing src/dst/count/op arrays within a phase, as ``ring_collective`` does."""
    rank, right, down, col, row = _links(rows, cols)
    part_size = np.full(rank.size, rows, dtype=np.int64)
    one = np.ones(rank.size, dtype=np.int64)
    reduce, copy = np.full(rank.size, REDUCE, dtype=np.int64), np.full(rank.size, COPY, dtype=np.int64)
    owned = (col + 1) % cols
    for step in range(cols - 1):  # row reduce-scatter of parts
        yield Round.lazy(rank, right, part_size, reduce, lambda s=step: ((col - s) % cols) * rows)
    for step in range(rows - 1):  # column ring reduce-scatter of the owned part's chunks
        yield Round.lazy(rank, down, one, reduce, lambda s=step: owned * rows + (row - s) % rows)
    for step in range(rows - 1):  # column ring allgather
        yield Round.lazy(rank, down, one, copy, lambda s=step: owned * rows + (row + 1 - s) % rows)
    for step in range(cols - 1):  # row allgather of parts
        yield Round.lazy(rank, right, part_size, copy, lambda s=step: ((col + 1 - s) % cols) * rows)


class Torus2dCollective:
    name = "torus_2d"
    collectives: tuple[str, ...] = ("allreduce",)
    options = ("rows",)

    def schedule(self, collective: str, ranks: int, *, devices_per_node: int = 1, **options: Any) -> Schedule:
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        rows, cols = grid(ranks, devices_per_node, options)
        return Schedule(self.name, collective, ranks, ranks, lambda: _rounds(rows, cols))

    def closed_form_s(
        self, collective: str, ranks: int, message_bytes: float, costs: FabricCosts, **options: Any
    ) -> float:
        """Two ring phases on rows, one ring allreduce on columns:

        2 (cols-1) (alpha_row + S/(cols beta_row)) + 2 (rows-1) (alpha_col + S/(P beta_col)), each
        ring paced by its slowest hop. E.g. P=8 as 2 x 4 on one kind of hop, S=8 MB, alpha=1 us,
        beta=1 GB/s: 6 * (1e-6 + 2e-3) + 2 * (1e-6 + 1e-3) = 14.008e-3 s.
        Exact when devices_per_node divides the row length or the row length divides
        devices_per_node (the default grid); otherwise an upper bound (see docs/collectives.md).
        """
        check_collective(self, collective)
        reject_options(self.name, options, self.options)
        check_ranks(self.name, ranks)
        rows, cols = grid(ranks, costs.devices_per_node, options)
        d, per_leaf = costs.devices_per_node, costs.ranks_per_leaf
        total = 0.0
        if cols > 1:
            leaves = row_ring_crosses(rows, cols, per_leaf) if per_leaf else None
            row = hop(costs, row_ring_crosses(rows, cols, d), leaves)
            total += 2 * (cols - 1) * row.time(message_bytes / cols)
        if rows > 1:
            # a column ring with rows at least a node long sends every device of a node across at once,
            # and the last min(cols, ranks of a leaf) ranks of each leaf out of it
            crosses = column_ring_crosses(rows, cols, d)
            leaves = column_ring_crosses(rows, cols, per_leaf) if per_leaf else None
            if crosses and cols >= d:
                column = whole_node_crossing(costs, min(cols, per_leaf) if leaves else 0)
            else:
                column = hop(costs, crosses, leaves)
            total += 2 * (rows - 1) * column.time(message_bytes / ranks)
        return total


COLLECTIVE_ALGORITHMS.register("torus_2d")(Torus2dCollective())
