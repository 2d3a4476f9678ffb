"""Skipping periods of a fluid simulation that repeats itself: a pipeline's steady state on the fluid path.

The fluid path (``fluid_executor``) follows every flow instant by instant. In a run of identical
rounds (same src, dst, chunk count and op arrays: a pipelined tree's steady state) its state often
settles into a period: each time the last rank leaves a round, the flows in flight, the flows
waiting to start and every rank's progress through the rounds it has reached are what they were
when the last rank left the round p rounds before (p = 1 on a switch or a fat tree, more where the
ranks' pace beats, as on a dragonfly), p rounds later and a time c later. The simulation is
deterministic and its rounds identical, so from then on it repeats that period for as long as the
rounds it reaches stay in the run: the executor then moves its whole state on by as many periods as
the run allows (round numbers + m p, times + m c) instead of simulating them.

``Snapshot`` is the state at such a moment, taken relative to the round the last rank is in and the
instant; ``period`` compares two consecutive ones. "Equal" means within rounding as in
``steady_state`` (``ULPS`` units in the last place of the instant); integers and flags exactly, and
the flows in flight and waiting in the same order. A flow's bytes left are compared through its
end at its rate: the rates are those of the same flows in flight, the same arithmetic.

Where no period comes: a pipelined tree on a torus (measured 26 Nov 2026, 100 MB, 96 pieces). Its
tree edges run over routes of up to 3 (4x4) to 33 (64x64) torus links, up to 5 (4x4) to 11 (64x64)
share the busiest link, and that link's cycle sets the pace (216 us a round on 4x4); the ranks off
it have slack and drift against it at a constant rate, round after round: on a 4x4 torus ranks 4, 8
and 12 (their flows in flight end p x 133 ns later, relative to the rest, p rounds on, through all
86 steady rounds; the same 133 ns on 4x4x4), on 8x8 about 1.4 us a round, on 16x8 and 16x16 3-23 us
every two rounds, on 8x8x8 6-23 us a round, with most rounds not even matching flow for flow. The
drift is in what decides the future (flows in flight, ranks still in their round), not in left-over
history, and it lasts until the slack is used up: longer than the run. So no longer look-back and no
other sampling point finds a period; the fluid path simulates every round, about 0.8 instants per
transfer (19,283 instants for 24,128 transfers at 64 ranks, 76,734 for 97,664 at 256; 111,978 for
196,224 on 8x8x8, where the instants a round grow from about 400 to 1,600 as the ranks spread). With
600 pieces the 4x4 torus leaves the drift after about 56 rounds, converges geometrically (about
x0.67 a round) and skips 502 rounds (4x4x4: 499); 8x8 finds no period in 600 rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ddlsim.simulator.engine.steady_state import rounding

__all__ = ["LONGEST_PERIOD", "Snapshot", "period"]

LONGEST_PERIOD = 8  # rounds: the longest period looked for


@dataclass
class Snapshot:
    """The fluid simulation's state when every rank has reached round ``first`` (at ``now``): flows in
    flight and waiting by round (less ``first``) and transfer, and for each round built from
    ``first`` on, its ranks' progress through it (times less ``now``)."""

    first: int
    now: float
    built: int
    flows: tuple[np.ndarray, ...]  # in flight: round - first, transfer, end - now
    waiting: tuple[np.ndarray, ...]  # round - first, transfer, start - now
    current: np.ndarray  # each rank's round, less first
    progress: list[tuple[np.ndarray, ...]]  # per round: left, entered, done - now, entry - now


def _times_equal(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
        return False
    return bool(np.all(np.abs(a[finite] - b[finite]) <= tolerance))


def period(before: Snapshot, after: Snapshot) -> float | None:
    """The time c when ``after`` is ``before`` c later (and ``after.first - before.first`` rounds on),
    else None."""
    if after.first <= before.first or after.built - after.first != before.built - before.first:
        return None
    if len(before.flows[0]) != len(after.flows[0]) or len(before.waiting[0]) != len(after.waiting[0]):
        return None
    tolerance = rounding(np.array([before.now, after.now]))
    for x, y in ((before.flows, after.flows), (before.waiting, after.waiting)):
        if not (np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])):
            return None
        if not _times_equal(x[-1], y[-1], tolerance):
            return None
    if not np.array_equal(before.current, after.current):
        return None
    for x, y in zip(before.progress, after.progress, strict=True):
        if not (np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])):
            return None
        if not (_times_equal(x[2], y[2], tolerance) and _times_equal(x[3], y[3], tolerance)):
            return None
    return after.now - before.now
