"""Data-parallel training rows of catalog transformers (BERT-large in MLPerf-style files) and the
framework tokens sources use instead of a library (Horovod): read, predicted, never refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddlsim.algorithms.training_algorithm import make_options
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.calibration.fit import TRANSFORMER_ROW_REASON, usable_rows
from ddlsim.simulator.calibration.measurements import read_measurements
from ddlsim.simulator.calibration.predict import predict
from ddlsim.simulator.cli.main import main
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.records import read_csv
from ddlsim.simulator.scenario import Scenario, Stragglers
from ddlsim.simulator.workloads.transformer import load_transformer
from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks
from tests.test_measurements import GOOD, write_rows

DATA = Path(__file__).resolve().parents[1] / "simulator" / "calibration" / "data"
BERT = {
    **GOOD, "id": "B-8", "kind": "training", "collective": "", "workload": "bert_large", "algorithm": "nccl",
    "device": "v100_sxm2", "devices_per_node": "8", "nodes": "1", "intra_node_link": "nvlink2", "network": "",
    "nics_per_node": "", "message_bytes": "", "per_device_batch": "8", "precision": "fp16",
    "metric": "throughput_samples_per_s", "value": "250",
}  # fmt: skip
ONE = {**BERT, "id": "B-1", "devices_per_node": "1", "intra_node_link": "", "algorithm": "", "value": "33"}


def _rows(tmp_path: Path, rows: list[dict[str, str]]):
    read = read_measurements([write_rows(tmp_path / "m.csv", rows)])
    assert not read.rejected, read.rejected
    return {row.id: row for row in read.rows}


def test_a_transformer_row_is_read_and_predicted_by_the_megatron_model(tmp_path):
    rows = _rows(tmp_path, [BERT, ONE])
    one, eight = predict(rows["B-1"]), predict(rows["B-8"])
    assert one.ok and eight.ok, (one.reason, eight.reason)
    assert "megatron data-parallel" in eight.detail
    # one V100 on BERT-large at 512 tokens: below the fp16 peak, above a tenth of it
    flops = model_flops_per_sample(transformer_blocks(load_transformer("bert_large")))
    mfu = one.value * flops / load_device("v100_sxm2").peak_flops_for("fp16")
    assert 0.1 < mfu < 1.0
    # eight on NVLink: the gradient all-reduce costs something, and far from all of the step
    assert 6.0 * one.value < eight.value < 8.0 * one.value


@pytest.mark.parametrize("note", ["phase 1, sequence length 128", "seq_len=128", "max_seq_length 128, LAMB"])
def test_a_sequence_length_in_the_notes_is_the_runs(tmp_path, note):
    """A quarter of the tokens: faster per sequence, by less than 4x (attention shrinks more, the
    per-sequence weights' traffic and fixed costs do not)."""
    rows = _rows(tmp_path, [ONE, {**ONE, "id": "B-128", "notes": note}])
    long, short = predict(rows["B-1"]).value, predict(rows["B-128"]).value
    assert 3.0 * long < short < 4.5 * long


def test_a_sequence_longer_than_the_models_positions_is_declined(tmp_path):
    rows = _rows(tmp_path, [{**ONE, "notes": "sequence length 1024"}])
    prediction = predict(rows["B-1"])
    assert not prediction.ok and "1024" in prediction.reason


def test_scaling_efficiency_of_a_transformer_row_is_the_ratio_of_its_rates(tmp_path):
    rows = _rows(tmp_path, [BERT, ONE, {**BERT, "id": "B-E", "metric": "scaling_efficiency", "value": "0.9"}])
    efficiency = predict(rows["B-E"]).value
    assert efficiency == pytest.approx(predict(rows["B-8"]).value / (8 * predict(rows["B-1"]).value))


def test_a_transformer_on_a_parameter_server_is_declined_with_the_reason(tmp_path):
    rows = _rows(tmp_path, [{**BERT, "algorithm": "parameter_server"}])
    prediction = predict(rows["B-8"])
    assert not prediction.ok and "not a parameter server" in prediction.reason


def test_transformer_rows_calibrate_nothing_and_say_why(tmp_path):
    rows = _rows(tmp_path, [BERT, GOOD])
    usable, unused = usable_rows(list(rows.values()))
    assert [row.id for row in usable] == ["T-1"]
    assert unused == [("B-8", TRANSFORMER_ROW_REASON)]


def test_validate_predicts_a_transformer_row_calibrated_on_other_rows(tmp_path, capsys):
    """Calibrated on the development rows (none a transformer): predicted, with an interval."""
    path = write_rows(tmp_path / "m.csv", [BERT, GOOD])
    out = tmp_path / "report"
    calibration = str(DATA / "published_dev.csv")
    command = ["validate", "--measurements", str(path), "--calibration", calibration, "--bootstrap", "0"]
    assert main([*command, "--out", str(out), "--tolerance", "10"]) == 0
    table = {row["id"]: row for row in read_csv(out / "validation.csv")}
    assert table["B-8"]["status"] == "predicted"
    assert table["B-8"]["basis"] == "training, 1 node: transformer model compute"
    assert "slowest of 8 ranks" in table["B-8"]["note"]  # the fitted rank jitter it pays is named
    assert float(table["B-8"]["ci_low"]) < float(table["B-8"]["predicted"]) < float(table["B-8"]["ci_high"])


@pytest.mark.parametrize(("device", "library"), [("v100_sxm2", "nccl"), ("xeon_8180", "mpich"), ("knl_7250", "mpich")])
def test_horovod_is_read_as_the_library_it_reduces_with(tmp_path, device, library):
    row = {**BERT, "workload": "resnet50", "algorithm": "horovod", "device": device, "notes": "from a paper"}
    if device != "v100_sxm2":
        row |= {"devices_per_node": "1", "intra_node_link": "", "nodes": "4", "network": "opa_100", "precision": "fp32"}
    read = _rows(tmp_path, [row])["B-8"]
    assert read.algorithm == library
    assert read.notes == f"from a paper; horovod reduces with {library} on {load_device(device).kind} devices"
    assert predict(read).ok


@pytest.mark.parametrize(
    ("algorithm", "device", "library", "verb"),
    [("ddp", "v100_sxm2", "nccl", "reduces with"), ("deepspeed", "a100_sxm4", "nccl", "reduces with"),
     ("rccl", "mi300x", "nccl", "modelled as"), ("intel_mpi", "xeon_8180", "mpich", "modelled as"),
     ("mvapich2", "v100_sxm2", "mpich", "modelled as"), ("ddp", "xeon_8180", "gloo", "reduces with")],
)  # fmt: skip
def test_other_frameworks_and_library_builds_are_read_as_the_library_ddlsim_models(
    tmp_path, algorithm, device, library, verb
):
    row = {**BERT, "workload": "resnet50", "algorithm": algorithm, "device": device, "notes": "from a paper"}
    if device == "xeon_8180":
        row |= {"devices_per_node": "1", "intra_node_link": "", "nodes": "4", "network": "opa_100", "precision": "fp32"}
    if device in ("mi300x", "a100_sxm4"):
        row |= {"intra_node_link": load_device(device).system.intra_node_link}
    read = _rows(tmp_path, [row])["B-8"]
    assert read.algorithm == library
    assert read.notes == f"from a paper; {algorithm} {verb} {library} on {load_device(device).kind} devices"
    assert predict(read).ok


def test_horovod_without_a_device_leaves_the_library_open(tmp_path):
    read = _rows(tmp_path, [{**BERT, "workload": "resnet50", "algorithm": "horovod", "device": ""}])["B-8"]
    assert read.algorithm == "" and read.notes == "horovod: library left open"


def test_the_megatron_closed_form_pays_the_expected_slowest_rank():
    """Data parallelism alone: each rank's forward and backward run at the expected slowest of the
    eight ranks' pace (the optimizer step, after the reduction, does not); without overlap the
    reduction follows the compute, so the iteration grows by exactly what the compute grows."""
    layout = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 4, "global_batch": 32, "precision": "fp16"}
    base = Scenario(
        workload="bert_large", algorithm="megatron", device="v100_sxm2", devices_per_node=8, intra_node="nvlink2",
        precision="fp16", nodes=(1,), enforce_memory=False, options=make_options("megatron", {"layout": layout}),
    )  # fmt: skip
    calm = closed_form_result(base, 1)
    jittery = closed_form_result(dataclasses.replace(base, stragglers="lognormal:0.1"), 1)
    factor = Stragglers(0.1).expected_slowest(8)
    assert factor > 1.1
    growth = jittery.layout["compute_s"] - calm.layout["compute_s"]
    forward_backward = growth / (factor - 1)
    assert 0.8 * calm.layout["compute_s"] < forward_backward < calm.layout["compute_s"]
    assert jittery.iteration_s - calm.iteration_s == pytest.approx(growth, rel=1e-9)
    one_rank = dataclasses.replace(base, devices_per_node=1, intra_node=None, stragglers="lognormal:0.1",
                                   options=make_options("megatron", {"layout": {**layout, "dp": 1, "global_batch": 4}}))
    assert closed_form_result(one_rank, 1).layout["compute_s"] == pytest.approx(calm.layout["compute_s"], rel=1e-12)


def test_the_megatron_closed_forms_slowest_rank_matches_the_event_simulations_draws():
    """The DES draws each rank's multiplier; the closed form pays their expected maximum. Averaged
    over seeds the two iterations agree within 4 % (sigma 0.1, eight data-parallel ranks)."""
    from ddlsim.simulator.sweep import simulate_point

    layout = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, "precision": "fp16"}
    base = Scenario(
        workload="bert_large", algorithm="megatron", device="v100_sxm2", devices_per_node=8, intra_node="nvlink2",
        precision="fp16", nodes=(1,), enforce_memory=False, stragglers="lognormal:0.1",
        options=make_options("megatron", {"layout": layout}),
    )  # fmt: skip
    closed = closed_form_result(base, 1).iteration_s
    drawn = [
        simulate_point(dataclasses.replace(base, executor="des", seed=seed), 1)["iteration_s"] for seed in range(16)
    ]
    calm = closed_form_result(dataclasses.replace(base, stragglers="none"), 1).iteration_s
    assert min(drawn) < closed < max(drawn)
    assert sum(drawn) / len(drawn) == pytest.approx(closed, rel=0.04)
    assert closed > calm * 1.05
