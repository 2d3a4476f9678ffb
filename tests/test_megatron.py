"""The megatron training algorithm (transformer layouts): the event simulation equals the closed form
where nothing contends, the pipeline bubble comes out of the schedule, and the breakdown adds up."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ddlsim.algorithms.megatron_training import coordinates, data_parallel_group, rank_of
from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError, make_options
from ddlsim.simulator.closed_form.costs import ClosedFormCosts
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.executor.des import NOTE_RANKS, fallback_note, note_on_stderr, run_des
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.training.setup import setup_of

BREAKDOWN = ("compute_s", "tp_s", "cp_s", "ep_s", "zero3_s", "pipeline_wait_s", "dp_wait_s")


def scenario(nodes: int = 2, per_node: int = 4, workload: str = "gpt2", **layout) -> Scenario:
    """A100 nodes of ``per_node`` GPUs on NVSwitch, one HDR NIC per GPU (no two ranks share a port)."""
    layout = {"micro_batch": 1, **layout}
    return Scenario(
        workload=workload, device="a100_sxm4", devices_per_node=per_node, intra_node="nvswitch2",
        network="ib_hdr", nics_per_node=per_node, nodes=(nodes,), precision="bf16", algorithm="megatron",
        options=make_options("megatron", {"layout": layout}),
    )  # fmt: skip


LAYOUTS = [
    {"tp": 2, "pp": 2, "global_batch": 8},
    {"tp": 4, "pp": 2, "global_batch": 8, "sequence_parallel": True},
    {"tp": 1, "pp": 4, "global_batch": 16, "virtual_stages": 3},
    {"tp": 2, "pp": 2, "global_batch": 8, "zero_stage": 1},
    {"tp": 2, "pp": 1, "global_batch": 8, "zero_stage": 3},
    {"tp": 2, "pp": 2, "global_batch": 8, "recompute": "full", "schedule": "gpipe"},
    {"tp": 2, "pp": 2, "cp": 2, "global_batch": 4},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(sorted(layout.items())) for layout in LAYOUTS])
def test_the_event_simulation_equals_the_closed_form_without_contention(layout):
    point = scenario(**layout)
    des = run_des(point, 2).result
    closed = closed_form_result(point, 2)
    assert des.path == "vectorised"
    assert des.iteration_s == pytest.approx(closed.iteration_s, rel=1e-9)


def overlapped(point: Scenario, **options) -> Scenario:
    values = {"layout": point.options.layout, **options}
    return dataclasses.replace(point, options=make_options("megatron", values))


OVERLAPS = [
    ({"tp": 2, "pp": 2, "global_batch": 8, "zero_stage": 1}, {"overlap_grad_reduce": True}),
    ({"tp": 2, "pp": 2, "global_batch": 8, "zero_stage": 1}, {"overlap_param_gather": True}),
    ({"tp": 1, "pp": 4, "global_batch": 16, "virtual_stages": 3, "zero_stage": 1},
     {"overlap_grad_reduce": True, "overlap_param_gather": True, "bucket_bytes": 20e6}),
    ({"tp": 2, "pp": 1, "global_batch": 8}, {"overlap_grad_reduce": True, "bucket_bytes": 5e6}),
]  # fmt: skip


@pytest.mark.parametrize(("layout", "options"), OVERLAPS, ids=[str(sorted(o.items())) for _, o in OVERLAPS])
def test_overlapped_reductions_and_gathers_agree_in_both_executors_and_hide_time(layout, options):
    plain = scenario(**layout)
    point = overlapped(plain, **options)
    des = run_des(point, 2).result
    closed = closed_form_result(point, 2)
    if layout.get("virtual_stages", 1) > 1:
        # the reductions run while the pipeline's messages leave the same ports: the event simulation
        # sees the contention (and takes the message path); the closed form, which has none, is a bound
        assert des.path == "message"
        assert closed.iteration_s < des.iteration_s < 1.01 * closed.iteration_s
    else:
        assert des.iteration_s == pytest.approx(closed.iteration_s, rel=1e-9)
    assert closed.iteration_s < closed_form_result(plain, 2).iteration_s  # something was hidden
    steady = run_des(dataclasses.replace(point, updates=3), 2).result  # every iteration costs the same
    assert steady.iteration_s == pytest.approx(des.iteration_s, rel=1e-6)


def test_a_point_re_run_message_by_message_says_so_and_why(capsys):
    """The interleaved layout above takes the message path: the user is told before the re-run, with
    the fast path's reason; the default notice stays quiet for a point this small."""
    point = overlapped(scenario(tp=1, pp=4, global_batch=16, virtual_stages=3, zero_stage=1),
                       overlap_grad_reduce=True, bucket_bytes=20e6)  # fmt: skip
    told: list[tuple[int, str, bool]] = []
    des = run_des(point, 2, note=lambda *said: told.append(said)).result
    assert des.path == "message"
    assert len(told) == 1 and told[0][0] == des.devices and "collective" in told[0][1]
    assert told[0][2]  # megatron has a closed form: the note offers it
    assert "8 ranks" in fallback_note(*told[0]) and told[0][1] in fallback_note(*told[0])
    assert "--executor analytic" in fallback_note(*told[0])
    assert "--executor analytic" not in fallback_note(8, told[0][1], closed_form=False)
    note_on_stderr(*told[0])
    note_on_stderr(NOTE_RANKS, told[0][1])
    lines = capsys.readouterr().err.splitlines()
    assert lines == [fallback_note(NOTE_RANKS, told[0][1])]
    quiet = run_des(scenario(tp=2, pp=2, global_batch=8), 2, note=lambda *said: told.append(said)).result
    assert quiet.path == "vectorised" and len(told) == 1


