"""A collective as one fluid simulation over all its rounds: the message path's model, vectorised.

The round path (``collective_engine.VectorisedExecutor``) times a round at a time and proves that
no flow of one round meets a flow of another on a shared link, or meets only flows of the round
just before (``round_overlap``). On a dragonfly that proof fails where it should: halving doubling's
exchanges share global links with 64 or 512 flows each, a flow that starts a little earlier has
the link alone for a moment, and the ranks' clocks drift apart by a factor of about seven per
round (0.1 us, 0.7, 4.5, 30, 208 us at 4096 ranks), so flows of three and more rounds share links.
Then the message path (``message_executor``) was the only exact answer: SimPy events per message,
minutes at 131,072 ranks.

Yet such a run has few distinct instants: the ranks drift apart in classes that move together
(the message path re-rates 143 times for halving doubling at 4096 ranks, 98,304 transfers). This
executor follows the message path's model instant by instant, with numpy over every flow in
flight rather than an event per message:

* a rank enters round k+1 once every transfer it sends or receives in round k has arrived (and a
  received REDUCE transfer has been added in), a rank that takes no part in a round passes
  through it; its flows of the round start the sender overhead after it entered;
* at each instant (the earliest flow end or flow start) every flow in flight is advanced at its
  rate, the flows due end (within ``FINISH_TOLERANCE``, as the flow network ends them), the
  arrivals they imply open the next rounds of their ranks (arrival = end + latency, + reduction
  for the receiver: known as the flow ends, so a rank's next flows are scheduled at once), and
  the flows due start;
* then every flow in flight gets its max-min fair rate as ``FlowNetwork._rerate`` gives it: at
  most its route's slowest link, links that cannot bind (the flows' bounds sum to no more than
  the capacity) left out, ``max_min_fair_rates_flat`` over the rest.

So the times are the message path's up to the rounding of the same arithmetic in another order
(``tests/test_fluid_executor.py`` holds them to 1e-9 relative). The cost is one pass over the
flows in flight per instant: halving doubling on the dragonfly at 131,072 ranks has a few hundred.
Rounds are built as the first rank reaches them and dropped once every rank has left them. A run
may start after rounds the round path timed already, where every rank entered the next in step
(``Resume``). In a run of identical rounds, once the state repeats a few rounds later, whole
periods are skipped (``fluid_steady``; not where a transfer log is kept). Where the schedule and the
fabric repeat every few ranks, only one period of ranks is simulated (``fold``: ``fluid_fold``).
LogGP overheads (a rank's CPU handling one message at a time) are not modelled here:
``ContentionDetected``, and the caller goes message by message.

``run(..., log=...)`` records the transfers as the message path does (sender's round entry to
arrival, schedule ranks). ``run(..., link_use=True)`` also keeps, per link the collective's flows
crossed, their lowest and highest sender and when the first of them started and the last ended
(``LinkUse``): what a caller that times other flows on the same fabric needs to check that none
met them and to check later flows against them (``RoleExecutor``, over
``VectorisedExecutor.place_apart``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.hardware_models.network import max_min_fair_rates_flat
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.flow_network import BINDING_TOLERANCE, FINISH_TOLERANCE
from ddlsim.simulator.engine.fluid_steady import LONGEST_PERIOD, Snapshot, period
from ddlsim.simulator.engine.link_state import ContentionDetected
from ddlsim.simulator.engine.message_executor import MemberLog, TransferLog
from ddlsim.simulator.engine.round_structures import RoundCache, ScheduleRuns, binding_hops, spans

if TYPE_CHECKING:
    from ddlsim.simulator.engine.fluid_fold import Fold  # which runs this module's executor

__all__ = ["FluidExecutor", "LinkUse"]


@dataclass
class LinkUse:
    """Per fabric link that a run's flows crossed (binding hops only): the lowest and highest
    schedule rank sending over it, when its first flow started and its last one ended."""

    links: np.ndarray
    low: np.ndarray
    high: np.ndarray
    first_s: np.ndarray
    last_s: np.ndarray


class _UseTracker:
    """``LinkUse`` gathered as flows start and end, per compact link id (ids grow as rounds are built)."""

    def __init__(self) -> None:
        self.low = np.empty(0, dtype=np.int64)
        self.high = np.empty(0, dtype=np.int64)
        self.first = np.empty(0)
        self.last = np.empty(0)

    def _cover(self, size: int) -> None:
        grow = size - self.first.size
        if grow > 0:
            self.low = np.concatenate([self.low, np.full(grow, np.iinfo(np.int64).max)])
            self.high = np.concatenate([self.high, np.full(grow, -1, dtype=np.int64)])
            self.first = np.concatenate([self.first, np.full(grow, np.inf)])
            self.last = np.concatenate([self.last, np.full(grow, -np.inf)])

    def started(self, links: np.ndarray, senders: np.ndarray, now: float, size: int) -> None:
        self._cover(size)
        np.minimum.at(self.low, links, senders)
        np.maximum.at(self.high, links, senders)
        self.first[links] = np.minimum(self.first[links], now)  # every flow here starts at now

    def ended(self, links: np.ndarray, now: float) -> None:
        self.last[links] = now  # instants only move forward

    def use(self, fabric_link: np.ndarray) -> LinkUse:
        on = np.flatnonzero(self.high >= 0)
        return LinkUse(fabric_link[on], self.low[on], self.high[on], self.first[on], self.last[on])


@dataclass(frozen=True)
class Resume:
    """A point from which ``run`` may start instead of the first round: the schedule's first ``rounds``
    non-empty rounds are timed already, and every rank entered the next one at ``entry_s``. Exact
    where no flow of those rounds is still in flight when a later one starts: the round path
    (``VectorisedExecutor.resume``) hands over only points where every rank entered at the same
    time, so that every earlier flow ended before then (it ended before its sender left its round)."""

    rounds: int
    entry_s: np.ndarray


def _after(runs: list[tuple[Round, int]], rounds: int) -> list[tuple[Round, int]]:
    """``runs`` without their first ``rounds`` rounds."""
    left: list[tuple[Round, int]] = []
    for rnd, count in runs:
        if rounds >= count:
            rounds -= count
            continue
        left.append((rnd, count - rounds))
        rounds = 0
    return left


@dataclass
class _Round:
    """One round's transfers as this executor needs them, and its ranks' progress through it."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    overhead_s: np.ndarray
    latency_s: np.ndarray
    reduce_s: np.ndarray  # the receiver's reduction seconds (zeros where free)
    cap_Bps: np.ndarray  # the route's slowest link (inf: no route, the transfer ends as it starts)
    hop_link: np.ndarray  # compact link ids of the binding hops, transfer by transfer
    hop_ptr: np.ndarray  # transfer i's hops: hop_link[hop_ptr[i]:hop_ptr[i + 1]]
    send_order: np.ndarray  # transfers sorted by sender
    send_ptr: np.ndarray  # rank r's sends: send_order[send_ptr[r]:send_ptr[r + 1]]
    left: np.ndarray  # per rank, transfers it sends or receives that have not arrived
    done_s: np.ndarray  # per rank, the latest arrival (or end of reduction) so far
    entered: np.ndarray  # per rank, whether it has entered this round
    entry_s: np.ndarray  # per rank, when it entered


