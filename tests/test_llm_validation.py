"""Large-model rows (llm_dev.csv's columns) in ``ddlsim validate``: read as they are, predicted by the
megatron closed form, calibrated by one named factor, left out source by source."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ddlsim.simulator.calibration import llm_validation
from ddlsim.simulator.calibration.llm_validation import LlmFit, predict_runs
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.workloads.llm_runs import DATA_FILE, load_llm_runs


def test_validate_reads_the_llm_file_as_it_is_and_lists_what_it_cannot_model(tmp_path, capsys):
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    out = tmp_path / "v"
    code = main(["validate", "--measurements", str(DATA_FILE), "--leave-one-source-out", "--out", str(out)])
    assert code in (0, 1)  # 1: past the tolerance, still a full answer
    printed = capsys.readouterr().out
    assert "27 of 27 held-out rows predicted" in printed
    rows = {row["id"]: row for row in read_csv(out / "validation.csv")}
    assert len(rows) == 27 and {row["status"] for row in rows.values()} == {"predicted"}
    # ZeRO's 100B: shape from its size and batch from the memory, both in the note
    assert rows["LLM-041"]["status"] == "predicted" and "architecture from the size (100B)" in rows["LLM-041"]["note"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_predicted"] == 27 and summary["split"] == "leave one source out"


def test_the_datasheets_alone_give_large_model_rows_no_interval(tmp_path, capsys):
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    out = tmp_path / "d"
    assert main(["validate", "--measurements", str(DATA_FILE), "--out", str(out)]) in (0, 1)
    assert "no intervals (nothing calibrated to size them)" in capsys.readouterr().out
    rows = read_csv(out / "validation.csv")
    assert {row["status"] for row in rows} == {"predicted"} and all(row["in_ci"] == "" for row in rows)
    assert json.loads((out / "summary.json").read_text())["ci_coverage"] is None


def test_a_narayanan_row_is_their_flop_count_over_the_closed_form_iteration():
    """Narayanan et al. count hardware FLOPs with full recomputation (their eq. 3):
    96 B s l h^2 (1 + s/6h + V/16lh) per iteration, over the predicted iteration and the GPUs."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-001")  # 1.7B: 24 layers, h 2304, 32 A100
    (prediction,) = predict_runs([run])
    batch, seq, layers, hidden, vocab = 512, 2048, 24, 2304, 51200
    flops = 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    expected = flops / prediction.iteration_s / 32 / 1e12
    assert llm_validation.metric_of(prediction, prediction.iteration_s) == pytest.approx(expected, rel=1e-9)
    assert llm_validation.slowdown(prediction) == pytest.approx(expected / 137.0, rel=1e-9)


def test_the_fit_recovers_a_known_slowdown_and_widens_with_scatter():
    """Rows made from the model's own predictions times a known factor: the fit finds the factor,
    a LOSO fold predicts the left-out rows exactly, and scatter shows up as the band."""
    runs = [run for run in load_llm_runs() if run.metric == "iteration_s"]
    predictions = [p for p in predict_runs(runs) if not p.reason]
    assert len(predictions) >= 6
    truth = 1.25
    made = [dataclasses.replace(p, run=dataclasses.replace(p.run, value=p.iteration_s * truth)) for p in predictions]
    fit = LlmFit.of(made, 0.9)
    assert fit.slowdown == pytest.approx(truth, rel=1e-9) and fit.low == pytest.approx(1.0) and fit.rows == len(made)
    row = llm_validation.table_row(made[0], fit)
    assert row["error_pct"] == pytest.approx(0.0, abs=1e-9) and row["in_ci"]
    scattered = [dataclasses.replace(p, run=dataclasses.replace(p.run, value=p.run.value * (1.1 if i % 2 else 0.9)))
                 for i, p in enumerate(made)]  # fmt: skip
    wide = LlmFit.of(scattered, 0.9)
    assert wide.low < 1.0 < wide.high and math.log(wide.high / wide.low) > 0.1


def test_the_band_holds_the_bias_of_a_family_the_fit_has_not_seen():
    """Two families each internally exact but 20 % apart: in-sample residuals would be a point (the
    median sits on one family); residuals from fits without each family span the 20 %."""
    predictions = [p for p in predict_runs(load_llm_runs()) if not p.reason and not p.guessed]
    first, second = sorted({p.family for p in predictions})[:2]
    factor = {first: 1.0, second: 1.2}
    made = [dataclasses.replace(p, run=dataclasses.replace(
                p.run, value=llm_validation.metric_of(p, p.iteration_s * factor[p.family])))
            for p in predictions if p.family in factor]  # fmt: skip
    fit = LlmFit.of(made, 1.0)  # the whole range of the residuals
    assert fit.high / fit.low == pytest.approx(1.2 * 1.2, rel=1e-9)  # each family 20 % off the other's fit