def test_overlapped_reduction_leaves_one_bucket_exposed_when_the_network_is_fast():
    """Data parallelism only (pp 1) over one node's NVSwitch: without overlap the whole reduction
    follows the backward; with it the buckets reduce while the last backward runs, and what shows is
    the last bucket's."""
    plain = scenario(nodes=1, per_node=8, tp=1, pp=1, global_batch=16, micro_batch=2)
    point = overlapped(plain, overlap_grad_reduce=True, bucket_bytes=10e6)
    costs = ClosedFormCosts(setup_of(point, 1))
    trainer = costs.trainer(0)
    ((payload, collective, _),) = trainer.chunk_gradients(0)
    group = tuple(range(8))
    whole = costs.collective_s(collective, "ring", 8, payload.nbytes, {}, group=group)
    buckets = trainer.chunk_buckets(0, 10e6)
    assert buckets == math.ceil(payload.nbytes / 10e6) > 4
    backward = trainer.stage_backward(0, 0, None).duration_s
    last_bucket = costs.collective_s(collective, "ring", 8, payload.nbytes / buckets, {}, group=group)
    assert whole - last_bucket < backward * (buckets - 1) / buckets  # each bucket's reduction keeps up
    hidden = closed_form_result(plain, 1).iteration_s - closed_form_result(point, 1).iteration_s
    assert hidden == pytest.approx(whole - last_bucket, rel=1e-6)


def test_gradients_reduced_in_16_bits_halve_the_reduction():
    layout = {"tp": 2, "pp": 1, "global_batch": 8, "zero_stage": 1}
    fp32 = ClosedFormCosts(setup_of(scenario(**layout), 2)).trainer(0).chunk_gradients(0)
    bf16 = ClosedFormCosts(setup_of(scenario(**layout, grad_reduce_in_fp32=False), 2)).trainer(0).chunk_gradients(0)
    assert bf16[0][0].nbytes == pytest.approx(fp32[0][0].nbytes / 2)


def test_a_mixture_of_experts_with_expert_parallelism_runs_and_agrees():
    point = scenario(nodes=2, per_node=8, workload="mixtral_8x7b", tp=2, pp=2, ep=2, global_batch=8,
                     sequence_parallel=True, zero_stage=1)  # fmt: skip
    point = dataclasses.replace(point, enforce_memory=False)
    des = run_des(point, 2).result
    assert des.iteration_s == pytest.approx(closed_form_result(point, 2).iteration_s, rel=1e-9)
    assert des.layout is not None and des.layout["ep_s"] > 0


def test_the_breakdown_adds_up_to_the_iteration():
    result = run_des(scenario(tp=2, pp=2, global_batch=8, zero_stage=1), 2).result
    row = result.row(1)
    assert sum(row[name] for name in BREAKDOWN) == pytest.approx(row["iteration_s"], rel=1e-9)
    assert row["tp_s"] > 0 and row["pipeline_wait_s"] > 0 and row["dp_wait_s"] > 0
    assert 0 < row["mfu"] < 1
    assert row["tflops_per_gpu"] == pytest.approx(row["mfu"] * 312.0, rel=1e-6)  # A100 bf16 peak: 312 TFLOP/s


def test_a_profiles_transformer_slowdown_scales_the_iteration_in_both_executors():
    """``ddlsim calibrate`` on large-model rows fits ``transformer_slowdown`` (measured over closed-form
    iteration time); a simulation under that profile is that much slower, every part of its breakdown
    with it (simulate had ignored it and printed the uncalibrated time)."""
    from ddlsim.hardware_models.profile import Profile

    plain = scenario(tp=2, pp=2, global_batch=8, zero_stage=1)
    calibrated = dataclasses.replace(plain, profile=Profile(transformer_slowdown=1.5))
    for run in (lambda point: run_des(point, 2).result, lambda point: closed_form_result(point, 2)):
        before, after = run(plain).row(1), run(calibrated).row(1)
        assert after["iteration_s"] == pytest.approx(1.5 * before["iteration_s"], rel=1e-9)
        assert after["mfu"] == pytest.approx(before["mfu"] / 1.5, rel=1e-9)
        parts = [name for name in BREAKDOWN if before[name] is not None]  # the closed form has no waits
        assert "compute_s" in parts and "tp_s" in parts
        for name in parts:
            assert after[name] == pytest.approx(1.5 * before[name], rel=1e-9, abs=1e-15), name
        if len(parts) == len(BREAKDOWN):
            assert sum(after[name] for name in BREAKDOWN) == pytest.approx(after["iteration_s"], rel=1e-9)


def test_more_micro_batches_shrink_the_bubble_and_interleaving_shrinks_it_more():
    """Narayanan et al. SC21: an iteration of m micro-batches takes (m + p - 1) slowest-stage steps
    with 1F1B, m + (p - 1) / v interleaved: time per micro-batch falls with m, and with v. (GPT-2's
    output head makes the last stage the slowest by far, so the fall is smaller than 1.75 -> 1.09.)"""

    def per_micro_batch(global_batch: int, **layout) -> float:
        result = run_des(scenario(nodes=1, per_node=4, tp=1, pp=4, global_batch=global_batch, **layout), 1).result
        return result.iteration_s / global_batch

    few, many = per_micro_batch(4), per_micro_batch(32)
    assert many < 0.85 * few
    assert per_micro_batch(32, virtual_stages=3) < many


