"""The command line as a user meets it: tables, files, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

from ddlsim.simulator.cli.main import main
from ddlsim.simulator.records import SCALING_COLUMNS, read_csv

SMALL = ["--nodes", "1,2,4", "--executor-pool", "serial"]


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_default_simulate_prints_scaling_table(capsys):
    code, out, err = run(capsys, "simulate", "--executor-pool", "serial")
    assert code == 0, err
    header = next(line for line in out.splitlines() if not line.startswith("#"))
    # the columns of results.csv, each with the unit it is shown in (reports.formatting)
    assert header.split() == [
        "nodes", "devices", "global_batch", "iteration_s", "compute_s", "exposed_comm_s",
        "throughput_samples_per_s", "speedup", "scaling_efficiency_pct",
    ]  # fmt: skip
    rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")][1:]
    assert [int(row.split()[0]) for row in rows] == [1, 2, 4, 8, 16, 32]


def test_installed_command_runs():
    result = subprocess.run(
        [sys.executable, "-m", "ddlsim", "simulate", "--nodes", "1,2", "--executor-pool", "serial"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "scaling_efficiency" in result.stdout


def test_a_fresh_collective_command_reports_a_bad_setting_in_one_line(tmp_path):
    """``ddlsim collective`` starts without the training scenario's module, yet an invalid setting it
    checks (sockets that do not divide the node's devices) is still the user's error: one line, exit
    2, nothing written. In a fresh process, where no other test has imported that module."""
    result = subprocess.run(
        [sys.executable, "-m", "ddlsim", "collective", "--ranks", "16", "--devices-per-node", "8",
         "--intra-node", "nvlink2", "--sockets", "3", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    message = "ddlsim: error: --sockets 3 does not divide --devices-per-node 8 evenly"
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "out").exists()


def test_out_writes_results_scenario_and_plot(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run(capsys, "simulate", *SMALL, "--out", str(out), "--plot")
    assert code == 0, err
    rows = read_csv(out / "results.csv")
    assert [int(row["nodes"]) for row in rows] == [1, 2, 4]
    assert set(SCALING_COLUMNS) <= set(rows[0])
    assert '"device"' in (out / "scenario.json").read_text()
    png = (out / "scaling_efficiency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_same_inputs_give_byte_identical_results(capsys, tmp_path):
    for name in ("a", "b"):
        assert run(capsys, "simulate", *SMALL, "--out", str(tmp_path / name))[0] == 0
    assert (tmp_path / "a" / "results.csv").read_bytes() == (tmp_path / "b" / "results.csv").read_bytes()


def test_analytic_executor_matches_des_without_contention(capsys, tmp_path):
    for executor in ("des", "analytic"):
        assert run(capsys, "simulate", *SMALL, "--executor", executor, "--out", str(tmp_path / executor))[0] == 0
    des = read_csv(tmp_path / "des" / "results.csv")
    closed = read_csv(tmp_path / "analytic" / "results.csv")
    for a, b in zip(des, closed, strict=True):
        assert float(a["iteration_s"]) == pytest.approx(float(b["iteration_s"]), rel=1e-6)


def _first_iteration_by_executor(capsys, tmp_path, *argv: str) -> tuple[float, float]:
    """``simulate ARGV`` under the event simulation and under the closed form: each first row's
    iteration seconds."""
    seconds = []
    for executor in ("des", "analytic"):
        assert run(capsys, "simulate", *argv, "--executor", executor, "--out", str(tmp_path / executor))[0] == 0
        seconds.append(float(read_csv(tmp_path / executor / "results.csv")[0]["iteration_s"]))
    return seconds[0], seconds[1]


def test_closed_form_matches_des_on_latency_bound_rings_across_nodes(capsys, tmp_path):
    """One all-reduce per layer of ResNet-50 over 128 GPUs (8 a node on PCIe, EDR between nodes):
    small rings whose steps are paced by PCIe's per-message cost inside the node, not the NIC path's.
    The closed form charged every crossing step at the NIC path and came out 1.33x fast (0.166 s
    against the DES's 0.220 s per iteration)."""
    scenario = [
        "--workload", "resnet50", "--device", "p40", "--devices-per-node", "8", "--intra-node", "pcie3_x16",
        "--network", "ib_edr", "--collective", "ring", "--per-device-batch", "32", "--precision", "fp16",
        "--nodes", "16", "--bucket-bytes", "1B", "--executor-pool", "serial",
    ]  # fmt: skip
    des, closed = _first_iteration_by_executor(capsys, tmp_path, *scenario)
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize(
    "scenario",
    [
        ["--workload", "vgg16", "--device", "v100_sxm2", "--devices-per-node", "1", "--collective",
         "recursive_doubling", "--nodes", "16"],
        ["--algorithm", "megatron", "--workload", "gpt3_1_3b", "--device", "a100_sxm4", "--intra-node", "nvswitch2",
         "--nics-per-node", "8", "--tp", "1", "--micro-batch", "2", "--global-batch", "512", "--nodes", "4"],
    ],
)  # fmt: skip
def test_closed_form_matches_des_on_an_oversubscribed_fat_tree(capsys, tmp_path, scenario):
    """Leaves of 4 (2) nodes with 4:1 uplinks: the far rounds of recursive doubling, and the data-parallel
    rings of eight groups at once, share a leaf's uplink. The closed form shared nothing: 13 % and
    6 % fast against the DES."""
    network = ["--network", "ib_hdr" if "megatron" in scenario else "ib_edr", "--topology", "fat_tree",
               "--oversubscription", "4", "--nodes-per-leaf", "2" if "megatron" in scenario else "4",
               "--executor-pool", "serial"]  # fmt: skip
    des, closed = _first_iteration_by_executor(capsys, tmp_path, *scenario, *network)
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize(
    "scenario",
    [
        "--algorithm sync_easgd --workload alexnet --device knl_7250 --network opa_100 --nodes 4",
        "--algorithm hybrid_parallel --workload vgg16 --device v100_sxm2 --devices-per-node 4 --intra-node nvlink2 "
        "--network ib_edr --nics-per-node 1 --nodes 4",
        "--workload resnet50 --device v100_sxm2 --intra-node nvlink2 --network ib_edr --nics-per-node 1 "
        "--collective hierarchical --collective-option intra=reduce_scatter --nodes 4",
        "--workload vgg16 --device k80 --intra-node pcie3_x16 --network eth_10g --collective parameter_server "
        "--topology fat_tree --oversubscription 4 --nodes-per-leaf 2 --nodes 4",
        "--algorithm megatron --workload gpt3_1_3b --device a100_sxm4 --intra-node nvswitch2 --network ib_hdr "
        "--nics-per-node 2 --tp 4 --pp 4 --virtual-stages 2 --micro-batch 1 --global-batch 128 --nodes 4",
    ],
    ids=["sync_easgd", "hybrid_parallel", "hierarchical_rs", "ps_fat_tree", "megatron_interleaved"],
)
def test_executors_agree_on_each_algorithm_with_a_closed_form(capsys, tmp_path, scenario):
    """The closed form and the event simulation give one iteration time where nothing contends beyond
    what the closed form counts: one scenario for each training algorithm that has a closed form, on
    fabrics whose NICs or uplinks are shared."""
    argv = [*scenario.split(), "--executor-pool", "serial"]
    des, closed = _first_iteration_by_executor(capsys, tmp_path, *argv)
    assert closed == pytest.approx(des, rel=1e-6)


def test_closed_form_does_not_share_nics_among_pipeline_stages_that_reduce_at_different_times(capsys, tmp_path):
    """hybrid_parallel on two-socket Skylake nodes (a stage a socket, one NIC): each stage's gradient
    all-reduce across nodes runs when that stage's backward ends, not beside the other's, so neither
    shares the NIC in the DES. A closed form that took every group of fewer members a node than its
    devices to run beside the others charged them half the NIC: 33 % slow."""
    scenario = [
        "--algorithm", "hybrid_parallel", "--workload", "alexnet", "--device", "xeon_8160", "--devices-per-node",
        "2", "--intra-node", "upi", "--network", "opa_100", "--nodes", "4", "--executor-pool", "serial",
    ]  # fmt: skip
    des, closed = _first_iteration_by_executor(capsys, tmp_path, *scenario)
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize("fabric", [[], ["--topology", "fat_tree", "--oversubscription", "4", "--nodes-per-leaf", "2"]])
def test_closed_form_shares_a_one_nic_node_among_its_data_parallel_groups_and_pipeline_sends(capsys, tmp_path, fabric):
    """tp 2 x pp 2 on nodes of 8 A100 with one NIC: each node holds two data-parallel groups (one a
    tensor rank) whose gradient all-reduces cross nodes at once through that NIC, and all 8 ranks of
    a stage send their activations to the next stage at once. The closed form gave each all-reduce
    and each send the whole NIC: 16 % fast against the DES on a switch, 28 % under 4:1 leaves of two
    nodes (where the sends also share the leaf's uplink)."""
    scenario = [
        "--algorithm", "megatron", "--workload", "gpt3_1_3b", "--device", "a100_sxm4", "--intra-node", "nvswitch2",
        "--network", "ib_hdr", "--nics-per-node", "1", "--tp", "2", "--pp", "2", "--micro-batch", "2",
        "--global-batch", "256", "--nodes", "4", "--executor-pool", "serial", *fabric,
    ]  # fmt: skip
    des, closed = _first_iteration_by_executor(capsys, tmp_path, *scenario)
    assert closed == pytest.approx(des, rel=1e-6)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "p9000"], "unknown device 'p9000'; valid: "),
        (["--workload", "resnet5"], "unknown workload 'resnet5'; valid: "),
        (["--collective", "rign"], "unknown collective algorithm 'rign'; valid: "),
        (["--algorithm", "rign"], "unknown training algorithm 'rign'; valid: "),
        (["--algorithm", "ring"], "'ring' is a collective algorithm, not a training algorithm: use --collective ring"),
        (["--tau", "4"], "--tau do(es) not apply to --algorithm sync_sgd; its options: --collective,"),
        (["--algorithm", "async_sgd", "--no-overlap"], "--no-overlap do(es) not apply to --algorithm async_sgd"),
        (["--tp", "2"], "(--tp is read by --algorithm megatron)"),
        (["--servers", "2"], "(--servers is read by --algorithm async_msgd, async_sgd, hogwild_sgd, sync_sgd_ps)"),
        (["--algorithm", "easgd", "--executor", "analytic"], "algorithm 'easgd' has no closed form"),
        (["--algorithm", "async_sgd", "--servers", "3"], "3 servers but only 1 node(s)"),
        (["--updates", "0"], "updates must be a positive integer"),
        (["--network", "ib_gdr"], "unknown link or network 'ib_gdr'; valid: "),
        (["--per-device-batch", "0"], "per-device-batch must be a positive integer"),
        (["--nodes", "0,1"], "counts must be positive"),
        (["--nodes", "1,2,banana"], "cannot parse '1,2,banana'"),
        (["--bucket-bytes", "25 furlongs"], "unknown size unit"),
        (["--bucket-bytes=-5MB"], "bucket bytes must be a finite size > 0"),
        (["--precision", "fp8"], "unknown precision 'fp8'"),
        (["--topology", "ring_of_rings"], "unknown topology"),
        (["--workload", "vgg16", "--per-device-batch", "4096"], "does not fit"),
        (["--network", "nvlink2"], "is an intra-node link, not a network"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(capsys, tmp_path, argv, message):
    out = tmp_path / "out"
    code, _stdout, err = run(capsys, "simulate", *SMALL, *argv, "--out", str(out))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ")
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize("kind", ["devices", "networks", "workloads", "algorithms"])
def test_list(capsys, kind):
    code, out, _ = run(capsys, "list", kind)
    assert code == 0
    expected = {"devices": "p100_sxm2", "networks": "ib_edr", "workloads": "resnet50", "algorithms": "ring"}[kind]
    assert expected in out


def test_collective_prints_busbw_and_writes_results(capsys, tmp_path):
    code, _out, err = run(capsys, "collective", "--ranks", "8", "--message-bytes", "1MB:4MB:x2", "--out", str(tmp_path))
    assert code == 0, err
    rows = read_csv(tmp_path / "results.csv")
    assert [float(r["message_bytes"]) for r in rows] == [1e6, 2e6, 4e6]
    for row in rows:  # nccl-tests: busbw = S / t x 2(n-1)/n for all-reduce
        assert float(row["busbw_Bps"]) == pytest.approx(float(row["message_bytes"]) / float(row["time_s"]) * 14 / 8)
        assert float(row["time_s"]) == pytest.approx(float(row["closed_form_s"]), rel=1e-9)


def test_collective_says_what_a_library_chose_besides_the_algorithm(capsys, tmp_path):
    """NCCL on 2 nodes of 8 GPUs with 4 NICs runs one ring channel per NIC: the table and results.csv
    say so; an algorithm token chooses nothing, and its table has no such column."""
    base = ["collective", "--ranks", "16", "--devices-per-node", "8", "--intra-node", "nvlink2",
            "--nics-per-node", "4", "--message-bytes", "64MB"]  # fmt: skip
    code, out, err = run(capsys, *base, "--algorithm", "nccl", "--out", str(tmp_path / "nccl"))
    assert code == 0, err
    assert "resolved_options" in out and "channels=4" in out
    [row] = read_csv(tmp_path / "nccl" / "results.csv")
    assert (row["resolved_algorithm"], row["resolved_options"]) == ("ring", "channels=4")
    code, out, err = run(capsys, *base, "--algorithm", "ring", "--out", str(tmp_path / "ring"))
    assert code == 0, err
    assert "resolved_options" not in out
    assert read_csv(tmp_path / "ring" / "results.csv")[0]["resolved_options"] == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithm", "rign"], "unknown collective algorithm 'rign'; valid: "),
        (["--topology", "hypercube"], "unknown topology 'hypercube'; valid: "),
        (["--message-bytes", "0"], "sizes must be > 0"),
        (["--ranks", "0"], "counts must be positive"),
        (["--collective", "alltoall"], "unknown collective 'alltoall'"),
        (["--topology", "torus_2d", "--torus-dims", "3x3", "--ranks", "16"], "do not hold 16 nodes"),
        # a forced path that cannot time the collective: the fluid path does not model LogGP, and the
        # round path cannot prove NCCL's pipelined trees over 64 ranks
        (["--loggp", "--mode", "fluid"], "--mode fluid cannot time ring over 8 ranks exactly"),
        (["--algorithm", "nccl", "--ranks", "64", "--message-bytes", "6400kB", "--mode", "vectorised"],
         "--mode vectorised cannot time double_binary_tree over 64 ranks exactly"),
    ],
)
def test_collective_bad_input(capsys, tmp_path, argv, message):
    code, _, err = run(capsys, "collective", "--ranks", "8", *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_list_training_algorithms(capsys):
    code, out, _ = run(capsys, "list", "training-algorithms")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"sync_sgd", "easgd", "sync_easgd", "async_sgd", "hogwild_sgd", "hybrid_parallel"} <= set(names)


