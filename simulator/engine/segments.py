"""A collective in segments: its steady runs on the round path, what lies between on the fluid path.

A pipelined schedule (NCCL's double binary tree in 191 pieces) fills, repeats one round many
times, and drains. The round path (``collective_engine.VectorisedExecutor``) skips the repeated
rounds in closed form (``steady_state``) but cannot prove the fill: ranks of different heights
leave their rounds at different times, flows of three and more rounds meet on the same links, and
it declines. The whole collective then went to the fluid path (``fluid_executor``), which has to
simulate every round, the repeated ones included: seconds at 4096 ranks.

Yet on many fabrics the ranks come out of the fill together: on a switch every rank enters the
first repeated round at the same instant, with every earlier flow arrived. Where that holds, the
collective is the same as its segments run one after another, each started at the times the one
before left its ranks: the runs of ``STEADY_MIN`` or more identical rounds each one segment, the
rounds between them another. Each segment runs on the round path, or on the fluid path where the
round path declines (or would: ``run_in_segments``).

The proof that cutting changes nothing, checked at every cut: every flow of the rounds before the
cut has ended before any flow of the rounds after it starts, so no flow meets one of the other
side and the two sides never share a link. A flow ends by the time its sender leaves its round
(arrival = end + latency), and a rank's clock only advances, so the latest time at which a sender
of the earlier segment leaves it bounds their flows' ends; a sender of the next segment starts a
flow no earlier than it entered that segment, nor before what it received there arrived
(``_earliest_start``: a device that waits in its node's chain for the trees' result waits for
flows of the next segment, not for the clock it left the chain reduce with). Where the check fails
(the fill of a fat tree, whose cross-leaf hops are slower, leaves the ranks a fraction of a
microsecond apart), the rest of the collective, from the last cut that held, runs as one fluid
simulation: the times are then the fluid path's for the whole collective, as without segments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.link_state import ContentionDetected
from ddlsim.simulator.engine.round_fluid import unique_ints
from ddlsim.simulator.engine.round_structures import ScheduleRuns

__all__ = ["STEADY_MIN", "run_in_segments"]

STEADY_MIN = 8  # identical rounds in a row that make a segment of their own


def _segments(runs: list[tuple[Round, int]]) -> list[list[tuple[Round, int]]]:
    """The runs cut before and after every run of at least ``STEADY_MIN`` rounds."""
    segments: list[list[tuple[Round, int]]] = []
    for run in runs:
        if run[1] >= STEADY_MIN or not segments or segments[-1][-1][1] >= STEADY_MIN:
            segments.append([run])
        else:
            segments[-1].append(run)
    return segments


def _part(schedule: Schedule, runs: list[tuple[Round, int]]) -> Schedule:
    """``schedule`` cut down to these runs (each run's first round repeated: the timing executors read
    only a round's src, dst, chunk count and op, never which chunks it moves)."""

    def rounds() -> Iterator[Round]:
        for rnd, count in runs:
            for _ in range(count):
                yield rnd

    return dataclasses.replace(schedule, round_factory=rounds)


def _senders(runs: list[tuple[Round, int]]) -> np.ndarray:
    return unique_ints(np.concatenate([np.asarray(rnd.src, dtype=np.int64) for rnd, _ in runs]))


def _earliest_start(runs: list[tuple[Round, int]], t: np.ndarray) -> float:
    """A time no flow of these rounds, entered at ``t``, starts before: their rounds taken once each
    with transfers of no duration (a rank enters a round no earlier than what it received arrived,
    and the rounds a run repeats start later still: clocks only advance)."""
    clock = t.copy()
    earliest = np.inf
    for rnd, _ in runs:
        src, dst = np.asarray(rnd.src, dtype=np.int64), np.asarray(rnd.dst, dtype=np.int64)
        earliest = min(earliest, float(clock[src].min()))
        np.maximum.at(clock, dst, clock[src])
    return earliest


def run_in_segments(
    schedule: Schedule, fabric: Fabric, message_bytes: float, start_s: np.ndarray | float, declined_at: int = 0
) -> tuple[np.ndarray, str] | None:
    """Per-rank finish times of ``schedule`` run in segments, and the path (``vectorised``, or
    ``fluid`` where some segment needed it); None where there is no run to cut at, or where the fluid
    path declines (LogGP): the caller then goes message by message.

    ``declined_at``: the round (counted over every round, repeats included) at which the round path
    declined the whole collective. A segment before it goes on the round path, the one that holds it
    on the fluid path, and so does every later one but the steady runs, which the round path tries
    first (a pipeline's drain mirrors its fill: the round path would decline it again).
    """
    from ddlsim.simulator.engine.collective_engine import VectorisedExecutor  # which calls this module

    segments = _segments(ScheduleRuns().get(schedule))
    if len(segments) < 2:
        return None
    t = np.array(np.broadcast_to(np.asarray(start_s, dtype=np.float64), (schedule.ranks,)))
    path = "vectorised"
    first = 0  # the first round of the segment at hand
    try:
        for index, runs in enumerate(segments):
            part = _part(schedule, runs)
            rounds = sum(count for _, count in runs)
            after = None
            if first + rounds <= declined_at or (first > declined_at and runs[0][1] >= STEADY_MIN):
                with contextlib.suppress(ContentionDetected):
                    after = VectorisedExecutor(fabric).run(part, message_bytes, t)
            if after is None:
                after = FluidExecutor(fabric).run(part, message_bytes, t)
                path = "fluid"
            if index + 1 < len(segments) and after[_senders(runs)].max() > _earliest_start(segments[index + 1], after):
                # not cut cleanly: the rest as one fluid simulation from where this segment began
                rest = _part(schedule, [run for segment in segments[index:] for run in segment])
                return FluidExecutor(fabric).run(rest, message_bytes, t), "fluid"
            t = after
            first += rounds
    except ContentionDetected:
        return None
    return t, path
