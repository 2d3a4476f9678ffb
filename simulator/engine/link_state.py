"""What the round executor knows of the fabric's links and ranks from one round, and one call, to the next.

The round executor (``collective_engine.VectorisedExecutor``) proves a round's times by checking that
none of its flows can meet a flow already on a link. It only has to check links that more than one
sender uses: a rank's own flows never overlap, because it sends round k+1 only after round k's
transfers arrived (flows of one round that share a link are simulated together, ``round_fluid``).
So per link it keeps who sends there (``link_sender``: a fabric rank, -1 for none yet, -2 for
several) and, for links with several senders, until when the flows known there keep it busy
(``busy_until``); per fabric rank its latest known time (``clock``: no earlier than the end of any
flow it started).

When a link first gets a second sender (``claim``), its busy time is the end of the first sender's
flow there in the round just executed, or else that sender's clock: conservative, so the check can
only err towards the fallback. Where a flow of the next round would start on a checked link while
the flow there is still in flight, the executor simulates the two together (``round_overlap``); for
that it keeps which flow set each checked link's busy time (``writer_serial``: the serial of its
round, -1 none; ``writer_index``: the transfer in it) and from when that flow was alone there
(``alone``). ``shared_version`` changes whenever a link gains its second sender, so that a round's
cached list of checked links (``round_structures.Structure.checked``) is found afresh.

Every piece of the round path reads and writes this state: a round's hop lists, its bundles
(``round_bundles``), its arcs (``round_arcs``), a relay, a point-to-point message, collectives in
flight together. Here it is one object with the operations that keep it consistent, which the
executor asks; ``copy`` and ``restore`` let it undo calls (``VectorisedExecutor.checkpoint``).
"""

from __future__ import annotations

import copy

import numpy as np

from ddlsim.simulator.engine.round_bundles import Bundles
from ddlsim.simulator.engine.round_fluid import unique_ints
from ddlsim.simulator.engine.round_overlap import Placed
from ddlsim.simulator.engine.round_structures import ArcPlaced

__all__ = ["ContentionDetected", "LinkState"]


class ContentionDetected(RuntimeError):
    """Two flows may share a link at the same time: the vectorised path does not apply."""


