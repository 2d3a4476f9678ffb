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
  the capacity) left out, ``max_min_fair_rates_flat`` over the rest. As in the flow network, each
  link's sum of bounds (and count of flows) is kept as flows start and end, an idle link's set to
  exactly nothing, rather than summed afresh over every hop at every instant.

So the times are the message path's up to the rounding of the same arithmetic in another order
(``tests/test_fluid_executor.py`` holds them to 1e-9 relative). The cost is a few passes over the
flows in flight per instant: halving doubling on the dragonfly at 131,072 ranks has a few hundred.
A flow that ends keeps its place in the in-flight arrays (its hops moved onto ``_NO_LINK``) until
the ended outnumber the rest, so that an instant's ends do not copy every array.
Rounds are built as the first rank reaches them and dropped once every rank has left them. A run
may start after rounds the round path timed already, where every rank entered the next in step
(``Resume``), and take the routes' costs and binding hops of the rounds that path routed from its
structures rather than route them again (``routed``). In a run of identical rounds, once the state
repeats a few rounds later, whole periods are skipped (``fluid_steady``; not where a transfer log is
kept). Where the schedule and the fabric repeat every few ranks, only one period of ranks is
simulated (``fold``: ``fluid_fold``).
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
from typing import TYPE_CHECKING, Any

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.hardware_models.network import MAX_MIN_TOLERANCE, max_min_fair_rates_flat
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.flow_network import BINDING_TOLERANCE, FINISH_TOLERANCE
from ddlsim.simulator.engine.fluid_steady import LONGEST_PERIOD, Snapshot, period
from ddlsim.simulator.engine.link_state import ContentionDetected
from ddlsim.simulator.engine.message_executor import MemberLog, TransferLog
from ddlsim.simulator.engine.round_structures import RoundCache, ScheduleRuns, Structure, binding_hops, spans

if TYPE_CHECKING:
    from ddlsim.simulator.engine.fluid_fold import Fold  # which runs this module's executor

__all__ = ["FluidExecutor", "LinkUse"]

_NO_LINK = 0  # the compact id of no link (infinite capacity): an ended flow's hops until they are dropped
# two levels of max-min passes this close (relative) could have been frozen in one pass: wider than
# the computation's tolerance, so that a pair it would join is never missed (``_Rerating``)
_NEAR = 4 * MAX_MIN_TOLERANCE
_FRESH = 0.5  # rate every flow afresh where the components reached have more than this share of them
# below this many flows in flight (ended places included), every flow is rated afresh without looking
# for the components reached or certifying the rates for holding: torus_2d on the dragonfly at
# 131,072 ranks (100-500 flows) reached more than ``_FRESH`` of them at 126,508 of 139,032 instants,
# each paying the search (~50 us) before rating afresh anyway (~190 us); halving doubling there,
# which holds most instants' rates, has over 5,000 flows at every instant but its first few
_FEW_FLOWS = 1000
_FEW = 32  # transfers ending at one instant that ``arrive`` handles as Python sets, not rank-wide masks


def _distinct(rounds: np.ndarray) -> list[int]:
    """The round numbers in ``rounds`` (a few distinct values, many flows), in order: counted rather
    than ``np.unique``, which hashes (several ms at 100k flows)."""
    if not rounds.size:
        return []
    low, high = int(rounds.min()), int(rounds.max())
    if low == high:  # one round (almost every instant): no count
        return [low]
    return (np.flatnonzero(np.bincount(rounds - low)) + low).tolist()


def _pointers(keys: np.ndarray, count: int) -> np.ndarray:
    """Where each key 0..count-1 starts among ``keys`` sorted, and where the last one ends (count + 1
    entries): ``np.searchsorted(np.sort(keys), np.arange(count + 1))`` without the sort or the search."""
    ptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=count), out=ptr[1:])
    return ptr


