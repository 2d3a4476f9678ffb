"""Chrome / Perfetto trace files (the JSON trace-event format) from timelines in the shared schema.

Open the file at https://ui.perfetto.dev or chrome://tracing. Layout::

    process "node 0"
        thread "rank 0 compute"     forward | backward | wait_allreduce | update | forward ...
        thread "rank 0 allreduce"           [bucket 0][bucket 1][bucket 2][bucket 3]
        thread "rank 0 sends"               ||||||||||||||||||  (one slice per transfer, "to 5")
        thread "rank 1 compute"     ...
    process "node 1" ...

* The **compute** thread of a rank (rows of kind ``compute``, or ops in ``COMPUTE_OPS`` where rows
  carry no kind) tiles its timeline from the synchronised start (t = 0) to the rank's last event
  with no gap: every interval between its compute slices is an explicit slice,
  ``wait_allreduce`` before an update (the exposed communication) and ``idle`` elsewhere. So the
  durations on a rank's compute thread sum to that rank's simulated time (iterations x its
  iteration time), which the tests check against the simulator.
* Communication ops (``allreduce`` per gradient bucket, or ``send``/``recv`` from real runs) overlap
  compute, so they get threads of their own; if two of a rank's ops overlap in time they go to
  extra lanes ("rank 0 allreduce (2)"), because the format needs slices on one thread to nest.
* Transfers (from a ``TransferLog``: src, dst, bytes, start, end) go on the sender's ``sends``
  threads, lanes assigned the same way. A large collective has millions of transfers: at most
  ``max_transfers`` are written, those of the lowest-numbered senders, and ``otherData`` says so.

Times: trace-event timestamps are microseconds; ``ts`` and ``dur`` are floats (no rounding), so
sums reproduce the simulator's seconds to double precision.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ddlsim.simulator.records import atomic_open, finite_json

COMPUTE_OPS = ("forward", "backward", "update")
WAIT = "wait_allreduce"
IDLE = "idle"
US_PER_S = 1e6
GAP_TOLERANCE_S = 1e-12  # gaps shorter than this are float noise, not idle time
TID_STRIDE = 1000  # tids of rank r: r*1000 (compute), +1.. (communication lanes), +500.. (send lanes)
COMM_TID_OFFSET = 1
SEND_TID_OFFSET = 500
DEFAULT_MAX_TRANSFERS = 50_000


@dataclass
class Transfers:
    """Flat arrays over transfers (seconds, bytes)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    total: int | None = None  # transfers executed, logged or not (None: these arrays are all of them)
    extrapolated: int = 0  # transfers of rounds advanced without executing them (no times exist)

    @classmethod
    def from_log(cls, log: Any) -> Transfers:
        """From a ``simulator.engine.message_executor.TransferLog`` (lists of per-round arrays, the
        traced senders' only, and counts of all)."""

        def flat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate([np.asarray(p, dtype=dtype).ravel() for p in parts]) if parts else np.zeros(0, dtype)

        return cls(
            flat(log.src, np.int64),
            flat(log.dst, np.int64),
            flat(log.nbytes, np.float64),
            flat(log.start_s, np.float64),
            flat(log.end_s, np.float64),
            log.total,
            log.extrapolated,
        )

    def __len__(self) -> int:
        return int(self.src.size)


def _is_compute(row: Mapping[str, Any]) -> bool:
    """A row of the compute thread: its ``kind`` says so where the row carries one (simulated runs:
    ``compute``, ``send``, ``recv``, ``collective``), else its op is one of ``COMPUTE_OPS``."""
    kind = row.get("kind")
    return kind == "compute" if kind else row["op"] in COMPUTE_OPS


