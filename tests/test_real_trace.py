"""Measured traces have exactly the simulator's columns; a killed writer's half line is dropped."""

from __future__ import annotations

import json

import pytest

from ddlsim.real_runs.trace import TraceWriter, read_trace, trace_path
from ddlsim.simulator.records import TRACE_COLUMNS


def test_rows_have_the_shared_schema_and_seconds(tmp_path):
    with TraceWriter(tmp_path, 3, {"scenario": {"x": 1}}) as tracer:
        tracer.iteration = 2
        tracer.record("allreduce", tracer.origin_ns + 1_000_000, tracer.origin_ns + 3_000_000, nbytes=400)
    (row,) = read_trace(tmp_path)
    assert tuple(row) == TRACE_COLUMNS
    assert row == {"rank": 3, "iteration": 2, "op": "allreduce", "peer": -1, "bytes": 400,
                   "start_s": pytest.approx(1e-3), "end_s": pytest.approx(3e-3)}  # fmt: skip
    assert not (tmp_path / "metadata.json").exists()  # rank 0 writes it


def test_metadata_names_host_libraries_and_scenario(tmp_path):
    TraceWriter(tmp_path, 0, {"scenario": {"model": "small_cnn"}, "ranks": 2}).close()
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["scenario"] == {"model": "small_cnn"} and metadata["ranks"] == 2
    assert metadata["host"] and "numpy" in metadata["libraries"]


def test_a_half_written_last_line_is_ignored_but_other_damage_is_an_error(tmp_path):
    tracer = TraceWriter(tmp_path, 0)
    tracer.record("forward", tracer.origin_ns, tracer.origin_ns + 10)
    tracer.flush()
    with trace_path(tmp_path, 0).open("a") as handle:
        handle.write('{"rank": 0, "iteration": 1, "op": "back')
    assert [row["op"] for row in read_trace(tmp_path)] == ["forward"]
    trace_path(tmp_path, 1).write_text('{"rank": 1}\n{"rank": 1, "iteration": 0}\n')
    with pytest.raises(ValueError, match="columns"):
        read_trace(tmp_path)
