"""Folding a fluid simulation onto one period of ranks where the schedule and the fabric repeat.

torus_2d on a dragonfly of one device per node: a row of the grid fills whole groups, and every
row's column-ring flows cross the same kind of links (the global link to the next row's group, the
same local hops). The rings of different columns drift apart (those whose routes skip a local hop
are faster and lap the others), so the fluid path's state never repeats (``fluid_steady`` finds no
period) and it simulates every instant of every round over every flow in flight: 131,072 flows
per instant and tens of thousands of instants at 131,072 ranks.

Yet every row does exactly what the row before it does. Where translating every rank by ``s``
(mod P) maps each round's transfers onto the same round's transfers (same chunk count and op), and
maps each transfer's route hop by hop onto its image's route by one permutation ``pi`` of the
links (capacities, latencies, redundancy and sender overheads kept), the fabric and the schedule
look the same from every copy of the ranks 0..s-1. The message path's model is deterministic and
the max-min fair rates of a symmetric state are symmetric (they are unique), so from a start that
repeats every s ranks the state stays so: rank r + k s does at each instant what rank r does,
and the flow of rank r + k s's transfer has the rate of rank r's.

So the fluid path may simulate ranks 0..s-1 only (``Fold``): their own transfers, a receiver r + k s
standing for r, and each link standing for its orbit under pi. A link carries the flows of its
orbit's copies: where the translation acts freely on the links (every orbit has P / s links,
checked), a flow of the folded run that crosses links of one orbit m times stands for m copies
crossing one link, which the max-min computation counts m times (a hop each), as the full
simulation would count m flows. The times are then the full simulation's, up to the rounding of
the same arithmetic over fewer terms (``tests/test_fluid_fold.py`` holds them to the message path
at 1e-9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fluid_executor import FluidExecutor, Resume, _after
from ddlsim.simulator.engine.round_structures import RoundCache, ScheduleRuns

__all__ = ["Fold", "find_fold", "run_fluid"]

MIN_COPIES = 4  # fewer copies save too little to pay for the check


@dataclass(frozen=True)
class Fold:
    """Ranks 0..``ranks``-1 of ``ranks * copies``, standing for every copy; ``orbit[link]``: the link
    that stands for fabric link ``link`` (-1 where no transfer of the schedule crosses it)."""

    ranks: int
    copies: int
    orbit: np.ndarray

    def sent(self, src: np.ndarray) -> np.ndarray:
        """The transfers (positions) that the kept ranks send: one per orbit of transfers."""
        return np.flatnonzero(src < self.ranks)

    def links(self, routes: np.ndarray) -> np.ndarray:
        """``routes`` (padded with -1) with each link replaced by its orbit's link."""
        return np.where(routes >= 0, self.orbit[np.maximum(routes, 0)], -1)