class FluidExecutor:
    """Per-rank finish times of a collective from one fluid simulation of all its flows (see the module)."""

    def __init__(self, fabric: Fabric, extrapolate: bool = True, fold: Fold | None = None) -> None:
        if fabric.spec.loggp:
            raise ContentionDetected("LogGP overheads serialise a rank's messages: not modelled by the fluid path")
        self.fabric = fabric
        self._redundant = fabric.redundant if fabric.redundant.any() else None
        self._compact = np.full(fabric.capacity_Bps.size, -1, dtype=np.int64)  # fabric link -> compact id
        self._capacity = np.empty(0)  # per compact id
        self._threshold = self._capacity  # a link binds where its flows' bounds sum to more than this
        self._routes = RoundCache()  # what each round's transfer arrays imply (``_route``)
        self._fabric_link = np.empty(0, dtype=np.int64)  # per compact id
        self.instants = 0  # instants at which rates were computed
        self.extrapolate = extrapolate  # False: simulate every round (tests hold the skipping to this)
        self.skipped_rounds = 0  # rounds of a repeating period moved over, not simulated (``fluid_steady``)
        self.transfers = 0
        self.link_use: LinkUse | None = None  # of the last run, where asked for
        self.fold = fold  # simulate ranks 0..fold.ranks-1 only, standing for every copy (``fluid_fold``)

    # --- rounds ----------------------------------------------------------------------------------
    def _build(self, schedule: Schedule, rnd: Round, message_bytes: float) -> _Round:
        fabric, ranks = self.fabric, schedule.ranks if self.fold is None else self.fold.ranks
        found, routes = self._routes.get(rnd, None)
        if not found:
            routes = self._route(rnd, ranks)
            self._routes.put(rnd, None, routes)
        src, dst, overhead_s, latency_s, cap, hop_link, hop_ptr, send_order, send_ptr, kept = routes
        nbytes = np.broadcast_to(schedule.transfer_bytes(rnd, message_bytes), (len(rnd),))
        op = rnd.op if kept is None else np.broadcast_to(np.asarray(rnd.op), (len(rnd),))[kept]
        nbytes = np.array(nbytes if kept is None else nbytes[kept], dtype=np.float64)
        reduce_s = fabric.reduce_times(nbytes, op)
        return _Round(
            src,
            dst,
            nbytes,
            overhead_s,
            latency_s,
            np.zeros(src.size) if reduce_s is None else np.broadcast_to(reduce_s, src.shape).astype(np.float64),
            cap,
            hop_link,
            hop_ptr,
            send_order,
            send_ptr,
            np.bincount(src, minlength=ranks) + np.bincount(dst, minlength=ranks),
            np.full(ranks, -np.inf),
            np.zeros(ranks, dtype=bool),
            np.full(ranks, -np.inf),
        )

    def _route(self, rnd: Round, ranks: int) -> tuple[np.ndarray | None, ...]:
        """What a round's transfer arrays imply, kept while the same arrays come back (a ring's
        steps): (src, dst, overhead, latency, bottleneck, hop links, hop pointers, send order, send
        pointers, the transfers kept where folded: ``fold.sent``, else None)."""
        fabric, fold = self.fabric, self.fold
        src = np.asarray(rnd.src, dtype=np.int64)
        dst = np.asarray(rnd.dst, dtype=np.int64)
        kept = None
        if fold is not None:  # the transfers the kept ranks send, over their links' orbits
            kept = fold.sent(src)
            src, dst = src[kept], dst[kept]
        routes = fabric.routes(src, dst)
        overhead_s = np.asarray(fabric.overheads(src, dst), dtype=np.float64)
        if fold is not None:
            routes, dst = fold.links(routes), dst % fold.ranks
        on = routes >= 0
        capacity = np.where(on, fabric.capacity_Bps[np.maximum(routes, 0)], np.inf)
        cap = capacity.min(axis=1) if routes.shape[1] else np.full(src.size, np.inf)
        links, owner = binding_hops(routes, self._redundant)
        new = np.zeros(self._compact.size, dtype=bool)
        new[links[self._compact[links] < 0]] = True
        fresh = np.flatnonzero(new)
        self._compact[fresh] = self._capacity.size + np.arange(fresh.size)
        self._capacity = np.concatenate([self._capacity, fabric.capacity_Bps[fresh]])
        self._fabric_link = np.concatenate([self._fabric_link, fresh])
        self._threshold = self._capacity * (1 + BINDING_TOLERANCE)
        order = np.argsort(src, kind="stable")
        return (
            src,
            dst,
            overhead_s,
            np.asarray(fabric.latencies(routes), dtype=np.float64),
            cap,
            self._compact[links],
            np.searchsorted(owner, np.arange(src.size + 1)),
            order,
            np.searchsorted(src[order], np.arange(ranks + 1)),
            kept,
        )

    # --- the simulation --------------------------------------------------------------------------
    def run(
        self,
        schedule: Schedule,
        message_bytes: float,
        start_s: np.ndarray | float,
        resume: Resume | None = None,
        link_use: bool = False,
        log: TransferLog | MemberLog | None = None,
        runs: list[tuple[Round, int]] | None = None,
    ) -> np.ndarray:
        """Per-rank finish times (absolute seconds) of ``schedule`` entered at ``start_s``, or from where
        the round path gave up (``resume``; ``start_s`` is then not read); with ``link_use``, what its
        flows did on each link is left in ``self.link_use``; ``log`` gets every transfer (its sender's
        round entry to its arrival); ``runs``: the schedule's runs of identical rounds where the caller
        has them (``ScheduleRuns``: else they are found here). Where ``fold``, the kept ranks' times
        are those of every copy (``start_s`` and ``resume`` must repeat as the fold does)."""
        fold = self.fold
        ranks = schedule.ranks if fold is None else fold.ranks
        if fold is not None and (link_use or log is not None):
            raise ValueError("a folded run keeps neither a transfer log nor link use")
        tracker = _UseTracker() if link_use else None
        self.link_use = None
        if runs is None:
            runs = ScheduleRuns().get(schedule)  # its non-empty rounds, identical ones as one run
        if resume is not None:
            runs = _after(runs, resume.rounds)
            start_s = resume.entry_s
        run_end = np.cumsum([count for _, count in runs], dtype=np.int64)  # each run's end (round index)
        rounds: dict[int, _Round] = {}
        built = 0  # rounds taken from the schedule so far
        recent: list[Snapshot] = []  # the state each time the last rank reached a round (``fluid_steady``)

        def run_start(run: int) -> int:
            return int(run_end[run - 1]) if run else 0

        def round_at(k: int) -> _Round | None:
            nonlocal built
            while built <= k and built < (run_end[-1] if runs else 0):
                rnd = runs[int(np.searchsorted(run_end, built, side="right"))][0]
                rounds[built] = self._build(schedule, rnd, message_bytes)
                built += 1
            return rounds.get(k)

        finish = np.full(ranks, np.nan)
        current = np.zeros(ranks, dtype=np.int64)  # the round each rank is in (or about to enter)
        # flows waiting to start, and flows in flight: (round, transfer) and their times
        w_round, w_index, w_start = [np.empty(0, dtype=np.int64)] * 2 + [np.empty(0)]
        a_round, a_index = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        a_remaining, a_cap, a_rate, a_finish = (np.empty(0) for _ in range(4))
        # the hops of the flows in flight: link (compact id), flow (position in the a_ arrays), its bound
        h_link, h_owner, h_cap = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0)

        def enter(who: np.ndarray, at: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            """Ranks ``who`` enter round k (and pass through every round they have nothing left in) at
            ``at``; returns their new flows as (round, transfers, start times) batches."""
            started = []
            while who.size:
                rd = round_at(k)
                if rd is None:
                    finish[who] = at
                    break
                current[who] = k
                rd.entered[who] = True
                rd.entry_s[who] = at
                lo, hi = rd.send_ptr[who], rd.send_ptr[who + 1]
                counts = hi - lo
                if counts.any():
                    position = spans(lo, counts)
                    sent = rd.send_order[position]
                    started.append((np.full(sent.size, k), sent, np.repeat(at, counts) + rd.overhead_s[sent]))
                through = rd.left[who] == 0  # nothing of this round still to arrive
                who, at = who[through], np.maximum(at[through], rd.done_s[who[through]])
                k += 1
            return started

        def arrive(ended_round: np.ndarray, ended_index: np.ndarray, now: float) -> list:
            """The transfers ended at ``now`` arrive; ranks with nothing left in their round move on."""
            started = []
            for k in np.unique(ended_round).tolist():
                rd = rounds[k]
                index = ended_index[ended_round == k]
                self.transfers += index.size
                arrival = now + rd.latency_s[index]
                src, dst = rd.src[index], rd.dst[index]
                if log is not None:
                    log.add(src, dst, rd.nbytes[index], rd.entry_s[src], arrival)
                np.maximum.at(rd.done_s, src, arrival)
                np.maximum.at(rd.done_s, dst, arrival + rd.reduce_s[index])
                np.subtract.at(rd.left, src, 1)
                np.subtract.at(rd.left, dst, 1)
                mark = np.zeros(ranks, dtype=bool)
                mark[src] = True
                mark[dst] = True
                touched = np.flatnonzero(mark)
                moving = touched[(rd.left[touched] == 0) & rd.entered[touched] & (current[touched] == k)]
                if moving.size:
                    at = np.maximum(rd.entry_s[moving], rd.done_s[moving])
                    started += enter(moving, at, k + 1)
            return started

        def progress(low: int, now: float) -> list[tuple[np.ndarray, ...]]:
            return [
                (rd.left.copy(), rd.entered.copy(), rd.done_s - now, rd.entry_s - now)
                for rd in (rounds[k] for k in range(low, built))
            ]

        start = np.broadcast_to(np.asarray(start_s, dtype=np.float64), (schedule.ranks,))[:ranks]
        transfers = self.transfers
        batches = enter(np.arange(ranks), np.array(start), 0)
        now, changed = -np.inf, False
        while True:
            if batches:
                w_round = np.concatenate([w_round, *(b[0] for b in batches)])
                w_index = np.concatenate([w_index, *(b[1] for b in batches)])
                w_start = np.concatenate([w_start, *(b[2] for b in batches)])
                batches = []
            # flows that start now (those that carry nothing, or cross no link, end at once, and what
            # their arrival schedules may start now too: the loop comes back to this instant)
            due = w_start <= now
            if due.any():
                changed = True
                new_round, new_index = w_round[due], w_index[due]
                w_round, w_index, w_start = w_round[~due], w_index[~due], w_start[~due]
                for k in np.unique(new_round).tolist():
                    rd = rounds[k]
                    index = new_index[new_round == k]
                    instant = (rd.nbytes[index] <= 0) | (rd.cap_Bps[index] == np.inf)
                    if instant.any():
                        batches += arrive(np.full(int(instant.sum()), k), index[instant], now)
                        index = index[~instant]
                    lo, hi = rd.hop_ptr[index], rd.hop_ptr[index + 1]
                    counts = hi - lo
                    position = spans(lo, counts)
                    if tracker is not None:
                        senders = np.repeat(rd.src[index], counts)
                        tracker.started(rd.hop_link[position], senders, now, self._capacity.size)
                    h_link = np.concatenate([h_link, rd.hop_link[position]])
                    h_owner = np.concatenate([h_owner, a_index.size + np.repeat(np.arange(index.size), counts)])
                    h_cap = np.concatenate([h_cap, np.repeat(rd.cap_Bps[index], counts)])
                    a_round = np.concatenate([a_round, np.full(index.size, k)])
                    a_index = np.concatenate([a_index, index])
                    a_remaining = np.concatenate([a_remaining, rd.nbytes[index]])
                    a_cap = np.concatenate([a_cap, rd.cap_Bps[index]])
                continue
            if changed:  # one re-rating per instant, after every start and end in it
                a_rate = self._rates(a_cap, h_link, h_owner, h_cap)
                a_finish = now + np.maximum(a_remaining, 0.0) / a_rate
                self.instants += 1
                changed = False
                low = int(current.min())
                for k in [k for k in rounds if k < low]:
                    del rounds[k]  # every rank has left it
                if self.extrapolate and log is None and (not recent or low != recent[-1].first):
                    run = int(np.searchsorted(run_end, low, side="right"))
                    if built <= run_end[run] and np.isnan(finish).all():  # every round reached is of one run
                        flows = (a_round - low, a_index, a_finish - now)
                        waiting = (w_round - low, w_index, w_start - now)
                        taken = Snapshot(low, now, built, flows, waiting, current - low, progress(low, now))
                        recent = [earlier for earlier in recent[-LONGEST_PERIOD:] if earlier.first >= run_start(run)]
                        rounds_per, period_s = next(
                            ((low - e.first, c) for e in reversed(recent) if (c := period(e, taken)) is not None),
                            (0, 0.0),
                        )
                        skip = (int(run_end[run]) - built) // rounds_per * rounds_per if rounds_per else 0
                        recent.append(taken)
                        if skip:  # as many whole periods as keep every round reached in the run
                            shift = skip // rounds_per * period_s
                            a_round += skip
                            a_finish += shift
                            w_round += skip
                            w_start[:] += shift
                            moved = {k + skip: rd for k, rd in rounds.items()}
                            for rd in moved.values():
                                rd.done_s += shift
                                rd.entry_s += shift
                            rounds.clear()
                            rounds.update(moved)
                            current += skip
                            built += skip
                            now += shift
                            self.transfers += skip * rounds[low + skip].src.size  # as built (folded)
                            self.skipped_rounds += skip
                            recent = []
            if not a_index.size and not w_index.size:
                break
            following = min(
                float(a_finish.min()) if a_finish.size else np.inf, float(w_start.min()) if w_start.size else np.inf
            )
            if a_index.size:
                a_remaining = a_remaining - a_rate * (following - now)
            now = following
            # flows that end now
            limit = now + FINISH_TOLERANCE * max(abs(now), 1e-9)
            ending = a_finish <= limit
            if ending.any():
                changed = True
                batches += arrive(a_round[ending], a_index[ending], now)
                keep = ~ending
                position = np.cumsum(keep) - 1
                # positions rather than masks: one pass to find them for the several arrays taken
                hop_keep = keep[h_owner]
                if tracker is not None:
                    tracker.ended(h_link[~hop_keep], now)
                hops = np.flatnonzero(hop_keep)
                h_link, h_owner, h_cap = h_link[hops], position[h_owner[hops]], h_cap[hops]
                kept = np.flatnonzero(keep)
                a_round, a_index, a_remaining, a_cap = a_round[kept], a_index[kept], a_remaining[kept], a_cap[kept]
                a_rate, a_finish = a_rate[kept], a_finish[kept]
        if np.isnan(finish).any():
            raise ContentionDetected("a rank never finished: the schedule's transfers do not match up")
        if tracker is not None:
            self.link_use = tracker.use(self._fabric_link)
        if fold is not None:  # each transfer counted stands for one per copy
            self.transfers += (self.transfers - transfers) * (fold.copies - 1)
            return np.tile(finish, fold.copies)
        return finish

    def _rates(self, cap: np.ndarray, link: np.ndarray, owner: np.ndarray, hop_cap: np.ndarray) -> np.ndarray:
        """Max-min fair rates of the flows in flight (bound ``cap``; hop e: flow ``owner[e]`` crosses
        ``link[e]``, ``hop_cap[e]`` its flow's bound), as ``FlowNetwork._rerate`` computes them.

        Called at every instant over every flow in flight, so it takes the common cases without
        copies: every hop on a binding link, every flow crossing one (then no flow needs renumbering).
        The binding links and constrained flows are numbered in order, as ``relabel`` would."""
        rates = cap.copy()
        if not link.size:
            return rates
        capacity = self._capacity
        binding = np.bincount(link, weights=hop_cap, minlength=capacity.size) > self._threshold
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
            local_owner, flows = (np.cumsum(constrained) - 1)[hop_owner], rows.size
        links = np.flatnonzero(binding)  # every binding link carries a hop
        local_link = (np.cumsum(binding) - 1)[hop_link]
        # each flow's own bound as one more link it crosses alone
        owners = np.concatenate([local_owner, np.arange(flows)])
        via = np.concatenate([local_link, links.size + np.arange(flows)])
        rates[rows] = max_min_fair_rates_flat(owners, via, flows, np.concatenate([capacity[links], cap[rows]]))
        return rates
