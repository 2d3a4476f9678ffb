"""Run a collective's schedule for real: the rounds of ``algorithms/`` as non-blocking messages.

Chunk c of the buffer is the c-th piece of ``np.array_split(range(elements), schedule.num_chunks)``.
In each round this rank posts its receives (into temporaries) and its sends, waits for all of them,
then applies each received piece in transfer order: REDUCE adds it in, COPY overwrites. Sends read
the buffer before any of the round's receives land, which is exactly the round semantics of
``algorithms.schedule`` (a simultaneous exchange, as MPI_Sendrecv).

Within a round all messages between one pair of ranks share one tag; MPI's non-overtaking rule
matches them in order because both sides post them in the round's transfer order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ddlsim.algorithms.schedule import COPY, REDUCE, Schedule
from ddlsim.real_runs.transport import Transport

SCHEDULE_TAG = 7000
SPARSE_INDEX_BYTES = 4  # int32 indices, as algorithms/topk_sparse_collective.py counts them


def chunk_bounds(elements: int, num_chunks: int) -> np.ndarray:
    """Element offset of each chunk boundary (``num_chunks + 1`` values), as ``np.array_split``."""
    base, extra = divmod(elements, num_chunks)
    index = np.arange(num_chunks + 1, dtype=np.int64)
    return index * base + np.minimum(index, extra)


class Workspace:
    """Receive temporaries reused across rounds and calls (fresh pages cost a page fault each)."""

    def __init__(self) -> None:
        self._slots: dict[tuple[int, np.dtype], np.ndarray] = {}

    def take(self, slot: int, count: int, dtype: np.dtype) -> np.ndarray:
        key = (slot, np.dtype(dtype))
        array = self._slots.get(key)
        if array is None or array.size < count:
            array = np.empty(max(count, 1), dtype=dtype)
            self._slots[key] = array
        return array[:count]


def run_schedule(
    schedule: Schedule,
    buffer: np.ndarray,
    transport: Transport,
    tracer: Any = None,
    *,
    group: Sequence[int] | None = None,
    tag: int = SCHEDULE_TAG,
    workspace: Workspace | None = None,
) -> np.ndarray:
    """Execute ``schedule`` on this rank, in place on ``buffer`` (contiguous), and return it.

    ``group`` maps schedule rank i to transport rank ``group[i]`` (default: the identity). Ranks
    outside the schedule return the buffer untouched. Helper ranks (``schedule.worker_ranks`` set
    and this rank >= it) start from zeros, as the symbolic contract says they start empty.
    With a ``tracer``, every transfer is recorded as a ``send`` or ``recv`` spanning its round.
    """
    if not buffer.flags.c_contiguous:
        raise ValueError("run_schedule needs a contiguous buffer")
    ranks = list(group) if group is not None else list(range(schedule.ranks))
    if len(ranks) != schedule.ranks:
        raise ValueError(f"group has {len(ranks)} ranks but the schedule spans {schedule.ranks}")
    try:
        me = ranks.index(transport.rank)
    except ValueError:
        return buffer
    flat = buffer.reshape(-1)
    if me >= schedule.workers:
        flat[:] = 0
    if is_sparse_allreduce(schedule):
        return _sparse_allreduce(schedule, buffer, transport, tracer, ranks, tag, workspace)
    if schedule.ranks == 1:
        return buffer
    bounds = chunk_bounds(flat.size, schedule.num_chunks)
    workspace = workspace or Workspace()
    for rnd in schedule.rounds():
        receiving = np.flatnonzero(rnd.dst == me)
        sending = np.flatnonzero(rnd.src == me)
        if receiving.size == 0 and sending.size == 0:
            continue
        lo = bounds[np.asarray(rnd.chunk_lo)]
        hi = bounds[np.asarray(rnd.chunk_hi)]
        start_ns = time.perf_counter_ns()
        requests = []
        pieces = []
        for slot, index in enumerate(receiving):
            piece = workspace.take(slot, int(hi[index] - lo[index]), flat.dtype)
            requests.append(transport.irecv(piece, ranks[int(rnd.src[index])], tag))
            pieces.append((index, piece))
        for index in sending:
            requests.append(transport.isend(flat[lo[index] : hi[index]], ranks[int(rnd.dst[index])], tag))
        transport.wait_all(requests)
        end_ns = time.perf_counter_ns()
        for index, piece in pieces:
            target = flat[lo[index] : hi[index]]
            op = int(np.broadcast_to(rnd.op, rnd.src.shape)[index])
            if op == REDUCE:
                np.add(target, piece, out=target)
            elif op == COPY:
                target[...] = piece
            else:
                raise ValueError(f"{schedule.name}: unknown transfer op {op}")
        if tracer is not None:
            for index in sending:
                tracer.record("send", start_ns, end_ns, peer=ranks[int(rnd.dst[index])],
                              nbytes=int(hi[index] - lo[index]) * flat.itemsize)  # fmt: skip
            for index, piece in pieces:
                tracer.record("recv", start_ns, end_ns, peer=ranks[int(rnd.src[index])], nbytes=piece.nbytes)
    return buffer


def is_sparse_allreduce(schedule: Schedule) -> bool:
    """An all-reduce checked as an allgather: each chunk is one rank's sparse contribution (top-k)."""
    return schedule.collective == "allreduce" and schedule.contract == "allgather"