class _Transfers:
    """A round's transfers as ``find_fold`` reads them for every period it tries: sorted by (sender,
    receiver), and their routes and sender overheads once asked for."""

    def __init__(self, fabric: Fabric, rnd: Round, ranks: int) -> None:
        self.fabric, self.rnd, self.ranks = fabric, rnd, ranks
        self.src, self.dst = np.asarray(rnd.src, dtype=np.int64), np.asarray(rnd.dst, dtype=np.int64)
        key = self.src * ranks + self.dst
        self.order = np.argsort(key, kind="stable")
        self.key = key[self.order]
        self.unique = bool(np.all(self.key[1:] > self.key[:-1]))
        self._routes: tuple[np.ndarray, np.ndarray] | None = None

    def routes(self) -> tuple[np.ndarray, np.ndarray]:
        if self._routes is None:
            self._routes = (
                self.fabric.routes(self.src, self.dst),
                np.asarray(self.fabric.overheads(self.src, self.dst)),
            )
        return self._routes

    def _moved(self, shift: int, part: slice) -> np.ndarray:
        ranks = self.ranks
        return ((self.src[part] + shift) % ranks) * ranks + (self.dst[part] + shift) % ranks

    def maybe(self, shift: int) -> bool:
        """Whether the first few transfers' translates by ``shift`` ranks are transfers of the round:
        cheap, and most periods tried fail there."""
        head = self._moved(shift, slice(0, 64))
        at = np.minimum(np.searchsorted(self.key, head), self.key.size - 1)
        return bool(np.array_equal(self.key[at], head))

    def translation(self, shift: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(transfers, their images): the transfers matched to those translating them by ``shift``
        ranks gives, or None where the translated round is not the round."""
        moved = self._moved(shift, slice(None))
        if not self.unique:  # a (sender, receiver) pair more than once: match them in sorted order
            order = np.argsort(moved, kind="stable")
            return (order, self.order) if np.array_equal(moved[order], self.key) else None
        at = np.minimum(np.searchsorted(self.key, moved), self.key.size - 1)
        if not np.array_equal(self.key[at], moved):
            return None
        return np.arange(moved.size), self.order[at]  # every key once: a bijection


def _per_transfer(values, size: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(values), (size,))


class _Check:
    """The link permutation that translating by ``shift`` ranks implies, gathered round by round."""

    def __init__(self, fabric: Fabric, shift: int) -> None:
        self.fabric = fabric
        self.shift = shift
        self.pi = np.empty(0, dtype=np.int64)  # per fabric link, its image (-1: unused); built on first match

    def round(self, transfers: _Transfers, matched: tuple[np.ndarray, np.ndarray]) -> bool:
        """Whether the round's transfers ``matched`` to their images (``_Transfers.translation``) keep
        their chunk counts, ops and overheads, and their routes map hop by hop by the permutation so far."""
        order, image = matched
        rnd, size = transfers.rnd, transfers.src.size
        routes, overheads = transfers.routes()
        for values in (rnd.chunk_count, rnd.op, overheads):
            per = _per_transfer(values, size)
            if not np.array_equal(per[order], per[image]):
                return False
        a, b = routes[order], routes[image]
        if not np.array_equal(a < 0, b < 0):
            return False
        on = a >= 0
        a, b = a[on], b[on]
        if not self.pi.size:
            self.pi = np.full(self.fabric.capacity_Bps.size, -1, dtype=np.int64)
        self.pi[a] = b
        return bool(np.array_equal(self.pi[a], b))  # one image per link, over every round so far

    def orbits(self, copies: int) -> np.ndarray | None:
        """Per link, its orbit's least link (-1 where unused), or None where ``pi`` is no permutation
        acting freely (an orbit of fewer than ``copies`` links) or changes a link's properties."""
        fabric, pi = self.fabric, self.pi
        used = np.flatnonzero(pi >= 0)
        image = pi[used]
        seen = np.zeros(pi.size, dtype=bool)
        seen[image] = True
        if np.count_nonzero(seen) != used.size or not np.all(pi[image] >= 0):  # no bijection of the used links
            return None
        for values in (fabric.capacity_Bps, fabric.latency_s, fabric.redundant):
            if not np.array_equal(values[used], values[image]):
                return None
        position = np.full(pi.size, -1, dtype=np.int64)
        position[used] = np.arange(used.size)
        step = position[image]  # pi over positions in ``used``
        least = used.copy()
        for _ in range(max(1, math.ceil(math.log2(copies)))):  # least over 2, 4, 8, ... steps of pi
            least = np.minimum(least, least[step])
            step = step[step]
        if not np.all(np.unique(least, return_counts=True)[1] == copies):
            return None
        orbit = np.full(pi.size, -1, dtype=np.int64)
        orbit[used] = least
        return orbit


def find_fold(
    schedule: Schedule, fabric: Fabric, runs: list[tuple[Round, int]], start_s: np.ndarray | float
) -> Fold | None:
    """The smallest period s of ranks (a divisor of P giving at least ``MIN_COPIES`` copies) under
    which ``schedule`` (its distinct rounds ``runs``) and ``fabric`` repeat and ``start_s`` does,
    as a ``Fold``; None where there is none."""
    ranks = schedule.ranks
    if fabric.spec.loggp or ranks < 2 * MIN_COPIES or not runs:
        return None
    start = np.broadcast_to(np.asarray(start_s, dtype=np.float64), (ranks,))
    distinct = [_Transfers(fabric, rnd, ranks) for rnd in {id(rnd): rnd for rnd, _ in runs}.values()]
    for shift in (s for s in range(1, ranks // MIN_COPIES + 1) if ranks % s == 0):
        if not np.array_equal(start, np.roll(start, shift)):
            continue
        check = _Check(fabric, shift)
        if not all(transfers.maybe(shift) for transfers in distinct):
            continue
        matched = []  # every round's transfers to their images, before any route is built
        for transfers in distinct:
            pairs = transfers.translation(shift)
            if pairs is None:
                break
            matched.append(pairs)
        if len(matched) < len(distinct):
            continue
        if all(check.round(transfers, pairs) for transfers, pairs in zip(distinct, matched, strict=True)):
            orbit = check.orbits(ranks // shift)
            if orbit is not None:
                return Fold(shift, ranks // shift, orbit)
    return None


def run_fluid(
    fabric: Fabric,
    schedule: Schedule,
    message_bytes: float,
    start_s: np.ndarray | float,
    resume: Resume | None = None,
    runs: list[tuple[Round, int]] | None = None,
    routed: RoundCache | None = None,
) -> np.ndarray:
    """``FluidExecutor(fabric).run(...)``, over one period of the ranks where the rounds it simulates
    (those after ``resume``), the fabric and their start repeat (``find_fold``); ``routed``: the round
    path's structures of the rounds it routed (used where the run is not folded)."""
    runs = ScheduleRuns().get(schedule) if runs is None else runs
    left, start = (runs, start_s) if resume is None else (_after(runs, resume.rounds), resume.entry_s)
    fold = find_fold(schedule, fabric, left, start)
    return FluidExecutor(fabric, fold=fold, routed=routed).run(schedule, message_bytes, start_s, resume, runs=runs)
