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
  exactly nothing, rather than summed afresh over every hop at every instant (``fluid_rates``: the
  links by compact id and the re-rating, which rates again only what an instant's changes reach).

So the times are the message path's up to the rounding of the same arithmetic in another order
(``tests/test_fluid_executor.py`` holds them to 1e-9 relative). The cost is a few passes over the
flows in flight per instant: halving doubling on the dragonfly at 131,072 ranks has a few hundred.
A flow that ends keeps its place in the in-flight arrays (its hops moved onto ``NO_LINK``) until
the ended outnumber the rest, so that an instant's ends do not copy every array.
Rounds are built as the first rank reaches them and dropped once every rank has left them. A run
may start after rounds the round path timed already, where every rank entered the next in step
(``Resume``), and take the routes' costs and binding hops of the rounds that path routed from its
structures rather than route them again (``routed``). In a run of identical rounds, once the state
repeats a few rounds later, whole periods are skipped (``fluid_steady``; not where a transfer log is
kept). Where the schedule and the fabric repeat every few ranks, only one period of ranks is
simulated (``fold``: ``fluid_fold``). A run that finds no period in ``COMPILED_AFTER`` instants goes on
in a compiled loop, the same arithmetic in the same order (``fluid_compiled``, where numba imports).
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
from ddlsim.hardware_models.network import FINISH_TOLERANCE, MAX_MIN_TOLERANCE
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fluid_rates import NO_LINK, LinkRates
from ddlsim.simulator.engine.fluid_steady import LONGEST_PERIOD, Snapshot, period
from ddlsim.simulator.engine.link_state import ContentionDetected
from ddlsim.simulator.engine.message_executor import MemberLog, TransferLog
from ddlsim.simulator.engine.round_structures import RoundCache, ScheduleRuns, Structure, binding_hops, spans

if TYPE_CHECKING:
    from ddlsim.simulator.engine.fluid_fold import Fold  # which runs this module's executor

__all__ = ["FluidExecutor", "LinkUse"]

# instants without a period after which a run goes on compiled, where numba is there (``fluid_compiled``):
# enough that a short run never pays numba's start (about 0.7 s), few against a long one's
COMPILED_AFTER = 4000
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
        self.links = LinkRates(fabric.capacity_Bps)  # the links crossed, by compact id, and the rating
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
        # instants after which a run that found no period goes on compiled (``fluid_compiled``; None:
        # numpy to the end), and the instants rated there
        self.compiled_after: int | None = COMPILED_AFTER
        self.compiled_instants = 0

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
        compact = self.links.ids(links)
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

    def _compiled(
        self,
        schedule: Schedule,
        message_bytes: float,
        runs: list[tuple[Round, int]],
        run_end: np.ndarray,
        now: float,
        state: tuple[Any, ...],
    ) -> bool:
        """Hand the rest of a run to the compiled loop (``fluid_compiled``) from an instant just rated,
        where numba is there and the rest fits; whether it did (every rank's finish time then set)."""
        try:
            from ddlsim.simulator.engine import fluid_compiled
        except (ImportError, RuntimeError):  # numba missing, or no cache it may write to: numpy to the end
            return False
        low, built, progress, current, finish, flows, waiting = state
        if (int(run_end[-1]) - low) * current.size > fluid_compiled.MAX_PLACES:  # (rounds x ranks of progress)
            return False
        first = int(np.searchsorted(run_end, low, side="right"))  # the run the last rank is in
        handover = fluid_compiled.Handover(self, schedule, message_bytes, runs, first)  # (may number new links)
        if handover.places(low) > fluid_compiled.MAX_PLACES:
            return False
        links = self.links
        instants, transfers = fluid_compiled.finish(
            handover,
            now,
            (FINISH_TOLERANCE, MAX_MIN_TOLERANCE),
            low,
            built,
            progress,
            current,
            finish,
            flows,
            waiting,
            (links.load, links.users, links.capacity, links.threshold),
        )
        self.instants += instants
        self.compiled_instants += instants
        self.transfers += transfers
        return True

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
        # hops on ``NO_LINK``), flow (position in the a_ arrays)
        h_link = np.empty(0, dtype=np.int64)  # (flow i's hops: i repeated a_hops[i] times, where needed)
        self.links.reset()

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

        def crossing(links: np.ndarray) -> np.ndarray:
            """Where the re-rating looks: the flows in flight over each of ``links`` (their places in
            the in-flight arrays, a flow once per hop; -1 for a transfer of a round not in flight)."""
            found = [rd.slot[rd.by_link.transfers(links)] for rd in rounds.values() if rd.flying]
            return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

        start = np.broadcast_to(np.asarray(start_s, dtype=np.float64), (schedule.ranks,))[:ranks]
        transfers = self.transfers
        batches = enter(np.arange(ranks), np.array(start), 0)
        now, changed = -np.inf, False
        plain_from: float = self.instants  # the instant since which no period was found
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
                        tracker.started(links, senders, now, self.links.capacity.size)
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
                self.links.started(links, np.repeat(bound, counts))
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
                a_rate = self.links.rerate(a_cap, h_link, a_rate, a_hop, a_hops, crossing)
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
                            plain_from = self.instants
                if (
                    self.compiled_after is not None
                    and log is None
                    and tracker is None
                    and self.instants - plain_from >= self.compiled_after
                ):
                    plain_from = np.inf  # asked once a run: where it does not fit, numpy goes on
                    on = np.flatnonzero(a_index >= 0)
                    in_flight = (a_round[on], a_index[on], a_remaining[on], a_cap[on], a_rate[on], a_finish[on])
                    progress_of = {k: (rd.left, rd.done_s, rd.entered, rd.entry_s) for k, rd in rounds.items()}
                    state = (low, built, progress_of, current, finish, in_flight, (w_round, w_index, w_start))
                    if self._compiled(schedule, message_bytes, runs, run_end, now, state):
                        break
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
                self.links.ended(links, np.repeat(a_cap[ended], counts))
                for k in _distinct(a_round[ended]):
                    rd = rounds[k]
                    gone = a_index[ended[a_round[ended] == k]]
                    rd.slot[gone] = -1
                    rd.flying -= gone.size
                a_rate[ended] = a_cap[ended]  # crossing no link now, as a re-rating from scratch would give it
                h_link[position] = NO_LINK
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
            self.link_use = tracker.use(self.links.fabric_link)
        if fold is not None:  # each transfer counted stands for one per copy
            self.transfers += (self.transfers - transfers) * (fold.copies - 1)
            return np.tile(finish, fold.copies)
        return finish
