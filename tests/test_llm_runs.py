"""The published large-model runs: read as they are, mapped onto the catalog with every assumption stated, and
used to check the FLOPs counts and the memory model (no run that really ran is refused)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from ddlsim.simulator.workloads.llm_checks import flops_checks, largest_fragmentation, memory_checks
from ddlsim.simulator.workloads.llm_runs import (
    COLUMNS,
    DATA_FILE,
    LlmRunsError,
    MappedRun,
    load_llm_runs,
    map_run,
    mapped_runs,
)
from ddlsim.simulator.workloads.transformer_memory import FRAGMENTATION, RUNTIME_RESERVE_BYTES

SHARED = Path("/work/shared/data/llm_dev.csv")


def test_the_packaged_copy_keeps_the_columns_and_rows() -> None:
    runs = load_llm_runs()
    assert len(runs) == 27
    with DATA_FILE.open(newline="", encoding="utf-8") as handle:
        assert tuple(csv.DictReader(handle).fieldnames or ()) == COLUMNS
    assert {run.source_family for run in runs} == {"narayanan", "korthikanti", "zero", "nemo", "megatron_readme"}


@pytest.mark.skipif(not SHARED.is_file(), reason="the workspace's shared data set is not on this machine")
def test_the_packaged_copy_equals_the_shared_data_set() -> None:
    assert DATA_FILE.read_bytes() == SHARED.read_bytes()


def test_every_row_is_mapped_or_says_why() -> None:
    mapped, unmapped = mapped_runs()
    assert unmapped == []
    assert len(mapped) == 27
    without_layout = {row.run.id: row.layout_missing for row in mapped if row.layout is None}
    assert without_layout == {"LLM-067": "tp, pp or dp is not in the row"}


def by_id(run_id: str) -> MappedRun:
    result = map_run(next(run for run in load_llm_runs() if run.id == run_id))
    assert isinstance(result, MappedRun)
    return result


def test_mapping_of_a_narayanan_row() -> None:
    """LLM-006: Megatron 76.1B on 1024 A100-80GB of Selene, TP 8, PP 4, DP 32; micro-batch not in table 1,
    but in the authors' script for it (Megatron-LM examples/sc21/run_table_1.sh): 2, and 3 chunks of 5
    layers; the smaller models' runs all-reduce in PyTorch DDP's overlapped 25 MB buckets."""
    row = by_id("LLM-006")
    assert (row.model.name, row.device, row.intra_node_link, row.network, row.nics_per_node) == (
        "megatron_76b", "a100_sxm4_80gb", "nvswitch2", "ib_hdr", 8)
    assert row.layout is not None
    assert (row.layout.tp, row.layout.pp, row.layout.dp, row.layout.gpus) == (8, 4, 32, 1024)
    assert (row.layout.recompute, row.layout.precision, row.layout.flash_attention) == ("full", "fp16", False)
    assert (row.layout.micro_batch, row.layout.virtual_stages, row.options) == (2, 3, ())  # Megatron's local DDP
    assert any(note.startswith("micro-batch 2 (Narayanan et al.'s script") for note in row.assumptions)
    small = by_id("LLM-001")  # 1.7B: TP 1, PP 1, DP 32, micro-batch 16, --DDP-impl torch
    assert small.layout is not None and small.layout.micro_batch == 16
    assert dict(small.options) == {"overlap_grad_reduce": True, "bucket_bytes": 25 * 2**20}


def test_mapping_of_nemo_rows_reads_the_notes() -> None:
    """LLM-064: Llama 3 70B, TP 4, PP 4, CP 2, VP=5 in the notes, fp8, distributed optimizer."""
    row = by_id("LLM-064")
    assert row.layout is not None
    assert (row.layout.cp, row.layout.virtual_stages, row.layout.zero_stage, row.layout.precision) == (2, 5, 1, "fp8")
    assert row.layout.sequence_parallel and row.layout.flash_attention
    assert row.tokens_per_s_per_gpu == 1524
    assert by_id("LLM-067").model.vocabulary == 131072 and by_id("LLM-067").model.seq_len == 4096


def test_nemo_rows_run_as_nemo_performance_configurations_do() -> None:
    """bf16 gradient reduction, overlapped reductions and gathers, TP communication under the GEMMs
    where tp > 1; the Megatron-LM rows of 2021-22 no overlap, and their gradients reduced in the
    weights' fp16 (the SC21 scripts pass --fp16 without --accumulate-allreduce-grads-in-fp32), as
    DeepSpeed's ZeRO rows (fp32_allreduce off); a bf16 Megatron-LM row reduces in fp32 (forced)."""
    nemo, single, narayanan = by_id("LLM-064"), by_id("LLM-057"), by_id("LLM-006")
    assert nemo.layout is not None and single.layout is not None and narayanan.layout is not None
    assert not nemo.layout.grad_reduce_in_fp32 and nemo.layout.tp_comm_overlap and not single.layout.tp_comm_overlap
    assert dict(nemo.options) == {"overlap_grad_reduce": True, "overlap_param_gather": True, "bucket_bytes": 125e6}
    assert not narayanan.layout.tp_comm_overlap and narayanan.options == ()
    assert narayanan.layout.gradient_bytes == 2.0 and narayanan.layout.precision == "fp16"
    zero, readme = by_id("LLM-041"), by_id("LLM-067")
    assert zero.layout is not None and zero.layout.gradient_bytes == 2.0
    assert readme.layout is None or readme.layout.gradient_bytes == 4.0  # bf16: its layout is planned


