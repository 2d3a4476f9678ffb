"""Relays: an unpipelined chain of single-transfer rounds, timed in one batch instead of round by round.

A chain broadcast or reduce (and the start of a pipelined one) is a run of rounds of one transfer
each, every one sent on by the rank the one before delivered to. Round by round, the round executor
(``collective_engine.VectorisedExecutor``) would pay its per-round set-up thousands of times for one
flow each. Here the whole chain is routed in one call and its max-plus recurrence runs in scalars:

* each transfer starts only after the one before arrived (its sender's entry is no earlier than that
  arrival, and send overheads are part of alpha), so relay flows never meet each other;
* where they also start no earlier than every link they cross was last busy (``link_state``: its
  busy time, and the clock of any other rank that sent there), each runs alone at its route's
  bottleneck, which is what the round-at-a-time path would find round by round, to the bit (the
  same floating-point operations in the same order).

Where that last check fails the executor runs the chain's rounds one by one after all.
"""

from __future__ import annotations

import numpy as np

from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.engine.link_state import LinkState
from ddlsim.simulator.engine.message_executor import TransferLog
from ddlsim.simulator.engine.round_structures import binding_hops

__all__ = ["RELAY_MIN", "relay_exits", "relay_length"]

RELAY_MIN = 8  # shorter relays run round by round (the batch's set-up costs about as much)


def relay_length(runs: list[tuple[Round, int]], index: int) -> int:
    """How many runs from ``index`` form a relay: single rounds of one transfer each, each sent by the
    rank the round before delivered to, no rank delivered to twice (0 or 1 where none starts)."""
    length = 0
    visited: set[int] = set()
    previous = -1
    for position in range(index, len(runs)):
        rnd, count = runs[position]
        if count != 1 or len(rnd) != 1:
            break
        src, dst = int(rnd.src[0]), int(rnd.dst[0])
        if length == 0:
            visited.add(src)
        elif src != previous:
            break
        if dst in visited:
            break
        visited.add(dst)
        previous = dst
        length += 1
    return length


def relay_exits(
    fabric: Fabric,
    redundant: np.ndarray | None,
    links: LinkState,
    schedule: Schedule,
    rounds: list[tuple[Round, int]],
    message_bytes: float,
    t: np.ndarray,
    log: TransferLog | None,
    members: np.ndarray | None,
) -> np.ndarray | None:
    """Per-rank exit times after the relay ``rounds`` entered at ``t``, its flows claimed and recorded
    in ``links`` (no round's: none is the link's writer); None where the proof fails (then only the
    clocks have moved up to ``t``). ``redundant``, ``members``: as ``binding_hops`` and
    ``VectorisedExecutor.run`` take them."""
    count = len(rounds)
    src = np.fromiter((int(rnd.src[0]) for rnd, _ in rounds), np.int64, count)
    dst = np.fromiter((int(rnd.dst[0]) for rnd, _ in rounds), np.int64, count)
    chunks = np.fromiter((rnd.chunk_count[0] if np.ndim(rnd.chunk_count) else rnd.chunk_count
                          for rnd, _ in rounds), np.float64, count)  # fmt: skip
    ops = np.fromiter((int(rnd.op[0]) for rnd, _ in rounds), np.int64, count)
    global_src = src if members is None else members[src]
    global_dst = dst if members is None else members[dst]
    routes, alpha, bottleneck = fabric.path_properties(global_src, global_dst)
    overhead = fabric.overheads(global_src, global_dst)
    if np.any(overhead > alpha):
        return None
    nbytes = schedule.transfer_bytes(Round(src, dst, op=ops, chunk_count=chunks), message_bytes)
    flow = nbytes / bottleneck
    reduce_s = fabric.reduce_times(nbytes, ops)
    entries, ends = [], []
    clock = float(t[src[0]])
    receivers = t[dst].tolist()
    reduce_list = None if reduce_s is None else reduce_s.tolist()
    for k, (a, f) in enumerate(zip(alpha.tolist(), flow.tolist(), strict=True)):
        entries.append(clock)
        end = clock + a + f  # the sender leaves when its send arrived
        ends.append(end)
        received = end if reduce_list is None else end + reduce_list[k]
        clock = max(receivers[k], received)  # the receiver, who sends next
    begin = np.asarray(entries)
    start = begin + overhead
    hops, owner = binding_hops(routes, redundant)
    links.advance_clocks(t, members)
    starts = start[owner]
    if np.any(starts < links.busy_until[hops]):
        return None
    prior = links.link_sender[hops]
    other = (prior >= 0) & (prior != global_src[owner])
    if np.any(starts[other] < links.clock[prior[other]]):
        return None
    links.claim(hops, global_src[owner], None)  # no round placed before: the clocks give busy times
    np.maximum.at(links.busy_until, hops, (start + flow)[owner])
    links.writer_serial[hops] = -1  # no round of this call wrote them last
    out = t.copy()
    out[src] = ends
    out[dst[-1]] = clock
    links.advance_clocks(out, members)
    if log is not None:
        log.add(global_src, global_dst, nbytes, begin, np.asarray(ends))
    return out
