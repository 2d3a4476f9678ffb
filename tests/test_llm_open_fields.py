"""Large-model rows worded another way, or leaving the shape or batch open: read into catalog tokens by
their words, filled in with the documented defaults, and predicted with intervals that span the choices."""

from __future__ import annotations

import dataclasses

import pytest

from ddlsim.simulator.calibration import llm_validation
from ddlsim.simulator.workloads.llm_open_fields import (
    device_from_text,
    links_from_text,
    shape_from_parameters,
)
from ddlsim.simulator.workloads.llm_runs import MappedRun, Unmapped, load_llm_runs, map_run
from ddlsim.simulator.workloads.transformer_costs import transformer_blocks


def counted_parameters(model) -> float:
    return sum(block.parameters for block in transformer_blocks(model))


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("A100 80GB SXM", "a100_sxm4_80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100_sxm4"),
        ("A100", "a100_sxm4_80gb"),
        ("H100 PCIe", "h100_pcie"),
        ("DGX H100 (H100 SXM5 80GB)", "h100_sxm5"),
        ("Tesla V100-SXM3-32GB (DGX-2)", "v100_sxm3"),
        ("V100 16GB", "v100_sxm2"),
        ("AMD MI300X", "mi300x"),
        ("h200_sxm", "h200_sxm"),
    ],
)
def test_a_gpu_is_read_by_the_words_that_identify_it(text, token):
    found = device_from_text(text)
    assert found is not None and found[0] == token


def test_words_that_name_no_device_are_none():
    assert device_from_text("Ascend 910") is None and device_from_text("") is None


@pytest.mark.parametrize(
    ("text", "device", "expected"),
    [
        ("8x NDR 400Gb/s InfiniBand", "h100_sxm5", ("nvswitch3", "ib_ndr", 8)),
        ("NVLink3 + 4x HDR", "a100_sxm4_80gb", ("nvswitch2", "ib_hdr", 4)),
        ("800 Gbps EDR", "v100_sxm3", ("nvswitch", "ib_edr", 8)),  # a node total over EDR's 100 Gb/s
        ("RoCE 400G, 8 NICs", "h100_sxm5", ("nvswitch3", "roce_400g", 8)),
        ("InfiniBand 200 Gb/s", "a100_sxm4", ("nvswitch2", "ib_hdr", 8)),
        ("NVLink; Omni-Path 4x", "a100_sxm4_80gb", ("nvswitch2", "opa_100", 4)),
        ("4x 100 Gbps EFA", "a100_sxm4", ("nvswitch2", "roce_100g", 4)),
        ("4x NVLink per GPU; NDR", "h100_sxm5", ("nvswitch3", "ib_ndr", 8)),  # NVLinks are not adapters
        ("NVSwitch 900GB/s; InfiniBand 200Gb/s", "h100_sxm5", ("nvswitch3", "ib_hdr", 8)),  # GB/s is NVLink's
        ("NVLink; 2x 40GbE", "v100_sxm2", ("nvlink2", "eth_40g", 2)),  # Ethernet by its rate's suffix
        ("25GbE TCP", "v100_sxm2", ("nvlink2", "eth_25g", 4)),
        ("10GE", "p100_sxm2", ("nvlink1", "eth_10g", 4)),
        ("1600 Gb/s InfiniBand", "a100_sxm4", ("nvswitch2", "ib_hdr", 8)),  # a node total of the usual HDR
        ("800 Gbps IB", "h100_sxm5", ("nvswitch3", "ib_ndr", 2)),  # 2 NDR, not XDR on an H100 node
    ],
)
def test_an_interconnect_is_read_by_generation_and_adapter_count(text, device, expected):
    intra, network, nics, _ = links_from_text(text, device)
    assert (intra, network, nics) == expected


def test_an_interconnect_that_names_no_network_takes_the_node_s_and_says_so():
    intra, network, nics, notes = links_from_text("NVLink", "v100_sxm2")
    assert (intra, network, nics) == ("nvlink2", "ib_edr", 4)  # the DGX-1's
    assert any("the row names none" in note for note in notes) and any("not stated" in note for note in notes)


