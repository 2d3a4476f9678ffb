"""TPU v3 rows (the measurement schema's ``tpu_v3``): read, their open fields filled from the chip's
datasheet (its ICI, the 2-D torus all-reduce, bf16), a slice over several hosts modelled as one
scale-up domain, and predicted instead of declined."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.intervals import Estimator
from ddlsim.simulator.calibration.measurements import read_measurements
from ddlsim.simulator.calibration.open_fields import open_choices, with_choice
from ddlsim.simulator.calibration.predict import predict
from ddlsim.simulator.workloads import load_workload
from tests.test_measurements import GOOD, write_rows

TPU = {
    **GOOD, "id": "TPU-1", "kind": "training", "collective": "", "workload": "resnet50", "algorithm": "",
    "device": "tpu_v3", "devices_per_node": "4", "nodes": "1", "intra_node_link": "", "network": "",
    "nics_per_node": "", "message_bytes": "", "per_device_batch": "", "precision": "",
    "metric": "throughput_samples_per_s", "value": "3000",
}  # fmt: skip


def _read(tmp_path: Path, rows: list[dict[str, str]]):
    read = read_measurements([write_rows(tmp_path / "tpu.csv", rows)])
    assert not read.rejected, read.rejected
    return {row.id: row for row in read.rows}


def test_open_fields_of_a_tpu_row_come_from_the_chip(tmp_path):
    rows = _read(tmp_path, [TPU])
    choices = {choice.column: choice for choice in open_choices(rows["TPU-1"])}
    assert choices["intra_node_link"].default == "tpu_v3_ici"
    assert choices["algorithm"].default == "torus_2d" and choices["algorithm"].alternatives == ("ring",)
    assert choices["precision"].default == "bf16"
    assert choices["per_device_batch"].default == 256


def test_a_slice_over_hosts_is_one_scale_up_domain_and_keeps_its_per_chip_rate(tmp_path):
    rows = _read(tmp_path, [TPU, {**TPU, "id": "TPU-256", "nodes": "64"}, {**TPU, "id": "TPU-2048", "nodes": "512"}])
    one_host, slice_ = (with_choice(rows[key], open_choices(rows[key])) for key in ("TPU-1", "TPU-256"))
    folded = slice_.modeled()
    assert (folded.devices_per_node, folded.nodes, folded.intra_node_link) == (256, 1, "tpu_v3_ici")
    assert rows["TPU-2048"].modeled().nodes == 512  # beyond a 1024-chip pod: hosts on the network
    per_chip_host, per_chip_slice = predict(one_host).value / 4, predict(slice_).value / 256
    assert 0.9 * per_chip_host < per_chip_slice <= per_chip_host
    workload = load_workload("resnet50")
    flops = per_chip_host * (workload.forward_flops + workload.backward_flops)
    assert 0.05 < flops / load_device("tpu_v3").peak_flops_for("bf16") < 1.0


def test_a_tpu_row_is_estimated_with_an_interval_spanning_its_open_fields(tmp_path):
    rows = _read(tmp_path, [TPU])
    estimator = Estimator(Profile(noise_sigma=0.05), ci=0.9)
    estimate = estimator.estimate(rows["TPU-1"])
    assert estimate.value is not None, estimate.reason
    assert "tpu_v3_ici assumed" in estimate.note and "torus_2d assumed" in estimate.note
    resolved = with_choice(rows["TPU-1"], open_choices(rows["TPU-1"]))
    for alternative in ({"per_device_batch": 128}, {"precision": "fp32"}, {"algorithm": "ring"}):
        value = predict(dataclasses.replace(resolved, **alternative), Profile()).value
        assert estimate.low <= value <= estimate.high
    assert estimate.width > estimator.estimate(resolved).width
