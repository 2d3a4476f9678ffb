"""The measurement schema: the published set loads, bad files fail naming file, row and column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ddlsim.simulator.calibration.measurements import (
    MEASUREMENT_COLUMNS,
    MeasurementError,
    from_trace,
    load_measurements,
    packaged_published_dev,
    split_by_scale,
)
from ddlsim.simulator.cli.main import main

GOOD = {
    "id": "T-1", "source": "test", "kind": "collective", "workload": "", "collective": "allreduce",
    "algorithm": "ring", "device": "v100_sxm2", "devices_per_node": "1", "nodes": "4", "intra_node_link": "",
    "network": "ib_edr", "nics_per_node": "1", "sockets": "", "socket_link": "", "message_bytes": "1000000",
    "per_device_batch": "",
    "precision": "fp32", "metric": "time_s", "value": "0.001", "quote": "direct", "notes": "",
}  # fmt: skip


def write_rows(path: Path, rows: list[dict[str, str]], columns=MEASUREMENT_COLUMNS) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_published_dev_loads_every_row_and_token():
    rows = load_measurements([packaged_published_dev()])
    assert len(rows) == 187
    assert {row.kind for row in rows} == {"collective", "training"}


def test_split_keeps_small_scale_for_calibration():
    rows = load_measurements([packaged_published_dev()])
    calibration, held_out = split_by_scale(rows)
    assert len(calibration) + len(held_out) == 187
    assert all(row.devices == 1 for row in calibration if row.kind == "training")
    by_id = {row.id for row in calibration}
    assert "DEEPBENCH-001" in by_id and "DEEPBENCH-002" not in by_id  # KNL 2 nodes fit, 4 predicted
    assert "DEEPBENCH-066" in by_id and "DEEPBENCH-068" not in by_id  # TitanX 2 GPUs fit, 8 predicted
    assert "NCCL-001" not in by_id and "NCCL-004" not in by_id  # plateau quotes only check


@pytest.mark.parametrize(
    ("change", "column", "expected"),
    [
        ({"device": "quantum_9000"}, "device", "not in the hardware catalog"),
        ({"network": "carrier_pigeon"}, "network", "unknown token 'carrier_pigeon'"),
        ({"value": "nan"}, "value", "finite"),
        ({"value": "-0.5"}, "value", "must be > 0"),
        ({"nodes": "2.5"}, "nodes", "whole number"),
        ({"metric": "throughput_samples_per_s"}, "metric", "unknown metric"),
        (
            {"devices_per_node": "8", "intra_node_link": "pcie3_x16", "sockets": "3", "socket_link": "qpi"},
            "sockets",
            "do not split 8 devices per node evenly",
        ),
        (
            {"devices_per_node": "8", "intra_node_link": "pcie3_x16", "sockets": "2"},
            "socket_link",
            "must name the link",
        ),
        ({"sockets": "1", "socket_link": "ib_edr"}, "socket_link", "unknown token 'ib_edr'"),
    ],
)
def test_bad_cell_names_file_row_line_and_column(tmp_path, change, column, expected):
    path = write_rows(tmp_path / "bad.csv", [GOOD, {**GOOD, "id": "T-2", **change}])
    with pytest.raises(MeasurementError) as caught:
        load_measurements([path])
    message = str(caught.value)
    assert str(path) in message and "'T-2'" in message and "line 3" in message and f"'{column}'" in message
    assert expected in message


def test_missing_column_is_named(tmp_path):
    path = write_rows(tmp_path / "short.csv", [GOOD], [c for c in MEASUREMENT_COLUMNS if c != "network"])
    with pytest.raises(MeasurementError, match=r"short.csv: row 'header' \(line 1\), column 'network': missing"):
        load_measurements([path])


def test_socket_columns_are_optional_and_read(tmp_path):
    """A file written before the socket columns reads as one socket per node; a row that names two reads so."""
    old = write_rows(tmp_path / "old.csv", [GOOD], [c for c in MEASUREMENT_COLUMNS if not c.startswith("socket")])
    (row,) = load_measurements([old])
    assert row.sockets is None and row.socket_link == ""
    two = {**GOOD, "devices_per_node": "8", "intra_node_link": "pcie3_x16", "sockets": "2", "socket_link": "qpi"}
    (row,) = load_measurements([write_rows(tmp_path / "new.csv", [two])])
    assert (row.sockets, row.socket_link) == (2, "qpi")
    assert row.to_row()["sockets"] == 2 and row.to_row()["socket_link"] == "qpi"


def test_tpu_rows_load_and_duplicate_ids_fail(tmp_path):
    path = write_rows(tmp_path / "tpu.csv", [{**GOOD, "device": "tpu_v3"}, GOOD])
    with pytest.raises(MeasurementError, match="duplicate id"):
        load_measurements([path])


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    path = write_rows(tmp_path / "bad.csv", [{**GOOD, "value": "-1"}])
    out = tmp_path / "report"
    code = main(["validate", "--measurements", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "'T-1'" in err and "'value'" in err
    assert not out.exists()
    code = main(["calibrate", "--measurements", str(path), "--out", str(tmp_path / "p.toml")])
    assert code == 2 and not (tmp_path / "p.toml").exists()


def test_from_trace_takes_the_median_span_over_ranks(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "metadata.json").write_text(json.dumps({"measurement": {"device": "local_cpu", "network": "local_shm"}}))
    for rank in range(2):
        lines = []
        for iteration, span in enumerate((9.0, 1.0, 2.0, 3.0)):  # iteration 0 is warm-up
            start = 10.0 * iteration + 0.1 * rank
            lines.append({"rank": rank, "iteration": iteration, "op": "allreduce", "peer": -1, "bytes": 1024,
                          "start_s": start, "end_s": start + span})  # fmt: skip
        (trace / f"trace.rank{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = from_trace(trace, {"algorithm": "ring"})
    assert len(rows) == 1
    row = rows[0]
    assert row["kind"] == "collective" and row["collective"] == "allreduce" and row["message_bytes"] == 1024
    assert row["value"] == pytest.approx(2.1)  # spans 1.1, 2.1, 3.1 (rank 1 starts 0.1 later)
    out = tmp_path / "rows.csv"
    assert main(["measurements", "from-trace", str(trace), "--algorithm", "ring", "--out", str(out)]) == 0
    assert load_measurements([out])[0].nodes == 2


def test_from_trace_of_a_failed_run_warns_and_keeps_what_every_rank_finished(tmp_path, capsys):
    """Rank 1 was killed in iteration 3 (its iteration-3 op is cut short at 0.5 s): iterations 1 and 2
    (spans 1.0 and 2.0, after the warm-up) are converted, the median is 1.5 s, and the user is told."""
    trace = tmp_path / "trace"
    trace.mkdir()
    spans = {0: (9.0, 1.0, 2.0, 3.0, 4.0), 1: (9.0, 1.0, 2.0, 0.5)}
    for rank, durations in spans.items():
        lines = [{"rank": rank, "iteration": i, "op": "allreduce", "peer": -1, "bytes": 64, "start_s": 10.0 * i,
                  "end_s": 10.0 * i + span} for i, span in enumerate(durations)]  # fmt: skip
        (trace / f"trace.rank{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        status = {"rank": rank, "exit_status": -9 if rank else 0, "signal": "SIGKILL" if rank else None}
        (trace / f"status.rank{rank}.json").write_text(json.dumps(status))
    out = tmp_path / "rows.csv"
    args = ["measurements", "from-trace", str(trace), "--algorithm", "ring", "--device", "local_cpu", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "failed run (rank 1 (signal SIGKILL))" in err
    row = load_measurements([out])[0]
    assert row.value == pytest.approx(1.5)
    assert "FAILED RUN" in row.notes