def sparse_count(schedule: Schedule, elements: int, itemsize: int) -> int:
    """Elements each rank keeps: ``payload_factor = P x density x (value + 4) / value`` solved for density.

    The value size is the buffer's item size (build the schedule with ``value_bytes`` = itemsize).
    """
    density = schedule.payload_factor / (schedule.ranks * (itemsize + SPARSE_INDEX_BYTES) / itemsize)
    return max(1, min(elements, round(density * elements)))


def top_k(flat: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` largest-magnitude elements of ``flat``: (int32 indices ascending, values)."""
    if count >= flat.size:
        indices = np.arange(flat.size)
    else:
        indices = np.sort(np.argpartition(np.abs(flat), flat.size - count)[flat.size - count :])
    return indices.astype(np.int32), flat[indices]


def sparsified(schedule: Schedule, flat: np.ndarray) -> np.ndarray:
    """``flat`` with everything but this rank's top-k contribution set to zero."""
    indices, values = top_k(flat, sparse_count(schedule, flat.size, flat.itemsize))
    out = np.zeros_like(flat)
    out[indices] = values
    return out


def _sparse_allreduce(schedule, buffer, transport, tracer, ranks, tag, workspace) -> np.ndarray:
    """Top-k sparse all-reduce: pack (values, indices), allgather the packets by the schedule, sum locally.

    Packet r (chunk r of a staging buffer of P equal packets) is rank r's contribution: k values
    then k int32 indices. The buffer ends as the sum of every rank's sparsified buffer, added in
    rank order.
    """
    flat = buffer.reshape(-1)
    count = sparse_count(schedule, flat.size, flat.itemsize)
    value_bytes = count * flat.itemsize
    packet = value_bytes + count * SPARSE_INDEX_BYTES
    staging = np.zeros(schedule.ranks * packet, dtype=np.uint8)
    me = ranks.index(transport.rank)
    indices, values = top_k(flat, count)
    mine = staging[me * packet : (me + 1) * packet]
    mine[:value_bytes] = values.view(np.uint8)
    mine[value_bytes:] = indices.view(np.uint8)
    dense = replace(schedule, collective="allgather", contract=None, payload_factor=1.0)
    run_schedule(dense, staging, transport, tracer, group=ranks, tag=tag, workspace=workspace)
    flat[:] = 0
    for rank in range(schedule.ranks):
        body = staging[rank * packet : (rank + 1) * packet]
        np.add.at(flat, body[value_bytes:].view(np.int32), body[:value_bytes].view(flat.dtype))
    return buffer


def contract_blocks(schedule: Schedule, elements: int) -> list[tuple[int, int]]:
    """Element ranges each worker owns at the end (reduce_scatter) or starts with (allgather)."""
    bounds = chunk_bounds(elements, schedule.num_chunks)
    contract = schedule.contract or schedule.collective
    chunks = schedule.owned_chunks if contract == "reduce_scatter" else schedule.initial_chunks
    chunks = chunks or tuple((r, r + 1) for r in range(schedule.workers))
    return [(int(bounds[lo]), int(bounds[hi])) for lo, hi in chunks]


def reference_result(schedule: Schedule, data: np.ndarray, transport: Transport) -> np.ndarray:
    """What the communication library's own collective gives on ``data``, laid out as our buffer.

    ``transport.reference`` has plain MPI semantics (see ``MpiTransport``); schedules may keep a
    rank's block elsewhere (the ring's reduce-scatter leaves chunk r+1 on rank r), so the blocks are
    gathered into rank order first when they have equal sizes, and otherwise the library's
    all-reduce stands in (a reduce-scatter's block is the all-reduce's block; an allgather is the
    all-reduce of buffers that are zero outside each rank's block, exact in any precision).
    Helper ranks (dedicated servers) contribute zeros. Only ``promised`` parts are meaningful.
    """
    contract = schedule.contract or schedule.collective
    flat = np.ascontiguousarray(data).reshape(-1)
    if transport.rank >= schedule.workers:
        flat = np.zeros_like(flat)
    if is_sparse_allreduce(schedule):  # the library's all-reduce of every rank's top-k
        return transport.reference("allreduce", sparsified(schedule, flat))
    if contract not in ("reduce_scatter", "allgather"):
        return transport.reference(contract, flat, root=schedule.root)
    blocks = contract_blocks(schedule, flat.size)
    sizes = {hi - lo for lo, hi in blocks}
    equal = len(blocks) == transport.size and len(sizes) == 1 and sum(hi - lo for lo, hi in blocks) == flat.size
    out = np.zeros_like(flat)
    me = transport.rank
    if contract == "reduce_scatter":
        if equal:
            mine = transport.reference("reduce_scatter", np.concatenate([flat[lo:hi] for lo, hi in blocks]))
        else:
            total = transport.reference("allreduce", flat)
            mine = total[slice(*blocks[me])] if me < len(blocks) else out[:0]
        if me < len(blocks):
            out[slice(*blocks[me])] = mine
        return out
    if equal:
        gathered = transport.reference("allgather", flat[slice(*blocks[me])].copy())
        size = sizes.pop()
        for rank, (lo, hi) in enumerate(blocks):
            out[lo:hi] = gathered[rank * size : (rank + 1) * size]
        return out
    masked = np.zeros_like(flat)
    if me < len(blocks):
        masked[slice(*blocks[me])] = flat[slice(*blocks[me])]
    return transport.reference("allreduce", masked)


def promised(schedule: Schedule, rank: int, buffer: np.ndarray) -> np.ndarray | None:
    """The part of ``buffer`` the schedule's contract defines on ``rank`` (None: nothing promised)."""
    contract = schedule.collective if is_sparse_allreduce(schedule) else (schedule.contract or schedule.collective)
    flat = buffer.reshape(-1)
    if rank >= schedule.workers:
        return None
    if contract == "reduce_scatter":
        lo, hi = contract_blocks(schedule, flat.size)[rank]
        return flat[lo:hi]
    if contract == "reduce":
        return flat if rank == schedule.root else None
    return flat


def build_schedule(algorithm: str, collective: str, ranks: int, **options: Any) -> Schedule:
    """The schedule of registered ``algorithm`` spanning exactly ``ranks`` ranks.

    Schedules with helper ranks (a parameter server's dedicated servers) span more ranks than they
    have workers; they are rebuilt with ``ranks - helpers`` workers so workers and helpers fill the
    ranks at hand.
    """
    from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
    from ddlsim.algorithms.schedule import ScheduleError

    implementation = COLLECTIVE_ALGORITHMS.get(algorithm)
    schedule = implementation.schedule(collective, ranks, **options)
    helpers = schedule.ranks - ranks
    if helpers > 0:
        if ranks - helpers < 1:
            raise ScheduleError(f"{algorithm}: {helpers} helper rank(s) leave no worker among {ranks} ranks")
        schedule = implementation.schedule(collective, ranks - helpers, **options)
    if schedule.ranks != ranks:
        raise ScheduleError(f"{algorithm}: cannot build a schedule spanning exactly {ranks} ranks")
    return schedule