class _ByLink:
    """A round's transfers by the links they cross (compact ids), from its hop lists: built the first
    time an instant's re-rating asks which transfers of the round cross some links, and kept with the
    round's routes while the same arrays come back."""

    def __init__(self, hop_link: np.ndarray, hop_ptr: np.ndarray) -> None:
        self.hop_link, self.hop_ptr = hop_link, hop_ptr
        self._ptr: np.ndarray | None = None  # link l's transfers: _transfers[_ptr[l]:_ptr[l + 1]]
        self._transfers = np.empty(0, dtype=np.int64)

    def transfers(self, links: np.ndarray) -> np.ndarray:
        """The transfers crossing each of ``links``, link after link (a transfer once per hop)."""
        if self._ptr is None:
            transfers = self.hop_ptr.size - 1
            owner = np.repeat(np.arange(transfers), np.diff(self.hop_ptr))
            # by link, then transfer: one sort of the pairs as numbers (an argsort of the links is slower)
            self._transfers = np.sort(self.hop_link * transfers + owner) % max(transfers, 1)
            self._ptr = _pointers(self.hop_link, int(self.hop_link.max()) + 1 if self.hop_link.size else 0)
        ptr = self._ptr
        links = links[links < ptr.size - 1]  # links first crossed after this round was routed: none of its
        lo = ptr[links]
        return self._transfers[spans(lo, ptr[links + 1] - lo)]


