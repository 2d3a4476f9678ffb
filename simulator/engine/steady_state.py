"""Skipping runs of identical rounds: when the per-rank times of the next rounds are known in closed form.

A round maps the times at which ranks enter it to the times they leave it by max-plus linear terms:
a rank leaves at the latest of its own send's end (t_src + e, e = overhead + latency + bytes/rate)
and each receive's arrival (t_src + e + rho, rho the receiver's reduction time); a rank that only
receives may also leave at t_self. Two facts let the round executor (``collective_engine``) skip
rounds of a run of identical rounds (same src, dst, bytes, op arrays) instead of computing them:

* Uniform advance. The map is homogeneous: F(t + c) = F(t) + c. If a round was entered exactly c
  later by every taking-part rank than the identical round before it, it leaves every rank c later
  too, and so does every further identical round: t advances by c per round for the rest of the
  run. The overlap checks repeat shifted by c as well (each compares a round's flow starts with
  the busy times the previous identical round left on the same links), so they hold for the
  skipped rounds once they held for the executed one.
* Affine advance. A ring whose hops differ only a little (8 devices per node on a fat tree:
  cross-leaf hops 200 ns slower than same-leaf ones) settles into uniform advance only after a long
  transient, during which each rank's time grows by its own constant delta per round, with the
  same term of its max (its own send, or a receive) winning round after round. Then every term is
  affine in the round number, and the run can be extrapolated exactly until the first round in
  which some losing term would overtake its rank's winning one (``affine_horizon``). This is used
  for permutation rounds (each rank sends and receives at most once) without in-round contention
  and without links that other senders share (so no overlap check depends on the skipped rounds).

"Equal" here means within rounding: ``ULPS`` units in the last place of the times involved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ULPS = 64  # advances that differ by at most this many units in the last place count as equal


@dataclass
class Steady:
    """Identical rounds that may be skipped: each advances the times by ``advance_s`` (a scalar for
    every taking-part rank, or one value per rank), for at most ``budget`` rounds."""

    structure: object
    advance_s: float | np.ndarray
    budget: float = math.inf


def magnitude(a: np.ndarray) -> float:
    """The largest ``abs`` of ``a`` (0 if empty), without the temporary array of ``np.abs(a).max()``:
    ``abs`` is exact, so the largest magnitude is the larger of ``a.max()`` and ``-a.min()``, to the bit
    (a NaN, if any, comes out of both)."""
    if not a.size:
        return 0.0
    return max(float(a.max()), -float(a.min()))


def tolerance(scale: float) -> float:
    """``ULPS`` ulps of ``scale``, the largest magnitude of the times compared (``rounding``)."""
    return ULPS * float(np.spacing(max(scale, 1e-300)))


def rounding(*arrays: np.ndarray) -> float:
    """The tolerance for comparing differences of these times: ``ULPS`` ulps of the largest."""
    return tolerance(max((magnitude(a) for a in arrays if a.size), default=0.0))


def uniform_advance(before: np.ndarray, t: np.ndarray, participants: np.ndarray | None) -> float | None:
    """c when every taking-part rank entered at ``t`` exactly c after ``before`` (None otherwise)."""
    advance = t - before if participants is None else t[participants] - before[participants]
    return uniform_of(advance, t if participants is None else t[participants])


def uniform_of(advance: np.ndarray, t: np.ndarray, scale: float | None = None) -> float | None:
    """``uniform_advance`` from the per-rank advances ``advance`` of the taking-part ranks' times ``t``
    (``scale``: ``magnitude(t)``, if known). Equal advances pass without the tolerance (it is positive)."""
    if not advance.size:
        return None
    low, high = float(advance.min()), float(advance.max())
    if high != low and high - low > tolerance(magnitude(t) if scale is None else scale):
        return None
    return high


def affine_horizon(
    src: np.ndarray,
    dst: np.ndarray,
    end_offset: np.ndarray,
    received_offset: np.ndarray,
    t: np.ndarray,
    delta: np.ndarray,
) -> int:
    """How many further identical permutation rounds, entered at ``t`` and each advancing rank r by
    ``delta[r]``, keep the same winning term for every rank (0 if the premise fails).

    Round j (0-based) offers receiver r = dst[i] its own term t_r + j delta_r + E_r (E_r: its own
    send's end offset, 0 if it sends nothing) and the receive term t_s + j delta_s + R_i (s = src[i],
    R_i = ``received_offset[i]``). The winner must grow at r's own delta; a losing term that grows
    faster overtakes it after gap / (slope difference) rounds. Senders that receive nothing have a
    single term and never switch.
    """
    tolerance = rounding(t, delta)
    own = np.zeros(t.size)
    own[src] = end_offset
    mine = t[dst] + own[dst]
    theirs = t[src] + received_offset
    slope_mine, slope_theirs = delta[dst], delta[src]
    receive_wins = theirs > mine
    # the winning term must grow as its rank does
    if np.any(np.abs(np.where(receive_wins, slope_theirs, slope_mine) - delta[dst]) > tolerance):
        return 0
    gap = np.abs(mine - theirs)
    closing = np.where(receive_wins, slope_mine - slope_theirs, slope_theirs - slope_mine)
    catching = closing > tolerance
    if not catching.any():
        return np.iinfo(np.int64).max
    rounds = np.floor(gap[catching] / closing[catching])
    return int(max(rounds.min(), 0))