def test_a_size_gives_a_megatron_family_shape_and_its_neighbours():
    """100B: the nearest member of Narayanan et al.'s table 1 is 76.1B (hidden 10240); the depth that
    gives 100B at that width; the neighbours' widths (8192, 12288) as the alternatives."""
    chosen, alternatives, note = shape_from_parameters(100)
    assert (chosen.hidden, chosen.heads, chosen.head_dim, chosen.ffn_hidden) == (10240, 80, 128, 40960)
    # counted layer by layer by the cost model, not by the formula the shape was solved with
    assert counted_parameters(chosen) == pytest.approx(100e9, rel=0.01)
    assert sorted(a.hidden for a in alternatives) == [8192, 12288]
    assert all(counted_parameters(a) == pytest.approx(100e9, rel=0.02) for a in alternatives)
    assert "100B" in note


def unscripted(run):
    """``run`` from a source with no script of its settings (Narayanan et al.'s rows take their Table 1
    script's micro-batch and chunks): what a source that leaves them open gets."""
    return dataclasses.replace(run, source="A lab's report (no run script)")


def other_stack_row(**changes):
    base = next(run for run in load_llm_runs() if run.id == "LLM-006")  # 76.1B on 1024 A100, TP 8 PP 4 DP 32
    return dataclasses.replace(unscripted(base), **changes)


def test_a_row_worded_another_way_maps_as_the_file_s_own_wording_does():
    ours = map_run(other_stack_row())
    theirs = map_run(other_stack_row(gpu_type="NVIDIA A100 80GB SXM4", interconnect="NVSwitch; 8x HDR 200Gb/s IB"))
    assert isinstance(ours, MappedRun) and isinstance(theirs, MappedRun)
    key = ("device", "intra_node_link", "network", "nics_per_node", "layout")
    assert [getattr(theirs, name) for name in key] == [getattr(ours, name) for name in key]
    assert any("read as a100_sxm4_80gb" in note for note in theirs.assumptions)


def test_a_model_outside_the_catalog_runs_with_the_row_s_shape():
    row = map_run(other_stack_row(model="Some 60-layer GPT", layers=60, hidden=8192, heads=64))
    assert isinstance(row, MappedRun)
    assert (row.model.layers, row.model.hidden, row.model.heads, row.model.ffn_hidden) == (60, 8192, 64, 32768)
    (prediction,) = llm_validation.predict_runs([row.run])
    assert not prediction.reason and prediction.iteration_s > 0
    # the same layers at the catalog's 76.1B width take longer than at 8192
    (catalog,) = llm_validation.predict_runs([other_stack_row()])
    assert prediction.iteration_s < catalog.iteration_s


def test_a_row_without_shape_or_size_says_why():
    row = map_run(other_stack_row(model="Mystery LM", layers=None, hidden=None, heads=None, params_b=None))
    assert isinstance(row, Unmapped) and "neither its shape nor its size" in row.reason