def test_ranks_and_groups_follow_megatron_order():
    """tp fastest, then cp, dp, pp: the tensor group is consecutive ranks, a data group strides over them."""
    layout = make_options("megatron", {"layout": {"tp": 2, "pp": 2, "dp": 2, "cp": 2}}).layout
    assert [tuple(vars(coordinates(rank, layout)).values()) for rank in (0, 1, 2, 5, 15)] == [
        (0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 0), (1, 1, 1, 1),
    ]  # fmt: skip
    assert all(rank_of(coordinates(rank, layout), layout) == rank for rank in range(16))
    assert data_parallel_group(5, layout) == (1, 3, 5, 7)


@pytest.mark.parametrize(
    ("layout", "nodes", "message"),
    [
        ({"tp": 3}, 1, "do not divide into tp x pp x cp"),
        ({"tp": 8, "pp": 1, "dp": 3}, 2, "does not match 8 GPUs"),
        ({"tp": 4, "pp": 5}, 5, "are not divisible by pp x virtual_stages"),
        ({"tp": 8, "pp": 1}, 2, r"attention heads \(12\) of bert_base are not divisible by tp \(8\)"),
    ],
)
def test_impossible_layouts_are_one_clear_error(layout, nodes, message):
    with pytest.raises((ScenarioError, TrainingAlgorithmError), match=message):
        point = scenario(nodes=nodes, per_node=4, workload="bert_base", **layout)
        closed_form_result(point, nodes)


def test_a_layout_that_does_not_fit_says_where_the_memory_goes():
    point = scenario(nodes=1, per_node=8, workload="llama2_70b", tp=8, pp=1, global_batch=8)
    with pytest.raises(ScenarioError, match=r"does not fit: llama2_70b .* optimizer states .* GB"):
        closed_form_result(point, 1)
    assert closed_form_result(dataclasses.replace(point, enforce_memory=False), 1).iteration_s > 0


def test_a_transformer_needs_the_megatron_algorithm():
    with pytest.raises(ScenarioError, match="train it with --algorithm megatron"):
        Scenario(workload="gpt2", device="a100_sxm4", nodes=(1,))
    with pytest.raises(ScenarioError, match="trains a transformer"):
        Scenario(workload="resnet50", algorithm="megatron", nodes=(1,))


