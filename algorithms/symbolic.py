"""Symbolic execution of a schedule: does every rank end with what the collective promises?

State is a boolean array ``state[rank, chunk, contributor]``: which ranks' data a rank's copy of
a chunk holds. A reduce transfer unions the sets and fails on double counting (a contributor
reduced in twice); a copy overwrites. The final state is compared with the collective's contract
(``schedule.contract`` when set, else ``schedule.collective``).

Schedules with helper ranks (``schedule.worker_ranks`` set, e.g. dedicated parameter servers) have
contributors 0..worker_ranks-1 only; helper ranks start empty and the contract is checked on the
workers alone.
"""

from __future__ import annotations

import numpy as np

from ddlsim.algorithms.schedule import COPY, REDUCE, Schedule


class SymbolicError(AssertionError):
    """The schedule does not compute its collective; the message names the round and ranks."""


def _contract(schedule: Schedule) -> str:
    return schedule.contract or schedule.collective


def _initial(schedule: Schedule) -> np.ndarray:
    p, c, w = schedule.ranks, schedule.num_chunks, schedule.workers
    state = np.zeros((p, c, w), dtype=bool)
    contract = _contract(schedule)
    if contract in ("allreduce", "reduce_scatter", "reduce"):
        for r in range(w):
            state[r, :, r] = True
    elif contract == "allgather":
        ranges = schedule.initial_chunks or tuple((r, r + 1) for r in range(w))
        for r, (lo, hi) in enumerate(ranges):
            state[r, lo:hi, r] = True
    elif contract == "broadcast":
        state[schedule.root, :, schedule.root] = True
    else:
        raise SymbolicError(f"unknown collective {contract!r}")
    return state


def run_symbolic(schedule: Schedule) -> np.ndarray:
    """Execute ``schedule`` on contributor sets; return the final state."""
    state = _initial(schedule)
    p = schedule.ranks
    for index, rnd in enumerate(schedule.rounds()):
        if rnd.src.size and (
            rnd.src.min() < 0 or rnd.src.max() >= p or rnd.dst.min() < 0 or rnd.dst.max() >= p
        ):
            raise SymbolicError(f"{schedule.name}: round {index} names a rank outside 0..{p - 1}")
        before = state.copy()
        copied = np.zeros(state.shape[:2], dtype=bool)
        for s, d, lo, hi, op in zip(rnd.src, rnd.dst, rnd.chunk_lo, rnd.chunk_hi, rnd.op, strict=True):
            if s == d:
                raise SymbolicError(f"{schedule.name}: round {index} sends from rank {s} to itself")
            incoming = before[s, lo:hi]
            if not incoming.any(axis=1).all():
                raise SymbolicError(
                    f"{schedule.name}: round {index}: rank {s} sends chunks {lo}..{hi - 1} to {d} "
                    "but holds no data for some of them"
                )
            if op == REDUCE:
                if (state[d, lo:hi] & incoming).any():
                    raise SymbolicError(
                        f"{schedule.name}: round {index}: rank {s} -> {d} chunks {lo}..{hi - 1} "
                        "double-counts a contribution"
                    )
                state[d, lo:hi] |= incoming
            elif op == COPY:
                if copied[d, lo:hi].any():
                    raise SymbolicError(f"{schedule.name}: round {index}: two copies land on rank {d}")
                copied[d, lo:hi] = True
                state[d, lo:hi] = incoming
            else:
                raise SymbolicError(f"{schedule.name}: round {index}: unknown op {op}")
    return state


def check_schedule(schedule: Schedule) -> None:
    """Raise SymbolicError unless ``schedule`` fulfils its collective's contract."""
    state = run_symbolic(schedule)
    p, c = schedule.workers, schedule.num_chunks
    state = state[:p]  # helper ranks (dedicated servers) carry no contract
    full = np.ones(p, dtype=bool)
    name, collective = schedule.name, _contract(schedule)
    if collective == "allreduce":
        bad = np.argwhere(~state.all(axis=2))
        if bad.size:
            r, k = bad[0]
            raise SymbolicError(f"{name}: rank {r} ends without the full sum of chunk {k}")
    elif collective == "reduce":
        bad = np.argwhere(~state[schedule.root].all(axis=1))
        if bad.size:
            raise SymbolicError(f"{name}: root {schedule.root} lacks the full sum of chunk {bad[0][0]}")
    elif collective == "reduce_scatter":
        ranges = schedule.owned_chunks or tuple((r, r + 1) for r in range(p))
        for r, (lo, hi) in enumerate(ranges):
            if not (state[r, lo:hi] == full).all():
                raise SymbolicError(f"{name}: rank {r} lacks the full sum of its chunks {lo}..{hi - 1}")
    elif collective == "allgather":
        ranges = schedule.initial_chunks or tuple((r, r + 1) for r in range(p))
        want = np.zeros((c, p), dtype=bool)
        for r, (lo, hi) in enumerate(ranges):
            want[lo:hi, r] = True
        for r in range(p):
            if not (state[r] == want).all():
                raise SymbolicError(f"{name}: rank {r} does not end with every rank's chunk exactly once")
    elif collective == "broadcast":
        root_only = np.zeros(p, dtype=bool)
        root_only[schedule.root] = True
        for r in range(p):
            if not (state[r] == root_only).all():
                raise SymbolicError(f"{name}: rank {r} does not end with the root's data")