def test_an_open_batch_fills_the_memory_and_the_interval_spans_half_of_it():
    """ZeRO's 100B row (LLM-041) states no batch: the largest micro-batch that fits a 32 GB V100,
    with full recomputation as nothing fits without it; half of it and the neighbouring shapes
    widen the row's interval, and the row is not fitted (its residual would measure the choice)."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-041")
    row = map_run(run)
    assert isinstance(row, MappedRun) and row.layout is not None
    assert (row.layout.tp, row.layout.dp, row.layout.recompute) == (16, 25, "full")
    assert row.alternative_layouts[0].micro_batch == row.layout.micro_batch // 2
    (prediction,) = llm_validation.predict_runs([run])
    assert prediction.guessed and prediction.spread[0] < 1.0
    fit = llm_validation.LlmFit(1.0, 0.9, 1.1, 10)
    table = llm_validation.table_row(prediction, fit)
    assert table["ci_low"] < 0.9 * table["predicted"] * 0.99
    others = [p for p in llm_validation.predict_runs(load_llm_runs()) if not p.reason]
    assert llm_validation.LlmFit.of(others, 0.9).rows == len(others) - 2  # LLM-041 and LLM-067 (layout chosen)


def test_an_open_micro_batch_runs_at_one_and_the_interval_spans_two_while_the_row_stays_fitted():
    """A source that gives the global batch, not the micro-batch (Narayanan et al.'s table, read without
    its script): the row runs at micro-batch 1 (the default) and its interval spans micro-batch 2,
    which on a pipeline (76B: PP 4, 1792 sequences over DP 32) halves the micro-batches and lengthens
    the bubble; a pipeline-less row's spread is tiny; the row is still fitted (an open micro-batch is
    not a guessed layout); a row that states its micro-batch gets no such reading, nor one whose
    script gives it (Narayanan et al.'s own rows)."""
    runs = {run.id: unscripted(run) for run in load_llm_runs()}
    scripted = map_run(next(run for run in load_llm_runs() if run.id == "LLM-006"))
    assert isinstance(scripted, MappedRun) and scripted.layout is not None and scripted.open_layouts == ()
    assert (scripted.layout.micro_batch, scripted.layout.virtual_stages) == (2, 3)  # run_table_1.sh's
    row = map_run(runs["LLM-006"])
    assert isinstance(row, MappedRun) and row.layout is not None and row.layout.micro_batch == 1
    assert [layout.micro_batch for layout in row.open_layouts] == [2]
    assert "the interval spans micro-batch 2 (it fits and divides the batch)" in row.assumptions
    (prediction,) = llm_validation.predict_runs([runs["LLM-006"]])
    assert not prediction.guessed and prediction.spread[0] < 0.97 and prediction.spread[1] == 1.0
    (flat,) = llm_validation.predict_runs([runs["LLM-001"]])  # 1.7B, PP 1
    assert flat.spread[0] > 0.99
    stated = map_run(next(run for run in load_llm_runs() if run.id == "LLM-025"))  # micro-batch 1 stated
    assert isinstance(stated, MappedRun) and stated.open_layouts == ()
    odd = map_run(dataclasses.replace(runs["LLM-006"], global_batch=1760))  # 55 a replica: 2 does not divide
    assert isinstance(odd, MappedRun) and odd.open_layouts == ()


def test_an_interleaved_schedule_without_its_chunks_runs_at_two_and_the_interval_spans_the_most():
    """A row whose notes name the interleaved schedule but not its chunk count: 2 chunks (the fewest, and
    Megatron has no default), the interval reaching the most the stages' layers allow (39B: 48 layers on
    2 stages, 24 chunks of one layer); where a stage's layers do not split in two (76B: 60 layers on 4
    stages, 15 each) plain 1F1B, said."""
    runs = {run.id: unscripted(run) for run in load_llm_runs()}
    run = dataclasses.replace(runs["LLM-005"], notes="interleaved 1F1B")
    row = map_run(run)
    assert isinstance(row, MappedRun) and row.layout is not None and row.layout.virtual_stages == 2
    assert [layout.virtual_stages for layout in row.open_layouts] == [2, 24]  # micro-batch 2, then the most chunks
    (plain,) = llm_validation.predict_runs([runs["LLM-005"]])
    (interleaved,) = llm_validation.predict_runs([run])
    assert interleaved.iteration_s < plain.iteration_s  # a shorter bubble
    assert interleaved.spread[1] > 1.0  # 24 chunks: shorter still
    assert not interleaved.guessed
    uneven = map_run(dataclasses.replace(runs["LLM-006"], notes="interleaved 1F1B"))
    assert isinstance(uneven, MappedRun) and uneven.layout is not None and uneven.layout.virtual_stages == 1
    assert any(text.startswith("plain 1F1B: the source names the interleaved schedule") for text in uneven.assumptions)


def test_a_fully_sharded_row_without_a_micro_batch_takes_the_largest_that_divides_and_fits():
    """ZeRO-3 and FSDP gather every weight again for each micro-batch, and DeepSpeed's and FSDP's default is
    no gradient accumulation: Llama 2 7B under FSDP on 64 A100 with 512 sequences (8 a replica, full
    recomputation) runs at micro-batch 8, the interval spanning 4, and beats micro-batch 1, which gathers
    the model eight times; where only 1 fits (no recomputation), micro-batch 1 as for other stacks."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-057")
    fsdp = dataclasses.replace(run, source="an FSDP run", tp=1, pp=1, dp=64, gpus=64, global_batch=512,
                               micro_batch=None, gpu_type="A100-80GB", interconnect="NVLink; 8x HDR IB",
                               zero_stage="FSDP FULL_SHARD", recompute="full", precision="bf16", notes="")  # fmt: skip
    row = map_run(fsdp)
    assert isinstance(row, MappedRun) and row.layout is not None
    assert (row.layout.zero_stage, row.layout.micro_batch) == (3, 8)
    assert [layout.micro_batch for layout in row.open_layouts] == [4]
    assert any(text.startswith("micro-batch 8 of the replica's 8 sequences") for text in row.assumptions)
    assert not any(text.startswith("micro-batch 1") for text in row.assumptions)
    (chosen,) = llm_validation.predict_runs([fsdp])
    (single,) = llm_validation.predict_runs([dataclasses.replace(fsdp, micro_batch=1)])
    assert chosen.iteration_s < single.iteration_s
    unrecomputed = map_run(dataclasses.replace(fsdp, recompute="none"))
    assert isinstance(unrecomputed, MappedRun) and unrecomputed.layout is not None
    assert unrecomputed.layout.micro_batch == 1
    assert "micro-batch 1 (not in the source's table)" in unrecomputed.assumptions


def test_a_row_without_a_layout_runs_the_planner_s_best_with_what_it_states_held():
    """The Megatron-LM README's GPT-3 175B on 96 H100 (LLM-067) names its overlap flags but shows TP/PP
    only in an image: the planner's best layout for its GPUs and global batch, with those flags, and
    its next two as the interval's alternatives. Its MFU is a percent, as the row's 47."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-067")
    (prediction,) = llm_validation.predict_runs([run])
    assert not prediction.reason and prediction.guessed
    mapped = prediction.mapped
    assert mapped is not None and mapped.layout is not None
    assert mapped.layout.gpus == 96 and mapped.layout.global_batch == 1152 and mapped.layout.tp <= 8
    assert mapped.layout.tp_comm_overlap and dict(mapped.options) == {
        "overlap_grad_reduce": True, "overlap_param_gather": True}  # fmt: skip
    assert len(mapped.alternative_layouts) == 2 and "layout not stated" in mapped.assumptions[-1]
    mfu = llm_validation.metric_of(prediction, prediction.iteration_s)
    tflops = llm_validation.metric_of(
        dataclasses.replace(prediction, run=dataclasses.replace(run, metric="tflops_per_gpu")), prediction.iteration_s)
    assert mfu == pytest.approx(100 * tflops / 989.0, rel=0.01)  # H100 SXM5 dense bf16 peak: 989 TFLOP/s
    assert 20.0 < mfu < 80.0
    # a stated tensor-parallel width is held
    (held,) = llm_validation.predict_runs([dataclasses.replace(run, tp=4)])
    assert held.mapped is not None and held.mapped.layout is not None and held.mapped.layout.tp == 4


