"""Flows of two consecutive rounds that overlap on a link: simulated together instead of refused.

The round executor runs round k+1 from the times at which ranks left round k. A flow f of round k+1
may start on a link L shared by several senders while the flow g that round k put on L is still in
flight (e.g. the last row step and the first column step of a 2D-torus all-reduce on a fat tree,
where the cross-leaf hops of a row lag by 200 ns). Without this module the executor gives up and the
whole collective runs message by message.

``OverlapGroup`` collects such pairs and resolves them exactly when:

* g is from the round executed just before (its start, bytes and route are known), and
* f starts after every flow that was on L before g had ended (the executor keeps, per link, the
  busy time the writer g found), so on L g is the only earlier flow f can meet.

Then a fluid simulation of the group's flows alone (``round_fluid.fluid_ends``) gives every group
flow's true end. The group holds, with each flow, the whole in-round contention component it
belongs to in its own round; a round-(k+1) flow whose sender sent or received a round-k group flow
starts only after that flow has arrived (a start dependency of the simulation, ``After``), the
other round-(k+1) flows at known times. The round-k flows end later than they did alone, the ranks
that sent and received them leave round k later, and round k+1 is timed again from there with the
group's round-(k+1) flows ending when the simulation says. The executor repeats the check; pairs
found then join the group and the group is simulated again from the original state, until no flow
of round k+1 meets an earlier one it is not simulated with (or a condition above fails, or the
group keeps growing: ``ContentionDetected``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ddlsim.simulator.engine.round_fluid import After, fluid_ends
from ddlsim.simulator.engine.round_structures import Structure, spans


@dataclass
class Placed:
    """A round as executed: what a later round needs to re-time it (transfer-indexed arrays)."""

    serial: int
    structure: Structure  # the round's routes and timing terms
    entry: np.ndarray  # per-rank entry times
    flow_start: np.ndarray
    duration: np.ndarray  # flow seconds as executed
    nbytes: np.ndarray
    flat_links: np.ndarray  # binding hops and their transfer indices
    flat_owner: np.ndarray
    contended: np.ndarray  # bool per transfer: shared a link within its own round
    reduce_s: np.ndarray | None  # receivers' reduction seconds per transfer (None: free)
    joint: np.ndarray | None = None  # flows that were simulated with the round before theirs


@dataclass
class OverlapGroup:
    """Flows of the previous round (``earlier``) and of the current one (``later``) simulated together."""

    earlier: set[int] = field(default_factory=set)
    later: set[int] = field(default_factory=set)

    def add(
        self,
        previous: Placed,
        later: np.ndarray,
        earlier: np.ndarray,
        too_early: np.ndarray,
        components: np.ndarray | None,
    ) -> str | None:
        """Add the pairs (``later[i]`` of this round meets ``earlier[i]`` of the previous one), with
        the in-round contention components both belong to; ``too_early[i]``: later[i] starts while a
        flow older than earlier[i] may still be on that link; ``components``: this round's
        component per transfer (-1: none). Returns why the group cannot be resolved, or None."""
        if np.any(too_early):
            return "a flow starts while flows older than the previous round's may be in flight"
        self.earlier.update(earlier.tolist())
        self.later.update(later.tolist())
        for members, labels in ((self.earlier, _labels(previous)), (self.later, components)):
            if labels is not None:
                joined = np.unique(labels[np.fromiter(members, dtype=np.int64)])
                joined = joined[joined >= 0]
                members.update(np.flatnonzero(np.isin(labels, joined)).tolist())
        if previous.joint is not None and previous.joint[np.fromiter(self.earlier, dtype=np.int64)].any():
            # its course was set together with flows two rounds back, which are not simulated here
            return "an earlier flow it meets was itself simulated with the round before it"
        return None

    def simulate(
        self,
        previous: Placed,
        current: Placed,
        base_start: np.ndarray,
        capacity_Bps: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(earlier flows, their durations, later flows, their end times) from a joint fluid run.

        ``current``: this round as timed so far (only its structure, routes, sizes and overheads
        are used); ``base_start[i]``: when later flow i could start if no earlier group flow held
        its sender back (the earlier group flows of its sender then add start dependencies).
        """
        earlier = np.array(sorted(self.earlier), dtype=np.int64)
        later = np.array(sorted(self.later), dtype=np.int64)
        e_pos = np.full(previous.duration.size, -1)
        e_pos[earlier] = np.arange(earlier.size)
        l_pos = np.full(current.duration.size, -1)
        l_pos[later] = earlier.size + np.arange(later.size)
        e_hop = e_pos[previous.flat_owner] >= 0
        l_hop = l_pos[current.flat_owner] >= 0
        owner = np.concatenate([e_pos[previous.flat_owner[e_hop]], l_pos[current.flat_owner[l_hop]]])
        links, local = np.unique(
            np.concatenate([previous.flat_links[e_hop], current.flat_links[l_hop]]), return_inverse=True
        )
        starts = np.concatenate([previous.flow_start[earlier], base_start[later]])
        sizes = np.concatenate([previous.nbytes[earlier], current.nbytes[later]])
        ends = fluid_ends(
            owner,
            local.ravel(),
            capacity_Bps[links],
            sizes,
            starts,
            after=_dependencies(previous, current, earlier, later),
        )
        return earlier, ends[: earlier.size] - starts[: earlier.size], later, ends[earlier.size :]


def _labels(placed: Placed) -> np.ndarray | None:
    """In-round contention component of every transfer of a placed round (-1: none)."""
    contention = placed.structure.contention
    if not contention.flows.size:
        return None
    labels = np.full(placed.duration.size, -1)
    labels[contention.flows] = contention.component
    return labels


def _dependencies(previous: Placed, current: Placed, earlier: np.ndarray, later: np.ndarray) -> After:
    """Later flow f waits for every earlier group flow g its sender r takes part in: r leaves the
    previous round no earlier than g's arrival (flow end + latency) if r sent g, plus the reduction
    time if r received it; f's flow starts the sender overhead after that."""
    prev, cur = previous.structure, current.structure
    arrival = (prev.alpha_s - prev.overhead_s)[earlier]
    rho = (
        np.zeros(earlier.size)
        if previous.reduce_s is None
        else np.broadcast_to(previous.reduce_s, prev.src.shape)[earlier]
    )
    rank = np.concatenate([prev.src[earlier], prev.dst[earlier]])
    flow = np.concatenate([np.arange(earlier.size), np.arange(earlier.size)])
    delay = np.concatenate([arrival, arrival + rho])
    order = np.argsort(rank, kind="stable")
    rank, flow, delay = rank[order], flow[order], delay[order]
    sender = cur.src[later]
    lo = np.searchsorted(rank, sender, side="left")
    hi = np.searchsorted(rank, sender, side="right")
    count = hi - lo
    dependent = np.repeat(np.arange(later.size), count)
    pick = spans(lo, count)
    overhead = cur.overhead_s[later]
    return After(earlier.size + dependent, flow[pick], delay[pick] + overhead[dependent])
