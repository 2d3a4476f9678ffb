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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

FINISH_TOLERANCE = 1e-12  # relative: a flow projected to end within this of an event ends with it


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
    drain at them.
    """
    count = len(collectives)
    rounds = [list(collective) for collective in collectives]
    index = [0] * count  # the run of rounds each is in
    repeat = [0] * count  # rounds done of that run
    flowing = [False] * count
    until = list(starts)  # end of the overhead or latency each is in (when not flowing)
    entering = [True] * count  # ``until`` is the entry of a round (not the end of its overhead)
    remaining = [0.0] * count
    last_end = [float("-inf")] * count
    exits = [float("-inf")] * count
    done = [not rounds[i] for i in range(count)]
    for i in range(count):
        if done[i]:
            exits[i] = starts[i]
    now = min(starts) if starts else 0.0
    cached: dict[tuple[int | None, ...], tuple[float, ...]] = {}
    while not all(done):
        key = tuple(rounds[i][index[i]].flows if flowing[i] else None for i in range(count))
        rate = cached.get(key)
        if rate is None:
            rate = cached[key] = rates(key)
        due = [until[i] if not flowing[i] else now + remaining[i] / rate[i] for i in range(count)]
        step_to = min(due[i] for i in range(count) if not done[i])
        tolerance = FINISH_TOLERANCE * max(abs(step_to), 1e-9)
        for i in range(count):
            if flowing[i]:
                remaining[i] -= rate[i] * (step_to - now)
        now = step_to
        for i in range(count):
            if done[i] or due[i] > step_to + tolerance:
                continue
            if flowing[i]:  # the flow ended: the round ends at the arrival and the reduction
                current = rounds[i][index[i]]
                flowing[i] = False
                last_end[i] = now
                until[i] = now + current.latency_s + current.reduce_s
                entering[i] = True
                repeat[i] += 1
                if repeat[i] == current.count:
                    index[i], repeat[i] = index[i] + 1, 0
            elif entering[i]:  # a round (or the collective) is over: the next one starts
                if index[i] == len(rounds[i]):
                    done[i], exits[i] = True, now
                    continue
                until[i] = now + rounds[i][index[i]].overhead_s
                entering[i] = False
            else:  # the overhead is over: the flow starts (zero bytes: it ends at the next pass)
                flowing[i] = True
                remaining[i] = rounds[i][index[i]].nbytes
    return list(zip(exits, last_end, strict=True))