def test_a_row_without_layout_gpus_or_batch_says_why():
    run = next(run for run in load_llm_runs() if run.id == "LLM-067")
    (prediction,) = llm_validation.predict_runs([dataclasses.replace(run, global_batch=None)])
    assert prediction.reason == "tp, pp or dp is not in the row, nor both the GPUs and the global batch to choose one"


def test_a_time_to_train_row_is_its_tokens_over_the_predicted_rate():
    """time_to_train_min: the tokens the notes give over the tokens each predicted iteration trains;
    without them the row says what is missing."""
    run = other_stack_row(metric="time_to_train_min", value=1000.0, notes="trained on 300B tokens")
    (prediction,) = llm_validation.predict_runs([run])
    assert not prediction.reason
    per_iteration = run.global_batch * 2048  # sequences of 2048 tokens
    expected = 300e9 / per_iteration * prediction.iteration_s / 60.0
    assert llm_validation.metric_of(prediction, prediction.iteration_s) == pytest.approx(expected, rel=1e-12)
    assert llm_validation.slowdown(prediction) == pytest.approx(1000.0 / expected, rel=1e-12)
    (missing,) = llm_validation.predict_runs([dataclasses.replace(run, notes="2621 tokens/s/GPU")])
    assert missing.reason.startswith("time to train needs the tokens trained")


@pytest.mark.parametrize(
    ("zero_stage", "recompute", "expected"),
    [("ZeRO-3", "full", (3, "full")), ("FSDP", "", (3, "none")), ("SHARD_GRAD_OP", "Selective", (2, "selective")),
     ("distributed optimizer", "none", (1, "none")), ("2", "Full (uniform)", (2, "full"))],
)  # fmt: skip
def test_sharding_and_recomputation_are_read_by_their_words(zero_stage, recompute, expected):
    row = map_run(other_stack_row(zero_stage=zero_stage, recompute=recompute))
    assert isinstance(row, MappedRun) and row.layout is not None
    assert (row.layout.zero_stage, row.layout.recompute) == expected


def test_a_planned_layout_keeps_the_sharding_and_recomputation_the_row_states():
    run = next(run for run in load_llm_runs() if run.id == "LLM-067")
    (prediction,) = llm_validation.predict_runs([dataclasses.replace(run, zero_stage="1", recompute="full")])
    assert prediction.mapped is not None and prediction.mapped.layout is not None
    assert (prediction.mapped.layout.zero_stage, prediction.mapped.layout.recompute) == (1, "full")


