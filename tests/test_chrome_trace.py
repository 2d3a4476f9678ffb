"""Chrome/Perfetto traces: the trace-event format, and durations that add up to the simulated time."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from ddlsim.reports.chrome_trace import (
    COMPUTE_OPS,
    TID_STRIDE,
    Transfers,
    compute_thread_totals,
    trace_events,
)
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.cli.simulate_command import timeline
from ddlsim.simulator.records import read_csv
from ddlsim.simulator.scenario import Scenario


def row(rank, op, start, end, iteration=0, nbytes=0.0, peer=-1):
    return {
        "rank": rank,
        "iteration": iteration,
        "op": op,
        "peer": peer,
        "bytes": nbytes,
        "start_s": start,
        "end_s": end,
    }


def slices(trace, tid=None):
    return [
        (e["name"], e["ts"], e["ts"] + e["dur"])
        for e in trace["traceEvents"]
        if e["ph"] == "X" and (tid is None or e["tid"] == tid)
    ]


def test_story_exposed_communication_becomes_an_explicit_wait():
    """Rank 0: forward 0-1 s, backward 1-3 s, its all-reduce 2-5 s, update 5-6 s.

    The compute thread tiles 0..6 s: forward, backward, wait_allreduce (3-5 s), update, so its
    durations sum to 6 s = the rank's time; the all-reduce sits on a thread of its own.
    """
    rows = [
        row(0, "forward", 0, 1),
        row(0, "backward", 1, 3),
        row(0, "allreduce", 2, 5, nbytes=100.0),
        row(0, "update", 5, 6),
    ]
    trace = trace_events(rows, devices_per_node=1)
    us = 1e6
    assert slices(trace, tid=0) == [
        ("forward", 0, 1 * us),
        ("backward", 1 * us, 3 * us),
        ("wait_allreduce", 3 * us, 5 * us),
        ("update", 5 * us, 6 * us),
    ]
    assert slices(trace, tid=1) == [("allreduce bucket 0", 2 * us, 5 * us)]
    assert compute_thread_totals(trace) == {0: 6.0}
    assert trace["otherData"]["rank_busy_idle_s"] == {"0": 6.0}


def test_story_late_start_is_idle_and_overlapping_ops_get_lanes():
    rows = [
        row(1, "forward", 0.5, 1),
        row(1, "send", 0.2, 0.8, peer=0),
        row(1, "recv", 0.4, 0.9, peer=2),  # overlaps the send: second lane
        row(1, "update", 1, 2),
    ]
    trace = trace_events(rows, devices_per_node=2)
    base = 1 * TID_STRIDE
    assert [name for name, _, _ in slices(trace, tid=base)] == ["idle", "forward", "update"]
    assert slices(trace, tid=base + 1) == [("send to 0", pytest.approx(0.2e6), pytest.approx(0.8e6))]
    assert slices(trace, tid=base + 2) == [("recv from 2", pytest.approx(0.4e6), pytest.approx(0.9e6))]
    names = {(e["tid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert (base + 2, "rank 1 recv (2)") in names
    assert all(e["pid"] == 0 for e in trace["traceEvents"])  # ranks 0-1 on node 0


def test_transfers_are_capped_by_sender_with_a_note():
    n = 10
    transfers = Transfers(
        src=np.repeat(np.arange(n), 3),
        dst=(np.repeat(np.arange(n), 3) + 1) % n,
        nbytes=np.full(3 * n, 8.0),
        start_s=np.tile([0.0, 1.0, 2.0], n),
        end_s=np.tile([1.0, 2.0, 3.0], n),
    )
    trace = trace_events([row(0, "forward", 0, 1)], 1, transfers, max_transfers=7)
    written = [e for e in trace["traceEvents"] if e.get("cat") == "transfer"]
    assert len(written) == 6 and {e["args"]["dst"] for e in written} == {1, 2}
    assert trace["otherData"]["transfers_written"] == 6
    assert "ranks 0..1" in trace["otherData"]["transfers_note"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    argv = ["simulate", "--nodes", "1,2", "--iterations", "2", "--executor-pool", "serial"]
    assert main([*argv, "--out", str(out / "run"), "--trace", str(out / "timeline.json")]) == 0
    return json.loads((out / "timeline.json").read_text()), read_csv(out / "run" / "results.csv")


def test_trace_has_the_required_fields(traced):
    trace, _ = traced
    assert trace["traceEvents"]
    for event in trace["traceEvents"]:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in event, (key, event)
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert event["dur"] >= 0
        else:
            assert event["ph"] == "M"
    kinds = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"forward", "backward", "update", "allreduce bucket 0"} <= kinds
    assert any(e.get("cat") == "transfer" for e in trace["traceEvents"])


def test_slices_on_one_thread_never_overlap(traced):
    trace, _ = traced
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            by_thread.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-6


def test_durations_per_rank_sum_to_the_simulated_time(traced):
    """Each rank's compute thread (busy + explicit idle/wait slices) adds up to the rank's simulated
    time, and the slowest rank's time / iterations is results.csv's iteration_s for that point."""
    trace, rows = traced
    ends = {int(rank): end for rank, end in trace["otherData"]["rank_end_s"].items()}
    totals = compute_thread_totals(trace)
    assert sorted(totals) == list(range(16))  # 2 nodes x 8 devices
    for rank, total in totals.items():
        assert total == pytest.approx(ends[rank], rel=1e-6)
    iterations = trace["otherData"]["ddlsim"]["updates"]
    point = next(r for r in rows if int(r["nodes"]) == 2)
    assert max(ends.values()) / iterations == pytest.approx(float(point["iteration_s"]), rel=1e-6)
    assert trace["otherData"]["iteration_s"] == pytest.approx(float(point["iteration_s"]), rel=1e-12)


def test_each_iteration_adds_up_on_its_own(traced):
    trace, _ = traced
    per_iteration: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X" and event["tid"] % TID_STRIDE == 0:
            key = (event["tid"] // TID_STRIDE, event["args"]["iteration"])
            per_iteration.setdefault(key, []).append((event["ts"], event["dur"]))
    for spans in per_iteration.values():
        first = min(ts for ts, _ in spans)
        last = max(ts + dur for ts, dur in spans)
        assert sum(dur for _, dur in spans) == pytest.approx(last - first, rel=1e-9)


def test_message_path_trace_adds_up_too():
    scenario = Scenario(nodes=(2,), updates=1, workload="alexnet", devices_per_node=2, intra_node="nvlink1")
    trace, _, _ = timeline(scenario, 2, mode="message")
    assert trace["otherData"]["ddlsim"]["execution_path"] == "message"
    ends = trace["otherData"]["rank_end_s"]
    for rank, total in compute_thread_totals(trace).items():
        assert total == pytest.approx(ends[str(rank)], rel=1e-6)
    ops = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] % TID_STRIDE == 0}
    assert set(COMPUTE_OPS) <= ops


def test_trace_nodes_must_be_positive(capsys, tmp_path):
    out = tmp_path / "t.json"
    assert main(["simulate", "--nodes", "1,2", "--trace", str(out), "--trace-nodes", "0"]) == 2
    assert "--trace-nodes" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("algorithm", ["async_sgd", "easgd", "hybrid_parallel"])
def test_every_algorithm_traces_and_adds_up(algorithm):
    """Any training algorithm's timeline: each rank's compute thread tiles its time up to its last
    compute item (a server ends with a reply, so that may come before the rank's end)."""
    scenario = Scenario(
        nodes=(2,), updates=3, workload="alexnet", device="knl_7250", devices_per_node=2, intra_node="upi",
        network="opa_100", algorithm=algorithm,
    )  # fmt: skip
    trace, rows, run = timeline(scenario, 2)
    last_compute: dict[int, float] = {}
    for row in rows:
        if row["kind"] == "compute":
            last_compute[row["rank"]] = max(last_compute.get(row["rank"], 0.0), row["end_s"])
    totals = compute_thread_totals(trace)
    assert sorted(totals) == sorted(last_compute) == list(range(4))
    for rank, total in totals.items():
        assert total == pytest.approx(last_compute[rank], rel=1e-9)
        assert total <= run.finish_s[rank] * (1 + 1e-12)


def test_trace_file_is_strict_json(tmp_path):
    """A figure that does not apply (NaN) in the trace's otherData is written as null: the file parses
    under a strict reader (Python's json accepts NaN unless told not to)."""
    from ddlsim.reports.chrome_trace import write_trace

    trace = trace_events([row(0, "forward", 0.0, 1.0)], 1, other_data={"staleness": float("nan"), "iteration_s": 1.0})
    path = tmp_path / "t.json"
    write_trace(path, trace)

    def refuse(token):
        raise ValueError(f"non-JSON constant {token}")

    data = json.loads(path.read_text(), parse_constant=refuse)
    assert data["otherData"]["staleness"] is None and data["otherData"]["iteration_s"] == 1.0