def _lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Greedy lane per interval (in the given order, sorted by start) so no two on a lane overlap."""
    lane_end: list[float] = []
    lanes = []
    for start, end in intervals:
        for lane, busy_until in enumerate(lane_end):
            if start >= busy_until:
                lane_end[lane] = end
                lanes.append(lane)
                break
        else:
            lane_end.append(end)
            lanes.append(len(lane_end) - 1)
    return lanes


def _slice(name: str, cat: str, pid: int, tid: int, start_s: float, end_s: float, args: dict) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start_s * US_PER_S,
        "dur": (end_s - start_s) * US_PER_S,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _meta(kind: str, pid: int, tid: int, value: Any) -> dict:
    key = "name" if kind.endswith("_name") else "sort_index"
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


def trace_events(
    rows: Iterable[Mapping[str, Any]],
    devices_per_node: int,
    transfers: Transfers | None = None,
    max_transfers: int = DEFAULT_MAX_TRANSFERS,
    other_data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace-event JSON object for timeline ``rows`` (``simulator.records.TRACE_COLUMNS``).

    Returns ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``; ``otherData``
    holds ``rank_busy_idle_s`` (per rank, the summed compute-thread durations, seconds) next to
    anything passed in ``other_data``.
    """
    by_rank: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_rank.setdefault(int(row["rank"]), []).append(row)
    events: list[dict] = []
    thread_names: dict[tuple[int, int], str] = {}
    rank_total: dict[int, float] = {}

    def node_of(rank: int) -> int:
        return rank // devices_per_node

    for rank in sorted(by_rank):
        pid, base = node_of(rank), rank * TID_STRIDE
        mine = sorted(by_rank[rank], key=lambda row: (float(row["start_s"]), float(row["end_s"])))
        compute = [row for row in mine if _is_compute(row)]
        comm = [row for row in mine if not _is_compute(row)]
        thread_names[(pid, base)] = f"rank {rank} compute"
        cursor, total = 0.0, 0.0
        for row in compute:
            start, end = float(row["start_s"]), float(row["end_s"])
            iteration = int(row["iteration"])
            if start - cursor > GAP_TOLERANCE_S:
                gap = WAIT if row["op"] == "update" else IDLE
                events.append(_slice(gap, "wait", pid, base, cursor, start, {"iteration": iteration}))
                total += start - cursor
            events.append(_slice(str(row["op"]), "compute", pid, base, start, end, {"iteration": iteration}))
            total += end - start
            cursor = max(cursor, end)
        rank_total[rank] = total
        bucket: dict[tuple[str, int], int] = {}
        lanes = _lanes([(float(row["start_s"]), float(row["end_s"])) for row in comm])
        for row, lane in zip(comm, lanes, strict=True):
            op, iteration = str(row["op"]), int(row["iteration"])
            index = bucket.get((op, iteration), 0)
            bucket[(op, iteration)] = index + 1
            args: dict[str, Any] = {"iteration": iteration, "bytes": float(row.get("bytes") or 0)}
            peer = int(row.get("peer", -1) if row.get("peer", "") != "" else -1)
            if peer >= 0:
                args["peer"] = peer
                name = f"{op} {'to' if op == 'send' else 'from' if op == 'recv' else 'with'} {peer}"
            else:
                name = f"{op} bucket {index}" if op == "allreduce" else op
            tid = base + COMM_TID_OFFSET + lane
            thread_names[(pid, tid)] = f"rank {rank} {op}" + (f" ({lane + 1})" if lane else "")
            events.append(_slice(name, "communication", pid, tid, float(row["start_s"]), float(row["end_s"]), args))

    other: dict[str, Any] = dict(other_data or {})
    if transfers is not None and (len(transfers) or transfers.extrapolated):
        total = len(transfers) if transfers.total is None else transfers.total
        per_sender = np.bincount(transfers.src)
        cumulative = np.cumsum(per_sender)
        senders = max(int(np.searchsorted(cumulative, max_transfers, side="right")), 1)
        keep = np.flatnonzero(transfers.src < senders)
        other["transfers_total"] = total + transfers.extrapolated
        other["transfers_written"] = int(keep.size)
        if keep.size < total:
            other["transfers_note"] = (
                f"only the transfers sent by ranks 0..{senders - 1} are written "
                f"({keep.size} of {total}; raise max_transfers for more)"
            )
        if transfers.extrapolated:
            other["transfers_extrapolated"] = transfers.extrapolated
            other["transfers_extrapolated_note"] = (
                f"{transfers.extrapolated} transfers belong to rounds of identical steady progress that "
                "the simulator advanced at once (their times are exact for the ranks, not drawn per transfer)"
            )
        order = keep[np.lexsort((transfers.start_s[keep], transfers.src[keep]))]
        for sender in np.unique(transfers.src[order]).tolist():
            mine_idx = order[transfers.src[order] == sender]
            spans = zip(transfers.start_s[mine_idx].tolist(), transfers.end_s[mine_idx].tolist(), strict=True)
            lanes = _lanes(list(spans))
            pid, base = node_of(sender), sender * TID_STRIDE + SEND_TID_OFFSET
            for index, lane in zip(mine_idx.tolist(), lanes, strict=True):
                tid = base + lane
                thread_names[(pid, tid)] = f"rank {sender} sends" + (f" ({lane + 1})" if lane else "")
                dst = int(transfers.dst[index])
                events.append(
                    _slice(
                        f"to {dst}",
                        "transfer",
                        pid,
                        tid,
                        float(transfers.start_s[index]),
                        float(transfers.end_s[index]),
                        {"dst": dst, "bytes": float(transfers.nbytes[index])},
                    )
                )
    other["rank_busy_idle_s"] = {str(rank): total for rank, total in sorted(rank_total.items())}
    metadata: list[dict] = []
    for pid in sorted({pid for pid, _ in thread_names}):
        metadata.append(_meta("process_name", pid, 0, f"node {pid}"))
        metadata.append(_meta("process_sort_index", pid, 0, pid))
    for (pid, tid), name in sorted(thread_names.items()):
        metadata.append(_meta("thread_name", pid, tid, name))
        metadata.append(_meta("thread_sort_index", pid, tid, tid))
    return {"traceEvents": metadata + events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: Path, trace: Mapping[str, Any]) -> None:
    """Write the trace JSON atomically (compact: traces get large) and strictly: figures that do not
    apply in ``otherData`` become null; the events' times are finite by construction (a NaN there
    is a bug and raises rather than writing a file other tools reject)."""
    strict = {**trace, "otherData": finite_json(trace.get("otherData", {}))}
    with atomic_open(Path(path)) as handle:
        json.dump(strict, handle, separators=(",", ":"), allow_nan=False)
        handle.write("\n")


def compute_thread_totals(trace: Mapping[str, Any]) -> dict[int, float]:
    """Per rank, the summed durations (seconds) of the X slices on its compute thread."""
    totals: dict[int, float] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event["tid"] % TID_STRIDE == 0:
            rank = event["tid"] // TID_STRIDE
            totals[rank] = totals.get(rank, 0.0) + event["dur"] / US_PER_S
    return totals