def test_a_row_from_another_source_runs_as_current_stacks_do():
    """FlashAttention on for a row from another source on Hopper or later, off on an A100 (whose
    flagship runs predate it) and a V100; a pipeline whose stages do not divide the layers gets lighter
    ends, as Llama 3 405B's 126 layers on 16 stages (7, 8 x 14, 7)."""
    for gpu, flash in (("H100 SXM", True), ("A100 80GB", False), ("V100 32GB", False)):
        row = map_run(other_stack_row(source="A later paper", gpu_type=gpu))
        assert isinstance(row, MappedRun) and row.layout is not None and row.layout.flash_attention == flash, gpu
    llama = map_run(other_stack_row(source="A later paper", model="Llama 3.1 405B", layers=None, hidden=None,
                                    heads=None, tp=8, pp=16, dp=8, global_batch=1024, seq_len=8192))  # fmt: skip
    assert isinstance(llama, MappedRun) and llama.layout is not None
    assert llama.layout.layers_per_stage(126) == [7] + [8] * 14 + [7]


def test_a_global_batch_that_does_not_divide_into_the_replicas_is_rounded_and_said():
    """LLM-006's layout (dp 32, micro-batch 1) with a global batch of 1000: 992, the nearest multiple."""
    row = map_run(other_stack_row(global_batch=1000))
    assert isinstance(row, MappedRun) and row.layout is not None and row.layout.global_batch == 992
    assert any(note.startswith("global batch 1000 taken as 992") for note in row.assumptions)


def test_a_planned_layout_rounds_a_batch_no_layout_divides_to_each_layout_s_nearest_multiple():
    """992 GPUs (124 nodes) with TP 8 and a global batch of 2048: no pipeline depth divides both the
    96 layers and the GPUs into replicas that 2048 divides, so each layout runs 2048 rounded to the
    nearest multiple of its micro-batch x dp, and the note says so."""
    run = next(run for run in load_llm_runs() if run.id == "LLM-067")
    odd = dataclasses.replace(run, gpus=992, tp=8, global_batch=2048, notes="")
    (prediction,) = llm_validation.predict_runs([odd])
    assert not prediction.reason and prediction.mapped is not None and prediction.mapped.layout is not None
    layout = prediction.mapped.layout
    step = layout.micro_batch * layout.dp
    assert layout.tp == 8 and layout.global_batch == max(step, round(2048 / step) * step) != 2048
    assert prediction.mapped.assumptions[-1].endswith("rounded to the nearest multiple of micro-batch x dp")


def test_nemotron_4_and_mixtral_8x22b_are_read_by_their_names():
    """NeMo's Nemotron-4 and Mixtral rows name the model only: 'Nemotron-4 340B' is the launcher's 340B
    config (96 layers of 18432, 8 query groups), not a Megatron GPT reshaped to 340B."""
    nemo = next(run for run in load_llm_runs() if run.id == "LLM-064")
    for name, token in (("Nemotron-4 340B", "nemotron4_340b"), ("Nemotron4 15B", "nemotron4_15b"),
                        ("Mixtral 8x22B", "mixtral_8x22b"), ("BLOOM 176B", "bloom_176b")):
        row = map_run(dataclasses.replace(nemo, model=name, params_b=None, layers=None, hidden=None, heads=None))
        assert isinstance(row, MappedRun) and row.model.name == token, name
        assert row.model.kv_heads == (112 if token == "bloom_176b" else 8)


@pytest.mark.parametrize(
    ("source", "notes", "gpu", "flash"),
    [
        ("Touvron et al. 2023 (LLaMA)", "", "A100-80GB", True),  # after FlashAttention and PyTorch 2.0
        ("Zhang et al. 2022 (OPT)", "", "A100-80GB", False),  # A100's flagship runs before it
        ("A lab's 2022 report", "trained with FlashAttention-2", "A100-80GB", True),  # as the row says
        ("A lab's 2024 report", "no flash attention (debug run)", "H100-80GB", False),
        ("A lab's 2024 report", "", "H100-80GB", True),
    ],
)
def test_another_stack_s_attention_is_fused_by_its_words_its_device_and_its_date(source, notes, gpu, flash):
    row = map_run(other_stack_row(source=source, notes=notes, gpu_type=gpu))
    assert isinstance(row, MappedRun) and row.layout is not None and row.layout.flash_attention is flash
    assert any("FlashAttention" in note for note in row.assumptions)
