"""Flows of one round that share links: who contends with whom, and when each flow ends.

The round executor (``collective_engine.VectorisedExecutor``) runs a round's transfers at their
routes' bottleneck rates, except those that share a link with another transfer of the same round.
For those this module gives the exact end times of a fluid simulation restricted to them: max-min
fair rates (``max_min_fair_rates_flat``) that hold until the next flow starts or ends, then a
re-rating, as the flow network does when no other flow touches these links meanwhile (the executor
checks that separately). Pure numpy; no SimPy.

``Contention`` splits the contended flows into connected components (flows linked through shared
links). Components are independent, so a component whose flows all start together ends as it would
from time zero, shifted: those durations are computed once per round structure and reused, and
only components whose flows start apart get a simulation of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddlsim.hardware_models.network import max_min_fair_rates_flat

FLUID_TOLERANCE = 1e-12  # relative: flows projected to end within this of an event end with it
_PROPAGATION_PASSES = 16  # label propagation's passes before ``_components`` hooks trees instead


@dataclass(frozen=True)
class Runs:
    """A sequence cut into consecutive non-empty runs (a round's flows, component by component, or
    bundle by bundle), with per-run reductions: numpy's ``reduceat``, or where every run has the same
    few elements, elementwise passes over the positions in a run, adjacent pairs first (at eight flows
    a run a fifth of the time of ``reduceat`` or ``ufunc.at`` over 131,072 flows). Exact for minimum
    and maximum, whose result does not depend on the order."""

    bounds: np.ndarray  # where each run begins
    sizes: np.ndarray  # how long each is
    width: int  # the length of every run, or 0 where they differ (or are too long to go by position)

    @staticmethod
    def of_labels(labels: np.ndarray) -> Runs | None:
        """The runs of equal ``labels``, or None where one label occurs in two runs (not sorted)."""
        if not labels.size:
            return None
        step = np.diff(labels)
        if np.any(step < 0):
            return None
        return Runs.of_bounds(np.concatenate(([0], np.flatnonzero(step) + 1)), labels.size)

    @staticmethod
    def of_bounds(bounds: np.ndarray, size: int) -> Runs:
        """The runs that begin at ``bounds`` (increasing, the first 0) of a sequence of ``size``."""
        sizes = np.diff(np.append(bounds, size))
        width = int(sizes[0])
        return Runs(bounds, sizes, width if width <= 64 and np.all(sizes == width) else 0)

    def spread(self, per_run: np.ndarray) -> np.ndarray:
        """Each run's value repeated over its positions."""
        return np.repeat(per_run, self.width or self.sizes)

    def reduce(self, values: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
        """``ufunc`` (minimum or maximum) over each run of ``values`` (a new array)."""
        width = self.width
        if not width:
            return ufunc.reduceat(values, self.bounds)
        table = values
        while width % 2 == 0:  # adjacent pairs: a contiguous pass over half as many each time
            pairs = table.reshape(-1, 2)
            table = ufunc(pairs[:, 0], pairs[:, 1])
            width //= 2
        if width == 1:
            return table if table is not values else values.copy()
        columns = table.reshape(-1, width)
        out = columns[:, 0].copy()
        for position in range(1, width):
            ufunc(out, columns[:, position], out=out)
        return out


@dataclass(frozen=True)
class Contention:
    """The transfers of a round that share a link with another, and their routes.

    ``flows`` indexes the round's transfers; entry e says contended flow ``owner[e]`` crosses local
    link ``link[e]`` (every hop of a contended flow, shared or not, since all take part in its rate);
    ``capacity_Bps`` per local link; ``component`` labels each flow's connected component.
    """

    flows: np.ndarray
    owner: np.ndarray
    link: np.ndarray
    capacity_Bps: np.ndarray
    component: np.ndarray
    components: int
    runs: Runs | None = None  # the components as runs of consecutive flows, where they are

    @staticmethod
    def of(flat_links: np.ndarray, owner: np.ndarray, capacity_Bps: np.ndarray) -> Contention:
        """From every binding hop of a round: ``flat_links[e]`` crossed by transfer ``owner[e]``.

        Counts per link id (``bincount`` over the fabric's links: linear, no sort)."""
        if flat_links.size * 16 < capacity_Bps.size:  # a small round on a large fabric: sort instead
            order = np.argsort(flat_links)
            ordered = flat_links[order]
            repeated = ordered[1:] == ordered[:-1]
            shared = np.zeros(flat_links.size, dtype=bool)
            shared[order[1:][repeated]] = True
            shared[order[:-1][repeated]] = True
            widest = 0
        else:
            counts = np.bincount(flat_links, minlength=capacity_Bps.size)
            shared = counts[flat_links] > 1
            widest = int(counts.max()) if counts.size else 0
        if not shared.any():  # no entry on a link another entry also uses
            empty = owner[:0]
            return Contention(empty, empty, empty, np.empty(0), empty, 0)
        mask = np.zeros(int(owner.max()) + 1, dtype=bool)
        mask[owner[shared]] = True
        flows = np.flatnonzero(mask)
        if flows.size == mask.size:  # every transfer contends: its hops as they are
            links, local_link = relabel(flat_links, capacity_Bps.size)
            local_owner = owner
        else:
            local = np.cumsum(mask) - 1  # transfer -> position among the contended
            entries = mask[owner]
            links, local_link = relabel(flat_links[entries], capacity_Bps.size)
            local_owner = local[owner[entries]]
        if widest == flows.size:  # one link carries every contended flow: they form one component
            component, count = np.zeros(flows.size, dtype=np.int64), 1
        else:
            component, count = _components(local_owner, local_link, flows.size, links.size)
        return Contention(
            flows, local_owner, local_link, capacity_Bps[links], component, count, Runs.of_labels(component)
        )

    def start_spans(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per component the earliest and the latest start of its flows (``starts`` per contended flow)."""
        if self.runs is not None:
            return self.runs.reduce(starts, np.minimum), self.runs.reduce(starts, np.maximum)
        lo = np.full(self.components, np.inf)
        hi = np.full(self.components, -np.inf)
        np.minimum.at(lo, self.component, starts)
        np.maximum.at(hi, self.component, starts)
        return lo, hi

    def end_times(self, nbytes: np.ndarray, starts: np.ndarray, durations_from_zero: np.ndarray) -> np.ndarray:
        """End times of the contended flows (bytes ``nbytes``, starting at ``starts``, both per flow).

        ``durations_from_zero``: ``fluid_ends(...)`` of all of them started at time 0, which a
        component whose flows all start together only shifts.
        """
        lo, hi = self.start_spans(starts)
        ends = starts + durations_from_zero
        if np.array_equal(lo, hi):  # every component's flows start together
            return ends
        apart = (hi > lo)[self.component]
        if apart.any():
            index = np.cumsum(apart) - 1  # flow -> position among the flows that start apart
            entries = apart[self.owner]
            ends[apart] = fluid_ends(
                index[self.owner[entries]],
                self.link[entries],
                self.capacity_Bps,
                nbytes[apart],
                starts[apart],
                self.component[apart],
            )
        return ends


def relabel(values: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values sorted, each value's index among them) for integers in [0, ``bound``):
    ``np.unique(values, return_inverse=True)``, by marks in a table of ``bound`` slots (linear) when
    the values outnumber a sixteenth of them, else by sorting."""
    if values.size * 16 < bound:
        distinct, inverse = np.unique(values, return_inverse=True)
        return distinct, inverse.ravel()
    distinct = np.flatnonzero(_marks(values, bound))
    # each distinct value's index written into a scratch table (no running count over all ``bound``
    # slots: a dragonfly of 131,072 nodes has millions of link ids, and a cumsum over them took 80 ms)
    index = np.empty(bound, dtype=np.int64)
    index[distinct] = np.arange(distinct.size)
    return distinct, index[values]


def _marks(values: np.ndarray, bound: int) -> np.ndarray:
    """A table of ``bound`` flags, set where ``values`` (integers in [0, ``bound``)) occur."""
    present = np.zeros(bound, dtype=bool)
    present[values] = True
    return present


def _components(owner: np.ndarray, link: np.ndarray, flows: int, links: int) -> tuple[np.ndarray, int]:
    """Connected components of flows joined by shared links: (label per flow, 0..count-1), count.

    Minimum-label propagation through the links with pointer jumping converges in a few passes where
    flows overlap in short chains. Where it has not after ``_PROPAGATION_PASSES`` (a pipelined tree's
    flows chain through every level, and each pass went one level further: a second a round over
    4096 nodes), every root takes the smallest label any flow of its tree sees and the trees are
    then flattened (hooking and pointer jumping, as Shiloach and Vishkin): a chain collapses in one
    pass. Labels only decrease and stay in their component, so each ends at its component's lowest
    flow either way.
    """
    label = np.arange(flows)
    for _ in range(_PROPAGATION_PASSES):
        at_link = np.full(links, flows)
        np.minimum.at(at_link, link, label[owner])
        new = label.copy()
        np.minimum.at(new, owner, at_link[link])
        new = new[new]
        if np.array_equal(new, label):
            break
        label = new
    else:
        while True:
            while not np.array_equal(jumped := label[label], label):  # every flow points at its root
                label = jumped
            at_link = np.full(links, flows)
            np.minimum.at(at_link, link, label[owner])
            seen = label.copy()
            np.minimum.at(seen, owner, at_link[link])
            hooked = label.copy()
            np.minimum.at(hooked, label, seen)  # a root takes the smallest label its tree's flows see
            if np.array_equal(hooked, label):
                break
            label = hooked
    roots = _marks(label, flows)  # the distinct labels, numbered in order (np.unique's inverse, linear)
    return (np.cumsum(roots) - 1)[label], int(np.count_nonzero(roots))


def unique_ints(values: np.ndarray, bound: int = 0) -> np.ndarray:
    """Sorted distinct values, by sorting (numpy 2.4's hash-based ``np.unique`` takes 0.6 s for
    262,144 integers, a sort 3 ms); values known to lie in [0, ``bound``) and outnumbering a
    sixteenth of that range are marked in a table instead (linear: a round's millions of hops)."""
    if bound and values.size * 16 >= bound:
        return np.flatnonzero(_marks(values, bound))
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


@dataclass(frozen=True)
class After:
    """Start dependencies: flow ``dependent[i]`` cannot start before flow ``prerequisite[i]`` has
    ended plus ``delay_s[i]`` (its own start time then being the latest of those and its base)."""

    dependent: np.ndarray
    prerequisite: np.ndarray
    delay_s: np.ndarray


def fluid_ends(
    owner: np.ndarray,
    link: np.ndarray,
    capacity_Bps: np.ndarray,
    nbytes: np.ndarray,
    starts: np.ndarray,
    component: np.ndarray | None = None,
    after: After | None = None,
) -> np.ndarray:
    """End time of each flow in a fluid simulation of these flows alone.

    Flow ``owner[e]`` crosses local link ``link[e]``; flow i has ``nbytes[i]`` and starts at
    ``starts[i]`` (or, when ``after`` names prerequisites for it, at the latest of that and their
    ends plus delays). Max-min rates hold until the next start or end; flows that start or end at
    the same instant are handled in one step. Zero-byte flows end as they start. ``component``
    (flows joined through shared links, see ``_components``; computed when not given) lets every
    component advance on its own clock, from one of its own events to the next, all in the same
    step: unrelated components do not multiply each other's events.
    """
    flows = np.asarray(nbytes).size
    remaining = np.asarray(nbytes, dtype=np.float64).copy()
    start = np.asarray(starts, dtype=np.float64).copy()
    ends = np.full(flows, np.nan)
    unmet = np.zeros(flows, dtype=np.int64)  # prerequisites not yet ended
    if after is not None and after.dependent.size:
        np.add.at(unmet, after.dependent, 1)
    if component is None or after is not None:
        links = int(link.max()) + 1 if link.size else 0
        own, via = owner, link
        if after is not None and after.dependent.size:  # a dependency joins two flows like a shared link
            virtual = links + np.arange(after.dependent.size)
            own = np.concatenate([owner, after.dependent, after.prerequisite])
            via = np.concatenate([link, virtual, virtual])
            links += after.dependent.size
        component, count = _components(own, via, flows, links)
    else:
        count = int(component.max()) + 1 if flows else 0
    pending = np.ones(flows, dtype=bool)
    known = unmet == 0  # start time known
    now = np.full(count, np.inf)
    np.minimum.at(now, component[known], start[known])
    while pending.any():
        active = pending & known & (start <= now[component])
        if active.all():  # every flow under way (a round's first step): the entries as they are, uncopied
            rates = max_min_fair_rates_flat(owner, link, flows, capacity_Bps)
        else:
            keep = active[owner]
            rates = max_min_fair_rates_flat(owner[keep], link[keep], flows, capacity_Bps)
        finish = np.where(active, now[component] + remaining / np.where(active, rates, 1.0), np.inf)
        step_to = np.full(count, np.inf)
        np.minimum.at(step_to, component, finish)
        waiting = pending & known & ~active
        np.minimum.at(step_to, component[waiting], start[waiting])
        here = step_to[component]
        ending = active & (finish <= here + FLUID_TOLERANCE * np.maximum(np.abs(here), 1e-9))
        remaining = np.where(active, remaining - rates * (here - now[component]), remaining)
        ends[ending] = here[ending]
        pending &= ~ending
        if after is not None and after.dependent.size and ending.any():
            done = ending[after.prerequisite]
            dependents = after.dependent[done]
            np.maximum.at(start, dependents, here[after.prerequisite[done]] + after.delay_s[done])
            np.subtract.at(unmet, dependents, 1)
            ready = pending & ~known & (unmet == 0)
            known |= ready
            # a component whose clock ran out of events waits for the flows that just became known
            idle = ~np.isfinite(step_to)
            np.minimum.at(step_to, component[ready & idle[component]], start[ready & idle[component]])
        now = np.where(np.isfinite(step_to), step_to, now)
    return ends