def test_target_accuracy_adds_time_to_accuracy(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", *SMALL, "--target-accuracy", "0.7", "--out", str(tmp_path))
    assert code == 0, err
    rows = read_csv(tmp_path / "results.csv")
    steps = [float(row["steps_to_target"]) for row in rows]
    assert steps == sorted(steps, reverse=True)  # a bigger global batch needs fewer steps
    for row in rows:
        assert float(row["time_to_accuracy_s"]) == pytest.approx(
            float(row["steps_to_target"]) * float(row["iteration_s"])
        )


def test_unreachable_target_accuracy_exits_2_before_simulating(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", *SMALL, "--target-accuracy", "0.999", "--out", str(tmp_path / "o"))
    assert code == 2 and "not reachable" in err
    assert not (tmp_path / "o").exists()


def test_scatter_placement_on_oversubscribed_fat_tree_is_slower(capsys, tmp_path):
    base = [
        "simulate",
        "--nodes",
        "16",
        "--devices-per-node",
        "1",
        "--topology",
        "fat_tree",
        "--nodes-per-leaf",
        "4",
        "--executor-pool",
        "serial",
    ]
    for name, extra in (("block", []), ("scatter", ["--placement", "scatter"])):
        assert run(capsys, *base, "--oversubscription", "4", *extra, "--out", str(tmp_path / name))[0] == 0
    block = float(read_csv(tmp_path / "block" / "results.csv")[0]["iteration_s"])
    scatter = float(read_csv(tmp_path / "scatter" / "results.csv")[0]["iteration_s"])
    assert scatter > block


def test_collective_scatter_placement_pays_the_oversubscription(capsys, tmp_path):
    """A ring whose every hop crosses 4:1-oversubscribed leaf uplinks gets about a quarter of the
    bus bandwidth it gets with neighbours under one leaf (bandwidth-bound size)."""
    argv = ["collective", "--ranks", "32", "--topology", "fat_tree", "--nodes-per-leaf", "8", "--oversubscription", "4",
            "--message-bytes", "320MB"]  # fmt: skip
    busbw = {}
    for placement in ("block", "scatter"):
        assert run(capsys, *argv, "--placement", placement, "--out", str(tmp_path / placement))[0] == 0
        busbw[placement] = float(read_csv(tmp_path / placement / "results.csv")[0]["busbw_Bps"])
    assert 3.9 < busbw["block"] / busbw["scatter"] < 4.05


def test_topology_fields_have_one_meaning_in_the_flags_the_configs_and_the_fabric():
    """Scenario, CollectiveSetup and the topology flags of simulate and collective carry every
    FabricSpec topology field under its name, with FabricSpec's default."""
    import dataclasses

    from ddlsim.simulator.cli.common import topology_options
    from ddlsim.simulator.cli.main import build_parser
    from ddlsim.simulator.collective_sim import CollectiveSetup
    from ddlsim.simulator.engine.fabric_spec import TOPOLOGY_FIELDS, FabricSpec
    from ddlsim.simulator.scenario import Scenario

    def defaults(cls):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name in TOPOLOGY_FIELDS}

    fabric = defaults(FabricSpec)
    assert set(fabric) == set(TOPOLOGY_FIELDS)
    assert defaults(Scenario) == fabric and defaults(CollectiveSetup) == fabric
    for command in ("simulate", "collective"):
        # and the socket link, a token there (a Link in FabricSpec), unset by default
        assert topology_options(build_parser().parse_args([command])) == fabric | {"socket_link": None}, command


@pytest.mark.parametrize("library", ["nccl", "mpich", "mlsl", "openmpi"])
def test_simulate_takes_library_selectors_as_collective_does(capsys, tmp_path, library):
    """A library picks per bucket size and rank count; the DES and the closed form agree on its picks
    (one device per node: no two ranks share a NIC, so nothing contends)."""
    for executor in ("des", "analytic"):
        argv = ["simulate", "--nodes", "2,4", "--devices-per-node", "1", "--collective", library]
        out = tmp_path / executor
        assert run(capsys, *argv, "--executor", executor, "--executor-pool", "serial", "--out", str(out))[0] == 0
    des, closed = read_csv(tmp_path / "des" / "results.csv"), read_csv(tmp_path / "analytic" / "results.csv")
    for a, b in zip(des, closed, strict=True):
        assert a["collective"] == library
        assert float(a["iteration_s"]) == pytest.approx(float(b["iteration_s"]), rel=1e-9)


def test_a_saved_scenario_reruns_and_flags_change_it(capsys, tmp_path):
    first = tmp_path / "first"
    argv = ["simulate", "--algorithm", "easgd", "--tau", "2", "--device", "knl_7250", "--network", "opa_100"]
    assert run(capsys, *argv, "--nodes", "2,4", "--updates", "6", "--out", str(first))[0] == 0
    again = tmp_path / "again"
    assert run(capsys, "simulate", "--scenario", str(first / "scenario.json"), "--out", str(again))[0] == 0
    assert (again / "results.csv").read_bytes() == (first / "results.csv").read_bytes()
    changed = tmp_path / "changed"
    assert run(capsys, "simulate", "--scenario", str(first / "scenario.json"), "--alpha", "0.25", "--nodes", "4",
               "--out", str(changed))[0] == 0  # fmt: skip
    saved = json.loads((changed / "scenario.json").read_text())["scenario"]
    assert saved["options"]["alpha"] == 0.25 and saved["options"]["tau"] == 2 and saved["nodes"] == [4]
    assert saved["algorithm"] == "easgd" and saved["device"] == "knl_7250"


def test_a_scenario_in_toml(capsys, tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('workload = "alexnet"\ndevice = "knl_7250"\ndevices_per_node = 1\nintra_node = ""\n'
                    'network = "opa_100"\nnodes = [2]\n[options]\ncollective = "halving_doubling"\n')  # fmt: skip
    code, out, err = run(capsys, "simulate", "--scenario", str(path))
    assert code == 0, err
    assert "halving_doubling all-reduce: alexnet on knl_7250 x 1/node" in out


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("{not json", ".json", "not valid JSON"),
        ("[1, 2]", ".json", "expected a table of scenario fields"),
        ('{"scenario": {"wrkload": "alexnet"}}', ".json", "unknown scenario key(s) wrkload; valid:"),
        ("workload = ", ".toml", "not valid TOML"),
    ],
)
def test_a_bad_scenario_file_is_one_line(capsys, tmp_path, content, suffix, message):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    code, _, err = run(capsys, "simulate", "--scenario", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_device_takes_its_systems_node_shape_unless_told_otherwise(capsys, tmp_path):
    assert run(capsys, "simulate", "--device", "h100_sxm5", "--nodes", "2", "--out", str(tmp_path / "a"))[0] == 0
    scenario = json.loads((tmp_path / "a" / "scenario.json").read_text())["scenario"]
    assert (scenario["devices_per_node"], scenario["intra_node"], scenario["network"], scenario["nics_per_node"]) == (
        8, "nvswitch3", "ib_ndr", 8,
    )  # fmt: skip
    argv = ["simulate", "--device", "h100_sxm5", "--devices-per-node", "4", "--network", "ib_hdr", "--nodes", "2"]
    assert run(capsys, *argv, "--out", str(tmp_path / "b"))[0] == 0
    scenario = json.loads((tmp_path / "b" / "scenario.json").read_text())["scenario"]
    assert (scenario["devices_per_node"], scenario["intra_node"], scenario["network"], scenario["nics_per_node"]) == (
        4, "nvswitch3", "ib_hdr", 1,
    )  # fmt: skip


def test_the_memory_check_can_be_turned_off(capsys):
    code, _, err = run(capsys, "simulate", "--workload", "vgg16", "--per-device-batch", "4096", "--nodes", "1")
    assert code == 2 and "does not fit" in err and "--no-memory-check" in err
    code, out, _ = run(capsys, "simulate", "--workload", "vgg16", "--per-device-batch", "4096", "--nodes", "1",
                       "--no-memory-check")  # fmt: skip
    assert code == 0 and "vgg16" in out


def test_simulate_refuses_an_unwritable_out_before_simulating(capsys, tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a directory")
    code, _, err = run(capsys, "simulate", *SMALL, "--out", str(blocker))
    assert code == 2 and err.startswith(f"ddlsim: error: --out {blocker}: is a file") and err.count("\n") == 1
    code, _, err = run(capsys, "simulate", *SMALL, "--trace", str(tmp_path))
    assert code == 2 and "--trace" in err and "is a directory" in err


def test_simulate_writes_each_point_as_it_finishes(capsys, tmp_path):
    """The results file holds the points in node order however the pool finishes them."""
    assert run(capsys, "simulate", "--nodes", "1,2,4", "--workers", "2", "--executor-pool", "process",
               "--out", str(tmp_path))[0] == 0  # fmt: skip
    assert [row["nodes"] for row in read_csv(tmp_path / "results.csv")] == ["1", "2", "4"]


@pytest.mark.slow
def test_profile_published_fits_the_shipped_runs_on_the_spot(tmp_path, capsys):
    """``--profile published``: ddlsim calibrate on the packaged published_dev.csv, then the run.
    MLPerf v0.7's DGX-1 ResNet-50 (MLPERF-042, 11,176 images/s, in that file) comes out within 3 %
    (the datasheets alone give 7,722: their efficiencies are lower bounds)."""
    argv = ["simulate", "--workload", "resnet50", "--device", "v100_sxm2", "--precision", "fp16",
            "--per-device-batch", "208", "--devices-per-node", "8", "--intra-node", "nvlink2", "--nodes", "1",
            "--executor", "analytic"]  # fmt: skip
    rates = {}
    for name, extra in (("datasheets", []), ("published", ["--profile", "published"])):
        assert main([*argv, *extra, "--out", str(tmp_path / name)]) == 0
        rates[name] = float(read_csv(tmp_path / name / "results.csv")[0]["throughput_samples_per_s"])
    err = capsys.readouterr().err
    assert "--profile published: calibrating on the 187 rows of the packaged published_dev.csv" in err
    assert rates["published"] == pytest.approx(11176.4, rel=0.03)
    assert rates["datasheets"] < 0.75 * 11176.4
