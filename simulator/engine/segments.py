"""A collective in segments: what comes before the round path's decline on it, the rest on the fluid path.

The round path (``collective_engine.VectorisedExecutor``) declines a pipelined double binary tree
at its fill: ranks of different heights leave their rounds at different times, flows of three and
more rounds meet on the same links. The whole collective then went to the fluid path
(``fluid_executor``), the rounds before the decline included: with several devices per node, a
whole pipelined chain reduce (hundreds of rounds) that the round path skips in closed form.

So ``run_collective`` cuts the collective into segments, the runs of ``STEADY_MIN`` or more
identical rounds each one segment and the rounds between them another, runs those before the
segment where the round path declined on the round path, each started at the times the one before
left its ranks, and the rest as one fluid simulation (which skips the periods of its steady runs
itself: ``fluid_steady``).

The proof that cutting changes nothing, checked at every cut: every flow of the rounds before the
cut has ended before any flow of the rounds after it starts, so no flow meets one of the other
side and the two sides never share a link. A flow ends by the time its sender leaves its round
(arrival = end + latency), and a rank's clock only advances, so the latest time at which a sender
of the earlier segment leaves it bounds their flows' ends; a sender of the next segment starts a
flow no earlier than it entered that segment, nor before what it received there arrived
(``_earliest_start``: a device that waits in its node's chain for the trees' result waits for
flows of the next segment, not for the clock it left the chain reduce with). Where a check fails,
the fluid simulation starts at the last cut that held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.fluid_fold import run_fluid
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
    schedule: Schedule,
    fabric: Fabric,
    message_bytes: float,
    start_s: np.ndarray | float,
    declined_at: int,
    runs: list[tuple[Round, int]] | None = None,
) -> tuple[np.ndarray, str] | None:
    """Per-rank finish times of ``schedule``: the segments before the one that holds round
    ``declined_at`` (counted over every round, repeats included: where the round path declined the
    whole collective) on the round path, the rest as one fluid simulation, which skips the periods
    of its steady runs itself (``fluid_steady``). None where the round path would begin with the
    fluid path anyway (it declined in the first segment), or where the fluid path declines (LogGP):
    the caller then goes on as without segments. ``runs``: the schedule's runs (``ScheduleRuns``)
    where the caller has them."""
    from ddlsim.simulator.engine.collective_engine import VectorisedExecutor  # which calls this module

    segments = _segments(ScheduleRuns().get(schedule) if runs is None else runs)
    t = np.array(np.broadcast_to(np.asarray(start_s, dtype=np.float64), (schedule.ranks,)))
    first = 0  # the first round of the segment at hand
    for index, segment in enumerate(segments):
        rounds = sum(count for _, count in segment)
        if first + rounds > declined_at or index + 1 == len(segments):
            break
        try:
            after = VectorisedExecutor(fabric).run(_part(schedule, segment), message_bytes, t)
        except ContentionDetected:
            break
        if after[_senders(segment)].max() > _earliest_start(segments[index + 1], after):
            break  # not cut cleanly: the rest from where this segment began
        t = after
        first += rounds
    else:
        index = len(segments)
    if index == 0:
        return None
    rest = [run for segment in segments[index:] for run in segment]
    try:
        return run_fluid(fabric, _part(schedule, rest), message_bytes, t, runs=rest), "fluid"
    except ContentionDetected:
        return None
