"""What the round executor builds for a round and keeps while the same arrays come back.

The round executor (``collective_engine.VectorisedExecutor``) times a round from what its transfer
arrays imply once they are routed: who sends to whom (schedule ranks and fabric ranks), the hops
that can bind and which transfer each belongs to, latencies, overheads and bottlenecks, whether the
round is a permutation or a shift, which transfers contend within the round (``round_fluid``) and in
which bundles they travel (``round_bundles``). That is a ``Structure``; a torus round taken as arcs
(``round_arcs``) has an ``ArcStructure`` instead, with the same timing fields and the arcs in place
of the hop lists. A schedule hands out the same arrays round after round and bucket after bucket,
so both are kept in a ``RoundCache`` keyed by those arrays, and so are the byte counts they imply
(``RoundBytes``, for the message size and operation last asked for).

``ArcPlaced`` is a round executed as arcs as the next round needs it (``round_overlap.Placed`` is
the same for a round executed hop by hop). These are plain records: building them reads the fabric
and claims links (``link_state``), which is the executor's part; the overlap, steady-state and
relay pieces of the round path only read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.round_arcs import ArcRound
from ddlsim.simulator.engine.round_bundles import Bundles
from ddlsim.simulator.engine.round_fluid import Contention

__all__ = [
    "ArcPlaced",
    "ArcStructure",
    "RoundBytes",
    "RoundCache",
    "ScheduleRuns",
    "Structure",
    "binding_hops",
    "identity_and_shift",
    "round_bytes",
]


@dataclass
class RoundBytes:
    """What a round's byte counts give, kept with its structure while the same arrays come back."""

    chunk_count: Any  # the round's arrays these were computed from (held, so compared by identity)
    op: Any
    message_bytes: float
    nbytes: np.ndarray
    reduce_s: np.ndarray | None
    flow_s: np.ndarray  # uncontended: bytes / bottleneck
    fluid_s: np.ndarray | None = None  # contended transfers' durations when they start together


@dataclass
class Structure:
    """A round routed hop by hop: its transfers, their binding hops, and what times them."""

    src: np.ndarray  # schedule ranks (index the per-rank time vector)
    dst: np.ndarray
    senders: np.ndarray  # fabric rank of each transfer's sender (keys the shared link state)
    flat_links: np.ndarray  # link ids of all valid hops of all transfers, flattened
    flat_owner: np.ndarray  # transfer index of each flat link
    alpha_s: np.ndarray
    overhead_s: np.ndarray
    bottleneck_Bps: np.ndarray
    identity_src: bool  # src == arange(ranks): every rank sends exactly once, in rank order
    permutation: bool  # every rank sends at most once and receives at most once
    shift: int  # dst == (src + shift) % ranks with identity src; 0 when not such a structure
    checked: np.ndarray  # positions in flat_links whose link more than one sender uses
    version: int  # shared-link version ``checked`` was computed for
    # transfers that share a link with another transfer of the same round (in-round fluid simulation)
    contention: Contention
    contended_mask: np.ndarray  # bool per transfer: in ``contention.flows``
    participants: np.ndarray | None  # ranks that send or receive in the round (None: every rank)
    bundles: Bundles | None  # contended transfers in bundles of one route each (``round_bundles``)
    bytes: RoundBytes | None = None
    # the link latencies summed along each route (``PathCosts.latency_s``): what the fluid path takes
    # over where it times the same round after a handover, rather than routing it again
    latency_s: np.ndarray | None = None


@dataclass
class ArcStructure:
    """A round routed as torus arcs (``round_arcs``): the proof and the timing per link and per flow.

    Taken only where the in-round fluid needs no simulation: every link's flows have one equal share
    (its capacity over its flow count, the smallest on their routes), which then is each contended
    flow's max-min fair rate, and, checked per execution, start together with equal bytes, so they
    end together as the fluid would have them (``round_fluid``: a component whose flows all start
    together ends as it would from time zero, shifted).
    """

    src: np.ndarray
    dst: np.ndarray
    senders: np.ndarray
    alpha_s: np.ndarray
    overhead_s: np.ndarray
    bottleneck_Bps: np.ndarray
    identity_src: bool
    permutation: bool
    shift: int
    participants: np.ndarray | None
    arcs: ArcRound
    used: np.ndarray  # ids of the links some flow crosses
    contended: np.ndarray  # transfers that share a link with another (indices)
    share_Bps: np.ndarray  # their rates: the smallest equal share on their routes
    writer: np.ndarray  # per link: the highest-numbered transfer that crosses it (-1: none)
    bytes: RoundBytes | None = None


@dataclass
class ArcPlaced:
    """A round executed as arcs, as the next round's claims need it: per link the end of its last flow
    there (-inf: none) and which transfer that is (all of a link's flows end together), per transfer
    its flow start; and what rebuilds it as a ``Placed`` where flows of the next round overlap its own."""

    serial: int
    link_end: np.ndarray
    writer: np.ndarray
    flow_start: np.ndarray
    round: Round
    members: np.ndarray | None
    entry: np.ndarray
    duration: np.ndarray
    bytes: RoundBytes