@pytest.mark.parametrize(
    ("workload", "layout", "nodes", "message"),
    [
        ("llama3_8b", "tp = 8\npp = 2\ndp = 3", 2,
         "megatron: tp x pp x dp x cp = 8 x 2 x 3 x 1 = 48 does not match 16 GPUs"),
        ("llama3_8b", "tp = 3\npp = 2\ndp = 4", 3, "attention heads (32) of llama3_8b are not divisible by tp (3)"),
        ("llama3_8b", "tp = 8\npp = 2\nvirtual_stages = 3", 2,
         "layers (32) of llama3_8b are not divisible by pp x virtual_stages = 2 x 3 = 6"),
        ("llama9_8b", "tp = 8\npp = 2", 2, "unknown workload 'llama9_8b'; valid: layer tables alexnet"),
    ],
)  # fmt: skip
def test_bad_layouts_on_the_command_line_are_one_line_and_exit_2(tmp_path, capsys, workload, layout, nodes, message):
    from ddlsim.simulator.cli.main import main

    path = tmp_path / "layout.toml"
    path.write_text(
        f'workload = "{workload}"\nalgorithm = "megatron"\ndevice = "h100_sxm5"\n'
        f"[options.layout]\n{layout}\nglobal_batch = 16\nmicro_batch = 1\n"
    )
    out = tmp_path / "out"
    code = main(["simulate", "--scenario", str(path), "--nodes", str(nodes), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"ddlsim: error: {message}") and err.count("\n") == 1, err
    assert not out.exists()


def test_a_scenario_file_naming_a_device_gets_its_catalog_node_and_a_layout_header(tmp_path, capsys):
    """A file that names h100_sxm5 but not its node runs on a DGX H100 (8 GPUs on NVSwitch, NDR NICs),
    as the --device flag does, and the header states the layout's batch, not a per-device batch."""
    from ddlsim.simulator.cli.main import main

    path = tmp_path / "layout.toml"
    path.write_text(
        'workload = "llama3_8b"\nalgorithm = "megatron"\ndevice = "h100_sxm5"\n'
        "[options.layout]\ntp = 8\npp = 2\nglobal_batch = 16\nmicro_batch = 2\n"
    )
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(path), "--nodes", "2", "--out", str(out)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "h100_sxm5 x 8/node (nvswitch3), ib_ndr switch" in header, header
    assert "tp8xpp2, micro-batch 2, global batch 16 sequences" in header, header
    saved = json.loads((out / "scenario.json").read_text())["scenario"]
    assert saved["intra_node"] == "nvswitch3" and saved["network"] == "ib_ndr" and saved["nics_per_node"] == 8


@pytest.mark.parametrize(("per_node", "tp", "pp", "dp"), [(2, 2, 2, 2), (1, 1, 2, 2), (2, 2, 4, 2)])
def test_a_pipeline_with_data_parallelism_runs_on_the_round_path_exactly(per_node, tp, pp, dp):
    """A stage's receiver link carries the next stage's messages, then the stage's DP reduce-scatter
    while the next stage still runs its own: the round path proves that free (the messages' ends are
    known) and gives the message path's time, instead of falling back on every such layout."""
    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.simulator.executor.des import run_des
    from ddlsim.simulator.scenario import Scenario

    nodes = tp * pp * dp // per_node
    layout = {"tp": tp, "pp": pp, "dp": dp, "global_batch": 8 * dp, "micro_batch": 1, "zero_stage": 1}
    scenario = Scenario(
        workload="gpt2", algorithm="megatron", device="h100_sxm5", devices_per_node=per_node,
        intra_node="nvswitch3" if per_node > 1 else None, network="ib_ndr", nics_per_node=per_node,
        precision="bf16", nodes=[nodes], options=make_options("megatron", {"layout": layout}),
    )  # fmt: skip
    rounds = run_des(scenario, nodes, mode="vectorised")
    messages = run_des(scenario, nodes, mode="message")
    assert rounds.result.iteration_s == pytest.approx(messages.result.iteration_s, rel=1e-9)
    assert run_des(scenario, nodes).result.path == "vectorised"


def test_interleaving_with_uneven_end_stages_runs_and_the_des_equals_the_closed_form():
    """Llama 3 405B's shape in small: GPT-2's 12 layers on 3 stages as 3, 6, 3, two chunks each
    (2+1, 3+3, 2+1 layers): it runs as an interleaved schedule (a timeline of its own) and both executors agree."""
    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.simulator.closed_form.training import closed_form_result
    from ddlsim.simulator.executor.des import run_des
    from ddlsim.simulator.scenario import Scenario

    def scenario(virtual: int) -> Scenario:
        layout = {"tp": 1, "pp": 3, "dp": 1, "global_batch": 6, "micro_batch": 1, "virtual_stages": virtual,
                  "first_stage_layers": 3, "last_stage_layers": 3}  # fmt: skip
        return Scenario(workload="gpt2", algorithm="megatron", device="h100_sxm5", devices_per_node=1,
                        intra_node=None, network="ib_ndr", precision="bf16", nodes=[3],
                        options=make_options("megatron", {"layout": layout}))  # fmt: skip

    interleaved = run_des(scenario(2), 3).result
    assert interleaved.iteration_s == pytest.approx(closed_form_result(scenario(2), 3).iteration_s, rel=1e-9)
    plain = run_des(scenario(1), 3).result
    assert interleaved.iteration_s != pytest.approx(plain.iteration_s, rel=1e-3)


def test_layout_flags_set_the_layout_field_by_field(tmp_path, capsys):
    """--tp/--pp/... on the command line give the same run as a scenario file with that layout, change
    a file's layout one field at a time, default a transformer to bf16, and are refused for sync SGD."""
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    flags = ["--algorithm", "megatron", "--workload", "llama3_8b", "--device", "h100_sxm5", "--tp", "8", "--pp", "2",
             "--global-batch", "16", "--nodes", "4", "--no-progress"]  # fmt: skip
    assert main(["simulate", *flags, "--out", str(tmp_path / "flags")]) == 0
    path = tmp_path / "layout.toml"
    path.write_text('workload = "llama3_8b"\nalgorithm = "megatron"\ndevice = "h100_sxm5"\nprecision = "bf16"\n'
                    "[options.layout]\ntp = 8\npp = 2\ndp = 2\nglobal_batch = 16\n")  # fmt: skip
    assert main(["simulate", "--scenario", str(path), "--nodes", "4", "--out", str(tmp_path / "file")]) == 0
    by_flags, by_file = read_csv(tmp_path / "flags" / "results.csv"), read_csv(tmp_path / "file" / "results.csv")
    assert by_flags[0]["iteration_s"] == by_file[0]["iteration_s"]
    saved = json.loads((tmp_path / "flags" / "scenario.json").read_text())["scenario"]
    assert saved["precision"] == "bf16" and saved["options"]["layout"]["dp"] == 0  # 0: what the GPUs leave
    changed = tmp_path / "changed"
    assert main(["simulate", "--scenario", str(path), "--nodes", "4", "--zero-stage", "1", "--out", str(changed)]) == 0
    layout = json.loads((changed / "scenario.json").read_text())["scenario"]["options"]["layout"]
    assert (layout["tp"], layout["pp"], layout["dp"], layout["zero_stage"]) == (8, 2, 2, 1)
    capsys.readouterr()
    assert main(["simulate", "--tp", "2", "--nodes", "2"]) == 2
    assert "--tp do(es) not apply to --algorithm sync_sgd" in capsys.readouterr().err


def test_megatron_on_gpus_reduces_through_nccl_unless_told_otherwise(tmp_path):
    """The planner's stack: on GPUs the data-parallel collectives run as NCCL does, its channels over
    every NIC (a data-parallel-heavy layout is faster than one ring through one NIC); --collective
    ring keeps the single ring, and a CPU's default stays the ring."""
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    flags = ["--algorithm", "megatron", "--workload", "gpt2", "--device", "h100_sxm5", "--global-batch", "32",
             "--nodes", "2", "--executor", "analytic", "--no-progress"]  # fmt: skip
    assert main(["simulate", *flags, "--out", str(tmp_path / "default")]) == 0
    assert main(["simulate", *flags, "--collective", "ring", "--out", str(tmp_path / "ring")]) == 0
    saved = {name: json.loads((tmp_path / name / "scenario.json").read_text())["scenario"]["options"]["collective"]
             for name in ("default", "ring")}  # fmt: skip
    assert saved == {"default": "nccl", "ring": "ring"}
    nccl, ring = (float(read_csv(tmp_path / name / "results.csv")[0]["iteration_s"]) for name in ("default", "ring"))
    assert nccl < ring
    cpu = ["--algorithm", "megatron", "--workload", "gpt_tiny", "--device", "local_cpu", "--global-batch", "2",
           "--nodes", "2", "--executor", "analytic", "--no-progress", "--out", str(tmp_path / "cpu")]  # fmt: skip
    assert main(["simulate", *cpu]) == 0
    assert json.loads((tmp_path / "cpu" / "scenario.json").read_text())["scenario"]["options"]["collective"] == "ring"


def test_overlap_and_gradient_type_flags_reach_the_run_and_hide_communication(tmp_path, capsys):
    """--overlap-grad-reduce, --overlap-param-gather and --no-grad-reduce-in-fp32 are saved with the
    scenario and make a data-parallel-heavy layout faster; sync SGD refuses them."""
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    flags = ["--algorithm", "megatron", "--workload", "gpt2", "--device", "h100_sxm5", "--tp", "2", "--global-batch",
             "64", "--zero-stage", "1", "--nodes", "2", "--executor", "analytic", "--no-progress"]  # fmt: skip
    assert main(["simulate", *flags, "--out", str(tmp_path / "plain")]) == 0
    extra = ["--overlap-grad-reduce", "--overlap-param-gather", "--no-grad-reduce-in-fp32"]
    assert main(["simulate", *flags, *extra, "--out", str(tmp_path / "overlapped")]) == 0
    plain = read_csv(tmp_path / "plain" / "results.csv")[0]
    fast = read_csv(tmp_path / "overlapped" / "results.csv")[0]
    assert float(fast["iteration_s"]) < float(plain["iteration_s"])
    assert float(fast["compute_s"]) == pytest.approx(float(plain["compute_s"]))
    saved = json.loads((tmp_path / "overlapped" / "scenario.json").read_text())["scenario"]["options"]
    assert saved["overlap_grad_reduce"] and saved["overlap_param_gather"]
    assert saved["layout"]["grad_reduce_in_fp32"] is False
    capsys.readouterr()
    assert main(["simulate", "--overlap-grad-reduce", "--nodes", "2"]) == 2
    assert "--overlap-grad-reduce do(es) not apply to --algorithm sync_sgd" in capsys.readouterr().err


def test_hopper_nodes_reach_their_nics_over_pcie5_so_a_data_parallel_reduction_runs_at_the_nic_rate():
    """DGX H100: a GPU's ConnectX-7 (400 Gb/s, 47.5 GB/s of payload) sits on PCIe 5.0; over PCIe 4.0
    (25.2 GB/s of payload) the network could never be filled."""
    point = dataclasses.replace(scenario(nodes=2, per_node=8, tp=1, pp=1, global_batch=16), device="h100_sxm5",
                                intra_node="nvswitch3", network="ib_ndr")  # fmt: skip
    costs = ClosedFormCosts(setup_of(point, 2))
    assert costs.fabric.inter.beta_Bps == pytest.approx(50e9 * 0.95)


def test_tensor_parallel_overlap_shows_only_what_exceeds_each_matrix_product():
    """With tp_comm_overlap a part's TP collectives hide under that part's own compute: the chunk's
    exposed TP seconds are sum(max(0, tp - compute)) over its parts; tp 1 refuses the option."""
    from ddlsim.algorithms.parallel_layout import LayoutError, check_layout
    from ddlsim.simulator.workloads.transformer import load_transformer

    plain = scenario(nodes=1, per_node=4, tp=4, pp=1, global_batch=4, sequence_parallel=True)
    point = dataclasses.replace(plain, options=make_options(
        "megatron", {"layout": dataclasses.replace(plain.options.layout, tp_comm_overlap=True)}))  # fmt: skip
    slow, fast = (ClosedFormCosts(setup_of(p, 1)).transformer for p in (plain, point))
    layer = next(block for block in slow.blocks if block.kind == "layer")
    expected = sum(max(0.0, slow._tp_s(part, 0, False) - slow._part_s(part, layer, False)) for part in layer.parts)
    assert slow.block_cost(layer, 0).forward_tp > fast.block_cost(layer, 0).forward_tp
    assert fast.block_cost(layer, 0).forward_tp == pytest.approx(expected, abs=1e-15)
    assert fast.block_cost(layer, 0).forward_compute == slow.block_cost(layer, 0).forward_compute
    assert closed_form_result(point, 1).iteration_s < closed_form_result(plain, 1).iteration_s
    with pytest.raises(LayoutError, match="tp_comm_overlap needs tp > 1"):
        single = dataclasses.replace(plain.options.layout, tp=1, dp=1, sequence_parallel=False, tp_comm_overlap=True)
        check_layout(single, load_transformer("gpt2"))


def test_full_recomputation_repeats_the_forward_collectives_and_selective_does_not():
    """Megatron's checkpointed layer runs its whole forward again before the backward, tensor-parallel
    all-reduces included (2 a layer with TP 4, no SP): under ``full`` the backward's TP seconds are its own
    plus the forward's; ``selective`` redoes only the attention core, which has no collective."""
    def layer_cost(recompute: str):
        point = scenario(nodes=1, per_node=4, tp=4, pp=1, global_batch=4, recompute=recompute)
        costs = ClosedFormCosts(setup_of(point, 1)).transformer
        return costs.block_cost(next(block for block in costs.blocks if block.kind == "layer"), 0)

    none, selective, full = layer_cost("none"), layer_cost("selective"), layer_cost("full")
    assert none.forward_tp > 0 and none.backward_tp > 0
    assert full.backward_tp == pytest.approx(none.backward_tp + none.forward_tp, rel=1e-12)
    assert selective.backward_tp == none.backward_tp
    assert full.forward_tp == selective.forward_tp == none.forward_tp
    assert full.backward_compute > selective.backward_compute > none.backward_compute


def test_full_recomputation_repeats_an_expert_layer_s_all_to_alls():
    """The dispatch and combine of a mixture-of-experts layer are part of its forward: recomputed under
    ``full``, the backward pays them twice (its own gradients' and the recomputed forward's)."""
    def expert_seconds(recompute: str) -> tuple[float, float]:
        point = scenario(nodes=1, per_node=8, workload="mixtral_8x7b", tp=1, pp=1, ep=8, global_batch=8,
                         recompute=recompute)  # fmt: skip
        point = dataclasses.replace(point, enforce_memory=False)
        chunk = ClosedFormCosts(setup_of(point, 1)).transformer._chunk_cost(0, 0)
        return chunk.forward_parts["ep"], chunk.backward_parts["ep"]

    (plain_forward, plain_backward), (full_forward, full_backward) = expert_seconds("none"), expert_seconds("full")
    assert plain_forward > 0 and plain_backward == pytest.approx(plain_forward)
    assert full_forward == plain_forward
    assert full_backward == pytest.approx(2 * plain_backward, rel=1e-12)


def test_a_fixed_cost_per_kernel_adds_on_a_cpu_and_floors_an_accelerator():
    """launch_s of the profile's compute model: on a CPU (dispatch and compute on one core) every
    part's pass pays it on top, forward once and backward twice for a part with weights; on a GPU
    it only bounds a pass from below (kernels run while the host issues the next)."""
    from ddlsim.hardware_models.profile import ComputeFit, Profile

    def costs(device: str, launch_s: float):
        point = dataclasses.replace(scenario(nodes=1, per_node=1, workload="gpt_tiny", tp=1, pp=1, global_batch=1),
                                    device=device, intra_node=None, network="local_shm", host_link=None,
                                    precision="fp32", profile=Profile(compute=ComputeFit({f"launch_s.{kind}": launch_s
                                    for kind in ("cpu", "gpu")})))  # fmt: skip
        return ClosedFormCosts(setup_of(point, 1)).transformer

    plain, paid = costs("local_cpu", 0.0), costs("local_cpu", 1e-3)
    layer = next(block for block in plain.blocks if block.kind == "layer")
    weighted = sum(1 for part in layer.parts if part.parameters)
    extra_forward = paid.block_cost(layer, 0).forward_compute - plain.block_cost(layer, 0).forward_compute
    extra_backward = paid.block_cost(layer, 0).backward_compute - plain.block_cost(layer, 0).backward_compute
    assert extra_forward == pytest.approx(len(layer.parts) * 1e-3)
    assert extra_backward == pytest.approx((len(layer.parts) + weighted) * 1e-3)
    gpu_plain, gpu_floor = costs("a100_sxm4", 0.0), costs("a100_sxm4", 1e-9)
    assert gpu_floor.block_cost(layer, 0).forward_compute == gpu_plain.block_cost(layer, 0).forward_compute
    gpu_bound = costs("a100_sxm4", 1.0)  # one second per kernel: every pass is launch bound
    assert gpu_bound.block_cost(layer, 0).forward_compute == pytest.approx(len(layer.parts))


def test_an_attention_core_without_flash_attention_pays_for_its_score_traffic():
    """Megatron's 22B on TP 8 of an A100: a rank's 8 heads hold 8 x 2048^2 score elements a sequence.
    FlashAttention keeps them on chip, so its core is compute-bound (2 s^2 a (d_qk + d_v) / 8 FLOPs at
    0.64 x 312 TFLOP/s); without it the forward moves 13 bytes an element plus the rank's Q, K and V
    (2 bytes each of 3 x 2048 x 768), at 0.85 x 2039 GB/s, and its backward 19 bytes plus twice those.
    Nothing else in the layer changes."""
    def layer_cost(flash: bool):
        point = scenario(nodes=1, per_node=8, workload="megatron_22b", tp=8, global_batch=1, flash_attention=flash)
        point = dataclasses.replace(point, device="a100_sxm4_80gb", nics_per_node=8)
        costs = ClosedFormCosts(setup_of(point, 1)).transformer
        return costs.block_cost(next(block for block in costs.blocks if block.kind == "layer"), 0)

    flash, unfused = layer_cost(True), layer_cost(False)
    elements, qkv = 8 * 2048**2, 2.0 * 3 * 2048 * 768
    bandwidth, compute = 0.85 * 2039e9, 0.64 * 312e12
    core_flops = 2 * 2048**2 * 64 * (96 + 96) / 8
    forward = (13 * elements + qkv) / bandwidth - core_flops / compute
    backward = (19 * elements + 2 * qkv) / bandwidth - 2 * core_flops / compute
    assert unfused.forward_compute - flash.forward_compute == pytest.approx(forward, rel=1e-3)
    assert unfused.backward_compute - flash.backward_compute == pytest.approx(backward, rel=1e-3)


def test_zero3_without_prefetch_pays_every_gather_and_reduce_scatter():
    """--no-zero3-prefetch (FSDP without forward/backward prefetch): a block's gathers and its
    gradient reduce-scatter add to its time instead of hiding under its compute."""
    layout = {"tp": 1, "pp": 1, "global_batch": 16, "zero_stage": 3}
    prefetched = scenario(nodes=2, per_node=4, **layout)
    plain = scenario(nodes=2, per_node=4, **layout, zero3_prefetch=False)
    setup = setup_of(plain, 2)
    costs = ClosedFormCosts(setup).transformer
    layer = next(block for block in costs.blocks if block.kind == "layer")
    cost = costs.block_cost(layer, 0)
    group = data_parallel_group(0, setup.plan.options.layout)  # dp 8: the whole run
    gathered = costs.group_s("allgather", cost.dense_parameters * costs.weight_bytes, group)
    scattered = costs.group_s("reduce_scatter", cost.dense_parameters * 4.0, group)
    assert costs.zero3_exposed_s(cost.dense_parameters, group, cost.forward_compute, False) == gathered
    assert costs.zero3_exposed_s(cost.dense_parameters, group, cost.backward_compute, True) == gathered + scattered
    assert closed_form_result(plain, 2).iteration_s > closed_form_result(prefetched, 2).iteration_s
    assert run_des(plain, 2).result.iteration_s == pytest.approx(closed_form_result(plain, 2).iteration_s, rel=1e-9)


def test_fp8_runs_the_linear_layers_in_fp8_and_the_attention_core_and_logits_in_bf16():
    """Megatron-Core under fp8: Transformer Engine's linear layers at the fp8 peak; the attention
    core (fp8_dot_product_attention off) and the output layer (a plain ColumnParallelLinear) at the
    bf16 peak, which is half the H100's fp8 peak; fp8_attention_and_logits runs those in fp8 too."""
    from ddlsim.algorithms.parallel_layout import LayoutError, check_layout
    from ddlsim.hardware_models.catalog import load_device
    from ddlsim.simulator.workloads.transformer import load_transformer

    h100 = load_device("h100_sxm5")
    assert h100.peak_flops_for("fp8") == pytest.approx(2 * h100.peak_flops_for("bf16"), rel=1e-3)

    def costs(precision: str, **layout):
        base = scenario(nodes=1, per_node=8, workload="llama2_7b", tp=1, pp=1, global_batch=8, **layout)
        point = dataclasses.replace(base, device="h100_sxm5", intra_node="nvswitch3", network="ib_ndr",
                                    precision=precision, enforce_memory=False)  # fmt: skip
        return ClosedFormCosts(setup_of(point, 1)).transformer

    bf16, fp8 = costs("bf16"), costs("fp8")
    everything = costs("fp8", fp8_attention_and_logits=True)
    layer = next(block for block in bf16.blocks if block.kind == "layer")
    output = next(block for block in bf16.blocks if block.kind == "output")
    qkv, core, logits = layer.part("attention_qkv"), layer.part("attention_core"), output.part("logits")
    for backward in (False, True):  # all three are compute-bound at 4096 tokens a sample
        assert fp8._part_s(qkv, layer, backward) == pytest.approx(bf16._part_s(qkv, layer, backward) / 2, rel=1e-3)
        for part, block in ((core, layer), (logits, output)):
            assert fp8._part_s(part, block, backward) == pytest.approx(bf16._part_s(part, block, backward))
            assert everything._part_s(part, block, backward) == pytest.approx(
                bf16._part_s(part, block, backward) / 2, rel=1e-3)  # fmt: skip
    assert [fp8.part_precision(part) for part in (qkv, core, logits)] == ["fp8", "bf16", "bf16"]
    with pytest.raises(LayoutError, match="fp8_attention_and_logits needs precision fp8, got 'bf16'"):
        check_layout(dataclasses.replace(bf16.layout, fp8_attention_and_logits=True), load_transformer("llama2_7b"))


def test_frozen_weights_compute_input_gradients_only_and_reduce_and_update_nothing():
    """LoRA-style fine-tuning (``frozen_weights``): every product with weights does half its usual
    backward (its input gradient; the weight gradient is skipped), products without weights (the
    attention core) keep theirs; no gradient leaves a rank, no optimizer step runs, and the memory
    holds no gradients or optimizer states. Both executors agree."""
    from ddlsim.simulator.workloads.transformer_memory import stage_memory

    layout = {"tp": 2, "pp": 1, "global_batch": 8, "zero_stage": 1}
    full, frozen = scenario(**layout), scenario(**layout, frozen_weights=True)
    full_costs, frozen_costs = ClosedFormCosts(setup_of(full, 2)), ClosedFormCosts(setup_of(frozen, 2))
    layer = next(block for block in full_costs.transformer.blocks if block.kind == "layer")
    for part in layer.parts:
        expected = full_costs.transformer._part_s(part, layer, True)
        seconds = frozen_costs.transformer._part_s(part, layer, True)
        if part.parameters and part.backward_flops:
            assert seconds < expected
        else:
            assert seconds == expected
    mlp = max(layer.parts, key=lambda part: part.parameters)  # compute-bound: half the FLOPs, half the time
    assert frozen_costs.transformer._part_s(mlp, layer, True) == pytest.approx(
        full_costs.transformer._part_s(mlp, layer, True) / 2, rel=1e-9)  # fmt: skip
    assert frozen_costs.trainer(0).chunk_gradients(0) == [] and full_costs.trainer(0).chunk_gradients(0) != []
    assert frozen_costs.trainer(0).step(None).duration_s == 0.0 < full_costs.trainer(0).step(None).duration_s
    config = full.transformer_spec
    memory = stage_memory(config, setup_of(frozen, 2).plan.options.layout)[0]
    assert memory.gradients == 0.0 and memory.optimizer_states == 0.0
    assert stage_memory(config, setup_of(full, 2).plan.options.layout)[0].gradients > 0.0
    closed = closed_form_result(frozen, 2)
    assert closed.iteration_s < closed_form_result(full, 2).iteration_s
    assert run_des(frozen, 2).result.iteration_s == pytest.approx(closed.iteration_s, rel=1e-9)


def test_a_profiles_rank_jitter_stays_with_data_parallel_steps(tmp_path, capsys):
    """A profile's rank jitter (fitted on data-parallel steps) makes sync SGD wait for the expected
    slowest rank, but not a transformer layout: its calibration, transformer_slowdown, is of the
    closed form without jitter. --stragglers still applies it when asked for."""
    from ddlsim.hardware_models.profile import Profile, profile_to_toml
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    saved = tmp_path / "jitter.toml"
    saved.write_text(profile_to_toml(Profile(rank_jitter_sigma=0.2, description="test")))
    flags = ["--algorithm", "megatron", "--workload", "gpt2", "--device", "a100_sxm4", "--tp", "2", "--pp", "2",
             "--global-batch", "8", "--nodes", "2", "--executor", "analytic", "--no-progress"]  # fmt: skip
    times = {}
    for name, extra in (("plain", []), ("profile", ["--profile", str(saved)]),
                        ("asked", ["--profile", str(saved), "--stragglers", "lognormal:0.2:expected"])):  # fmt: skip
        assert main(["simulate", *flags, *extra, "--out", str(tmp_path / name)]) == 0
        times[name] = float(read_csv(tmp_path / name / "results.csv")[0]["iteration_s"])
        if name == "profile":
            assert "rank jitter not applied (fitted on data-parallel steps)" in capsys.readouterr().out
    assert times["profile"] == pytest.approx(times["plain"], rel=1e-12)
    assert times["asked"] > 1.1 * times["plain"]
    # a data-parallel run under the same profile waits for the slowest rank
    dp = ["--workload", "resnet50", "--nodes", "2", "--executor", "analytic", "--no-progress"]
    for name, extra in (("dp_plain", []), ("dp_profile", ["--profile", str(saved)])):
        assert main(["simulate", *dp, *extra, "--out", str(tmp_path / name)]) == 0
        times[name] = float(read_csv(tmp_path / name / "results.csv")[0]["iteration_s"])
    assert times["dp_profile"] > 1.1 * times["dp_plain"]


def test_a_layout_that_cannot_run_is_refused_before_the_published_fit(tmp_path, capsys):
    """--profile published fits the shipped runs (7 s) only for a layout that can run: one that does not
    fit its GPUs is the usual one line and exit 2 with no fit made."""
    from ddlsim.simulator.cli.main import main

    code = main(["simulate", "--algorithm", "megatron", "--workload", "llama3_8b", "--device", "h100_sxm5",
                 "--tp", "2", "--pp", "1", "--global-batch", "64", "--nodes", "2", "--profile", "published",
                 "--out", str(tmp_path / "x"), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ddlsim: error: does not fit: llama3_8b") and err.count("\n") == 1
    assert "calibrating" not in err and not (tmp_path / "x").exists()


def test_simulate_shows_where_a_transformer_iteration_goes(tmp_path, capsys):
    """simulate's table for a transformer layout has its rates and parts (not speedup against one device,
    which does not apply), and the breakdown plot stacks those parts: the event simulation's sum to the
    iteration; the closed form's waits, which it does not split, are the rest."""
    from ddlsim.reports.plots import transformer_parts
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    flags = ["simulate", "--algorithm", "megatron", "--workload", "gpt2", "--device", "a100_sxm4", "--tp", "2",
             "--pp", "2", "--global-batch", "8", "--nodes", "2", "--no-progress"]  # fmt: skip
    for executor in ("des", "analytic"):
        assert main([*flags, "--executor", executor, "--out", str(tmp_path / executor)]) == 0
        header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("nodes"))
        assert header.split()[:8] == ["nodes", "devices", "global_batch", "iteration_s", "tokens_per_s",
                                      "tflops_per_gpu", "mfu_pct", "compute_s"]  # fmt: skip
        assert "speedup" not in header and "ep_s" not in header  # no experts: a part of zeros is left out
        rows = read_csv(tmp_path / executor / "results.csv")
        iteration = [float(row["iteration_s"]) for row in rows]
        parts = transformer_parts(rows, iteration)
        labels = [label for label, *_ in parts]
        assert sum(values[0] for _, values, *_ in parts) == pytest.approx(iteration[0], rel=1e-9)
        assert labels[:2] == ["compute", "tensor parallel"]
        if executor == "des":
            assert "pipeline wait (bubble, messages)" in labels and not labels[-1].startswith("waits")
        else:
            assert labels[-1] == "waits (pipeline bubble, messages, data-parallel)"
    # the scaling plot (MFU and tokens/s: no efficiency against one device) and the HTML report, which
    # had stopped on a traceback at the run's empty scaling efficiency
    run = tmp_path / "des"
    assert main(["plot", "scaling", str(run), "--out", str(tmp_path / "scaling.png")]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "tokens per s" in page and "pipeline wait (s)" in page and "mfu (%)" in page
    assert "scaling efficiency" not in page


def test_a_large_model_profile_file_reaches_simulate_with_its_band(tmp_path, capsys):
    """A profile file as calibrate writes it for large-model rows: simulate scales the iteration by its
    transformer_slowdown and says so, with the band its calibration rows fell in."""
    from ddlsim.hardware_models.profile import Profile, profile_to_toml
    from ddlsim.simulator.cli.main import main
    from ddlsim.simulator.records import read_csv

    saved = tmp_path / "llm.toml"
    saved.write_text(profile_to_toml(Profile(transformer_slowdown=1.2, transformer_band=(0.8, 1.1))))
    flags = ["simulate", "--algorithm", "megatron", "--workload", "gpt2", "--device", "a100_sxm4", "--tp", "2",
             "--pp", "2", "--global-batch", "8", "--nodes", "2", "--executor", "analytic", "--no-progress"]  # fmt: skip
    assert main([*flags, "--out", str(tmp_path / "plain")]) == 0
    assert main([*flags, "--profile", str(saved), "--out", str(tmp_path / "fitted")]) == 0
    out = capsys.readouterr().out
    assert "every transformer time x1.200 (its transformer_slowdown)" in out and "x0.800-x1.100" in out
    plain, fitted = (float(read_csv(tmp_path / name / "results.csv")[0]["iteration_s"]) for name in ("plain", "fitted"))
    assert fitted == pytest.approx(1.2 * plain, rel=1e-9)
    # the same file on a data-parallel run: nothing in it applies, and the header says so
    dp = ["simulate", "--workload", "resnet50", "--nodes", "2", "--executor", "analytic", "--no-progress"]
    assert main([*dp, "--profile", str(saved), "--out", str(tmp_path / "dp")]) == 0
    assert "nothing in it applies to this run (a large-model calibration)" in capsys.readouterr().out
