"""The links a fluid run's flows cross, and the max-min fair rates of the flows in flight over them.

``fluid_executor`` moves flows through instants; this is its per-link side. Links get compact ids
as a run first crosses them (``ids``: a dragonfly of 131,072 nodes has millions of link ids, a run
crosses a few hundred thousand), and per id the table keeps the capacity, the flows in flight over
it and their bounds summed, updated as flows start and end (``started``, ``ended``) rather than
summed afresh over every hop at every instant, and whether the link binds: its flows' bounds sum to
more than its capacity, as ``FlowNetwork._rerate`` decides it.

At each instant ``rerate`` gives every flow in flight its max-min fair rate, to the bit what ``rates``
over all of them gives (``max_min_fair_rates_flat`` over the binding links): it rates again only the
components of flows that the instant's starts and ends reached and holds the others' rates, while
they are certified to be each component's own (see ``rerate``); among few flows it rates them all.
Id 0 (``NO_LINK``) is no link: infinite capacity, where an ended flow's hops point until dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ddlsim.hardware_models.network import BINDING_TOLERANCE, MAX_MIN_TOLERANCE, max_min_fair_rates_flat
from ddlsim.simulator.engine.round_structures import spans

__all__ = ["NO_LINK", "LinkRates"]

NO_LINK = 0  # the compact id of no link (infinite capacity): an ended flow's hops until they are dropped
# two levels of max-min passes this close (relative) could have been frozen in one pass: wider than
# the computation's tolerance, so that a pair it would join is never missed (``LinkRates.rerate``)
_NEAR = 4 * MAX_MIN_TOLERANCE
_FRESH = 0.5  # rate every flow afresh where the components reached have more than this share of them
# below this many flows in flight (ended places included), every flow is rated afresh without looking
# for the components reached or certifying the rates for holding: torus_2d on the dragonfly at
# 131,072 ranks (100-500 flows) reached more than ``_FRESH`` of them at 126,508 of 139,032 instants,
# each paying the search (~50 us) before rating afresh anyway (~190 us); halving doubling there,
# which holds most instants' rates, has over 5,000 flows at every instant but its first few
_FEW_FLOWS = 1000


class LinkRates:
    """Per compact link id: capacity, binding threshold, the flows in flight and their bounds summed,
    and the rating of the flows in flight (see the module). Arrays past ``count`` are spare room."""

    def __init__(self, capacity_Bps: np.ndarray) -> None:
        self._fabric_capacity = capacity_Bps
        self.compact = np.full(capacity_Bps.size, -1, dtype=np.int64)  # fabric link -> compact id
        self.count = 1  # ids in use (``NO_LINK`` first)
        self.capacity = np.array([np.inf])
        self.threshold = np.array([np.inf])  # a link binds where its flows' bounds sum to more than this
        self.load = np.zeros(1)  # the bounds of the flows in flight over it, summed
        self.users = np.zeros(1, dtype=np.int64)  # the flows in flight over it
        self._local = np.zeros(1, dtype=np.int64)  # scratch: binding link -> its number in ``rates``
        self.binding = np.zeros(1, dtype=bool)  # whether it bound at the last re-rating (``rerate``)
        self._cover = np.zeros(1, dtype=np.int64)  # scratch, zeros between re-ratings (``rerate``)
        self.changed = np.zeros(1, dtype=bool)  # whether its flows started or ended since the last re-rating
        # whether the rates of the last re-rating are each connected component's own (``rerate``)
        self.certified = False
        self.fabric_link = np.array([-1], dtype=np.int64)  # compact id -> fabric link

    def ids(self, links: np.ndarray) -> np.ndarray:
        """The compact ids of fabric ``links``, numbering those crossed for the first time."""
        compact = self.compact[links]
        unseen = links[compact < 0]
        if unseen.size:  # (a mask over the fabric's links: np.unique hashes, slower by far at 600k hops)
            new = np.zeros(self.compact.size, dtype=bool)
            new[unseen] = True
            self._grow(np.flatnonzero(new))
            compact = self.compact[links]
        return compact

    def _grow(self, fresh: np.ndarray) -> None:
        """Compact ids for fabric links ``fresh`` (crossed for the first time), the per-id arrays grown
        by half again where they are full: not at every round, each time copying them all."""
        first = self.count
        self.count += fresh.size
        if self.count > self.capacity.size:
            spare = max(self.count, self.capacity.size * 3 // 2) - self.capacity.size
            self.capacity = np.concatenate([self.capacity, np.full(spare, np.inf)])
            self.threshold = np.concatenate([self.threshold, np.full(spare, np.inf)])
            self.fabric_link = np.concatenate([self.fabric_link, np.full(spare, -1)])
            self.load = np.concatenate([self.load, np.zeros(spare)])
            self.users = np.concatenate([self.users, np.zeros(spare, dtype=np.int64)])
            self._local = np.concatenate([self._local, np.zeros(spare, dtype=np.int64)])
            self.binding = np.concatenate([self.binding, np.zeros(spare, dtype=bool)])
            self._cover = np.concatenate([self._cover, np.zeros(spare, dtype=np.int64)])
            self.changed = np.concatenate([self.changed, np.zeros(spare, dtype=bool)])
        ids = slice(first, self.count)
        self.compact[fresh] = np.arange(first, self.count)
        self.capacity[ids] = self._fabric_capacity[fresh]
        self.threshold[ids] = self.capacity[ids] * (1 + BINDING_TOLERANCE)
        self.fabric_link[ids] = fresh

    def reset(self) -> None:
        """No flow in flight (where an earlier run stopped short), nothing certified."""
        self.load[:], self.users[:] = 0.0, 0
        self.certified = False

    def started(self, links: np.ndarray, bounds: np.ndarray) -> None:
        """Flows start over ``links`` (compact ids, one entry per hop), with bound ``bounds[e]`` on hop e."""
        self.changed[links] = True
        np.add.at(self.load, links, bounds)
        np.add.at(self.users, links, 1)

    def ended(self, links: np.ndarray, bounds: np.ndarray) -> None:
        """Flows that crossed ``links`` (one entry per hop, bound ``bounds[e]``) end."""
        load, users = self.load, self.users
        np.subtract.at(load, links, bounds)
        np.subtract.at(users, links, 1)
        load[links[users[links] == 0]] = 0.0  # no drift: an idle link carries exactly nothing
        self.changed[links] = True

    def rerate(
        self,
        cap: np.ndarray,
        link: np.ndarray,
        held: np.ndarray,
        hop: np.ndarray,
        hops: np.ndarray,
        crossing: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """The rates of the flows in flight at an instant, to the bit those of ``rates`` over them all
        (bound ``cap``; flow i crosses ``link[hop[i]:hop[i] + hops[i]]``), from ``held``: the rates at
        the instant before of the flows then in flight (those past them are new; the ended among them
        at their ``cap``, crossing no link now). ``crossing(links)``: the flows in flight that cross
        each of ``links`` (their places, a flow once per hop; -1 for transfers not in flight), as the
        executor finds them; ``changed`` marks the links of the flows that started or ended since.

        Max-min fair rates are those of each connected component of the flows (over the links that
        bind) on its own. A component none of whose flows is new or crosses a changed link that binds
        now or bound before (a link's load changes only as its flows start and end, and whether it
        binds with it) is a component of the instant before with the same flows, bounds and links:
        its rates are held. The rest, the components reached from the new flows and from those
        changed links, are rated by ``max_min_fair_rates_flat`` over their flows alone.

        One computation over every flow gives the same only where none of its passes joins links of
        two components whose levels differ, which its tolerance allows where they lie within 1e-12
        (relative) of each other. So rates are held and recomputed only while they are certified
        (``certified``) to be each component's own: every pass exact (``max_min_fair_rates_flat``'s
        ``levels``) and no two distinct levels among the rates in flight within ``_NEAR`` of each
        other. Otherwise, and where the components reached hold a good part of the flows
        (``_FRESH``), every flow is rated afresh (``afresh``), which certifies its rates again where
        its passes were exact and its levels apart. Among few flows (``_FEW_FLOWS``) every flow is
        rated afresh at once, uncertified: the components reached there were most of them."""
        if cap.size < _FEW_FLOWS:
            return self.afresh(cap, link, hops, certify=False)
        if not self.certified or not held.size:
            return self.afresh(cap, link, hops)
        # whether a link binds changes only where its flows started or ended: kept up to date there
        links = np.flatnonzero(self.changed[: self.count])
        self.changed[links] = False
        binding = self.binding
        before = binding[links]
        now = self.load[links] > self.threshold[links]
        binding[links] = now
        pending = links[before | now]
        users, cover = self.users, self._cover
        most = _FRESH * cap.size
        # the components reached, a frontier of flows at a time, from the new flows and the changed
        # links: a link is looked up (its flows in flight, round by round) only where it has more
        # flows in flight than reached flows cross it (``cover``: their hops on it, counted)
        reached = np.zeros(cap.size, dtype=bool)
        covered: list[np.ndarray] = []  # the reached flows' hops, to clear ``cover`` after
        frontier = np.arange(held.size, cap.size)
        across = link[hop[held.size] :] if frontier.size else link[:0]  # the new flows' hops: the last ones
        looked: np.ndarray | None = None  # links looked up (scratch, made where one is)
        tag: np.ndarray | None = None  # scratch per flow
        count = 0
        while True:
            if frontier.size:
                reached[frontier] = True
                count += frontier.size
                if count > most:  # as costly as rating every flow afresh
                    for hop_links in covered:
                        cover[hop_links] = 0
                    return self.afresh(cap, link, hops)
                np.add.at(cover, across, 1)
                if tag is not None:  # (found by looking up: the new flows' links changed, pending where they bind)
                    pending = np.concatenate([pending, across[binding[across]]])
                covered.append(across)
            pending = pending[users[pending] > cover[pending]]
            if looked is not None:
                pending = pending[~looked[pending]]
            pending = self._once(pending)
            if not pending.size:
                break
            # the flows still to find, counted once per link they cross here: so many that rating
            # every flow afresh costs no more
            if count + int(users[pending].sum() - cover[pending].sum()) > _FRESH * cap.size:
                for hop_links in covered:
                    cover[hop_links] = 0
                return self.afresh(cap, link, hops)
            if looked is None:
                looked = np.zeros(self.count, dtype=bool)
            looked[pending] = True
            flows = crossing(pending)
            flows = flows[flows >= 0]
            flows = flows[~reached[flows]]
            if tag is None:
                tag = np.empty(cap.size, dtype=np.int64)
            place = np.arange(flows.size)
            tag[flows] = place
            frontier = flows[tag[flows] == place]  # each flow found once
            across = link[spans(hop[frontier], hops[frontier])]
            pending = pending[:0]
        for hop_links in covered:
            cover[hop_links] = 0
        rates = np.concatenate([held, cap[held.size :]])
        flows = np.flatnonzero(reached)
        if not flows.size:
            return rates
        # the reached flows' binding hops, the flows numbered in order among them, their links in
        # any order (the computation reads a link's share and sums over its entries, whatever its number)
        at = spans(hop[flows], hops[flows])
        hop_link = link[at]
        on = binding[hop_link]
        sub = cap[flows]
        levels: list[tuple[float, bool]] = []
        if on.any():
            hop_owner = np.repeat(np.arange(flows.size), hops[flows])[on]
            hop_link = hop_link[on]
            constrained = np.zeros(flows.size, dtype=bool)
            constrained[hop_owner] = True
            rows = np.flatnonzero(constrained)
            renumber = np.empty(flows.size, dtype=np.int64)
            renumber[rows] = np.arange(rows.size)
            used = self._once(hop_link)
            self._local[used] = np.arange(used.size)
            sub[rows] = max_min_fair_rates_flat(
                renumber[hop_owner],
                self._local[hop_link],
                rows.size,
                self.capacity[used],
                bound=sub[rows],
                levels=levels,
            )
        rates[flows] = sub
        if not all(exact for _, exact in levels):
            return self.afresh(cap, link, hops)
        for level in {value for value, _ in levels}:  # no other rate in flight close to a new level
            close = (rates >= level * (1 - _NEAR)) & (rates <= level * (1 + _NEAR))
            if np.any(rates[close] != level):
                return self.afresh(cap, link, hops)
        return rates

    def _once(self, links: np.ndarray) -> np.ndarray:
        """``links`` (compact ids) with each one kept once, at one of its places: with ``_local`` as
        scratch, in their number of steps rather than the links' or a sort's."""
        place = np.arange(links.size)
        self._local[links] = place
        return links[self._local[links] == place]

    def afresh(self, cap: np.ndarray, link: np.ndarray, hops: np.ndarray, certify: bool = True) -> np.ndarray:
        """``rates`` over every flow in flight, and whether each component got its own rates there
        (``certified``): every pass exact, no two distinct levels within ``_NEAR`` of each other.
        Without ``certify`` (few flows: the next instant is rated afresh too, or is certified afresh
        before any rate is held) the levels are not checked, and the rates are not certified."""
        self.changed[:] = False
        if not certify:
            self.certified = False
            return self.rates(cap, link, np.repeat(np.arange(cap.size), hops))
        levels: list[tuple[float, bool]] = []
        rates = self.rates(cap, link, np.repeat(np.arange(cap.size), hops), levels)
        values = np.unique(np.array([value for value, _ in levels]))  # a few
        self.certified = all(exact for _, exact in levels) and not np.any(values[1:] <= values[:-1] * (1 + _NEAR))
        return rates

    def rates(
        self, cap: np.ndarray, link: np.ndarray, owner: np.ndarray, levels: list[tuple[float, bool]] | None = None
    ) -> np.ndarray:
        """Max-min fair rates of the flows in flight (bound ``cap``; hop e: flow ``owner[e]`` crosses
        ``link[e]``), as ``FlowNetwork._rerate`` computes them: a link binds where the bounds of its
        flows (``_load``, kept as they start and end) sum to more than its capacity.

        Called at every instant over every flow in flight, so it takes the common cases without
        copies: every hop on a binding link, every flow crossing one (then no flow needs renumbering).
        The binding links are numbered in order of their compact ids (``_local`` is scratch space),
        the constrained flows in order, as ``relabel`` would."""
        rates = cap.copy()
        binding = self.load[: self.count] > self.threshold[: self.count]
        self.binding[: self.count] = binding  # (``rerate`` keeps it up to date from here)
        if not link.size:
            return rates
        on = binding[link]
        if on.all():
            hop_owner, hop_link = owner, link
        else:
            where = np.flatnonzero(on)
            if not where.size:
                return rates
            hop_owner, hop_link = owner[where], link[where]
        constrained = np.zeros(cap.size, dtype=bool)
        constrained[hop_owner] = True
        if constrained.all():
            rows: np.ndarray | slice = slice(None)
            local_owner, flows = hop_owner, cap.size
        else:
            rows = np.flatnonzero(constrained)
            flows = rows.size
            renumber = np.empty(cap.size, dtype=np.int64)
            renumber[rows] = np.arange(flows)
            local_owner = renumber[hop_owner]
        links = np.flatnonzero(binding)
        self._local[links] = np.arange(links.size)
        local_link = self._local[hop_link]
        rates[rows] = max_min_fair_rates_flat(
            local_owner, local_link, flows, self.capacity[links], bound=cap[rows], levels=levels
        )
        return rates