class LinkState:
    """Per link its sender(s), busy time and writer; per fabric rank its clock (see the module)."""

    def __init__(self, links: int, ranks: int) -> None:
        self.busy_until = np.full(links, -np.inf)
        self.link_sender = np.full(links, -1, dtype=np.int64)  # -1 unused, -2 several senders
        # latest known time of each fabric rank (no earlier than the end of any flow it started)
        self.clock = np.full(ranks, -np.inf)
        self.shared_version = 0
        # which flow set each checked link's busy time: serial of its round (-1 none) and index in it
        self.writer_serial = np.full(links, -1, dtype=np.int64)
        self.writer_index = np.zeros(links, dtype=np.int64)
        self.alone = np.full(links, np.inf)  # from when the writer's flow is the only one there
        self._scratch = np.zeros(links, dtype=np.int64)

    # the arrays ``copy`` and ``restore`` carry (the scratch array is copied too, but holds nothing to undo)
    _SAVED = ("busy_until", "link_sender", "clock", "writer_serial", "writer_index", "alone")

    def copy(self) -> LinkState:
        """The state as it is now (its arrays copied), for ``restore`` or to read while this one moves on."""
        saved = copy.copy(self)
        for name in (*self._SAVED, "_scratch"):
            setattr(saved, name, getattr(self, name).copy())
        return saved

    def restore(self, saved: LinkState) -> None:
        """Go back to ``saved`` (a ``copy``), with a new shared-link version: checked links found since
        were found in the state undone."""
        for name in self._SAVED:
            setattr(self, name, getattr(saved, name).copy())
        self.shared_version += 1

    def cover_ranks(self, ranks: int) -> None:
        """Clocks for fabric ranks up to ``ranks`` (a schedule may run on more ranks than the fabric has devices)."""
        if self.clock.size < ranks:
            self.clock = np.concatenate([self.clock, np.full(ranks - self.clock.size, -np.inf)])

    def advance_clocks(self, t: np.ndarray, members: np.ndarray | None) -> None:
        """Move the clocks of the ranks of a call (schedule rank i on ``members[i]``) up to ``t``."""
        if members is None:
            self.clock[: t.size] = np.maximum(self.clock[: t.size], t)
        else:
            self.clock[members] = np.maximum(self.clock[members], t)

    def busy_before(self, links: np.ndarray) -> np.ndarray:
        """Until when each of ``links`` may carry a flow already known: its busy time where several
        senders use it, its one sender's clock where one does (no earlier than the end of any flow it
        started)."""
        sender = self.link_sender[links]
        own = self.clock[np.maximum(sender, 0)]
        return np.where(sender == -2, self.busy_until[links], np.where(sender >= 0, own, -np.inf))

    # --- who sends where ---------------------------------------------------------------------------
    def claim(self, links: np.ndarray, senders: np.ndarray, placed: Placed | ArcPlaced | None) -> None:
        """Record who sends over ``links``; links gaining a second sender become checked.

        A link that had one sender before gets as its busy time that sender's flow's end in
        ``placed`` (the round executed just before, if any), or else its clock; two senders on one
        link within a round are handled by the round itself (the contended path) and checked
        against later rounds.
        """
        if links.size * 4 >= self.link_sender.size:  # a large round: per link, not per hop
            self.claim_per_link(links, senders, placed)
        else:
            self.claim_per_hop(links, senders, placed)

    def claim_per_hop(self, links: np.ndarray, senders: np.ndarray, placed: Placed | ArcPlaced | None) -> None:
        """``claim`` hop by hop."""
        # links with two senders in this batch: some entry's sender differs from the one recorded
        # last for its link (a scratch array over the fabric's links: linear, no sort)
        scratch = self._scratch
        scratch[links] = senders
        within = links[scratch[links] != senders]
        previous = self.link_sender[links]
        across = links[(previous >= 0) & (previous != senders)]
        shared = unique_ints(np.concatenate([across, within]), self.link_sender.size)
        shared = shared[self.link_sender[shared] != -2]
        before = self.link_sender[shared]  # the one earlier sender, or -1 for a link new to all
        had_one = before >= 0
        self._busy_from_first_sender(shared[had_one], self.clock[before[had_one]], placed)
        fresh = previous == -1
        self.link_sender[links[fresh]] = senders[fresh]
        self._mark_shared(shared)

    def claim_per_link(self, links: np.ndarray, senders: np.ndarray, placed: Placed | ArcPlaced | None) -> None:
        """``claim`` for a batch with hops on a good part of the fabric's links: each link's lowest
        and highest sender in the batch (two reductions) say whether it has two, instead of a
        dozen passes over the hops."""
        low = np.full(self.link_sender.size, np.iinfo(np.int64).max)
        high = np.full(self.link_sender.size, -1, dtype=np.int64)
        np.minimum.at(low, links, senders)
        np.maximum.at(high, links, senders)
        self.claim_bounds(low, high, placed)

    def claim_bounds(self, low: np.ndarray, high: np.ndarray, placed: Placed | ArcPlaced | None) -> None:
        """``claim`` from each link's lowest and highest sender in the batch (-1 as highest: none)."""
        used = np.flatnonzero(high >= 0)
        previous = self.link_sender[used]
        first, last = low[used], high[used]
        shared_mask = (previous != -2) & ((first != last) | ((previous >= 0) & (previous != first)))
        shared = used[shared_mask]
        before = previous[shared_mask]  # the one earlier sender, or -1 for a link new to all
        had_one = before >= 0
        self._busy_from_first_sender(shared[had_one], self.clock[before[had_one]], placed)
        fresh = previous == -1
        self.link_sender[used[fresh]] = first[fresh]
        self._mark_shared(shared)

    def _mark_shared(self, shared: np.ndarray) -> None:
        if shared.size:
            self.link_sender[shared] = -2
            self.shared_version += 1

    def _busy_from_first_sender(self, links: np.ndarray, clock: np.ndarray, placed: Placed | ArcPlaced | None) -> None:
        """Busy times of ``links`` (sorted) as they gain a second sender: the end of the first sender's
        flow there in ``placed`` (the round just executed), if it sent one (then that flow is its last
        there, and recorded as the link's writer), else its clock (no earlier than the end of any of
        its flows)."""
        value = clock
        if isinstance(placed, ArcPlaced) and links.size:
            found = placed.link_end[links]
            hit = np.isfinite(found)
            written = links[hit]
            writer = placed.writer[written]
            self.writer_serial[written] = placed.serial
            self.writer_index[written] = writer
            self.alone[written] = placed.flow_start[writer]
            value = np.where(hit, found, clock)
        elif isinstance(placed, Placed) and links.size:
            hit = np.isin(placed.flat_links, links)
            if hit.any():
                owner = placed.flat_owner[hit]
                position = np.searchsorted(links, placed.flat_links[hit])
                ends = placed.flow_start[owner] + placed.duration[owner]
                found = np.full(links.size, -np.inf)
                np.maximum.at(found, position, ends)
                last = ends >= found[position]
                self.writer_serial[links[position[last]]] = placed.serial
                self.writer_index[links[position[last]]] = owner[last]
                # the first sender's earlier flows there ended before this one started
                self.alone[links[position[last]]] = placed.flow_start[owner[last]]
                value = np.where(np.isfinite(found), found, clock)
        self.busy_until[links] = np.maximum(self.busy_until[links], value)

    # --- a round's flows on its checked links ------------------------------------------------------
    def commit(
        self,
        serial: int,
        ends: np.ndarray,
        owners: np.ndarray,
        links: np.ndarray,
        before: np.ndarray,
        repeated: bool,
    ) -> None:
        """Record round ``serial``'s flows on its checked links, hop by hop (``links``, ``owners``: the
        link and transfer of each hop; ``ends``: its flow's end; ``before``: the link's busy time until
        now): busy until their end, and which flow. ``repeated``: a link may appear more than once
        (the round's flows share links)."""
        busy = self.busy_until
        if repeated:
            np.maximum.at(busy, links, ends)
            last = ends >= busy[links]
        else:  # every checked link once: no unbuffered max needed, and a flow is last where it ends later
            busy[links] = np.maximum(before, ends)
            last = ends >= before
        written, who, was = (links, owners, before) if last.all() else (links[last], owners[last], before[last])
        if written.size >= 2 * self._scratch.size:  # many hops per link: one entry per link first
            entry = np.full(self._scratch.size, -1, dtype=np.int64)
            entry[written] = np.arange(written.size)  # of a repeated link the last entry stays, as below
            written = np.flatnonzero(entry >= 0)
            entry = entry[written]
            who, was = who[entry], was[entry]
        self.writer_serial[written] = serial
        self.writer_index[written] = who
        self.alone[written] = was

    def commit_per_link(
        self, serial: int, links: np.ndarray, before: np.ndarray, ends: np.ndarray, writer: np.ndarray
    ) -> None:
        """``commit`` given per checked link (each once): the latest end of its flows and the transfer
        that ends there last (a round as arcs)."""
        self.busy_until[links] = np.maximum(before, ends)
        self.writer_serial[links] = serial
        self.writer_index[links] = writer
        self.alone[links] = before

    def commit_bundles(self, serial: int, bundles: Bundles, flow_start: np.ndarray, flow_end: np.ndarray) -> bool:
        """``commit`` per bundle (``round_bundles``), False (nothing changed) where a flow would meet an
        earlier one."""
        bundles.refresh(self.link_sender, self.shared_version)
        state = (self.busy_until, self.writer_serial, self.writer_index, self.alone)
        return bundles.commit(flow_start, flow_end, *state, serial)

    # --- a collective timed apart ----------------------------------------------------------------------
    def place_apart(
        self, links: np.ndarray, low: np.ndarray, high: np.ndarray, first_s: np.ndarray, last_s: np.ndarray
    ) -> None:
        """Record the flows of a collective timed on its own (the fluid path) over ``links`` (each
        once; ``low``, ``high``: its lowest and highest fabric rank sending there; ``first_s``,
        ``last_s``: when its first flow there started and its last one ended). Its times hold only
        if no flow known here was still on one of those links when its first flow there started:
        ``ContentionDetected`` otherwise (nothing changed). Its links gain senders as in ``claim``
        and stay busy until its last flow's end; no placed round wrote them (a later flow that meets
        them is not simulated with them). The caller moves its ranks' clocks to their finish."""
        if np.any(first_s < self.busy_before(links)):
            raise ContentionDetected("a collective timed on its own would meet a flow already on a link")
        bound_low = np.full(self.link_sender.size, np.iinfo(np.int64).max)
        bound_high = np.full(self.link_sender.size, -1, dtype=np.int64)
        bound_low[links], bound_high[links] = low, high
        self.claim_bounds(bound_low, bound_high, None)
        self.busy_until[links] = np.maximum(self.busy_until[links], last_s)
        self.writer_serial[links] = -1

    # --- a point-to-point message --------------------------------------------------------------------
    def send(self, src: int, links: tuple[int, ...], start_s: float, begin: float, flow: float) -> None:
        """Record a point-to-point flow of fabric rank ``src`` over ``links``, sent at ``start_s`` and
        streaming from ``begin`` for ``flow`` seconds: each link it crosses is checked from then on.
        ``ContentionDetected`` when it may share a link with another flow, or when the sender may
        still have flows of its own in flight (its clock is past ``start_s``: a collective it takes
        part in has not finished). Scalar arithmetic: a training run sends millions of these."""
        clock, busy, senders, writer = self.clock, self.busy_until, self.link_sender, self.writer_serial
        if start_s < clock[src]:
            raise ContentionDetected("a point-to-point message may overlap its sender's own flows")
        clock[src] = start_s
        for link in links:  # scalar loop: a message crosses a few links, numpy calls would dominate
            sender = int(senders[link])
            if sender != -2:
                # the link's busy time becomes exact from here on: a one-sender link's clock bound
                # (see claim) would make a pipeline's receiver look busy while its sender runs a
                # collective of its own elsewhere (Llama 3 405B: every DP reduce-scatter fell back)
                if sender >= 0:
                    busy[link] = max(busy[link], clock[sender])  # clock[src] is start_s by now
                senders[link] = -2
                self.shared_version += 1
            if begin < busy[link]:
                raise ContentionDetected("a point-to-point message may overlap another flow on a link")
            busy[link] = begin + flow
            writer[link] = -1
        clock[src] = begin + flow