def test_both_recomputation_runs_of_one_korthikanti_model_share_its_pipeline_schedule() -> None:
    """Korthikanti et al. give TP and PP only; the chunks come from Calculon's reconstruction, the
    same for a model's full and selective recomputation rows (175B, 530B: 3; 1T: 1)."""
    for full, selective, chunks in (("LLM-025", "LLM-026", 3), ("LLM-027", "LLM-028", 3), ("LLM-029", "LLM-030", 1)):
        layouts = [by_id(row).layout for row in (full, selective)]
        assert [layout.virtual_stages for layout in layouts if layout is not None] == [chunks, chunks]


def test_flops_agree_with_every_source_that_gives_a_second_figure() -> None:
    """NeMo: our model FLOPs per token within 0.5% of TFLOP/s / tokens/s; Korthikanti et al.: MFU within
    0.2 points of the paper's (56.0%, 56.3%); Narayanan et al.: parameters round to table 1."""
    mapped, _ = mapped_runs()
    checks, skipped = flops_checks(mapped)
    kinds = {check.what for check in checks}
    assert kinds == {"model FLOPs per token", "MFU", "parameters (billions)"}
    for check in checks:
        if check.what == "model FLOPs per token":
            assert abs(check.relative_error) < 0.005, check
        elif check.what == "MFU":
            assert abs(check.modelled - check.published) < 0.002, check
        else:
            assert round(check.modelled, 1) == check.published, check
    assert len(checks) == 17
    assert dict(skipped)["LLM-066"].startswith("packed fine-tuning sequences")
    assert dict(skipped)["LLM-065"].startswith("LoRA: the source counts the frozen pass its own way")


def test_no_run_that_ran_is_refused_for_memory() -> None:
    mapped, _ = mapped_runs()
    checks, skipped = memory_checks(mapped)
    assert len(checks) == 23
    refused = [check.run_id for check in checks if not check.fits]
    assert refused == []
    assert {run_id for run_id, _ in skipped} == {"LLM-041", "LLM-065", "LLM-066", "LLM-067"}


def test_the_fragmentation_allowance_is_the_calibrated_one() -> None:
    """The default allowance is the largest (to 0.01) that refuses none of the runs; a larger one refuses one."""
    mapped, _ = mapped_runs()
    checks, _ = memory_checks(mapped)
    assert largest_fragmentation(checks, RUNTIME_RESERVE_BYTES) == FRAGMENTATION
    stricter, _ = memory_checks(mapped, {"fragmentation": FRAGMENTATION + 0.02})
    assert any(not check.fits for check in stricter)


