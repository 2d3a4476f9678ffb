"""``ddlsim simulate``: predict a training scaling curve and say where the time goes."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.units import parse_bytes
from ddlsim.simulator.cli.common import (
    Progress,
    add_topology_arguments,
    parse_options,
    print_table,
    topology_options,
)
from ddlsim.simulator.records import SCALING_COLUMNS, write_csv, write_json
from ddlsim.simulator.scenario import EXECUTORS, Scenario, ScenarioError
from ddlsim.simulator.sweep import POOLS, parse_counts, run_sweep
from ddlsim.simulator.training import analytic_point, compute_profile

DEFAULT = Scenario()

# Intra-node link of each SXM part's usual server, for --device without --intra-node
SXM_INTRA_NODE = {
    "p100_sxm2": "nvlink1",
    "v100_sxm2": "nvlink2",
    "v100_sxm3": "nvswitch",
    "v100_sxm3_h": "nvswitch",
    "a100_sxm4": "nvswitch2",
    "h100_sxm5": "nvswitch2",
}

RESULT_COLUMNS = (*SCALING_COLUMNS, "comm_s", "analytic_iteration_s", "buckets", "executor", "execution_path")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="predict iteration time, throughput and scaling efficiency over node counts",
        description="Predict data-parallel training scaling. With no options: ResNet-50 on DGX-1-like "
        "P100 nodes (8 GPUs on NVLink, EDR InfiniBand), ring all-reduce, 1 to 32 nodes.",
    )
    p.add_argument("--workload", default=DEFAULT.workload, help="DNN (ddlsim list workloads)")
    p.add_argument("--device", default=DEFAULT.device, help="device token (ddlsim list devices)")
    p.add_argument(
        "--devices-per-node",
        type=int,
        default=None,
        help="devices per node (default 8 for GPUs, 1 otherwise)",
    )
    p.add_argument("--intra-node", default=None, help="link between devices of a node (e.g. nvlink2, pcie3_x16)")
    p.add_argument("--host-link", default="auto", help="device-to-NIC link; 'auto': PCIe for GPUs, none for CPUs")
    p.add_argument("--network", default=DEFAULT.network, help="network between nodes (ddlsim list networks)")
    add_topology_arguments(p)
    p.add_argument("--algorithm", default=DEFAULT.algorithm, help="all-reduce algorithm (ddlsim list algorithms)")
    p.add_argument("--algorithm-option", action="append", metavar="KEY=VALUE", help="algorithm option, repeatable")
    p.add_argument("--nodes", default="1,2,4,...,32", help="node counts: 1,2,4 or 1,2,4,...,256 or 1:256:x2")
    p.add_argument("--per-device-batch", type=int, default=DEFAULT.per_device_batch)
    p.add_argument("--precision", default=DEFAULT.precision, help="fp32, fp16 (mixed) or bf16 (mixed)")
    p.add_argument("--bucket-bytes", default="25MB", help="gradient fusion bucket size (e.g. 25MB, 64MiB)")
    p.add_argument("--no-overlap", action="store_true", help="start communication only after backward")
    p.add_argument("--iterations", type=int, default=1, help="iterations simulated per point")
    p.add_argument("--executor", default="des", choices=EXECUTORS, help="des (SimPy) or analytic (closed form)")
    p.add_argument("--executor-pool", default="auto", choices=POOLS, help="how sweep points run in parallel")
    p.add_argument("--workers", type=int, default=None, help="parallel workers for the sweep")
    p.add_argument("--out", type=Path, default=None, help="directory for results.csv and scenario.json")
    p.add_argument("--plot", action="store_true", help="also write scaling_efficiency.png into --out")
    p.add_argument(
        "--trace", type=Path, default=None, metavar="JSON", help="write a Chrome/Perfetto trace of one point (DES)"
    )
    p.add_argument("--trace-nodes", type=int, default=None, help="node count to trace (default: the largest)")
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=None,
        help="also report steps and time to this accuracy (statistical-efficiency model, docs/training_algorithms.md)",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar on stderr")
    p.set_defaults(func=run)


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    device = load_device(args.device)
    devices_per_node = args.devices_per_node
    if devices_per_node is None:
        devices_per_node = 8 if device.kind == "gpu" else 1
    intra = args.intra_node
    if intra is None and devices_per_node > 1:
        intra = SXM_INTRA_NODE.get(device.token, "pcie3_x16" if device.kind == "gpu" else "upi")
    return Scenario(
        workload=args.workload,
        device=args.device,
        devices_per_node=devices_per_node,
        intra_node=intra if devices_per_node > 1 else None,
        host_link=args.host_link if args.host_link != "none" else None,
        network=args.network,
        **topology_options(args),
        algorithm=args.algorithm,
        algorithm_options=parse_options(args.algorithm_option),
        nodes=parse_counts(args.nodes),
        per_device_batch=args.per_device_batch,
        precision=args.precision,
        bucket_bytes=parse_bytes(args.bucket_bytes, "--bucket-bytes"),
        overlap=not args.no_overlap,
        iterations=args.iterations,
        executor=args.executor,
    )


def add_time_to_accuracy(rows: list[dict], scenario: Scenario, target: float) -> None:
    """Synchronous SGD: one step per iteration at the global batch (statistical_efficiency)."""
    from ddlsim.simulator.statistical_efficiency import profile_for, steps_to_target

    convergence = profile_for(scenario.workload)
    for row in rows:
        steps = steps_to_target(target, row["global_batch"], profile=convergence)
        row["steps_to_target"] = steps
        row["time_to_accuracy_s"] = steps * row["iteration_s"]


def run(args: argparse.Namespace) -> int:
    scenario = scenario_from_args(args)
    if args.target_accuracy is not None:  # fail on an unreachable target before simulating anything
        add_time_to_accuracy(
            [{"global_batch": scenario.per_device_batch, "iteration_s": 1.0}], scenario, args.target_accuracy
        )
    if args.plot and args.out is None:
        from ddlsim.simulator.cli.common import InputError

        raise InputError("--plot needs --out DIR to write the PNG into")
    trace_nodes = max(scenario.nodes) if args.trace_nodes is None else args.trace_nodes
    if trace_nodes < 1:
        raise ScenarioError(f"--trace-nodes must be a positive integer, got {trace_nodes}")
    progress = Progress("simulating", args.progress if args.progress is not None else None)
    rows = run_sweep(scenario, workers=args.workers, pool=args.executor_pool, progress=progress)
    profile = compute_profile(scenario)
    for row in rows:
        row["analytic_iteration_s"] = analytic_point(scenario, row["nodes"], profile)["iteration_s"]
    columns: tuple[str, ...] = SCALING_COLUMNS
    if args.target_accuracy is not None:
        add_time_to_accuracy(rows, scenario, args.target_accuracy)
        columns = (*SCALING_COLUMNS, "steps_to_target", "time_to_accuracy_s")
    print(
        f"# {scenario.workload} on {scenario.device} x {scenario.devices_per_node}/node "
        f"({scenario.intra_node or '-'}), {scenario.network or '-'} {scenario.topology}, "
        f"{scenario.algorithm} all-reduce, batch {scenario.per_device_batch}/device, {scenario.precision}, "
        f"executor {scenario.executor}"
    )
    print_table(rows, columns)
    if args.out is not None:
        write_csv(args.out / "results.csv", rows, RESULT_COLUMNS + tuple(c for c in columns if c not in RESULT_COLUMNS))
        resolved = scenario.resolved()
        resolved["scenario"] = dataclasses.asdict(scenario) | {"nodes": list(scenario.nodes)}
        write_json(args.out / "scenario.json", resolved)
        written = ["results.csv", "scenario.json"]
        if args.plot:
            from ddlsim.reports.plots import plot_scaling

            plot_scaling([args.out], args.out / "scaling_efficiency.png")
            written.append("scaling_efficiency.png")
        print(f"# wrote {', '.join(str(args.out / name) for name in written)}")
    if args.trace is not None:
        from ddlsim.reports.chrome_trace import simulate_timeline, write_trace

        write_trace(args.trace, simulate_timeline(scenario, trace_nodes))
        print(f"# wrote {args.trace} (timeline of {trace_nodes} nodes, {scenario.iterations} iterations)")
    return 0