@pytest.mark.slow
def test_leaving_each_family_out_predicts_it_without_the_catalog_values_its_rows_gave():
    """The honest split (benchmarks/llm_validation.py prints the table). Korthikanti et al.'s rows are
    predicted without the A100's 0.64, which LLM-030 gave: with the bound Narayanan et al.'s LLM-005
    gives (0.479), the fold's rows are 20-50 % slow. Issue 14's target (median <= 10 %), met while the
    fold used 0.64, is not met since 28 Nov 2026 (11.0 %); the bound below guards that figure."""
    from ddlsim.hardware_models.profile import DeviceFit, Profile

    runs = load_llm_runs()
    rows, fits = llm_validation.leave_one_source_out(runs, 0.9)
    errors = sorted(abs(row["error_pct"]) for row in rows if row["status"] == "predicted")
    assert len(errors) == 27
    assert errors[len(errors) // 2] <= 12.0
    family = [run for run in runs if run.source_family == "korthikanti"]
    transformer = DeviceFit(layer_efficiency={"transformer": 0.479})
    by_hand = Profile(devices={"a100_sxm4_80gb": DeviceFit(compute_efficiency=0.479), "a100_sxm4": transformer})
    closed_form = {}
    for run in family:
        mapped = llm_validation.map_run(run)
        scenario = llm_validation.scenario_of(mapped, by_hand)
        closed_form[run.id] = closed_form_result(scenario, scenario.nodes[0]).iteration_s
    for row in rows:
        if row["id"] in closed_form:
            assert row["predicted"] == pytest.approx(closed_form[row["id"]] * fits["korthikanti"].slowdown, rel=1e-9)


def test_mixing_schemas_is_one_line_and_exit_2(tmp_path, capsys):
    from ddlsim.simulator.calibration.measurements import packaged_published_dev
    from ddlsim.simulator.cli.main import main

    published = packaged_published_dev()
    out = tmp_path / "v"
    code = main(["validate", "--measurements", str(DATA_FILE), "--calibration", str(published), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "not llm_dev.csv's columns" in err and err.count("\n") == 1
    assert not out.exists()


def test_calibrate_writes_the_slowdown_and_validate_reads_it_back(tmp_path, capsys):
    """calibrate -> profile -> validate on large-model rows: the profile holds the geometric median of
    measured / closed-form time (computed here from the rows), and validate --profile predicts with it."""
    import statistics

    from ddlsim.hardware_models.profile import load_profile
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    profile_path = tmp_path / "llm.toml"
    assert main(["calibrate", "--measurements", str(DATA_FILE), "--out", str(profile_path)]) == 0
    predictions = [p for p in predict_runs(load_llm_runs()) if not p.reason and not p.guessed]
    expected = math.exp(statistics.median(math.log(llm_validation.slowdown(p)) for p in predictions))
    saved = load_profile(profile_path)
    assert saved.transformer_slowdown == pytest.approx(expected, rel=1e-9)
    assert saved.transformer_band[0] < 1.0 < saved.transformer_band[1]
    assert "25 large-model rows" in saved.sources["transformer_slowdown"]
    printed = capsys.readouterr().out
    assert "# not fitted: LLM-041: the shape or batch is ddlsim's reading" in printed
    assert "# not fitted: LLM-067" in printed
    out = tmp_path / "v"
    argv = ["validate", "--measurements", str(DATA_FILE), "--profile", str(profile_path), "--out", str(out)]
    assert main(argv) in (0, 1)
    row = {r["id"]: r for r in read_csv(out / "validation.csv")}["LLM-023"]  # an iteration_s row
    first = next(p for p in predictions if p.run.id == "LLM-023")
    assert float(row["predicted"]) == pytest.approx(first.iteration_s * expected, rel=1e-9)
    capsys.readouterr()


def test_a_lora_run_takes_about_two_thirds_of_full_fine_tuning():
    """The same NeMo row as LoRA and as full fine-tuning: the products' backward halves (their FLOPs
    go from 3 forwards to 2), the attention core's does not, and nothing is reduced or updated."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-065")
    lora, full = predict_runs([run, dataclasses.replace(run, model="Llama 2 70B SFT")])
    assert not lora.reason and not full.reason
    assert 0.62 < lora.iteration_s / full.iteration_s < 0.75
