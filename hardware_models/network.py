"""Network cost functions (pure, seconds and bytes/s).

* alpha-beta: a message of n bytes over a path costs overhead + latency + n / bottleneck bandwidth
  (cut-through: the payload streams over all links of the path at the slowest link's rate).
* max-min fair sharing (flow level): concurrent flows share each link's capacity so that no flow
  can get more without taking from a flow that has less (progressive filling, Bertsekas & Gallager).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
    owner: np.ndarray, link: np.ndarray, flows: int, capacity_Bps: np.ndarray, tolerance: float = 1e-12
) -> np.ndarray:
    """Vectorised max-min fair rates; the same answer as ``max_min_fair_rates``.

    The routes are given flat: entry e says flow ``owner[e]`` crosses local link ``link[e]``
    (links numbered 0..len(capacity_Bps)-1). Each pass freezes every flow on every link whose
    equal share is the smallest left (all links at that level at once, which max-min allows), so
    a symmetric round takes one or two passes.
    """
    rates = np.full(flows, np.inf)
    frozen = np.zeros(flows, dtype=bool)
    remaining = np.asarray(capacity_Bps, dtype=np.float64).copy()
    links = remaining.size
    if not owner.size:
        return rates
    open_entries = np.ones(owner.size, dtype=bool)  # nothing frozen yet: every entry is open
    counts = np.bincount(link, minlength=links)
    while open_entries.any():
        used = counts > 0
        share = np.full(links, np.inf)
        share[used] = remaining[used] / counts[used]
        level = share.min()
        bottleneck = used & (share <= level * (1 + tolerance))
        hit = open_entries & bottleneck[link]
        newly = np.zeros(flows, dtype=bool)
        newly[owner[hit]] = True
        rates[newly] = level
        frozen |= newly
        if frozen.all():  # every flow has its rate (a symmetric round: often the first level)
            return rates
        entries = newly[owner]
        np.subtract.at(remaining, link[entries], level)
        open_entries = ~frozen[owner]
        counts = np.bincount(link[open_entries], minlength=links)
    return rates