class _Tail:
    """An array appended to at every instant: a view of a buffer with room at its end, grown by half
    again when full, so that an append copies what is there only now and then rather than every time."""

    def __init__(self, dtype: type) -> None:
        self._buffer: np.ndarray = np.empty(0, dtype=dtype)
        self._size = 0

    def append(self, values: np.ndarray) -> np.ndarray:
        """The array so far (the last view returned) followed by ``values``."""
        end = self._size + values.size
        if end > self._buffer.size:
            grown = np.empty(max(end, self._buffer.size * 3 // 2), dtype=self._buffer.dtype)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        self._buffer[self._size : end] = values
        self._size = end
        return self._buffer[:end]

    def replace(self, values: np.ndarray) -> np.ndarray:
        """``values`` (a new array) as the array so far."""
        self._buffer, self._size = values, values.size
        return values


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
    instant: np.ndarray  # whether the transfer ends as it starts (no bytes, or no route)
    hop_link: np.ndarray  # compact link ids of the binding hops, transfer by transfer
    hop_ptr: np.ndarray  # transfer i's hops: hop_link[hop_ptr[i]:hop_ptr[i + 1]]
    send_order: np.ndarray  # transfers sorted by sender
    send_ptr: np.ndarray  # rank r's sends: send_order[send_ptr[r]:send_ptr[r + 1]]
    left: np.ndarray  # per rank, transfers it sends or receives that have not arrived
    done_s: np.ndarray  # per rank, the latest arrival (or end of reduction) so far
    entered: np.ndarray  # per rank, whether it has entered this round
    entry_s: np.ndarray  # per rank, when it entered
    by_link: _ByLink  # its transfers by link
    slot: np.ndarray  # per transfer, its flow's place in the in-flight arrays while in flight, else -1
    flying: int = 0  # its flows in flight


class FluidExecutor:
    """Per-rank finish times of a collective from one fluid simulation of all its flows (see the module)."""

    def __init__(
        self, fabric: Fabric, extrapolate: bool = True, fold: Fold | None = None, routed: RoundCache | None = None
    ) -> None:
        if fabric.spec.loggp:
            raise ContentionDetected("LogGP overheads serialise a rank's messages: not modelled by the fluid path")
        self.fabric = fabric
        self._redundant = fabric.redundant if fabric.redundant.any() else None
        self._compact = np.full(fabric.capacity_Bps.size, -1, dtype=np.int64)  # fabric link -> compact id
        # per compact id (``_NO_LINK`` first: where an ended flow's hops point until they are dropped;
        # ids past ``_links`` are spare room, as ``_NO_LINK``: ``_grow``)
        self._links = 1
        self._capacity = np.array([np.inf])
        self._threshold = np.array([np.inf])  # a link binds where its flows' bounds sum to more than this
        self._load = np.zeros(1)  # the bounds of the flows in flight over it, summed
        self._users = np.zeros(1, dtype=np.int64)  # the flows in flight over it
        self._local = np.zeros(1, dtype=np.int64)  # scratch: binding link -> its number in ``_rates``
        self._binding = np.zeros(1, dtype=bool)  # whether it bound at the last re-rating (``_rerate``)
        self._cover = np.zeros(1, dtype=np.int64)  # scratch, zeros between re-ratings (``_rerate``)
        self._changed = np.zeros(1, dtype=bool)  # whether its flows started or ended since the last re-rating
        # whether the rates of the last re-rating are each connected component's own (``_rerate``)
        self._certified = False
        self._fabric_link = np.array([-1], dtype=np.int64)
        # per fabric link and one more (what a route's padding, -1, reads): for routes' sums and minima
        self._link_latency = np.append(fabric.latency_s, 0.0)
        self._link_capacity = np.append(fabric.capacity_Bps, np.inf)
        self._routes = RoundCache()  # what each round's transfer arrays imply (``_route``)
        self.instants = 0  # instants at which rates were computed
        self.extrapolate = extrapolate  # False: simulate every round (tests hold the skipping to this)
        self.skipped_rounds = 0  # rounds of a repeating period moved over, not simulated (``fluid_steady``)
        self.transfers = 0
        self.link_use: LinkUse | None = None  # of the last run, where asked for
        self.fold = fold  # simulate ranks 0..fold.ranks-1 only, standing for every copy (``fluid_fold``)
        # the round path's structures (``Structure``) of the rounds it routed before it handed over:
        # their routes' costs and binding hops are taken from there, not routed again (``_route``)
        self.routed = routed
        self.taken_routes = 0  # rounds whose routes' costs came from ``routed``

    # --- rounds ----------------------------------------------------------------------------------
    def _build(self, schedule: Schedule, rnd: Round, message_bytes: float) -> _Round:
        fabric, ranks = self.fabric, schedule.ranks if self.fold is None else self.fold.ranks
        found, routes = self._routes.get(rnd, None)
        if not found:
            routes = self._route(rnd, ranks)
            self._routes.put(rnd, None, routes)
        src, dst, overhead_s, latency_s, cap, hop_link, hop_ptr, send_order, send_ptr, kept, by_link = routes
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
            (nbytes <= 0) | (cap == np.inf),
            hop_link,
            hop_ptr,
            send_order,
            send_ptr,
            np.bincount(src, minlength=ranks) + np.bincount(dst, minlength=ranks),
            np.full(ranks, -np.inf),
            np.zeros(ranks, dtype=bool),
            np.full(ranks, -np.inf),
            by_link,
            np.full(src.size, -1, dtype=np.int64),
        )

    def _route(self, rnd: Round, ranks: int) -> tuple[Any, ...]:
        """What a round's transfer arrays imply, kept while the same arrays come back (a ring's
        steps): (src, dst, overhead, latency, bottleneck, hop links, hop pointers, send order, send
        pointers, the transfers kept where folded: ``fold.sent``, else None, the transfers by link)."""
        fabric, fold = self.fabric, self.fold
        src = np.asarray(rnd.src, dtype=np.int64)
        dst = np.asarray(rnd.dst, dtype=np.int64)
        kept = None
        structure = None if self.routed is None or fold is not None else self.routed.get(rnd, None)[1]
        if isinstance(structure, Structure) and structure.latency_s is not None:
            # the round path's costs of these routes: the same arithmetic on the same links
            overhead_s = np.asarray(structure.overhead_s, dtype=np.float64)
            latency_s, cap = structure.latency_s, structure.bottleneck_Bps
            links, owner = structure.flat_links, structure.flat_owner
            self.taken_routes += 1
        else:
            if fold is not None:  # the transfers the kept ranks send, over their links' orbits
                kept = fold.sent(src)
                src, dst = src[kept], dst[kept]
            routes = fabric.routes(src, dst)
            overhead_s = np.asarray(fabric.overheads(src, dst), dtype=np.float64)
            if fold is not None:  # an orbit's link is a fabric link of the same capacity and latency
                routes, dst = fold.links(routes), dst % fold.ranks
            cap = self._link_capacity[routes].min(axis=1) if routes.shape[1] else np.full(src.size, np.inf)
            latency_s = self._link_latency[routes].sum(axis=1)  # as ``Fabric.latencies``
            links, owner = binding_hops(routes, self._redundant)
        compact = self._compact[links]
        unseen = links[compact < 0]
        if unseen.size:  # (a mask over the fabric's links: np.unique hashes, slower by far at 600k hops)
            new = np.zeros(self._compact.size, dtype=bool)
            new[unseen] = True
            self._grow(np.flatnonzero(new))
            compact = self._compact[links]
        order = np.argsort(src, kind="stable")
        hop_ptr = _pointers(owner, src.size)
        return (
            src,
            dst,
            overhead_s,
            latency_s,
            cap,
            compact,
            hop_ptr,
            order,
            _pointers(src, ranks),
            kept,
            _ByLink(compact, hop_ptr),
        )

    def _grow(self, fresh: np.ndarray) -> None:
        """Compact ids for fabric links ``fresh`` (crossed for the first time), the per-id arrays grown
        by half again where they are full: not at every round, each time copying them all."""
        first = self._links
        self._links += fresh.size
        if self._links > self._capacity.size:
            spare = max(self._links, self._capacity.size * 3 // 2) - self._capacity.size
            self._capacity = np.concatenate([self._capacity, np.full(spare, np.inf)])
            self._threshold = np.concatenate([self._threshold, np.full(spare, np.inf)])
            self._fabric_link = np.concatenate([self._fabric_link, np.full(spare, -1)])
            self._load = np.concatenate([self._load, np.zeros(spare)])
            self._users = np.concatenate([self._users, np.zeros(spare, dtype=np.int64)])
            self._local = np.concatenate([self._local, np.zeros(spare, dtype=np.int64)])
            self._binding = np.concatenate([self._binding, np.zeros(spare, dtype=bool)])
            self._cover = np.concatenate([self._cover, np.zeros(spare, dtype=np.int64)])
            self._changed = np.concatenate([self._changed, np.zeros(spare, dtype=bool)])
        ids = slice(first, self._links)
        self._compact[fresh] = np.arange(first, self._links)
        self._capacity[ids] = self.fabric.capacity_Bps[fresh]
        self._threshold[ids] = self._capacity[ids] * (1 + BINDING_TOLERANCE)
        self._fabric_link[ids] = fresh

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
        # flows waiting to start, and flows in flight: (round, transfer) and their times; a flow that
        # ended keeps its place (transfer -1, nothing left, no end) until the ended outnumber the rest
        w_round, w_index, w_start = [np.empty(0, dtype=np.int64)] * 2 + [np.empty(0)]
        a_round, a_index = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        a_remaining, a_cap, a_rate, a_finish = (np.empty(0) for _ in range(4))
        a_hop, a_hops = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)  # its hops: h_[a_hop:a_hop + a_hops]
        # those appended to as flows start (views of buffers: each a_round, ... is the latest view)
        t_round, t_index, t_remaining, t_cap, t_hop, t_hops, t_link = (
            _Tail(dtype) for dtype in (np.int64, np.int64, np.float64, np.float64, np.int64, np.int64, np.int64)
        )
        flying = 0  # flows in flight that have not ended
        # the hops of the flows in flight, in the a_ arrays' order: link (compact id; an ended flow's
        # hops on ``_NO_LINK``), flow (position in the a_ arrays)
        h_link = np.empty(0, dtype=np.int64)  # (flow i's hops: i repeated a_hops[i] times, where needed)
        self._load[:], self._users[:] = 0.0, 0  # (where an earlier run stopped short)
        self._certified = False

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
                if not through.any():  # (most entries: every rank waits for what it sends and receives)
                    break
                who, at = who[through], np.maximum(at[through], rd.done_s[who[through]])
                k += 1
            return started

        def arrive(ended_round: np.ndarray, ended_index: np.ndarray, now: float) -> list:
            """The transfers ended at ``now`` arrive; ranks with nothing left in their round move on."""
            started = []
            distinct = _distinct(ended_round)
            for k in distinct:
                rd = rounds[k]
                index = ended_index if len(distinct) == 1 else ended_index[ended_round == k]
                self.transfers += index.size
                arrival = now + rd.latency_s[index]
                src, dst = rd.src[index], rd.dst[index]
                if log is not None:
                    log.add(src, dst, rd.nbytes[index], rd.entry_s[src], arrival)
                if index.size <= _FEW:  # a few transfers (most instants): one by one, as the .at calls below
                    done_s, left, entered = rd.done_s, rd.left, rd.entered
                    senders, receivers = src.tolist(), dst.tolist()
                    received = (arrival + rd.reduce_s[index]).tolist()
                    for rank, at_s in zip(senders, arrival.tolist(), strict=True):
                        if at_s > done_s[rank]:
                            done_s[rank] = at_s
                    for rank, at_s in zip(receivers, received, strict=True):
                        if at_s > done_s[rank]:
                            done_s[rank] = at_s
                    for rank in senders:
                        left[rank] -= 1
                    for rank in receivers:
                        left[rank] -= 1
                    # their ranks in order, those with nothing left that entered this round and are in it
                    ready = [
                        r for r in sorted({*senders, *receivers}) if not left[r] and entered[r] and current[r] == k
                    ]
                    if ready:
                        moving = np.array(ready, dtype=np.int64)
                        started += enter(moving, np.maximum(rd.entry_s[moving], rd.done_s[moving]), k + 1)
                    continue
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
                pieces = []  # per round: (round, transfers, their hop counts, hops' links, bytes, bounds)
                place = a_index.size  # where the flows' places in the in-flight arrays start
                distinct = _distinct(new_round)
                for k in distinct:
                    rd = rounds[k]
                    index = new_index if len(distinct) == 1 else new_index[new_round == k]
                    instant = rd.instant[index]
                    if instant.any():
                        batches += arrive(np.full(int(instant.sum()), k), index[instant], now)
                        index = index[~instant]
                    lo, hi = rd.hop_ptr[index], rd.hop_ptr[index + 1]
                    counts = hi - lo
                    links = rd.hop_link[spans(lo, counts)]
                    if tracker is not None:
                        senders = np.repeat(rd.src[index], counts)
                        tracker.started(links, senders, now, self._capacity.size)
                    pieces.append((np.full(index.size, k), index, counts, links, rd.nbytes[index], rd.cap_Bps[index]))
                    rd.slot[index] = np.arange(place, place + index.size)
                    rd.flying += index.size
                    place += index.size
                # appended once per instant, not once per round: each append copies the arrays whole
                if len(pieces) == 1:
                    new_round, index, counts, links, nbytes, bound = pieces[0]
                else:
                    new_round, index, counts, links, nbytes, bound = (
                        np.concatenate(p) for p in zip(*pieces, strict=True)
                    )
                self._changed[links] = True
                # each link's flows' bounds and flows, kept as they start and end
                np.add.at(self._load, links, np.repeat(bound, counts))
                np.add.at(self._users, links, 1)
                a_hop = t_hop.append(h_link.size + np.cumsum(counts) - counts)
                a_hops = t_hops.append(counts)
                h_link = t_link.append(links)
                a_round = t_round.append(new_round)
                a_index = t_index.append(index)
                a_remaining = t_remaining.append(nbytes)
                a_cap = t_cap.append(bound)
                flying += index.size
                continue
            if changed:  # one re-rating per instant, after every start and end in it
                a_rate = self._rerate(a_cap, h_link, a_rate, a_hop, a_hops, rounds)
                a_finish = now + np.maximum(a_remaining, 0.0) / a_rate
                self.instants += 1
                changed = False
                low = int(current.min())
                for k in [k for k in rounds if k < low]:
                    del rounds[k]  # every rank has left it
                if self.extrapolate and log is None and (not recent or low != recent[-1].first):
                    run = int(np.searchsorted(run_end, low, side="right"))
                    if built <= run_end[run] and np.isnan(finish).all():  # every round reached is of one run
                        on = np.flatnonzero(a_index >= 0)
                        flows = (a_round[on] - low, a_index[on], a_finish[on] - now)
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
            if not flying and not w_index.size:
                break
            following = min(
                float(a_finish.min()) if flying else np.inf, float(w_start.min()) if w_start.size else np.inf
            )
            if flying:
                a_remaining -= a_rate * (following - now)  # (in place: the same arithmetic)
            now = following
            # flows that end now
            limit = now + FINISH_TOLERANCE * max(abs(now), 1e-9)
            ended = np.flatnonzero(a_finish <= limit)
            if ended.size:
                changed = True
                batches += arrive(a_round[ended], a_index[ended], now)
                counts = a_hops[ended]
                position = spans(a_hop[ended], counts)
                links = h_link[position]
                if tracker is not None:
                    tracker.ended(links, now)
                load, users = self._load, self._users
                np.subtract.at(load, links, np.repeat(a_cap[ended], counts))
                np.subtract.at(users, links, 1)
                load[links[users[links] == 0]] = 0.0  # no drift: an idle link carries exactly nothing
                self._changed[links] = True
                for k in _distinct(a_round[ended]):
                    rd = rounds[k]
                    gone = a_index[ended[a_round[ended] == k]]
                    rd.slot[gone] = -1
                    rd.flying -= gone.size
                a_rate[ended] = a_cap[ended]  # crossing no link now, as a re-rating from scratch would give it
                h_link[position] = _NO_LINK
                a_index[ended] = -1
                a_remaining[ended] = np.inf
                a_finish[ended] = np.inf
                flying -= ended.size
                if 2 * flying < a_index.size:  # more ended than not: drop them (keeping the order)
                    kept = np.flatnonzero(a_index >= 0)
                    a_hops = t_hops.replace(a_hops[kept])
                    hops = spans(a_hop[kept], a_hops)
                    a_hop = t_hop.replace(np.cumsum(a_hops) - a_hops)
                    h_link = t_link.replace(h_link[hops])
                    a_round, a_index = t_round.replace(a_round[kept]), t_index.replace(a_index[kept])
                    a_remaining, a_cap = t_remaining.replace(a_remaining[kept]), t_cap.replace(a_cap[kept])
                    a_rate, a_finish = a_rate[kept], a_finish[kept]
                    for k in _distinct(a_round):
                        here = np.flatnonzero(a_round == k)
                        rounds[k].slot[a_index[here]] = here
        if np.isnan(finish).any():
            raise ContentionDetected("a rank never finished: the schedule's transfers do not match up")
        if tracker is not None:
            self.link_use = tracker.use(self._fabric_link)
        if fold is not None:  # each transfer counted stands for one per copy
            self.transfers += (self.transfers - transfers) * (fold.copies - 1)
            return np.tile(finish, fold.copies)
        return finish

    def _rerate(
        self,
        cap: np.ndarray,
        link: np.ndarray,
        held: np.ndarray,
        hop: np.ndarray,
        hops: np.ndarray,
        rounds: dict[int, _Round],
    ) -> np.ndarray:
        """The rates of the flows in flight at an instant, to the bit those of ``_rates`` over them all
        (bound ``cap``; flow i crosses ``link[hop[i]:hop[i] + hops[i]]``), from ``held``: the rates at
        the instant before of the flows then in flight (those past them are new; the ended among them
        at their ``cap``, crossing no link now). ``rounds``: the rounds built, whose transfers in
        flight are the flows (``_Round.slot``); ``_changed`` marks the links of the flows that started
        or ended since.

        Max-min fair rates are those of each connected component of the flows (over the links that
        bind) on its own. A component none of whose flows is new or crosses a changed link that binds
        now or bound before (a link's load changes only as its flows start and end, and whether it
        binds with it) is a component of the instant before with the same flows, bounds and links:
        its rates are held. The rest, the components reached from the new flows and from those
        changed links, are rated by ``max_min_fair_rates_flat`` over their flows alone.

        One computation over every flow gives the same only where none of its passes joins links of
        two components whose levels differ, which its tolerance allows where they lie within 1e-12
        (relative) of each other. So rates are held and recomputed only while they are certified
        (``_certified``) to be each component's own: every pass exact (``max_min_fair_rates_flat``'s
        ``levels``) and no two distinct levels among the rates in flight within ``_NEAR`` of each
        other. Otherwise, and where the components reached hold a good part of the flows
        (``_FRESH``), every flow is rated afresh (``_afresh``), which certifies its rates again where
        its passes were exact and its levels apart. Among few flows (``_FEW_FLOWS``) every flow is
        rated afresh at once, uncertified: the components reached there were most of them."""
        if cap.size < _FEW_FLOWS:
            return self._afresh(cap, link, hops, certify=False)
        if not self._certified or not held.size:
            return self._afresh(cap, link, hops)
        # whether a link binds changes only where its flows started or ended: kept up to date there
        links = np.flatnonzero(self._changed[: self._links])
        self._changed[links] = False
        binding = self._binding
        before = binding[links]
        now = self._load[links] > self._threshold[links]
        binding[links] = now
        pending = links[before | now]
        users, cover = self._users, self._cover
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
        live: list[_Round] | None = None
        count = 0
        while True:
            if frontier.size:
                reached[frontier] = True
                count += frontier.size
                if count > most:  # as costly as rating every flow afresh
                    for hop_links in covered:
                        cover[hop_links] = 0
                    return self._afresh(cap, link, hops)
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
                return self._afresh(cap, link, hops)
            if looked is None:
                looked = np.zeros(self._links, dtype=bool)
                live = [rd for rd in rounds.values() if rd.flying]
            assert live is not None
            looked[pending] = True
            found = [rd.slot[rd.by_link.transfers(pending)] for rd in live]
            flows = np.concatenate(found) if found else np.empty(0, dtype=np.int64)
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
                self._capacity[used],
                bound=sub[rows],
                levels=levels,
            )
        rates[flows] = sub
        if not all(exact for _, exact in levels):
            return self._afresh(cap, link, hops)
        for level in {value for value, _ in levels}:  # no other rate in flight close to a new level
            close = (rates >= level * (1 - _NEAR)) & (rates <= level * (1 + _NEAR))
            if np.any(rates[close] != level):
                return self._afresh(cap, link, hops)
        return rates

    def _once(self, links: np.ndarray) -> np.ndarray:
        """``links`` (compact ids) with each one kept once, at one of its places: with ``_local`` as
        scratch, in their number of steps rather than the links' or a sort's."""
        place = np.arange(links.size)
        self._local[links] = place
        return links[self._local[links] == place]

    def _afresh(self, cap: np.ndarray, link: np.ndarray, hops: np.ndarray, certify: bool = True) -> np.ndarray:
        """``_rates`` over every flow in flight, and whether each component got its own rates there
        (``_certified``): every pass exact, no two distinct levels within ``_NEAR`` of each other.
        Without ``certify`` (few flows: the next instant is rated afresh too, or is certified afresh
        before any rate is held) the levels are not checked, and the rates are not certified."""
        self._changed[:] = False
        if not certify:
            self._certified = False
            return self._rates(cap, link, np.repeat(np.arange(cap.size), hops))
        levels: list[tuple[float, bool]] = []
        rates = self._rates(cap, link, np.repeat(np.arange(cap.size), hops), levels)
        values = np.unique(np.array([value for value, _ in levels]))  # a few
        self._certified = all(exact for _, exact in levels) and not np.any(values[1:] <= values[:-1] * (1 + _NEAR))
        return rates

    def _rates(
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
        binding = self._load[: self._links] > self._threshold[: self._links]
        self._binding[: self._links] = binding  # (``_rerate`` keeps it up to date from here)
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
            local_owner, local_link, flows, self._capacity[links], bound=cap[rows], levels=levels
        )
        return rates
