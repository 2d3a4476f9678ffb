"""Network cost functions (pure, seconds and bytes/s).

* alpha-beta: a message of n bytes over a path costs overhead + latency + n / bottleneck bandwidth
  (cut-through: the payload streams over all links of the path at the slowest link's rate).
* max-min fair sharing (flow level): concurrent flows share each link's capacity so that no flow
  can get more without taking from a flow that has less (progressive filling, Bertsekas & Gallager).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# ``max_min_fair_rates_flat``'s default: links whose shares lie this close (relative) above the
# smallest freeze in the same pass
MAX_MIN_TOLERANCE = 1e-12
# the flow model's (``simulator/engine/flow_network.py`` and the paths that follow it without SimPy)
FINISH_TOLERANCE = 1e-12  # relative: a flow projected to end within this of now has ended
BINDING_TOLERANCE = 1e-12  # relative: a link loaded to within this of its capacity cannot bind


def alpha_beta_time_s(nbytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """alpha + n / beta. Example: 1 MB at 1 GB/s with alpha 2 us -> 2e-6 + 1e-3 s."""
    return alpha_s + nbytes / bandwidth_Bps


def max_min_fair_rates(flow_links: Sequence[Sequence[int]], capacity_Bps: np.ndarray) -> np.ndarray:
    """Max-min fair rate (bytes/s) of each flow; ``flow_links[i]`` lists the links flow i crosses.

    Example: two flows on one 10 GB/s link and a third alone on another -> [5e9, 5e9, cap2].
    A flow that crosses no link gets an infinite rate.
    """
    count = len(flow_links)
    rates = np.full(count, np.inf)
    remaining = np.asarray(capacity_Bps, dtype=np.float64).copy()
    users: dict[int, set[int]] = {}
    for flow, links in enumerate(flow_links):
        for link in links:
            users.setdefault(int(link), set()).add(flow)
    while users:
        # the bottleneck: the link offering the smallest equal share to its unfrozen flows
        link = min(users, key=lambda lk: (remaining[lk] / len(users[lk]), lk))
        share = remaining[link] / len(users[link])
        for flow in list(users[link]):
            rates[flow] = share
            for other in flow_links[flow]:
                other = int(other)
                remaining[other] -= share
                if other != link:
                    users[other].discard(flow)
                    if not users[other]:
                        del users[other]
        del users[link]
    return rates


def max_min_fair_rates_flat(
    owner: np.ndarray,
    link: np.ndarray,
    flows: int,
    capacity_Bps: np.ndarray,
    tolerance: float = MAX_MIN_TOLERANCE,
    bound: np.ndarray | None = None,
    levels: list[tuple[float, bool]] | None = None,
) -> np.ndarray:
    """Vectorised max-min fair rates; the same answer as ``max_min_fair_rates``.

    The routes are given flat: entry e says flow ``owner[e]`` crosses local link ``link[e]``
    (links numbered 0..len(capacity_Bps)-1). ``bound`` (optional, one per flow): each flow's own
    limit, the same answer as a private link of that capacity crossed by that flow alone, without
    the entries. Each pass freezes every flow on every link whose equal share is the smallest left
    (all links at that level at once, which max-min allows), so a symmetric round takes one or two
    passes; the entries of frozen flows are dropped as they freeze, so later passes are smaller.

    ``levels`` (optional): each pass appends (its level, whether every link and bound it froze was
    exactly at the level rather than within ``tolerance`` above it). Where every pass was exact, each
    connected component of the flows (over shared links) got what this function gives it alone: a
    pass that freezes only links and bounds at exactly the level freezes in each component what that
    component's own pass at that level would, and nothing in a component whose smallest share is
    higher. (Components rated in separate calls would share a pass where two of their distinct
    levels lie within ``tolerance`` of each other: a caller that combines such calls has to rule that
    out, as ``fluid_executor`` does.) Asking for them changes no rate.
    """
    rates = np.full(flows, np.inf)
    remaining = np.asarray(capacity_Bps, dtype=np.float64).copy()
    links = remaining.size
    # the flows whose own bound has not been reached, and those bounds (a private link's share is
    # its capacity until its one flow freezes: nothing else is subtracted from it)
    free = np.arange(flows) if bound is not None else np.empty(0, dtype=np.int64)
    free_bound = np.asarray(bound, dtype=np.float64) if bound is not None else np.empty(0)
    counts = np.bincount(link, minlength=links)
    while owner.size or free.size:
        share = np.divide(remaining, counts, out=np.full(links, np.inf), where=counts > 0)
        level = min(share.min() if links else np.inf, free_bound.min() if free.size else np.inf)
        cut = level * (1 + tolerance)
        newly = np.zeros(flows, dtype=bool)
        bottleneck = share <= cut
        newly[owner[bottleneck[link]]] = True  # the bottleneck links looked up per entry
        if free.size:
            reached = free_bound <= cut
            newly[free[reached]] = True
        if levels is not None:
            exact = bool(np.all(share[bottleneck] == level))
            if free.size:
                exact = exact and bool(np.all(free_bound[reached] == level))
            levels.append((float(level), exact))
        rates[newly] = level
        entries = newly[owner]
        if free.size:
            open_bound = ~newly[free]
            free, free_bound = free[open_bound], free_bound[open_bound]
        if entries.all():  # every entry's flow has its rate (a symmetric round: often the first level)
            if not free.size:
                return rates
            owner, link, counts = owner[:0], link[:0], np.zeros(links, dtype=np.int64)
            continue
        np.subtract.at(remaining, link[entries], level)
        open_entries = ~entries
        owner, link = owner[open_entries], link[open_entries]
        counts = np.bincount(link, minlength=links)
    return rates