class ScheduleRuns:
    """Per schedule object its non-empty rounds as (round, repeats): consecutive rounds sharing their
    src, dst, chunk count and op arrays are one run. Kept (up to a size), so a schedule run again and
    again (the buckets of a training run) neither walks its round generator again nor hands the
    structure cache fresh arrays."""

    MAX_RUNS = 4096  # schedules with more runs of rounds than this are walked afresh each call
    MAX_SCHEDULES = 64

    def __init__(self) -> None:
        self._compiled: dict[int, tuple[Schedule, list[tuple[Round, int]]]] = {}

    def get(self, schedule: Schedule) -> list[tuple[Round, int]]:
        cached = self._compiled.get(id(schedule))
        if cached is not None and cached[0] is schedule:
            return cached[1]
        runs: list[tuple[Round, int]] = []
        for rnd in schedule.rounds():
            if not len(rnd):
                continue
            if runs:
                last = runs[-1][0]
                if (
                    rnd.src is last.src
                    and rnd.dst is last.dst
                    and rnd.chunk_count is last.chunk_count
                    and rnd.op is last.op
                ):
                    runs[-1] = (last, runs[-1][1] + 1)
                    continue
            runs.append((rnd, 1))
        if len(runs) <= self.MAX_RUNS:
            if len(self._compiled) >= self.MAX_SCHEDULES:
                self._compiled.clear()
            self._compiled[id(schedule)] = (schedule, runs)  # the schedule held: its id stays valid
        return runs


class RoundCache:
    """What was built for a round's transfer arrays (and member ranks), while the same arrays come
    back: keyed by their ids, holding references to them so that the ids cannot be reused while
    cached; emptied past 256 entries."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int, int], tuple[Any, Any, Any, Any]] = {}

    def get(self, rnd: Round, members: np.ndarray | None) -> tuple[bool, Any]:
        """(whether ``rnd`` with ``members`` is cached, what was built for it)."""
        cached = self._entries.get((id(rnd.src), id(rnd.dst), id(members)))
        if cached is not None and cached[0] is rnd.src and cached[1] is rnd.dst and cached[2] is members:
            return True, cached[3]
        return False, None

    def put(self, rnd: Round, members: np.ndarray | None, value: Any) -> None:
        if len(self._entries) > 256:
            self._entries.clear()
        self._entries[(id(rnd.src), id(rnd.dst), id(members))] = (rnd.src, rnd.dst, members, value)


def identity_and_shift(src: np.ndarray, dst: np.ndarray, ranks: int) -> tuple[bool, int]:
    """(whether every rank sends once, in rank order; s where rank r sends to r + s mod ranks, else 0)."""
    identity = src.size == ranks and bool(np.array_equal(src, np.arange(ranks)))
    shift = int((dst[0] - src[0]) % ranks) if identity and src.size else 0
    if shift and not np.array_equal(dst, (src + shift) % ranks):
        shift = 0
    return identity, shift


_FEW_SPANS = 16


def spans(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions lo[i], lo[i] + 1, ..., lo[i] + counts[i] - 1 for every i, in order: the entries of
    ranges of a flat array (a rank's sends, a transfer's hops) gathered in one index array."""
    if lo.size <= _FEW_SPANS:  # a few ranges (the fluid path's instants): listed, not five array passes
        return np.array(
            [p for start, count in zip(lo.tolist(), counts.tolist(), strict=True) for p in range(start, start + count)],
            dtype=np.int64,
        )
    return np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))


def binding_hops(routes: np.ndarray, redundant: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(link, transfer index) of every hop of ``routes`` (rows padded with -1) that can bind: padding
    and ``redundant`` links (``Fabric.redundant``, None where the fabric has none) dropped.

    A redundant link (its constraint is implied by other links') changes no rate and never makes two
    flows contend, so it needs neither the overlap check nor a place in the in-round max-min
    computation.
    """
    flat = routes.ravel()
    if redundant is None:
        if routes.size and flat.min() >= 0:  # every route as long as the longest: no padding
            return flat, np.repeat(np.arange(routes.shape[0]), routes.shape[1])
        keep = np.flatnonzero(flat >= 0)
    else:
        valid = flat >= 0
        valid[valid] = ~redundant[flat[valid]]
        keep = np.flatnonzero(valid)
    return flat[keep], keep // max(routes.shape[1], 1)


def round_bytes(
    fabric: Fabric, st: Structure | ArcStructure, schedule: Schedule, rnd: Round, message_bytes: float
) -> RoundBytes:
    """The round's byte counts, reduction times and uncontended flow times, kept with its structure
    while the same arrays come back."""
    rb = st.bytes
    if rb is not None and rb.chunk_count is rnd.chunk_count and rb.op is rnd.op and rb.message_bytes == message_bytes:
        return rb
    nbytes = schedule.transfer_bytes(rnd, message_bytes)
    # the in-round fluid depends on the structure and the bytes only: a round of the same pairs and
    # sizes with another operation (halving-doubling's all-gather mirroring its reduce-scatter) keeps it
    fluid_s = None
    if rb is not None and rb.fluid_s is not None and np.array_equal(rb.nbytes, nbytes):
        fluid_s = rb.fluid_s
    reduce_s = fabric.reduce_times(nbytes, rnd.op)
    st.bytes = RoundBytes(rnd.chunk_count, rnd.op, message_bytes, nbytes, reduce_s, nbytes / st.bottleneck_Bps, fluid_s)
    return st.bytes
