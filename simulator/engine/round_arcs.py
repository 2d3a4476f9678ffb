"""A torus round as arcs: what the round executor needs per link and per flow, without a link per hop.

In a round of recursive doubling or halving-doubling on a torus every transfer makes the same number
of hops in each dimension (``fabric.TorusRound``), so its route there is an arc: that many
consecutive links of one ring, one way round. At 131,072 ranks the rounds make 10^8 hops, and a
(flow, link) entry per hop is what the hop-by-hop round path pays for. Here a flow is its start node
per dimension; ``covering`` (per link: over the flows that cross it) and ``along`` (per flow: over
the links it crosses) are sliding-window reductions along the rings, by doubling: a pass over the
torus per power of two of the arc length, for any ufunc that is associative and idempotent or exact
(maximum, minimum, integer addition). Each gives what the same reduction over the flat hops gives.
"""

from __future__ import annotations

import numpy as np

from ddlsim.simulator.engine.fabric import Fabric, TorusRound


def _window(grid: np.ndarray, axis: int, length: int, ufunc: np.ufunc, ahead: bool) -> np.ndarray:
    """``ufunc`` over ``length`` consecutive positions along ``axis`` (cyclic): from each position on
    where ``ahead``, else up to it. Doubling: the window is split into its powers of two."""
    sign = -1 if ahead else 1  # np.roll(x, -k)[p] == x[p + k]
    result: np.ndarray | None = None
    span, width, offset = grid, 1, 0  # span[p]: the reduction over the width positions from p on
    while True:
        if length & 1:
            part = np.roll(span, sign * offset, axis) if offset else span
            result = part if result is None else ufunc(result, part)
            offset += width
        length >>= 1
        if not length:
            assert result is not None
            return result
        span = ufunc(span, np.roll(span, sign * width, axis))
        width *= 2


class ArcRound:
    """Reductions over a ``TorusRound``'s flows and the fabric's links (link-indexed arrays cover every
    link of the fabric; a link no flow crosses holds the reduction's ``identity``)."""

    def __init__(self, fabric: Fabric, torus: TorusRound) -> None:
        self.fabric = fabric
        self.torus = torus
        self.flows = torus.edges.shape[0]
        self._edge_links = torus.edges.ravel()
        # (dimension, direction 0 = + / 1 = -, arc length, the flows going that way, their start nodes)
        self._arcs: list[tuple[int, int, int, np.ndarray, np.ndarray]] = []
        for d, length in enumerate(torus.hops):
            if length:
                for direction, way in ((0, torus.plus[d]), (1, ~torus.plus[d])):
                    rows = np.flatnonzero(way)
                    if rows.size:
                        self._arcs.append((d, direction, length, rows, torus.starts[d][rows]))

    def _torus_links(self, per_link: np.ndarray) -> np.ndarray:
        """The torus links' part of a link-indexed array, as (positions along each dimension, dimension,
        direction): link id torus_base + (node * dims + d) * 2 + direction (``Fabric._torus``)."""
        fabric = self.fabric
        shape = fabric.shape
        return per_link[fabric.torus_base : fabric.torus_base + fabric.torus_links].reshape(*shape, len(shape), 2)

    def covering(self, values: np.ndarray, ufunc: np.ufunc, identity) -> np.ndarray:
        """Per link: ``ufunc`` over ``values`` (one per flow) of the flows that cross it."""
        out = np.full(self.fabric.capacity_Bps.size, identity, dtype=values.dtype)
        ufunc.at(out, self._edge_links, np.repeat(values, self.torus.edges.shape[1]))
        torus = self._torus_links(out)
        shape = self.fabric.shape
        for d, direction, length, rows, starts in self._arcs:
            grid = np.full(torus.shape[:-2], identity, dtype=values.dtype).ravel()
            ufunc.at(grid, starts, values[rows])  # a node may start several arcs (3D: other dim-2 ways)
            # a + link at position p carries the flows that start at p - length + 1 .. p, a - link those
            # that start at p .. p + length - 1
            torus[..., d, direction] = _window(grid.reshape(shape), d, length, ufunc, ahead=direction == 1)
        return out

    def along(self, per_link: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
        """Per flow: ``ufunc`` over ``per_link`` of the links it crosses."""
        out = ufunc.reduce(per_link[self.torus.edges], axis=1)
        torus = self._torus_links(per_link)
        for d, direction, length, rows, starts in self._arcs:
            # a + flow from position p crosses the links at p .. p + length - 1, a - flow p - length + 1 .. p
            window = _window(np.ascontiguousarray(torus[..., d, direction]), d, length, ufunc, direction == 0)
            out[rows] = ufunc(out[rows], window.ravel()[starts])
        return out

    def alike(self, values: np.ndarray, links: np.ndarray) -> bool:
        """Whether on each of ``links`` the flows that cross it have equal ``values``."""
        values = np.asarray(values, dtype=np.float64)
        low = self.covering(values, np.minimum, np.inf)[links]
        return bool(np.array_equal(low, self.covering(values, np.maximum, -np.inf)[links]))
