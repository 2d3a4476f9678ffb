"""Collectives in flight at the same time whose ranks each move in lockstep: one fluid per collective.

Two collectives that overlap in time may share links (the two pipeline stages of ``hybrid_parallel``
each run a ring all-reduce through every node's one NIC). The round executor proves one collective
at a time, so it cannot time them; the message path can, at a cost of every transfer as SimPy
events. This module times them exactly in the case where every rank of a collective does the same
thing at the same instant:

* all its members enter at one time, and every round is a shift permutation (rank r sends to
  r + s and receives from r - s) whose transfers have equal bytes, overheads, latencies and
  reduction times, so all of a round's flows start together and arrive together, and a rank
  enters the next round when its one send and its one receive are done: at that same instant;
* whenever flows of several collectives are in flight together, the max-min fair rates give every
  flow of one collective the same rate (``rates`` checks this over all the flows of the rounds in
  flight, so a ring whose hops cross a fat tree's leaf boundaries on longer routes does not pass).

Then one representative per collective is exact: each round is an overhead, a flow of ``nbytes``
whose rate changes only when another collective's flows start or end, a latency and a reduction.
A round's flows end before any rank enters the next round, so flows of one collective never meet
each other across rounds. Whoever calls this proves that no other flow meets these on a link.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ddlsim.hardware_models.network import FINISH_TOLERANCE  # the flow network's: a flow ends with an event


@dataclass(frozen=True)
class LockstepRound:
    """A run of ``count`` identical rounds of one collective, as each of its ranks sees them."""

    flows: int  # which flows are in flight: rounds with equal keys cross the same links
    overhead_s: float  # from entering the round to the flow's start
    latency_s: float  # from the flow's end to its arrival
    nbytes: float
    reduce_s: float  # the receiver adds in what it received, after the arrival
    count: int = 1


# the rates of the flows in flight: per collective, its flows' key (None: none in flight) -> rate
Rates = Callable[[tuple[int | None, ...]], tuple[float, ...]]


def lockstep_exits(
    collectives: Sequence[Sequence[LockstepRound]], starts: Sequence[float], rates: Rates
) -> list[tuple[float, float]]:
    """(exit time, end of the last flow) of each collective, entered at ``starts``.

    An event loop over the collectives' representatives, as the flow network runs it: between two
    events (a flow starts or ends, an overhead or a latency is over) rates stay fixed and bytes
    drain at them. While no other collective can have a flow in flight, a collective goes on a
    whole round at a time (``_Lane.go_alone``: the same arithmetic, without the events).
    """
    lanes = [_Lane(list(collective), start) for collective, start in zip(collectives, starts, strict=True)]
    count = len(lanes)
    cached: dict[tuple[int | None, ...], tuple[float, ...]] = {}

    def rates_of(key: tuple[int | None, ...]) -> tuple[float, ...]:
        rate = cached.get(key)
        if rate is None:
            rate = cached[key] = rates(key)
        return rate

    alone_rates: dict[tuple[int, int], float] = {}

    def alone(i: int, flows: int) -> float:
        """The rate of collective i's flows with no other collective's in flight."""
        rate = alone_rates.get((i, flows))
        if rate is None:
            rate = alone_rates[i, flows] = rates_of(tuple(flows if j == i else None for j in range(count)))[i]
        return rate

    now = min(starts, default=0.0)
    alone_of = [partial(alone, i) for i in range(count)]
    # plain loops over the few lanes, not comprehensions and method calls: this loop runs once per
    # event, tens of thousands of times for two ring all-reduces over 4096 nodes (hybrid_parallel)
    while True:
        for i, lane in enumerate(lanes):
            if lane.entering and lane.exit is None:  # (else go_alone has nothing to do)
                horizon = math.inf  # no other collective's flow starts before this
                for other in lanes:
                    if other is not lane and other.exit is None:
                        horizon = min(horizon, other.next_start())
                lane.go_alone(horizon, alone_of[i])
        key: list[int | None] = []
        live = False
        for lane in lanes:
            live = live or lane.exit is None
            key.append(lane.rounds[lane.index].flows if lane.flowing else None)
        if not live:
            break
        rate = rates_of(tuple(key))
        due = []
        step_to = math.inf
        for lane, lane_rate in zip(lanes, rate, strict=True):
            at = lane.due(now, lane_rate)
            due.append(at)
            if lane.exit is None and at < step_to:
                step_to = at
        tolerance = FINISH_TOLERANCE * max(abs(step_to), 1e-9)
        for lane, lane_rate in zip(lanes, rate, strict=True):
            if lane.flowing:
                lane.remaining -= lane_rate * (step_to - now)
        now = step_to
        limit = step_to + tolerance
        for lane, at in zip(lanes, due, strict=True):
            if lane.exit is None and at <= limit:
                lane.event(now)
    return [(lane.exit, lane.last_end) for lane in lanes if lane.exit is not None]  # every one by now


@dataclass(slots=True)
class _Lane:
    """One collective's representative rank."""

    rounds: list[LockstepRound]
    until: float  # the entry of its next round (``entering``), else the end of its overhead
    index: int = 0  # the run of rounds it is in
    repeat: int = 0  # rounds done of that run
    entering: bool = True
    flowing: bool = False
    remaining: float = 0.0  # bytes of the flow in flight
    last_end: float = -math.inf
    exit: float | None = None

    def due(self, now: float, rate: float) -> float:
        return now + self.remaining / rate if self.flowing else self.until

    def next_start(self) -> float:
        """No flow of this collective starts before this (one is in flight: -inf)."""
        return -math.inf if self.flowing else self.until

    def event(self, now: float) -> None:
        """What is due at ``now``: a flow ends, a round (or the collective) is over, or a flow starts."""
        if self.flowing:  # the round ends at the arrival and the reduction
            self.flowing = False
            self._end_flow(now)
        elif self.entering:
            if self.index == len(self.rounds):
                self.exit = now
                return
            self.until = now + self.rounds[self.index].overhead_s
            self.entering = False
        else:  # zero bytes: the flow ends at the next pass
            self.flowing = True
            self.remaining = self.rounds[self.index].nbytes

    def _end_flow(self, end: float) -> None:
        current = self.rounds[self.index]
        self.last_end = end
        self.until = end + current.latency_s + current.reduce_s
        self.entering = True
        self.repeat += 1
        if self.repeat == current.count:
            self.index, self.repeat = self.index + 1, 0

    def go_alone(self, horizon: float, alone: Callable[[int], float]) -> None:
        """Whole rounds from a round's entry whose flows end by ``horizon`` (no other collective's
        flow starts before it): each flow at its rate alone, in the event loop's arithmetic."""
        while self.entering and self.exit is None:
            if self.index == len(self.rounds):
                self.exit = self.until
                return
            current = self.rounds[self.index]
            end = self.until + current.overhead_s + current.nbytes / alone(current.flows)
            if end > horizon:
                return
            self._end_flow(end)
