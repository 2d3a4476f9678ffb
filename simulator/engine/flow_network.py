"""Flow-level bandwidth sharing in SimPy: concurrent transfers share links max-min fairly.

Each active flow has bytes left and a rate. Whenever flows start or end, every flow is advanced to
``now`` at its old rate, rates are recomputed and the next completion is scheduled; a stale wake-up
(rates changed since it was scheduled) is ignored. Three things keep that cheap:

* Flows that start or end at the same instant are re-rated once: a start marks the network dirty
  and the re-rating runs as a zero-delay event after everything else already due at that instant.
  No time passes in between, so deferring it changes no byte count.
* A flow's rate can never exceed its path's slowest link, b_f (adding that bound changes nothing:
  a link's own constraint implies it). A link whose capacity is at least the sum of b_f over the
  flows crossing it therefore can never bind: its constraint is implied by those bounds, so it is
  left out (the feasible rates, hence the max-min allocation, are unchanged). A flow that crosses
  only such links runs at b_f with no max-min at all: a ring, or any pattern without a shared
  bottleneck, costs one division per flow.
* The max-min fair share of the flows that do cross a binding link is computed with numpy
  (``max_min_fair_rates_flat``), each flow's b_f taking part as a private link.
* With few flows in flight (a parameter server's port taking one push after another, the usual
  state of an asynchronous algorithm's run) the bookkeeping runs as scalar Python: a numpy call
  costs microseconds whatever its size, and a few dozen of them per start and end made the whole
  cost of such runs. Same arithmetic, same answers; the numpy code takes over above ``_SMALL_FLOWS``
  flows or ``_SMALL_HOPS`` link entries (a torus route may cross hundreds of links).
  A route is prepared once (``route``: links, b_f) and may be passed to ``transfer`` again.

Links marked ``redundant`` (``Fabric.redundant``: implied by other links by construction) are
dropped from every path as it enters.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import simpy

from ddlsim.hardware_models.network import BINDING_TOLERANCE, FINISH_TOLERANCE, max_min_fair_rates_flat

# scalar bookkeeping while at most this many flows, crossing at most this many links in all, are in flight
_SMALL_FLOWS = 8
_SMALL_HOPS = 64
_SHORT_PATH = 16  # a path of at most this many links is counted onto its links in scalar Python


class Route(NamedTuple):
    """A path as ``FlowNetwork.transfer`` keeps it: the binding-candidate links and b_f, the
    capacity of the path's slowest link (redundant links included: they bound the rate too)."""

    links: tuple[int, ...]
    cap_Bps: float


