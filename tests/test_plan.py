"""``ddlsim plan``: the layout search, its ranking and memory screen, its files and its bad input."""

from __future__ import annotations

import random

import pytest

from ddlsim.simulator.cli.main import main

SMALL = ["plan", "--model", "llama3_8b", "--gpus", "16", "--global-batch", "32", "--tp", "8", "--zero-stage", "1",
         "--recompute", "none", "--no-progress"]  # fmt: skip


def test_the_search_ranks_fitting_layouts_by_the_closed_form(tmp_path, capsys):
    """Every layout printed fits the H100's memory, the list is in falling tokens/s, and the best
    one's figures are the megatron closed form of that layout, built here from its own fields."""
    import pyarrow.parquet as pq

    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.simulator.closed_form.training import closed_form_result
    from ddlsim.simulator.records import read_csv
    from ddlsim.simulator.scenario import Scenario

    assert main([*SMALL, "--top", "4", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "# the best layout, tp8" in out and "fits in 85.5 GB" in out
    top = read_csv(tmp_path / "p" / "layouts.csv")
    assert len(top) == 4 and [row["rank"] for row in top] == ["1", "2", "3", "4"]
    rates = [float(row["tokens_per_s"]) for row in top]
    assert rates == sorted(rates, reverse=True)
    assert all(float(row["memory_GB"]) <= 85.5 for row in top)
    every = pq.read_table(tmp_path / "p" / "layouts.parquet").to_pylist()
    best = max((row for row in every if not row["reason"]), key=lambda row: row["tokens_per_s"])
    assert best["tokens_per_s"] == pytest.approx(rates[0], rel=1e-9)
    layout = {key: best[key] for key in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages", "zero_stage",
                                         "recompute")}  # fmt: skip
    assert layout["tp"] == 8 and layout["zero_stage"] == 1 and layout["tp"] * layout["pp"] * layout["dp"] * layout[
        "cp"] == 16  # fmt: skip
    scenario = Scenario(
        workload="llama3_8b", algorithm="megatron", device="h100_sxm5", devices_per_node=8, intra_node="nvswitch3",
        network="ib_ndr", nics_per_node=8, precision="bf16", nodes=(2,), enforce_memory=False,
        options=make_options("megatron", {"layout": {**layout, "global_batch": 32, "sequence_parallel": True},
                                          "collective": "nccl"}),  # the planner's stack on GPUs
    )  # fmt: skip
    result = closed_form_result(scenario, 2)
    assert best["iteration_s"] == pytest.approx(result.iteration_s, rel=1e-12)
    assert best["tokens_per_s"] == pytest.approx(32 * 8192 / result.iteration_s, rel=1e-9)


def test_layouts_that_do_not_fit_are_kept_with_their_reason(tmp_path, capsys):
    import pyarrow.parquet as pq

    argv = ["plan", "--model", "llama3_70b", "--gpus", "32", "--global-batch", "32", "--tp", "8",
            "--recompute", "none", "--micro-batch", "1", "--no-progress", "--exhaustive",
            "--out", str(tmp_path / "p")]  # fmt: skip
    assert main(argv) == 0
    every = pq.read_table(tmp_path / "p" / "layouts.parquet").to_pylist()
    refused = [row for row in every if row["reason"]]
    assert refused and all(row["reason"].startswith("needs ") and row["memory_GB"] > 85.5 for row in refused)
    assert all(row["memory_GB"] <= 85.5 for row in every if not row["reason"])
    # without ZeRO, weights, gradients and Adam states (16 B x 70.6e9 / (8 x 2) = 71 GB) and activations
    # overflow a two-stage pipeline; sharding them over 2 replicas (ZeRO 1) brings it in
    assert any(row["zero_stage"] == 0 and row["pp"] == 2 for row in refused)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama9_8b", "--gpus", "16"], "unknown transformer model 'llama9_8b'; valid:"),
        (["--model", "llama3_8b", "--gpus", "12"], "--gpus must be a positive multiple of h100_sxm5's 8 devices"),
        (["--model", "llama3_8b", "--gpus", "16", "--tp", "3"], "--tp 3: attention heads (32) of llama3_8b"),
        (["--model", "llama3_8b", "--gpus", "16", "--tp", "16"], "--tp 16 is larger than a node's 8 GPUs"),
        (["--model", "llama3_405b", "--gpus", "8", "--global-batch", "8"], "none of the"),
        (["--model", "llama3_8b", "--gpus", "16", "--global-batch", "3", "--dp", "2"], "no valid layout of llama3_8b"),
        (["--model", "llama3_8b", "--gpus", "16", "--zero-stage", "4"], "--zero-stage must be 0, 1, 2 or 3, got 4"),
        (["--model", "llama3_8b", "--gpus", "16", "--fp8-attention-and-logits"],
         "--fp8-attention-and-logits needs --precision fp8, got the default precision"),
        (["--model", "llama3_8b", "--gpus", "16", "--precision", "bf16", "--fp8-attention-and-logits"],
         "--fp8-attention-and-logits needs --precision fp8, got --precision bf16"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "p"
    assert main(["plan", *argv, "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ddlsim: error: {message}") and err.count("\n") == 1, err
    assert not out.exists()


def test_an_unwritable_out_is_refused_before_the_search(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main([*SMALL, "--out", str(blocker)]) == 2
    assert "ddlsim: error:" in capsys.readouterr().err


def test_recheck_runs_the_event_simulation_of_the_best_layouts(capsys):
    from ddlsim.simulator import planner

    assert main([*SMALL, "--top", "3", "--recheck", "2"]) == 0
    serial = capsys.readouterr().out
    lines = serial.split("# event simulation of the best layouts")[1].strip().splitlines()
    rows = [line.split() for line in lines[2:]]  # after the heading line and the column names
    assert [row[0] for row in rows] == ["1", "2"] and all(row[3] == "vectorised" for row in rows)
    # nothing contends in these layouts: the DES gives the closed form's time
    assert all(row[1] == row[2] for row in rows)
    # two worker processes event-simulate one layout each: the same table, in rank order
    assert main([*SMALL, "--top", "3", "--recheck", "2", "--workers", "2", "--executor-pool", "process"]) == 0
    assert capsys.readouterr().out == serial
    cluster = planner.Cluster.of("h100_sxm5", 16)
    assert (cluster.nodes, cluster.intra_node, cluster.network, cluster.nics_per_node) == (2, "nvswitch3", "ib_ndr", 8)


NEMO_STACK = (("overlap_grad_reduce", True), ("overlap_param_gather", True), ("tp_comm_overlap", True),
              ("grad_reduce_in_fp32", False), ("bucket_bytes", 125e6))  # fmt: skip


@pytest.mark.parametrize(
    ("model", "gpus", "device", "batch", "stack"),
    [
        ("llama3_8b", 64, "h100_sxm5", 256, ()),
        ("mixtral_8x7b", 32, "h100_sxm5", 128, ()),
        ("gpt3_13b", 64, "a100_sxm4_80gb", 256, ()),
        ("llama3_8b", 64, "h100_sxm5", 256, NEMO_STACK),
        ("llama2_70b", 16, "h100_sxm5", 32, (("frozen_weights", True),)),
    ],
)
def test_branch_and_bound_finds_the_exhaustive_top_and_prunes_only_slower_layouts(model, gpus, device, batch, stack):
    """The bound is below every layout's closed-form time; the search's top 8 are the exhaustive
    search's, in order and to the digit; every pruned layout's ceiling is below the 8th best. Also
    with NeMo's software stack (overlapped reductions, gathers and TP communication)."""
    from ddlsim.simulator import planner
    from ddlsim.simulator.planner_bounds import LowerBounds

    config = planner.load_model(model)
    cluster = planner.Cluster.of(device, gpus, stack=stack)
    every = list(planner.candidate_layouts(config, cluster, batch))
    layouts = random.Random(7).sample(every, min(300, len(every)))  # the exhaustive side takes ~10 ms a layout
    ranked, candidates = planner.branch_and_bound(model, config, cluster, layouts, keep=8)
    exhaustive = planner.evaluate(model, cluster, planner.screen(config, cluster, layouts))
    assert len(candidates) == len(layouts)
    assert [planner.layout_text(c.layout) for c in ranked[:8]] == [
        planner.layout_text(c.layout) for c in exhaustive[:8]
    ]
    assert [c.figures["iteration_s"] for c in ranked[:8]] == [c.figures["iteration_s"] for c in exhaustive[:8]]
    timed = {planner.layout_text(c.layout): c.figures["iteration_s"] for c in exhaustive}
    bounds = LowerBounds(model, config, cluster)
    for layout, bound in zip(layouts, bounds.bounds(layouts), strict=True):
        exact = timed.get(planner.layout_text(layout))
        assert exact is None or bound <= exact * (1 + 1e-12), planner.layout_text(layout)
    pruned = [c for c in candidates if c.reason.startswith("pruned")]
    assert pruned and len(ranked) < len(exhaustive)  # the point: layouts that cannot win are never timed
    eighth = exhaustive[7].figures["iteration_s"]
    assert all(c.figures["iteration_lower_bound_s"] >= eighth * (1 - 1e-12) for c in pruned)


def test_every_schedule_ends_each_rank_with_the_same_backward_on_chunk_0():
    """What the planner's lower bound relies on (``planner_bounds.ENDS_TOGETHER``): on every pipeline
    rank the last task is the backward of one and the same micro-batch on chunk 0."""
    from ddlsim.algorithms.pipeline_schedules import BACKWARD, SCHEDULES, pipeline_schedule
    from ddlsim.simulator.planner_bounds import ENDS_TOGETHER

    assert set(ENDS_TOGETHER) == set(SCHEDULES)
    checked = 0
    for name in SCHEDULES:
        for stages in (1, 2, 3, 4, 8):
            for chunks in (1, 2, 3) if name == "interleaved" else (1,):
                for micro in range(1, 33):
                    if name == "interleaved" and micro % stages:
                        continue
                    last = [tasks[-1] for tasks in pipeline_schedule(name, stages, micro, chunks)]
                    assert all(task.phase == BACKWARD and task.chunk == 0 for task in last), (name, stages, micro)
                    assert len({task.micro_batch for task in last}) == 1, (name, stages, micro)
                    checked += 1
    assert checked > 300


def test_a_tolerance_times_fewer_layouts_and_keeps_the_best_within_it(capsys):
    """--tolerance 0.05: the search may skip layouts at most 5% faster than its 5th best, so its best is
    within 5% of the exact search's best and it times no more layouts."""
    from ddlsim.simulator import planner

    config = planner.load_model("llama3_8b")
    cluster = planner.Cluster.of("h100_sxm5", 64)
    layouts = list(planner.candidate_layouts(config, cluster, 256))
    exact, _ = planner.branch_and_bound("llama3_8b", config, cluster, layouts, keep=5)
    loose, _ = planner.branch_and_bound("llama3_8b", config, cluster, layouts, keep=5, tolerance=0.05)
    assert len(loose) <= len(exact)
    assert loose[0].figures["tokens_per_s"] * 1.05 >= exact[0].figures["tokens_per_s"]
    assert main(["plan", "--model", "llama3_8b", "--gpus", "64", "--tolerance", "1.5"]) == 2
    assert "--tolerance must be a fraction in [0, 1)" in capsys.readouterr().err


def test_the_software_stack_flags_reach_every_layout(tmp_path, capsys):
    """--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap --no-grad-reduce-in-fp32: the
    same search with NeMo's stack finds faster layouts; so does fp8 with --fp8-attention-and-logits
    (attention core and logits in fp8, not bf16); a bad bucket size is one line and exit 2."""
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    base = ["plan", "--model", "llama3_8b", "--gpus", "64", "--global-batch", "256", "--top", "3", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    stack = ["--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--no-grad-reduce-in-fp32"]
    assert main([*base, *stack, "--out", str(tmp_path / "nemo")]) == 0
    plain, nemo = (read_csv(tmp_path / name / "layouts.csv") for name in ("plain", "nemo"))
    assert float(nemo[0]["tokens_per_s"]) > float(plain[0]["tokens_per_s"])
    fp8 = [*base, "--precision", "fp8"]
    assert main([*fp8, "--out", str(tmp_path / "fp8")]) == 0
    assert main([*fp8, "--fp8-attention-and-logits", "--out", str(tmp_path / "fp8_all")]) == 0
    bf16_core, fp8_core = (read_csv(tmp_path / name / "layouts.csv") for name in ("fp8", "fp8_all"))
    assert float(fp8_core[0]["tokens_per_s"]) > float(bf16_core[0]["tokens_per_s"])
    assert main([*base, "--precision", "fp16", "--out", str(tmp_path / "fp16")]) == 0
    # fp16 reduces its gradients in fp16 by default (Megatron-LM's default outside bf16): no flag needed
    fp16 = read_csv(tmp_path / "fp16" / "layouts.csv")
    assert main([*base, "--precision", "fp16", "--no-grad-reduce-in-fp32", "--out", str(tmp_path / "fp16_flag")]) == 0
    assert read_csv(tmp_path / "fp16_flag" / "layouts.csv") == fp16
    capsys.readouterr()
    assert main([*base, "--overlap-grad-reduce", "--bucket-bytes", "0"]) == 2
    assert "--bucket-bytes must be a size > 0" in capsys.readouterr().err


def test_lora_plans_frozen_weights_and_counts_their_flops(tmp_path, capsys):
    """--frozen-weights (LoRA-style fine-tuning of Llama 2 70B on 16 H100): every layout runs with the
    weights frozen and ZeRO 1-2 drop out (nothing left to shard but what ZeRO 0 holds); the best is
    faster and smaller than full training's; its TFLOP/s count the frozen pass's FLOPs, forward plus
    input gradients (about 2/3 of full training's), so it is not inflated by work never done."""
    import pyarrow.parquet as pq

    from ddlsim.simulator.records import read_csv
    from ddlsim.simulator.workloads.transformer import load_transformer
    from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks

    base = ["plan", "--model", "llama2_70b", "--gpus", "16", "--global-batch", "32", "--top", "1", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "full")]) == 0
    assert "frozen" not in capsys.readouterr().out.splitlines()[1]
    assert main([*base, "--frozen-weights", "--exhaustive", "--out", str(tmp_path / "lora")]) == 0
    assert "base weights frozen (LoRA-style fine-tuning)" in capsys.readouterr().out.splitlines()[1]
    every = pq.read_table(tmp_path / "lora" / "layouts.parquet").to_pylist()
    assert every and {row["zero_stage"] for row in every} == {0, 3}
    from ddlsim.simulator import planner

    cluster = planner.Cluster.of("h100_sxm5", 16, stack=(("frozen_weights", True),))
    layouts = list(planner.candidate_layouts(planner.load_model("llama2_70b"), cluster, 32))
    assert len(layouts) == len(every) and all(layout.frozen_weights for layout in layouts)
    (full,), (lora,) = (read_csv(tmp_path / name / "layouts.csv") for name in ("full", "lora"))
    assert float(lora["tokens_per_s"]) > 1.5 * float(full["tokens_per_s"])
    assert float(lora["memory_GB"]) < float(full["memory_GB"])
    blocks = transformer_blocks(load_transformer("llama2_70b"))
    share = model_flops_per_sample(blocks, frozen_weights=True) / model_flops_per_sample(blocks)
    assert 0.66 < share < 0.72  # 2N forward + 2N input gradients of 6N, plus the attention core's whole backward
    per_token = model_flops_per_sample(blocks, frozen_weights=True) / 4096
    assert float(lora["tflops_per_gpu"]) == pytest.approx(float(lora["tokens_per_s"]) * per_token / 16 / 1e12, rel=1e-3)


def test_nccl_spreads_the_data_parallel_collectives_over_every_nic(tmp_path, capsys):
    """One layout fixed (GPT-3 13B as tp2 dp32 ZeRO 1 on 8 DGX H100): its gradient reduce-scatter and
    weight all-gather are 13e9 / 2 x (4 + 2) B = 39 GB per rank per iteration (fp32 gradients, Megatron's
    default). As one ring per data-parallel group (--collective ring) they leave each node through one
    400 Gb/s NIC (about 47 GB/s of payload), 0.83 s; NCCL's channels (the default on GPUs) use the
    group's 4 NICs (a quarter of that), so the iteration is faster by most of it."""
    from ddlsim.simulator.records import read_csv

    base = ["plan", "--model", "gpt3_13b", "--gpus", "64", "--global-batch", "256", "--tp", "2", "--pp", "1",
            "--cp", "1", "--zero-stage", "1", "--micro-batch", "2", "--recompute", "selective", "--top", "1",
            "--no-progress"]  # fmt: skip
    assert main([*base, "--collective", "ring", "--out", str(tmp_path / "ring")]) == 0
    assert "data-parallel reductions and gathers: ring (one ring per group" in capsys.readouterr().out
    assert main([*base, "--out", str(tmp_path / "nccl")]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("data-parallel reductions and gathers: nccl")
    ring, nccl = (float(read_csv(tmp_path / name / "layouts.csv")[0]["iteration_s"]) for name in ("ring", "nccl"))
    ring_traffic_s = 39e9 / 47e9  # both collectives, unhidden (Megatron's default stack overlaps neither)
    assert ring - nccl > 0.5 * ring_traffic_s, (ring, nccl)
    assert main([*base, "--collective", "nope"]) == 2
    assert "--collective 'nope' is unknown; valid:" in capsys.readouterr().err


def test_a_volta_node_plans_in_fp16_by_default_and_says_what_bf16_would_cost(tmp_path, capsys):
    """V100 has fp16 tensor cores (125 TFLOP/s) and no bf16 units (bf16 runs at its 15.7 TFLOP/s
    fp32 rate): the default is fp16; bf16 asked for is kept and said to be 8x slower at peak. The
    DGX-2's node comes from the datasheet: 16 GPUs on NVSwitch, 8 EDR adapters."""
    from ddlsim.simulator.records import read_csv

    base = ["plan", "--model", "llama3_8b", "--gpus", "32", "--device", "v100_sxm3", "--global-batch", "64",
            "--top", "1", "--no-progress"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    header = capsys.readouterr().out.splitlines()[:2]
    assert header[0].startswith("# llama3_8b on 32 v100_sxm3 (2 nodes of 16, nvswitch, 8 x ib_edr)"), header
    assert header[1].startswith("# precision fp16 (the default: v100_sxm3 has no fast bf16 units); ")
    assert main([*base, "--precision", "bf16", "--out", str(tmp_path / "bf16")]) == 0
    note = capsys.readouterr().out.splitlines()[1]
    assert note.startswith("# precision bf16 as asked; v100_sxm3 has no bf16 units: runs it at 15.7 TFLOP/s, "
                           "--precision fp16 at 125.0; ")
    fp16, bf16 = (float(read_csv(tmp_path / name / "layouts.csv")[0]["tokens_per_s"]) for name in ("default", "bf16"))
    assert fp16 > 3 * bf16  # compute dominates: far from the 8x of the peaks, well past noise
    assert main(["plan", "--model", "llama3_8b", "--gpus", "16", "--top", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("# precision bf16 (the default); ")


@pytest.mark.mpi
def test_an_exhaustive_search_and_its_recheck_run_on_mpi4py_futures_under_mpiexec(tmp_path):
    """A search too big for one machine: ``mpiexec -n 3 python -m mpi4py.futures -m ddlsim plan ...
    --executor-pool mpi --workers 2`` times the layouts and event-simulates the best on the MPI
    workers; the output and the files are the serial search's, byte for byte."""
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("mpi4py")
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH (pip install mpich)")
    argv = [*SMALL[1:], "--top", "3", "--recheck", "2", "--exhaustive"]
    env = dict(os.environ, MPIR_CVAR_POLLS_BEFORE_YIELD="1")
    mpi = subprocess.run(
        [mpiexec, "-n", "3", sys.executable, "-m", "mpi4py.futures", "-m", "ddlsim", "plan",  # as docs/planner.md
         *argv, "--executor-pool", "mpi", "--workers", "2", "--out", str(tmp_path / "mpi")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert mpi.returncode == 0, mpi.stderr[-2000:]
    serial = subprocess.run(
        [sys.executable, "-m", "ddlsim", "plan", *argv, "--executor-pool", "serial", "--out", str(tmp_path / "serial")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert serial.returncode == 0, serial.stderr
    assert mpi.stdout.replace(str(tmp_path / "mpi"), "OUT") == serial.stdout.replace(str(tmp_path / "serial"), "OUT")
    assert "# event simulation of the best layouts" in serial.stdout
    for name in ("layouts.csv", "layouts.parquet"):
        assert (tmp_path / "mpi" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()


def test_branch_and_bound_times_and_bounds_a_changed_model_as_the_row_has_it():
    """A published run's changes to the catalog model (here a doubled sequence length and a larger
    vocabulary) reach the bounds and the timing alike: the top 3 are those of timing every layout with
    the changes, every bound is below its layout's time, and layouts are still pruned. (The bounds once
    probed the catalog model: half the time, so nothing could be pruned.)"""
    import dataclasses

    from ddlsim.simulator import planner
    from ddlsim.simulator.planner_bounds import LowerBounds

    model, changes = "llama3_8b", (("seq_len", 16384), ("vocabulary", 200000), ("max_positions", 16384))
    config = dataclasses.replace(planner.load_model(model), **dict(changes))
    cluster = planner.Cluster.of("h100_sxm5", 64)
    every = list(planner.candidate_layouts(config, cluster, 128))
    layouts = random.Random(3).sample(every, min(150, len(every)))
    ranked, candidates = planner.branch_and_bound(model, config, cluster, layouts, keep=3, changes=changes)
    fitting = [c.layout for c in planner.screen(config, cluster, layouts) if not c.reason]
    timed = {planner.layout_text(layout): planner.closed_form_figures((model, cluster, layout, changes))["iteration_s"]
             for layout in fitting}  # fmt: skip
    best = sorted(timed, key=timed.__getitem__)[:3]
    assert [planner.layout_text(c.layout) for c in ranked[:3]] == best
    bounds = LowerBounds(model, config, cluster, changes).bounds(fitting)
    ratios = sorted(bound / timed[planner.layout_text(layout)] for layout, bound in zip(fitting, bounds, strict=True))
    assert ratios[-1] <= 1 + 1e-12  # a lower bound
    assert ratios[len(ratios) // 2] > 0.9  # and a tight one (0.42 when the probes missed the changes)
    assert any(c.reason.startswith("pruned") for c in candidates)