def write_copy(tmp_path: Path, edit) -> Path:
    path = tmp_path / "llm.csv"
    shutil.copyfile(DATA_FILE, path)
    text = path.read_text(encoding="utf-8")
    path.write_text(edit(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("id,source,model", "id,origin,model", 1), "the header must be exactly id,source,model"),
        (lambda t: t.replace("LLM-002,", "LLM-001,", 1), "empty or repeated id 'LLM-001'"),
        (lambda t: t.replace("LLM-006,Narayanan et al. SC21 Table 1,GPT (Megatron),76.1,60,",
                             "LLM-006,Narayanan et al. SC21 Table 1,GPT (Megatron),76.1,sixty,", 1),
         "row 'LLM-006' (line 7), column 'layers': must be a whole number >= 1 or empty, got 'sixty'"),
    ],
)
def test_malformed_rows_name_file_row_and_column(tmp_path: Path, edit, message: str) -> None:
    path = write_copy(tmp_path, edit)
    with pytest.raises(LlmRunsError) as caught:
        load_llm_runs(path)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_bad_row_is_listed_and_the_rest_are_read_by_validate_calibrate_and_check(tmp_path: Path, capsys) -> None:
    """Every row gets an answer (issue 13): a truncated row, a bad number and a repeated id are each
    that row's reason (a truncated row used to end the command in a traceback), the other rows are read."""
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    lines = DATA_FILE.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = [
        "LLM-901,Somebody,GPT-3,175,96\n",  # 5 of 24 fields
        next(line for line in lines if line.startswith("LLM-006,"))
        .replace("LLM-006,", "LLM-902,", 1)
        .replace(",76.1,60,", ",76.1,sixty,", 1),
        next(line for line in lines if line.startswith("LLM-002,")),  # again
    ]
    path = tmp_path / "llm.csv"
    path.write_text("".join(lines) + "".join(bad), encoding="utf-8")
    rejected: list = []
    assert len(load_llm_runs(path, rejected)) == 27
    reasons = {row.id: row.reason for row in rejected}
    assert "5 fields, the header has 24" in reasons["LLM-901"]
    assert "column 'layers': must be a whole number >= 1 or empty, got 'sixty'" in reasons["LLM-902"]
    assert "repeated id 'LLM-002'" in reasons["LLM-002"]

    assert main(["measurements", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "27 valid large-model rows" in captured.out and "3 bad rows" in captured.out
    assert captured.err.count("ddlsim: error: ") == 3
    out = tmp_path / "v"
    assert main(["validate", "--measurements", str(path), "--leave-one-source-out", "--out", str(out)]) in (0, 1)
    assert "27 of 30 held-out rows predicted" in capsys.readouterr().out
    table = {row["id"]: row for row in read_csv(out / "validation.csv")}
    assert table["LLM-901"]["status"] == "cannot_model" and "5 fields" in table["LLM-901"]["reason"]
    assert main(["calibrate", "--measurements", str(path), "--out", str(tmp_path / "p.toml")]) == 0
    assert "# not used: LLM-902:" in capsys.readouterr().out
    split = ["measurements", "split", str(path), "--calibration-out", str(tmp_path / "a.csv"),
             "--heldout-out", str(tmp_path / "b.csv")]  # fmt: skip
    assert main(split) == 2 and not (tmp_path / "a.csv").exists()
    assert "a large-model file (llm_dev.csv's columns)" in capsys.readouterr().err


def test_a_lora_row_runs_its_base_model_with_the_weights_frozen() -> None:
    """LLM-065 (NeMo, Llama 2 70B LoRA): the base model with ``frozen_weights``, said in the note."""
    row = by_id("LLM-065")
    assert row.model.name == "llama2_70b" and row.layout is not None and row.layout.frozen_weights
    assert any(note.startswith("LoRA: base weights frozen") for note in row.assumptions)
    assert by_id("LLM-066").layout is not None and not by_id("LLM-066").layout.frozen_weights  # its SFT row


def test_a_row_with_a_metric_ddlsim_does_not_predict_is_one_row_s_reason_not_the_file_s(tmp_path: Path) -> None:
    """Every row gets an answer (issue 13): an unknown metric is that row's reason, the rest are read;
    a thousands separator in a count is read as the number."""
    from ddlsim.simulator.calibration.llm_validation import predict_runs

    path = write_copy(tmp_path, lambda t: t.replace(",tflops_per_gpu,140,", ",petaflops,140,", 1).replace(
        "LLM-006,Narayanan et al. SC21 Table 1,GPT (Megatron),76.1,60,10240,80,2048,1792,,1024,",
        'LLM-006,Narayanan et al. SC21 Table 1,GPT (Megatron),76.1,60,10240,80,2048,1792,,"1,024",', 1))
    runs = load_llm_runs(path)
    assert len(runs) == 27
    odd = next(run for run in runs if run.id == "LLM-006")
    assert odd.gpus == 1024
    (prediction,) = predict_runs([odd])
    assert prediction.reason.startswith("metric 'petaflops' is not one ddlsim predicts (tflops_per_gpu, mfu")
