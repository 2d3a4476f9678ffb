"""Executing collective schedules on the modeled fabric: a round at a time, or message by message.

Both paths implement the round semantics of ``algorithms.schedule``: a rank enters round k+1 once
every transfer it sends or receives in round k has arrived; a transfer costs the sender's
per-message overhead, then its bytes stream over the route as a flow (sharing links max-min
fairly with every other flow in flight), then the route's latency. With a finite
``FabricSpec.reduce_Bps`` the receiver of a REDUCE transfer also spends bytes / reduce_Bps adding
it in (the gamma term of the alpha-beta-gamma model): its round ends at arrival + that time (the
latest such end over its received transfers), the sender's still at the arrival.

* ``MessageExecutor`` (``message_executor.py``): every transfer a chain of SimPy events over a
  ``FlowNetwork``. Exact under any contention; the reference.
* ``VectorisedExecutor``: a whole round at once with numpy, each flow at its route's bottleneck
  rate, with a proof that this is what the message path would do; where no proof applies it raises
  ``ContentionDetected`` and ``run_collective`` re-runs the collective as one fluid simulation of
  all its flows (``fluid_executor.py``: the message path's model, instant by instant with numpy),
  or message by message where that does not apply either (LogGP).
  ``tests/test_collective_engine.py`` holds the paths to each other.

``run_collective`` lets the round path hand over early (``VectorisedExecutor.handover``): where ranks
that entered a round in step drift apart within a round's contended flows (halving doubling on a
dragonfly), it gives up at once rather than time round after round by small fluid simulations of
its own until flows of non-consecutive rounds meet (at 131,072 ranks, 40% of the run); the fluid
path then starts from the last rounds' entry in step (``fluid_executor.Resume``), as exact as from
the first round, since every earlier flow has ended by then.

This module holds the round path's loop: per round, look up what its arrays imply, time it, check
and record its flows, and decide what the next round may skip. Its pieces live apart:

* what it builds per round and keeps while the same arrays come back (``round_structures.py``);
* what it knows of the links and ranks across rounds and calls (``link_state.py``): who sends
  where, until when a link that several senders use is busy, each rank's clock; the overlap check
  reads it (no flow may meet another on such a link; a rank's own flows cannot overlap, since it
  sends round k+1 after round k arrived);
* flows of one round that share a link, as a small fluid simulation (``round_fluid.py``);
* flows that would start on a link while the previous round's flow there is still in flight,
  simulated together with it (``round_overlap.py``);
* runs of identical rounds extrapolated once their times advance in closed form (``steady_state.py``);
* a large torus round whose transfers make the same hops in each dimension (recursive doubling's)
  as arcs, per link and per flow rather than per hop (``round_arcs.py``), where that gives the same
  result; a round whose contended transfers travel in bundles of one route each (the devices of one
  node sending to those of another) checked and committed per bundle and link (``round_bundles.py``);
* an unpipelined chain of single-transfer rounds timed in one batch (``round_relay.py``);
* collectives in flight together, each in lockstep (``round_lockstep.py`` over ``lockstep.py``);
* where the round path declines a collective, the segments before the decline kept on it and the
  rest on the fluid path, cut only where no flow crosses the cut (``segments.py``, ``run_collective``).
* the fluid path over one period of the ranks where the schedule and the fabric repeat every few
  ranks (``fluid_fold.py``: torus_2d's rows on a dragonfly).

Links whose constraint is implied by others (``Fabric.redundant``) are left out of all of it.

Times are absolute seconds; ``start`` gives each rank's time of entering the collective.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fluid_executor import LinkUse, Resume
from ddlsim.simulator.engine.fluid_fold import run_fluid
from ddlsim.simulator.engine.link_state import ContentionDetected, LinkState
from ddlsim.simulator.engine.lockstep import LockstepRound
from ddlsim.simulator.engine.message_executor import MessageExecutor, TransferLog
from ddlsim.simulator.engine.round_arcs import ArcRound
from ddlsim.simulator.engine.round_bundles import Bundles
from ddlsim.simulator.engine.round_fluid import Contention, fluid_ends, relabel, unique_ints
from ddlsim.simulator.engine.round_lockstep import lockstep_round, time_in_lockstep
from ddlsim.simulator.engine.round_overlap import OverlapGroup, Placed
from ddlsim.simulator.engine.round_relay import RELAY_MIN, relay_exits, relay_length
from ddlsim.simulator.engine.round_structures import (
    ArcPlaced,
    ArcStructure,
    RoundBytes,
    RoundCache,
    ScheduleRuns,
    Structure,
    binding_hops,
    identity_and_shift,
    round_bytes,
)
from ddlsim.simulator.engine.segments import run_in_segments
from ddlsim.simulator.engine.steady_state import (
    Steady,
    affine_horizon,
    magnitude,
    tolerance,
    uniform_advance,
    uniform_of,
)

__all__ = ["Checkpoint", "ContentionDetected", "MessageExecutor", "TransferLog", "VectorisedExecutor", "run_collective"]

_OVERLAP_ATTEMPTS = 16  # times a round may grow its group of flows simulated with the previous round


@dataclass(frozen=True)
class Checkpoint:
    """``VectorisedExecutor.checkpoint``: its operation count, link state and counters."""

    operations: int
    links: LinkState
    counters: tuple[int, ...]  # ``VectorisedExecutor._COUNTERS``


class VectorisedExecutor:
    """Round-at-a-time execution with a proof check; keeps link state across calls.

    Several collectives executed one after another through one executor (the buckets of an
    iteration) are checked against each other too, since their flows may overlap in time.

    The overlap check only has to look at links that more than one sender uses; what it reads, and
    what each round leaves for the next, is the executor's ``LinkState`` (``link_state``).

    ``run`` keeps per schedule object its runs of identical rounds, and per round arrays its
    routes and byte counts, so repeated calls with the same schedule and ``members`` array (the
    buckets of a training run) cost little more than the rounds they execute.
    """

    def __init__(
        self,
        fabric: Fabric,
        ranks: int | None = None,
        extrapolate: bool = True,
        arcs: bool | None = None,
        bundles: bool | None = None,
        handover: bool = False,
    ) -> None:
        self.fabric = fabric
        self.extrapolate = extrapolate  # False: execute every round (tests hold the shortcuts to this)
        # torus rounds as arcs (``_arc_structure``): None where a round makes at least as many torus hops
        # as there are torus links (below that, hop lists are cheap); True / False: always / never
        # (tests hold the two to each other)
        self.arcs = arcs
        # a round's check and commit per bundle of same-route transfers (``round_bundles``): None where
        # that halves the entries; True / False: wherever it applies / never
        self.bundles = bundles
        self._redundant = fabric.redundant if fabric.redundant.any() else None  # see binding_hops
        # who sends over each link, until when it is busy, each fabric rank's clock (``link_state``)
        self.links = LinkState(fabric.capacity_Bps.size, max(ranks or 0, fabric.devices))
        self._structures = RoundCache()  # of Structure
        self._arc_structures = RoundCache()  # of ArcStructure, or None: not a round for arcs
        self._pairs: dict[tuple[int, int], tuple[tuple[int, ...], float, float, float]] = {}
        self._runs = ScheduleRuns()  # per schedule object its runs of identical rounds
        self._serial = 0  # executed rounds so far
        self._placed: Placed | ArcPlaced | None = None  # the round executed just before, in this call
        self.transfers = 0
        self.extrapolated_rounds = 0  # rounds advanced by the steady-state shortcut, not executed
        self.overlapping_rounds = 0  # rounds simulated together with flows of the round before
        self.relayed_rounds = 0  # rounds of one transfer each executed together (``round_relay``)
        self.arc_rounds = 0  # rounds executed as torus arcs (``_execute_arcs``)
        self.bundled_rounds = 0  # rounds checked and committed per bundle (``LinkState.commit_bundles``)
        self.operations = 0  # calls of ``run`` and ``transfer`` so far: a checkpoint is only undone
        # while nothing else ran after it (``restore``)
        # after ``run`` raised ``ContentionDetected``: the last point of it where every rank entered the
        # next round at the same time, from which the fluid path may take over (``Resume``)
        self.resume: Resume | None = None
        self._synced = _Synced(handover)
        # give up (to the fluid path, from that point) as soon as the ranks, in step a round ago, drift
        # apart within a round's contended flows (``_drifting``)
        self.handover = handover

    def _structure(self, rnd: Round, ranks: int, t: np.ndarray, members: np.ndarray | None) -> Structure:
        found, structure = self._structures.get(rnd, members)
        if not found:
            src = np.asarray(rnd.src, dtype=np.int64)
            dst = np.asarray(rnd.dst, dtype=np.int64)
            global_src = src if members is None else members[src]
            global_dst = dst if members is None else members[dst]
            costs = self.fabric.path_costs(global_src, global_dst)
            flat_links, owner = binding_hops(costs.routes, self._redundant)
            contention = Contention.of(flat_links, owner, self.fabric.capacity_Bps)
            # a link that gains a second sender takes its first sender's clock as busy time: bring
            # the clocks up to now (they are otherwise refreshed per call, not per round)
            self.links.advance_clocks(t, members)
            self.links.claim(flat_links, global_src[owner], self._placed)
            identity, shift = identity_and_shift(src, dst, ranks)
            permutation = bool(np.bincount(src, minlength=1).max() <= 1 and np.bincount(dst, minlength=1).max() <= 1)
            if self.fabric.spec.loggp and not permutation:
                # a rank's CPU would handle its several messages one after another
                raise ContentionDetected("LogGP overheads serialise a rank's messages within a round")
            overhead = self.fabric.overheads(global_src, global_dst)
            structure = Structure(
                src,
                dst,
                global_src,
                flat_links,
                owner,
                costs.alpha_s,
                overhead,
                costs.bottleneck_Bps,
                identity,
                permutation,
                shift,
                owner[:0],
                -1,
                contention,
                np.isin(np.arange(src.size), contention.flows),
                None if identity else unique_ints(np.concatenate([src, dst])),
                None
                if self.bundles is False or not contention.flows.size
                else Bundles.of(flat_links, owner, src.size, self.links.link_sender.size, halve=self.bundles is None),
                latency_s=costs.latency_s,
            )
            self._structures.put(rnd, members, structure)
        if structure.version != self.links.shared_version:
            structure.checked = np.flatnonzero(self.links.link_sender[structure.flat_links] == -2)
            structure.version = self.links.shared_version
        return structure

    def _arc_structure(self, rnd: Round, ranks: int, t: np.ndarray, members: np.ndarray | None) -> ArcStructure | None:
        """The round as torus arcs, or None where it is not such a round (``Fabric.torus_round``), is
        too small to be worth it (``arcs``), is not a permutation, or has a link whose flows' shares
        differ (their rates would then come from a fluid simulation). Claims its links when built."""
        found, cached = self._arc_structures.get(rnd, members)
        if found:
            return cached
        self._arc_structures.put(rnd, members, None)  # until it proves to be one
        if self.arcs is False or self._redundant is not None:
            return None
        src = np.asarray(rnd.src, dtype=np.int64)
        dst = np.asarray(rnd.dst, dtype=np.int64)
        global_src = src if members is None else members[src]
        global_dst = dst if members is None else members[dst]
        torus = self.fabric.torus_round(global_src, global_dst)  # None at once off the tori
        if torus is None or (self.arcs is None and src.size * sum(torus.hops) < self.fabric.torus_links):
            return None
        if np.bincount(src).max() > 1 or np.bincount(dst).max() > 1:
            return None
        arcs = ArcRound(self.fabric, torus)
        count = arcs.covering(np.ones(src.size, dtype=np.int64), np.add, 0)
        used = np.flatnonzero(count)
        share = np.full(count.size, np.inf)
        share[used] = self.fabric.capacity_Bps[used] / count[used]  # as max_min_fair_rates_flat divides
        flow_share = arcs.along(share, np.minimum)
        if not arcs.alike(flow_share, used):
            return None
        self.links.advance_clocks(t, members)  # as in _structure: the claims read the senders' clocks
        self.links.claim_bounds(
            arcs.covering(global_src, np.minimum, np.iinfo(np.int64).max),
            arcs.covering(global_src, np.maximum, -1),
            self._placed,
        )
        contended = np.flatnonzero(arcs.along(count, np.maximum) > 1)
        identity, shift = identity_and_shift(src, dst, ranks)
        structure = ArcStructure(
            src,
            dst,
            global_src,
            torus.alpha_s,
            self.fabric.overheads(global_src, global_dst),
            torus.bottleneck_Bps,
            identity,
            True,
            shift,
            None if identity else unique_ints(np.concatenate([src, dst])),
            arcs,
            used,
            contended,
            flow_share[contended],
            arcs.covering(np.arange(src.size), np.maximum, -1),
        )
        self._arc_structures.put(rnd, members, structure)
        return structure

    def _execute_arcs(
        self, st: ArcStructure, rnd: Round, rb: RoundBytes, t: np.ndarray, members: np.ndarray | None
    ) -> np.ndarray | None:
        """``_execute`` for a round as arcs, to the bit: the per-rank times after it, or None (nothing
        changed) where its contended flows do not start together with equal bytes on some link, or a
        flow may meet an earlier one on a link several senders use (the hop lists then decide)."""
        arcs = st.arcs
        begin = t if st.identity_src else t[st.src]
        flow_start = begin + st.overhead_s
        flow_s = rb.flow_s
        if st.contended.size:
            flows = st.contended
            starts = flow_start[flows]
            nbytes = np.broadcast_to(rb.nbytes, st.src.shape)
            for values in (flow_start, nbytes):
                if values[flows].min() != values[flows].max() and not arcs.alike(values, st.used):
                    return None
            if rb.fluid_s is None:  # round_fluid.fluid_ends from time 0: at its share until its bytes are done
                rb.fluid_s = nbytes[flows] / st.share_Bps
            flow_s = flow_s.copy()
            flow_s[flows] = (starts + rb.fluid_s) - starts  # Contention.end_times, less the start
        checked = st.used[self.links.link_sender[st.used] == -2]
        before = self.links.busy_until[checked]
        if np.any(arcs.covering(flow_start, np.minimum, np.inf)[checked] < before):
            return None
        link_end = arcs.covering(flow_start + flow_s, np.maximum, -np.inf)
        # as LinkState.commit: busy until the last end there; the flows a link carries end together, so
        # the last of them in transfer order is its writer, as in the hop lists
        self.links.commit_per_link(self._serial, checked, before, link_end[checked], st.writer[checked])
        self._placed = ArcPlaced(self._serial, link_end, st.writer, flow_start, rnd, members, t, flow_s, rb)
        return self._leave(st, t, begin + st.alpha_s + flow_s, rb.reduce_s)

    def _hop_placed(self, placed: ArcPlaced, t: np.ndarray) -> Placed:
        """An arc round's ``Placed`` with its hop lists, for an overlap group: the structure the hop
        lists would have had (its links are claimed already: claiming them again changes nothing)."""
        rnd = placed.round
        st = self._structure(rnd, t.size, t, placed.members)
        rb = placed.bytes
        return Placed(
            placed.serial, st, placed.entry, placed.flow_start, placed.duration,
            np.broadcast_to(rb.nbytes, st.src.shape), st.flat_links, st.flat_owner, st.contended_mask, rb.reduce_s,
        )  # fmt: skip

    def run(
        self,
        schedule: Schedule,
        message_bytes: float,
        start_s: np.ndarray | float,
        log: TransferLog | None = None,
        members: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per-rank finish times (absolute seconds) of ``schedule`` started at ``start_s``.

        ``members[i]`` is the fabric rank that schedule rank i runs on (default: rank i itself), so a
        collective over a group of a larger run shares the link state of every other call. Pass the
        same array object for the same group: per-round work is cached on its identity.

        Where it raises ``ContentionDetected``, ``resume`` says from where the fluid path may take over.
        """
        ranks = schedule.ranks
        if members is not None and members.size != ranks:
            raise ValueError(f"members maps {members.size} ranks, the schedule has {ranks}")
        self.operations += 1
        if members is None:
            self.links.cover_ranks(ranks)
        t = np.array(np.broadcast_to(np.asarray(start_s, dtype=np.float64), (ranks,)))
        self.links.advance_clocks(t, members)
        self._placed = None
        self.resume = None
        runs = self._runs.get(schedule)
        self._synced = _Synced(self.handover)
        try:
            t = self._rounds(schedule, message_bytes, runs, t, log, members)
        except ContentionDetected:
            self.resume = self._synced.latest
            raise
        self.links.advance_clocks(t, members)
        return t

    def _rounds(
        self,
        schedule: Schedule,
        message_bytes: float,
        runs: list[tuple[Round, int]],
        t: np.ndarray,
        log: TransferLog | None,
        members: np.ndarray | None,
    ) -> np.ndarray:
        """``run``'s loop over the runs of rounds; counts the rounds done in ``_synced``, which keeps the
        last point where every rank entered the next round at the same time."""
        ranks = schedule.ranks
        synced = self._synced
        index = relay_from = 0
        while index < len(runs):
            relay = relay_length(runs, index) if self.extrapolate and index >= relay_from else 0
            if relay >= RELAY_MIN:
                chain = runs[index : index + relay]
                relayed = relay_exits(
                    self.fabric, self._redundant, self.links, schedule, chain, message_bytes, t, log, members
                )
                if relayed is not None:
                    self._placed = None
                    self._serial += relay
                    self.transfers += relay
                    self.relayed_rounds += relay
                    t = relayed
                    index += relay
                    synced.advance(relay, t)
                    continue
                relay_from = index + relay  # not provable: these rounds go one by one
            rnd, count = runs[index]
            index += 1
            previous_input: np.ndarray | None = None  # entry times of the previous identical round
            scale: float | None = None  # magnitude(t), where the last steady-state check measured it
            done = 0
            while done < count:
                self._serial += 1
                if not done and count >= 3 and self.handover and log is None:
                    st = self._structure(rnd, ranks, t, members)
                    if self._bound_to_decline(st, t, round_bytes(self.fabric, st, schedule, rnd, message_bytes)):
                        raise ContentionDetected("this run's flows meet those two rounds on: the fluid path takes over")
                # a round run once may go as arcs (repeated ones keep the hop lists that their
                # steady-state shortcut reads); where the arcs decline, hop by hop
                arc = self._arc_structure(rnd, ranks, t, members) if count == 1 and log is None else None
                arc_exit = None
                if arc is not None:
                    arc_exit = self._execute_arcs(
                        arc, rnd, round_bytes(self.fabric, arc, schedule, rnd, message_bytes), t, members
                    )
                if arc_exit is not None:
                    new, overlapped = arc_exit, False
                    self.arc_rounds += 1
                else:
                    st = self._structure(rnd, ranks, t, members)
                    new, overlapped = self._execute(
                        st, t, log, members, round_bytes(self.fabric, st, schedule, rnd, message_bytes)
                    )
                self.transfers += len(rnd)
                done += 1
                steady = measured = None
                if overlapped:  # this round's times depend on the previous round's flows, not on t alone
                    previous_input = None
                    self.overlapping_rounds += 1
                elif self.extrapolate and previous_input is not None and done < count:
                    steady, measured = self._steady_advance(st, previous_input, t, new, scale)
                previous_input, t, scale = t, new, measured
                synced.advance(1, t)
                if steady is not None:
                    skip = int(min(count - done, steady.budget))
                    t = self._skip(steady, skip, t)
                    done += skip
                    if log is not None:
                        log.extrapolated += skip * len(rnd)
                    previous_input = scale = None  # the rounds before were skipped: detect afresh
                    synced.advance(skip, t)
        return t

    def _execute(
        self, st: Structure, t: np.ndarray, log: TransferLog | None, members: np.ndarray | None, rb: RoundBytes
    ) -> tuple[np.ndarray, bool]:
        """(per-rank times after one round entered at ``t``, whether flows of the previous round
        had to be simulated with it); checks and updates the link state.

        A flow that would start on a shared link while the previous round's flow there is still in
        flight is simulated together with it (``round_overlap``): the previous round's exit times
        (the ``t`` passed in) are then corrected before this round is timed again.
        """
        group: OverlapGroup | None = None
        forced: tuple[np.ndarray, np.ndarray] | None = None  # (later flows, their end times)
        attempts = 0
        previous = self._placed
        state = self.links  # its arrays, read in every pass
        busy, serial, writer, alone = state.busy_until, state.writer_serial, state.writer_index, state.alone
        if st.checked.size == st.flat_links.size:  # every hop is on a checked link: no copies
            owners, links = st.flat_owner, st.flat_links
        else:
            owners, links = st.flat_owner[st.checked], st.flat_links[st.checked]
        while True:
            begin = t if st.identity_src else t[st.src]
            flow_start = begin + st.overhead_s
            if group is None and self._drifting(st, flow_start):
                raise ContentionDetected("the ranks drift apart within contended flows: the fluid path takes over")
            flow_s = self._durations(st, rb, flow_start, forced)
            if (
                group is None
                and st.bundles is not None
                and self.links.commit_bundles(self._serial, st.bundles, flow_start, flow_start + flow_s)
            ):
                self.bundled_rounds += 1
                owners = owners[:0]  # committed per bundle: nothing left for the hop lists
                break
            if not owners.size:
                break
            before = busy[links]  # the checked links' busy times (fresh each pass: an overlap group moves them)
            meets = flow_start[owners] < before
            if group is not None and isinstance(previous, Placed):  # pairs simulated together may overlap
                in_group = np.zeros(st.src.size, dtype=bool)
                in_group[list(group.later)] = True
                earlier = np.zeros(previous.duration.size, dtype=bool)
                earlier[list(group.earlier)] = True
                from_previous = serial[links] == previous.serial
                earlier_writer = earlier[np.where(from_previous, writer[links], 0)]
                meets &= ~(in_group[owners] & from_previous & earlier_writer)
            if not meets.any():
                break
            if previous is None or log is not None or np.any(serial[links[meets]] != previous.serial):
                raise ContentionDetected(
                    "flows of non-consecutive rounds, or of another collective, may overlap on a link"
                )
            if isinstance(previous, ArcPlaced):
                previous = self._placed = self._hop_placed(previous, t)
            group = group or OverlapGroup()
            components = None
            if st.contention.flows.size:
                components = np.full(st.src.size, -1)
                components[st.contention.flows] = st.contention.component
            reason = group.add(
                previous, owners[meets], writer[links[meets]], flow_start[owners[meets]] < alone[links[meets]],
                components,
            )  # fmt: skip
            if reason is not None or attempts == _OVERLAP_ATTEMPTS:
                raise ContentionDetected(f"flows of consecutive rounds overlap and {reason or 'do not settle'}")
            attempts += 1
            current = Placed(
                self._serial, st, t, flow_start, flow_s, np.broadcast_to(rb.nbytes, st.src.shape),
                st.flat_links, st.flat_owner, st.contended_mask, rb.reduce_s,
            )  # fmt: skip
            base = self._previous_without(previous, np.fromiter(group.earlier, dtype=np.int64))
            base_start = (base if st.identity_src else base[st.src]) + st.overhead_s
            earlier_flows, earlier_s, later_flows, later_end = group.simulate(
                previous, current, base_start, self.fabric.capacity_Bps
            )
            forced = (later_flows, later_end)
            t = self._replace_previous(previous, earlier_flows, earlier_s)
        if owners.size:
            ends = (flow_start + flow_s)[owners]
            self.links.commit(self._serial, ends, owners, links, before, bool(st.contention.flows.size))
        self._placed = Placed(
            self._serial,
            st,
            t,
            flow_start,
            flow_s,
            np.broadcast_to(rb.nbytes, st.src.shape),
            st.flat_links,
            st.flat_owner,
            st.contended_mask,
            rb.reduce_s,
            None if forced is None else np.isin(np.arange(st.src.size), forced[0]),
        )
        end = begin + st.alpha_s
        end += flow_s  # (begin + alpha) + flow, as written out: one array fewer per round
        if log is not None:
            log.add(st.senders, st.dst if members is None else members[st.dst], rb.nbytes, begin, end)
        return self._leave(st, t, end, rb.reduce_s), group is not None

    def _bound_to_decline(self, st: Structure, t: np.ndarray, rb: RoundBytes) -> bool:
        """Whether the round path must decline within the first three rounds k, k+1, k+2 of a run of
        identical rounds, proved before round k is executed (``handover`` only): torus_2d's column
        steps on the dragonfly at 131,072 ranks, entered 17 us apart within each group's 64 flows on
        its global link by the row ring, a step taking at most ~7 us, so the early ranks run two
        rounds ahead of the late ones. The round path timed rounds k and k+1 by fluid simulations
        over every flow (1.2 s + 8.1 s, k+1 simulated with k) and declined at k+2.

        Where no flow of round k meets an earlier flow (``_execute``'s check), its flows start at
        ``t`` plus their overheads, as timed. Upper bounds: a flow of k, k+1 or k+2 lasts at most its
        bytes over the least c_l / n_l over its hops (n_l: the round's flows on link l; max-min
        gives a flow at least its bottleneck link's equal share, and the round path simulates on a
        link at most the flows of two consecutive rounds of the run, a sender's flows of k and k+1
        never in flight together: at most n_l at once); so each rank's exit from k and from k+1,
        as ``_leave`` takes it (latencies, reductions), and each flow's start in k+2. Lower bound: a
        flow of round k lasts at least its bytes over its slowest hop. Where on a checked link a
        flow a of k+2 must start before a flow b of k there can have ended, a's flow of k+1 (no
        later) meets b there: k+1 is simulated with k (no steady-state skip after it) or declines,
        and k+2 finds the link busy (its busy time and the time before which older flows may be
        there, as k+1's commit left it, both at least b's end) and declines, with no rank in step
        before (a's sender enters k+2 before b's sender leaves k). The same decline, in the same
        run (so the same segments), from the same hand-over point (``resume``)."""
        if st.bundles is not None or not st.checked.size or not st.contention.flows.size:
            return False
        size = st.src.size
        overhead = np.broadcast_to(st.overhead_s, (size,))
        start = (t if st.identity_src else t[st.src]) + overhead
        links, owner = st.flat_links, st.flat_owner
        hop_links, hop_owner = links[st.checked], owner[st.checked]
        if np.any(start[hop_owner] < self.links.busy_until[hop_links]):
            return False  # round k meets the round before: its times are not yet known
        _, local = relabel(links, self.fabric.capacity_Bps.size)
        capacity = self.fabric.capacity_Bps[links]
        slowest_share = np.array(st.bottleneck_Bps, dtype=np.float64)  # a flow's rate is at least this
        np.minimum.at(slowest_share, owner, capacity / np.bincount(local)[local])
        fastest = np.full(size, np.inf)  # and at most this: its slowest hop, or where it has none its bottleneck
        np.minimum.at(fastest, owner, capacity)
        fastest = np.maximum(st.bottleneck_Bps, np.where(np.isfinite(fastest), fastest, 0.0))
        nbytes = np.broadcast_to(np.asarray(rb.nbytes, dtype=np.float64), (size,))
        longest = nbytes / slowest_share * (1 + 1e-9)
        latency = np.broadcast_to(st.alpha_s - st.overhead_s, (size,))
        reduce_s = np.zeros(size) if rb.reduce_s is None else np.broadcast_to(rb.reduce_s, (size,))

        def exits(entered: np.ndarray, starts: np.ndarray) -> np.ndarray:
            arrival = starts + longest + latency
            out = entered.copy()
            np.maximum.at(out, st.src, arrival)
            np.maximum.at(out, st.dst, arrival + reduce_s)
            return out

        first = exits(t, start)  # from k
        second = exits(first, first[st.src] + overhead)  # from k + 1
        latest_start = second[st.src] + overhead  # of round k + 2's flows
        earliest_end = start + nbytes / fastest  # of round k's flows
        margin = 1e-9 * max(float(np.abs(second).max()), 1e-9)
        # per checked link: the latest a round-k flow ends at least, the earliest a round-(k+2) flow starts at most
        order = np.argsort(hop_links, kind="stable")
        hop_links, hop_owner = hop_links[order], hop_owner[order]
        heads = np.flatnonzero(np.concatenate(([True], hop_links[1:] != hop_links[:-1])))
        ends_by = np.maximum.reduceat(earliest_end[hop_owner], heads)
        starts_by = np.minimum.reduceat(latest_start[hop_owner], heads)
        return bool(np.any(starts_by < ends_by - margin))

    def _drifting(self, st: Structure, flow_start: np.ndarray) -> bool:
        """Whether to give up on this round for the fluid path (``handover``): its contended flows
        start apart within a component, while every rank entered the round before at the same time.

        From there each round's flows start more apart (halving doubling on the dragonfly: by about
        seven times a round), the round path times each round by a fluid simulation of its own, and
        soon flows of non-consecutive rounds meet and it gives up anyway; the fluid path started from
        the rounds in step times them all at once, with the same result (``Resume``)."""
        synced = self._synced.latest
        if not self.handover or synced is None or synced.rounds < self._synced.rounds - 1:
            return False
        if not st.contention.flows.size:
            return False
        lo, hi = st.contention.start_spans(flow_start[st.contention.flows])
        return bool(np.any(hi > lo))

    def _durations(
        self, st: Structure, rb: RoundBytes, flow_start: np.ndarray, forced: tuple[np.ndarray, np.ndarray] | None
    ) -> np.ndarray:
        """Flow seconds of every transfer: bytes / bottleneck, the in-round fluid for contended ones,
        and ``forced`` (indices, end times) for flows simulated with the previous round's."""
        flow_s = rb.flow_s
        contention = st.contention
        if contention.flows.size:
            flows = contention.flows
            every = flows.size == st.src.size  # every transfer contends: flows is arange, no gathers
            starts, nbytes = flow_start, np.broadcast_to(rb.nbytes, st.src.shape)
            if not every:
                starts, nbytes = starts[flows], nbytes[flows]
            if rb.fluid_s is None:  # durations when all start together (they then do not depend on when)
                zero = np.zeros(flows.size)
                rb.fluid_s = fluid_ends(
                    contention.owner, contention.link, contention.capacity_Bps, nbytes, zero, contention.component
                )
            contended_s = contention.end_times(nbytes, starts, rb.fluid_s) - starts
            if every:
                flow_s = contended_s
            else:
                flow_s = flow_s.copy()
                flow_s[flows] = contended_s
        if forced is not None:
            flow_s = flow_s.copy()
            flow_s[forced[0]] = forced[1] - flow_start[forced[0]]
        return flow_s

    def _previous_without(self, previous: Placed, flows: np.ndarray) -> np.ndarray:
        """The previous round's exit times if ``flows`` did not exist (their terms left out)."""
        st = previous.structure
        assert isinstance(st, Structure)
        begin = previous.entry if st.identity_src else previous.entry[st.src]
        end = begin + st.alpha_s + previous.duration
        end[flows] = -np.inf
        return self._leave(st, previous.entry, end, previous.reduce_s)

    def _replace_previous(self, previous: Placed, flows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """The previous round's exit times with ``flows`` lasting ``seconds``; their links' busy times follow."""
        st = previous.structure
        assert isinstance(st, Structure)
        duration = previous.duration.copy()
        duration[flows] = seconds
        # the links the previous round wrote and these flows cross: busy until the latest end there
        touched = np.isin(previous.flat_owner, flows)
        mine = self.links.writer_serial[previous.flat_links] == previous.serial
        on = np.isin(previous.flat_links, previous.flat_links[touched]) & mine
        links, owner = previous.flat_links[on], previous.flat_owner[on]
        ends = previous.flow_start[owner] + duration[owner]
        self.links.busy_until[links] = -np.inf
        np.maximum.at(self.links.busy_until, links, ends)
        last = ends >= self.links.busy_until[links]
        self.links.writer_index[links[last]] = owner[last]
        begin = previous.entry if st.identity_src else previous.entry[st.src]
        return self._leave(st, previous.entry, begin + st.alpha_s + duration, previous.reduce_s)

    def _leave(
        self, st: Structure | ArcStructure, t: np.ndarray, end: np.ndarray, reduce_s: np.ndarray | None
    ) -> np.ndarray:
        """Exit times of a round entered at ``t`` whose transfers arrive at ``end``: a sender leaves
        when its send arrived, a receiver when it has added in what it received."""
        if st.shift:
            return _shifted_leave(end, reduce_s, st.shift)
        received = end if reduce_s is None else end + reduce_s
        if st.identity_src and st.permutation:
            new = end.copy()  # every rank sent: its clock moves to its send's end (>= its old clock)
            new[st.dst] = np.maximum(end[st.dst], received)
            return new
        new = t.copy()
        if st.permutation:
            new[st.src] = end
            new[st.dst] = np.maximum(new[st.dst], received)
        else:
            np.maximum.at(new, st.src, end)
            np.maximum.at(new, st.dst, received)
        return new

    def _steady_advance(
        self, st: Structure, before: np.ndarray, t: np.ndarray, after: np.ndarray, scale: float | None
    ) -> tuple[Steady | None, float | None]:
        """How the identical rounds after this one can be skipped (``steady_state``), if they can, and
        ``magnitude(after)`` where this check measured it (None otherwise).

        ``before``, ``t``: entry times of the previous identical round and of this one; ``after``:
        this round's exit times (the next round's entry times); ``scale``: ``magnitude(t)`` where the
        check of the round before measured it (as its ``after``).

        A round that is executed rather than skipped (a ring's long transient, thousands of rounds at
        131,072 ranks) pays for this check on every rank, so it makes as few passes over the times as
        it can: ``t - before`` serves both tests, the affine test's difference is written in its place,
        and each array's magnitude (the tolerance's scale) is taken once, by ``magnitude``, which
        equals ``np.abs(a).max()`` to the bit. The tolerances and the values compared are the ones of
        ``uniform_advance`` and ``np.abs(delta - (t - before)).max() > rounding(after)``: the same
        rounds are skipped by the same advances.
        """
        if st.participants is None:
            advance = t - before
            uniform = uniform_of(advance, t, scale)
        else:  # ``scale`` is of every rank's time: the tolerance is of the taking-part ones'
            advance = None
            uniform = uniform_advance(before, t, st.participants)
        if uniform is not None:
            return Steady(st, uniform), None
        rb = st.bytes
        if not st.permutation or st.checked.size or st.contention.flows.size or rb is None:
            return None, None
        delta = after - t
        change = np.subtract(delta, t - before if advance is None else advance, out=advance)
        measured = magnitude(after)
        if magnitude(change) > tolerance(measured):
            return None, measured
        end_offset = st.alpha_s + rb.flow_s
        received = end_offset if rb.reduce_s is None else end_offset + rb.reduce_s
        horizon = affine_horizon(st.src, st.dst, end_offset, received, after, delta)
        return (Steady(st, delta, budget=horizon) if horizon >= 2 else None), measured

    def _skip(self, steady: Steady, rounds: int, t: np.ndarray) -> np.ndarray:
        """Times after ``rounds`` more identical rounds, extrapolated rather than executed: every
        taking-part rank advances by rounds x its advance, and so does every checked link's busy time
        (uniform advance only: the affine one is used only where no link is checked)."""
        if not rounds:
            return t
        st = steady.structure
        assert isinstance(st, Structure)
        shift = rounds * steady.advance_s
        if st.checked.size:
            assert np.ndim(shift) == 0
            self.links.busy_until[unique_ints(st.flat_links[st.checked])] += shift
        self.transfers += rounds * st.src.size
        self.extrapolated_rounds += rounds
        if np.ndim(shift):
            moved = t + shift
        else:
            moved = t.copy()
            if st.participants is None:
                moved += shift
            else:
                moved[st.participants] += shift
        self._place_skipped(st, rounds, moved - t, steady.advance_s)
        return moved

    def _place_skipped(self, st: Structure, rounds: int, shift: np.ndarray, advance_s) -> None:
        """Make the last skipped round the placed one, as the executed one shifted per rank by ``shift``
        (the same flows, entered that much later), so the next round can still meet its flows."""
        placed = self._placed
        self._serial += rounds
        if not isinstance(placed, Placed) or placed.structure is not st:
            self._placed = None
            return
        entry = placed.entry + shift
        begin = entry if st.identity_src else entry[st.src]
        moved = self.links.writer_serial == placed.serial
        self.links.writer_serial[moved] = self._serial
        flow_start = begin + st.overhead_s
        if np.ndim(advance_s) == 0:
            # uniform advance: the flow there before was the same flow one round (c) earlier
            self.links.alone[moved] = self.links.busy_until[moved] - advance_s
        else:
            self.links.alone[moved] = flow_start[self.links.writer_index[moved]]  # not tracked: assume the worst
        self._placed = dataclasses.replace(placed, serial=self._serial, entry=entry, flow_start=flow_start)

    # --- collectives in flight together ------------------------------------------------------------
    # the counters a ``restore`` takes back with the link state
    _COUNTERS = (
        "transfers",
        "extrapolated_rounds",
        "overlapping_rounds",
        "relayed_rounds",
        "arc_rounds",
        "bundled_rounds",
    )

    def checkpoint(self) -> Checkpoint:
        """The link state and clocks as they are now, for ``restore``."""
        counters = tuple(getattr(self, name) for name in self._COUNTERS)
        return Checkpoint(self.operations, self.links.copy(), counters)

    def restore(self, checkpoint: Checkpoint, calls: int) -> None:
        """Undo the ``calls`` calls made since ``checkpoint`` (a collective and the one that met it);
        ``ContentionDetected`` if anything else ran meanwhile, since that would be undone too."""
        if self.operations - checkpoint.operations != calls:
            raise ContentionDetected("another operation ran while a collective was in flight")
        self.links.restore(checkpoint.links)
        for name, value in zip(self._COUNTERS, checkpoint.counters, strict=True):
            setattr(self, name, value)
        self._placed = None

    def run_concurrently(
        self, calls: list[tuple[Schedule, float, np.ndarray, np.ndarray]], log: TransferLog | None = None
    ) -> list[np.ndarray]:
        """Per-rank finish times of collectives in flight at the same time, each given as (schedule,
        message bytes, per-rank start times, members: see ``run``), where every collective moves in
        lockstep (``lockstep``: one start time, shift rounds of equal transfers, equal rates), which
        is then exact; ``ContentionDetected`` where that or the absence of other flows on their
        links cannot be proved."""
        if log is not None:
            raise ContentionDetected("collectives in flight together keep no transfer log")
        self.operations += 1
        self._placed = None
        # what is known of other flows, before looking up the rounds claims links and moves clocks
        known = self.links.copy()
        lanes: list[list[LockstepRound]] = []
        starts: list[float] = []
        used: list[list[Structure]] = []  # each collective's distinct round structures
        transfers = 0
        for schedule, message_bytes, start_s, members in calls:
            first = float(start_s[0])
            if np.any(start_s != first):
                raise ContentionDetected("collectives in flight together whose members enter at different times")
            t = np.full(schedule.ranks, first)
            rounds, distinct = [], {}
            for rnd, count in self._runs.get(schedule):
                st = self._structure(rnd, schedule.ranks, t, members)
                round_bytes(self.fabric, st, schedule, rnd, message_bytes)
                rounds.append(lockstep_round(st, count))
                distinct[id(st)] = st
                transfers += count * st.src.size
            lanes.append(rounds)
            starts.append(first)
            used.append(list(distinct.values()))
        links, timed = time_in_lockstep(self.fabric.capacity_Bps, known, used, lanes, starts)
        finish = []
        for (schedule, _bytes, _start, members), (exit_s, _last) in zip(calls, timed, strict=True):
            finish.append(np.full(schedule.ranks, exit_s))
            self.links.advance_clocks(finish[-1], members)
        for structures, collective_links, (_exit, last_end) in zip(used, links, timed, strict=True):
            for st in structures:
                self.links.claim(st.flat_links, st.senders[st.flat_owner], None)  # nothing placed: see above
            self.links.busy_until[collective_links] = np.maximum(self.links.busy_until[collective_links], last_end)
            self.links.writer_serial[collective_links] = -1  # no placed round wrote them
        self.transfers += transfers
        self._serial += 1
        return finish

    def place_apart(self, use: LinkUse, members: np.ndarray, finish_s: np.ndarray, transfers: int) -> None:
        """Take in a collective timed on its own by another path (the fluid one, after ``restore``
        undid this executor's attempt at it), as the one call it replaces: what its flows did per
        link (``use``, schedule rank i on fabric rank ``members[i]``) goes into the link state, its
        ranks' clocks move to their finish. ``ContentionDetected`` (nothing changed) where one of
        its flows started on a link before a flow known there ended: its times assumed none."""
        self.links.place_apart(use.links, members[use.low], members[use.high], use.first_s, use.last_s)
        self.links.advance_clocks(finish_s, members)
        self.transfers += transfers
        self._placed = None
        self._serial += 1

    def route_pairs(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Route the point-to-point pairs (fabric ranks) ``transfer`` will be asked for, in one batch:
        one at a time, the 32,768 pipeline pairs of 16,384 ranks took a tenth of the run."""
        routes, alpha, bottleneck = self.fabric.path_properties(src, dst)
        overheads = self.fabric.overheads(src, dst)
        hops, index = binding_hops(routes, self._redundant)
        starts = np.searchsorted(index, np.arange(src.size + 1))
        hop_list = hops.tolist()
        for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            links = tuple(hop_list[starts[i] : starts[i + 1]])
            self._pairs[(a, b)] = (links, float(alpha[i]), float(bottleneck[i]), float(overheads[i]))

    def transfer(self, src: int, dst: int, nbytes: float, start_s: float) -> float:
        """Arrival time of one point-to-point message of ``nbytes`` between fabric ranks, sent at
        ``start_s`` (overhead, then the flow at its route's bottleneck rate, then the latency).

        Its flow joins the link state that collectives use; ``ContentionDetected`` when it may share
        a link with another flow, or when the sender may still have flows of its own in flight
        (its clock is past ``start_s``: a collective it takes part in has not finished). Scalar
        arithmetic over the route's few links: a training run sends millions of these.
        """
        self.operations += 1
        pair = self._pairs.get((src, dst))
        if pair is None:
            self.route_pairs(np.array([src]), np.array([dst]))
            pair = self._pairs[(src, dst)]
        links, alpha, bottleneck, overhead = pair
        flow = nbytes / bottleneck if nbytes > 0 else 0.0
        self._placed = None  # this flow is not in the last round: busy times must come from clocks
        self.links.send(src, links, start_s, start_s + overhead, flow)
        self.transfers += 1
        return start_s + alpha + flow


def _shifted_leave(end: np.ndarray, reduce_s: np.ndarray | None, shift: int) -> np.ndarray:
    """``_leave`` for a shift round (rank r sends to r + shift, every rank once): rank r leaves at
    max(end[r], received[r - shift]), received = end + reduce_s.

    The values of ``np.maximum(end, np.roll(end + reduce_s, shift))``, to the bit (the same sums, the
    same maximum with its arguments in the same order), written into one new array in two slices
    rather than through the sum's and the roll's temporaries: a ring's transient executes thousands
    of these rounds over every rank."""
    ranks = end.size
    cut = ranks - shift % ranks  # received[r - shift] for r >= shift is received[:cut]
    new = np.empty_like(end)
    head, tail = new[ranks - cut :], new[: ranks - cut]
    if reduce_s is None:
        head[...] = end[:cut]
        tail[...] = end[cut:]
    elif np.ndim(reduce_s) == 0:
        np.add(end[:cut], reduce_s, out=head)
        np.add(end[cut:], reduce_s, out=tail)
    else:
        np.add(end[:cut], reduce_s[:cut], out=head)
        np.add(end[cut:], reduce_s[cut:], out=tail)
    return np.maximum(end, new, out=new)


class _Synced:
    """``VectorisedExecutor.run``'s count of the non-empty rounds it has done, and (where ``track``:
    a handover) the last point at which every rank entered the next round at the same time: every
    flow before it has ended by then, so the fluid path may start there (``Resume``) with the same
    result as from the first round."""

    def __init__(self, track: bool) -> None:
        self.track = track
        self.rounds = 0
        self.latest: Resume | None = None

    def advance(self, rounds: int, t: np.ndarray) -> None:
        self.rounds += rounds
        if self.track and rounds and t.size and t.min() == t.max():
            self.latest = Resume(self.rounds, t.copy())


def run_collective(
    schedule: Schedule,
    fabric: Fabric,
    message_bytes: float,
    start_s: np.ndarray | float = 0.0,
    mode: str = "auto",
) -> tuple[np.ndarray, str]:
    """Finish times of one collective and the path used (``vectorised``, ``fluid`` or ``message``).

    ``mode``: ``auto`` tries the round path, and where it cannot prove its times the fluid path
    (``fluid_executor``: the message path's model over every flow in flight at each instant),
    which declines only LogGP fabrics; those go message by message. ``vectorised``, ``fluid`` and
    ``message`` force one path (``ContentionDetected`` where it does not apply). Where the round
    path declines, ``auto`` keeps it for the segments before the decline and runs the rest on the
    fluid path (``segments``: where the cut between them is proved clean).
    """
    if mode not in ("auto", "vectorised", "fluid", "message"):
        raise ValueError(f"unknown execution mode {mode!r}; valid: auto, vectorised, fluid, message")
    runs: list[tuple[Round, int]] | None = None  # the schedule's runs of identical rounds, once found
    resume = None  # where the round path handed over with every rank in step
    routed = None  # the round path's structures of the rounds it routed
    if mode in ("auto", "vectorised"):
        # no handover where the fluid path declines (LogGP): the round path may still prove those
        executor = VectorisedExecutor(fabric, handover=mode == "auto" and not fabric.spec.loggp)
        try:
            return executor.run(schedule, message_bytes, start_s), "vectorised"
        except ContentionDetected:
            if mode == "vectorised":
                raise
        resume, routed = executor.resume, executor._structures
        if mode == "auto":  # what came before the decline on the round path, the rest fluid (``segments``)
            runs = executor._runs.get(schedule)  # kept, not walked again
            segmented = run_in_segments(schedule, fabric, message_bytes, start_s, executor._serial - 1, runs)
            if segmented is not None:
                return segmented
    if mode in ("auto", "fluid"):
        try:
            # from the last point before the round path gave up where every rank was in step, if any
            return run_fluid(fabric, schedule, message_bytes, start_s, resume, runs, routed), "fluid"
        except ContentionDetected:
            if mode == "fluid":
                raise
    return MessageExecutor(fabric).run(schedule, message_bytes, start_s), "message"