class FlowNetwork:
    """Max-min fair flows over links of ``capacity_Bps`` (bytes/s), in ``env``'s time."""

    def __init__(self, env: simpy.Environment, capacity_Bps: np.ndarray, redundant: np.ndarray | None = None) -> None:
        self.env = env
        self.capacity_Bps = np.asarray(capacity_Bps, dtype=np.float64)
        links = self.capacity_Bps.size
        self._redundant = None if redundant is None else np.asarray(redundant, dtype=bool)
        # per link: active flows crossing it and the sum of their path bounds b_f
        self._count = np.zeros(links, dtype=np.int64)
        self._bound = np.zeros(links)
        # per flow slot (grown by doubling); a free slot has _done None
        slots = 16
        self._path = np.full((slots, 1), -1, dtype=np.int64)  # binding-candidate links, -1 padded
        self._hops = np.zeros(slots, dtype=np.int64)
        self._remaining = np.zeros(slots)
        self._rate = np.zeros(slots)
        self._cap = np.zeros(slots)  # b_f: the path's slowest link
        self._finish = np.full(slots, np.inf)
        self._order = np.zeros(slots, dtype=np.int64)  # start order, so ends fire in it
        self._live = np.zeros(slots, dtype=bool)
        self._live_index: np.ndarray | None = None  # flatnonzero(_live), kept until it changes
        self._live_set: set[int] = set()  # the same slots, for the scalar bookkeeping
        self._live_hops = 0  # link entries of the flows in flight
        self._links: list[tuple[int, ...]] = [()] * slots  # each slot's path, for the same
        self._done: list[simpy.Event | None] = [None] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._started = 0
        self._updated = env.now
        self._generation = 0
        self._dirty = False
        self.rerates = 0  # rate computations run (for benchmarks)

    @property
    def active_flows(self) -> int:
        return int(self._live.sum())

    def route(self, links) -> Route:
        """``links`` (link ids; -1 entries ignored) prepared for ``transfer``: keep it to send again."""
        path = np.asarray(links, dtype=np.int64).ravel()
        path = path[path >= 0]
        if not path.size:
            return Route((), np.inf)
        cap = float(self.capacity_Bps[path].min())
        if self._redundant is not None:
            path = path[~self._redundant[path]]
        return Route(tuple(path.tolist()), cap)

    def transfer(self, links, nbytes: float) -> simpy.Event:
        """An event that fires when ``nbytes`` have crossed ``links`` (link ids, -1 entries
        ignored, or a ``Route`` from ``route``)."""
        done = self.env.event()
        route = links if isinstance(links, Route) else self.route(links)
        path, cap = route
        if nbytes <= 0 or cap == np.inf:
            done.succeed()
            return done
        # no advance needed: rates change only at the re-rating, which advances first (a new flow's
        # rate is 0 until then)
        hops = len(path)
        slot = self._slot(hops)
        self._path[slot, :hops] = path
        self._path[slot, hops:] = -1
        self._links[slot] = path
        self._hops[slot] = hops
        self._remaining[slot] = float(nbytes)
        self._cap[slot] = cap
        self._rate[slot] = 0.0
        self._finish[slot] = np.inf
        self._order[slot] = self._started
        self._started += 1
        self._live[slot] = True
        self._live_set.add(slot)
        self._live_hops += hops
        self._live_index = None
        self._done[slot] = done
        if hops <= _SHORT_PATH:  # a few links: scalar updates beat np.add.at
            count, bound = self._count, self._bound
            for link in path:
                count[link] += 1
                bound[link] += cap
        else:
            index = np.fromiter(path, dtype=np.int64, count=hops)
            np.add.at(self._count, index, 1)
            np.add.at(self._bound, index, cap)
        self._mark_dirty()
        return done

    # --- slots -----------------------------------------------------------------------------------
    def _slot(self, hops: int) -> int:
        if hops > self._path.shape[1]:
            wider = np.full((self._path.shape[0], hops), -1, dtype=np.int64)
            wider[:, : self._path.shape[1]] = self._path
            self._path = wider
        if not self._free:
            old = self._live.size
            grow = old

            def extend(array: np.ndarray, fill) -> np.ndarray:
                extra = np.full((grow, *array.shape[1:]), fill, dtype=array.dtype)
                return np.concatenate([array, extra])

            self._path = extend(self._path, -1)
            self._hops = extend(self._hops, 0)
            self._remaining = extend(self._remaining, 0.0)
            self._rate = extend(self._rate, 0.0)
            self._cap = extend(self._cap, 0.0)
            self._finish = extend(self._finish, np.inf)
            self._order = extend(self._order, 0)
            self._live = extend(self._live, False)
            self._done.extend([None] * grow)
            self._links.extend([()] * grow)
            self._free = list(range(old + grow - 1, old - 1, -1))
        return self._free.pop()

    # --- time ------------------------------------------------------------------------------------
    def _live_slots(self) -> np.ndarray:
        if self._live_index is None:
            self._live_index = np.flatnonzero(self._live)
        return self._live_index

    def _small(self) -> bool:
        return len(self._live_set) <= _SMALL_FLOWS and self._live_hops <= _SMALL_HOPS

    def _advance(self) -> None:
        elapsed = self.env.now - self._updated
        if elapsed > 0:
            if self._small():
                remaining, rate = self._remaining, self._rate
                for slot in self._live_set:
                    remaining[slot] -= rate[slot] * elapsed
            else:
                live = self._live_slots()
                self._remaining[live] -= self._rate[live] * elapsed
        self._updated = self.env.now

    def _mark_dirty(self) -> None:
        """Re-rate once, after everything else due at this instant (a batch of starts and ends)."""
        if not self._dirty:
            self._dirty = True
            self._generation += 1  # a wake-up scheduled before this change is stale
            self.env.timeout(0).callbacks.append(self._rerate)

    def _rerate(self, _event: simpy.Event | None = None) -> None:
        self._dirty = False
        self._advance()
        self._generation += 1
        if not self._live_set:
            return
        self.rerates += 1
        if self._small() and self._rerate_unbound():
            return
        live = self._live_slots()
        rates = self._cap[live].copy()
        paths = self._path[live]
        hop = np.maximum(paths, 0)
        # links that can bind, looked up on the live paths only (a fabric may have millions of links)
        on_binding = (paths >= 0) & (self._bound[hop] > self.capacity_Bps[hop] * (1 + BINDING_TOLERANCE))
        if on_binding.any():
            constrained = on_binding.any(axis=1)
            if constrained.any():
                rows = np.flatnonzero(constrained)
                owner_local, column = np.nonzero(on_binding[rows])
                links = paths[rows][owner_local, column]
                unique_links, local_link = np.unique(links, return_inverse=True)
                flows = rows.size
                # each flow's own bound b_f as a private link numbered after the shared ones
                owner = np.concatenate([owner_local, np.arange(flows)])
                link = np.concatenate([local_link.ravel(), unique_links.size + np.arange(flows)])
                capacity = np.concatenate([self.capacity_Bps[unique_links], rates[rows]])
                rates[rows] = max_min_fair_rates_flat(owner, link, flows, capacity)
        now = self.env.now
        self._rate[live] = rates
        self._finish[live] = now + np.maximum(self._remaining[live], 0.0) / rates
        self._wake_at(float(self._finish[live].min()))

    def _rerate_unbound(self) -> bool:
        """With few flows: when no link of theirs can bind, each runs at b_f; schedule the next end
        and say True. False (nothing changed) when some link can bind."""
        bound, capacity, links = self._bound, self.capacity_Bps, self._links
        live = self._live_set
        for slot in live:
            for link in links[slot]:
                if bound[link] > capacity[link] * (1 + BINDING_TOLERANCE):
                    return False
        now = self.env.now
        cap, rate, finish, remaining = self._cap, self._rate, self._finish, self._remaining
        earliest = np.inf
        for slot in live:
            rate[slot] = cap[slot]
            end = now + max(float(remaining[slot]), 0.0) / cap[slot]
            finish[slot] = end
            earliest = min(earliest, end)
        self._wake_at(earliest)
        return True

    def _wake_at(self, end: float) -> None:
        """Wake at ``end``, the next flow's end under the rates just set (stale if they change first)."""
        generation = self._generation
        self.env.timeout(max(end - self.env.now, 0.0)).callbacks.append(lambda _event: self._wake(generation))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        now = self.env.now
        limit = now + FINISH_TOLERANCE * max(abs(now), 1e-9)
        if self._small():
            finish, order = self._finish, self._order
            ended_slots = sorted((slot for slot in self._live_set if finish[slot] <= limit), key=order.__getitem__)
            count, bound, cap, links = self._count, self._bound, self._cap, self._links
            for slot in ended_slots:
                self._live_hops -= len(links[slot])
                for link in links[slot]:
                    count[link] -= 1
                    bound[link] = bound[link] - cap[slot] if count[link] else 0.0  # idle: exactly nothing
        else:
            live = self._live_slots()
            ended = live[self._finish[live] <= limit]
            ended = ended[np.argsort(self._order[ended], kind="stable")]
            paths = self._path[ended]
            hop = paths >= 0
            hop_links = paths[hop]
            np.add.at(self._count, hop_links, -1)
            np.add.at(self._bound, hop_links, -np.broadcast_to(self._cap[ended, None], paths.shape)[hop])
            idle = hop_links[self._count[hop_links] == 0]
            self._bound[idle] = 0.0  # no drift: an idle link carries exactly nothing
            self._live_hops -= int(hop_links.size)
            ended_slots = ended.tolist()
        self._live[ended_slots] = False
        self._live_set.difference_update(ended_slots)
        self._live_index = None
        for slot in ended_slots:
            done = self._done[slot]
            self._done[slot] = None
            self._links[slot] = ()
            self._free.append(slot)
            assert done is not None
            done.succeed()
        self._mark_dirty()
