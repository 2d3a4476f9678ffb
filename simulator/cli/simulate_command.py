"""``ddlsim simulate``: any training algorithm on a modeled cluster, over node counts; where time goes.

One command for every training algorithm (``--algorithm``, default ``sync_sgd``: the bucketed,
overlapped data-parallel baseline), run by the event simulation or the closed form
(``--executor``). ``simulate-algorithm`` is an alias kept for older scripts. Every algorithm option is
a flag; a flag the chosen algorithm does not read is refused (``--tau`` for sync_sgd, say).

Example::

    ddlsim simulate --algorithm easgd --tau 4 --workload alexnet --device knl_7250 \\
        --network opa_100 --nodes 16,32,64 --updates 20 --stragglers lognormal:0.2 --out runs/easgd
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.cli.algorithm_options import add_algorithm_arguments, options_from_args
from ddlsim.simulator.cli.common import InputError, Progress, add_topology_arguments, print_table, topology_options
from ddlsim.simulator.records import TRACE_COLUMNS, write_csv, write_json
from ddlsim.simulator.scenario import EXECUTORS, STRAGGLER_FORMS, Scenario, ScenarioError
from ddlsim.simulator.sweep import POOLS, parse_counts, run_sweep
from ddlsim.simulator.training.result import RESULT_COLUMNS, SCALING_COLUMNS

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
SERVER_COLUMNS = ("comm_share", "server_utilisation", "server_queue_s", "staleness_mean", "staleness_p99")
TTA_COLUMNS = ("steps_to_target", "time_to_accuracy_s")
def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        aliases=["simulate-algorithm"],
        help="simulate a training algorithm over node counts: time per step, throughput, scaling, where time goes",
        description="Simulate a training algorithm (sync or async) on a modeled cluster. With no options: "
        "synchronous SGD of ResNet-50 on DGX-1-like P100 nodes (8 GPUs on NVLink, EDR InfiniBand), ring "
        "all-reduce in 25 MB buckets overlapping backward, 1 to 32 nodes. 'simulate-algorithm' is an alias.",
    )
    p.add_argument("--workload", default=DEFAULT.workload, help="DNN (ddlsim list workloads)")
    p.add_argument("--device", default=DEFAULT.device, help="device token (ddlsim list devices)")
    p.add_argument(
        "--devices-per-node", type=int, default=None, help="devices per node (default 8 for GPUs, 1 otherwise)"
    )
    p.add_argument("--intra-node", default=None, help="link between devices of a node (e.g. nvlink2, pcie3_x16)")
    p.add_argument("--host-link", default="auto", help="device-to-NIC link; 'auto': PCIe for GPUs, none for CPUs")
    p.add_argument("--network", default=DEFAULT.network, help="network between nodes (ddlsim list networks)")
    add_topology_arguments(p)
    add_algorithm_arguments(p)
    p.add_argument("--best-split", action="store_true", help="hybrid_parallel: search the fastest split")
    p.add_argument("--nodes", default="1,2,4,...,32", help="node counts: 1,2,4 or 1,2,4,...,256 or 1:256:x2")
    p.add_argument("--per-device-batch", type=int, default=DEFAULT.per_device_batch)
    p.add_argument("--precision", default=DEFAULT.precision, help="fp32, fp16 (mixed) or bf16 (mixed)")
    p.add_argument(
        "--updates", "--iterations", dest="updates", type=int, default=None,
        help="gradient steps per worker (default: 1 for synchronous algorithms, 20 otherwise)",
    )  # fmt: skip
    p.add_argument("--stragglers", default="none", help=STRAGGLER_FORMS)
    p.add_argument("--seed", type=int, default=0, help="seed of the straggler draws")
    p.add_argument("--executor", default="des", choices=EXECUTORS, help="des (SimPy) or analytic (closed form)")
    p.add_argument("--executor-pool", default="auto", choices=POOLS, help="how sweep points run in parallel")
    p.add_argument("--workers", type=int, default=None, help="parallel workers for the sweep")
    p.add_argument("--out", type=Path, default=None, help="directory for results.csv, scenario.json and the rest")
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
    options = options_from_args(args, {"best_split": {"hybrid_parallel"}})
    device = load_device(args.device)
    devices_per_node = args.devices_per_node
    if devices_per_node is None:
        devices_per_node = 8 if device.kind == "gpu" else 1
    intra = args.intra_node
    if intra is None and devices_per_node > 1:
        intra = SXM_INTRA_NODE.get(device.token, "pcie3_x16" if device.kind == "gpu" else "upi")
    nodes = parse_counts(args.nodes)
    return Scenario(
        workload=args.workload,
        device=args.device,
        devices_per_node=devices_per_node,
        intra_node=intra if devices_per_node > 1 else None,
        host_link=args.host_link if args.host_link != "none" else None,
        network=args.network,
        **topology_options(args),
        algorithm=args.algorithm,
        options=options,
        nodes=nodes,
        per_device_batch=args.per_device_batch,
        precision=args.precision,
        updates=args.updates,
        stragglers=args.stragglers,
        seed=args.seed,
        executor=args.executor,
    )


def add_time_to_accuracy(rows: list[dict], scenario: Scenario, target: float) -> None:
    """Steps and seconds to ``target`` per row (``simulator.statistical_efficiency``)."""
    from ddlsim.simulator.statistical_efficiency import profile_for, time_to_accuracy

    algorithm = scenario.training_algorithm
    convergence = profile_for(scenario.workload)
    for row in rows:
        workers = row["global_batch"] // scenario.per_device_batch
        estimate = time_to_accuracy(
            algorithm.family, target, row["iteration_s"] * row["updates"], workers, row["updates"],
            scenario.per_device_batch, row["staleness_mean"] or 0.0, scenario.options.tau, convergence,
        )  # fmt: skip
        row["steps_to_target"] = estimate.steps_to_target
        row["time_to_accuracy_s"] = estimate.time_to_accuracy_s


def run(args: argparse.Namespace) -> int:
    scenario = scenario_from_args(args)
    if args.target_accuracy is not None:  # fail on an unreachable target before simulating anything
        from ddlsim.simulator.statistical_efficiency import profile_for, steps_to_target

        steps_to_target(args.target_accuracy, 1.0, profile=profile_for(scenario.workload))
    if args.plot and args.out is None:
        raise InputError("--plot needs --out DIR to write the PNG into")
    trace_nodes = max(scenario.nodes) if args.trace_nodes is None else args.trace_nodes
    if trace_nodes < 1:
        raise ScenarioError(f"--trace-nodes must be a positive integer, got {trace_nodes}")
    from ddlsim.simulator.training.setup import setup_of

    for nodes in scenario.nodes:  # refuse any impossible point before simulating the others
        setup_of(scenario, nodes)
    if args.best_split:
        from ddlsim.simulator.executor.des import best_hybrid_split

        split, seconds = best_hybrid_split(scenario, max(scenario.nodes))
        options = dataclasses.replace(scenario.options, split=split)
        scenario = dataclasses.replace(scenario, options=options)
        print(f"# best split {','.join(map(str, split))}: {seconds:.6g} s per step")
    progress = Progress("simulating", args.progress if args.progress is not None else None)
    rows = run_sweep(scenario, workers=args.workers, pool=args.executor_pool, progress=progress)
    columns: tuple[str, ...] = SCALING_COLUMNS
    if any(row["servers"] for row in rows):
        columns = (*columns, *SERVER_COLUMNS)
    if args.target_accuracy is not None:
        add_time_to_accuracy(rows, scenario, args.target_accuracy)
        columns = (*columns, *TTA_COLUMNS)
    collective = f", {scenario.collective} all-reduce" if "collective" in scenario.training_algorithm.options else ""
    print(
        f"# {scenario.algorithm}{collective}: {scenario.workload} on {scenario.device} x "
        f"{scenario.devices_per_node}/node ({scenario.intra_node or '-'}), {scenario.network or '-'} "
        f"{scenario.topology}, batch {scenario.per_device_batch}/device, {scenario.precision}, "
        f"{scenario.steps} update(s)/worker, executor {scenario.executor}"
    )
    print_table(rows, columns)
    if args.out is not None:
        write_outputs(args.out, scenario, rows, columns, args.plot)
    if args.trace is not None:
        write_timeline(args.trace, scenario, trace_nodes, args.out)
    return 0


def write_outputs(out: Path, scenario: Scenario, rows: list[dict], columns: tuple[str, ...], plot: bool) -> None:
    extra = tuple(column for column in columns if column not in RESULT_COLUMNS)
    write_csv(out / "results.csv", rows, RESULT_COLUMNS + extra)
    write_json(out / "scenario.json", scenario.resolved())
    written = ["results.csv", "scenario.json"]
    if plot:
        from ddlsim.reports.plots import plot_scaling

        plot_scaling([out], out / "scaling_efficiency.png")
        written.append("scaling_efficiency.png")
    print(f"# wrote {', '.join(str(out / name) for name in written)}")


def timeline(scenario: Scenario, nodes: int, mode: str = "auto") -> tuple[dict, list[dict], Any]:
    """Simulate one point with every operation recorded: (the Chrome/Perfetto trace object, the trace
    rows, the DES run). ``otherData`` holds the simulated ``iteration_s`` and each rank's end time
    ``rank_end_s`` (seconds)."""
    from ddlsim.reports.chrome_trace import Transfers, trace_events
    from ddlsim.simulator.executor.des import run_des

    run = run_des(scenario, nodes, mode, record=True, log_transfers=True)
    assert run.records is not None and run.transfer_log is not None
    rows = [
        {"rank": r.rank, "iteration": r.iteration, "op": r.op, "kind": r.kind, "peer": r.peer, "bytes": r.nbytes,
         "start_s": r.start_s, "end_s": r.end_s}
        for r in run.records
    ]  # fmt: skip
    other = {
        "ddlsim": {
            "workload": scenario.workload, "device": scenario.device, "devices_per_node": scenario.devices_per_node,
            "network": scenario.network, "algorithm": scenario.algorithm, "collective": scenario.collective,
            "nodes": nodes, "updates": scenario.steps, "execution_path": run.result.path,
        },
        "iteration_s": run.result.iteration_s,
        "rank_end_s": {str(rank): float(end) for rank, end in enumerate(run.finish_s)},
    }  # fmt: skip
    trace = trace_events(rows, scenario.devices_per_node, Transfers.from_log(run.transfer_log), other_data=other)
    return trace, rows, run


def write_timeline(path: Path, scenario: Scenario, nodes: int, out: Path | None) -> None:
    """A Chrome/Perfetto trace of one point (and its trace.csv, roles.csv and staleness.csv in ``out``)."""
    from ddlsim.reports.chrome_trace import write_trace

    trace, rows, run = timeline(scenario, nodes)
    write_trace(path, trace)
    print(f"# wrote {path} (timeline of {nodes} nodes, {scenario.steps} update(s) per worker)")
    if out is not None:
        write_csv(out / "trace.csv", rows, TRACE_COLUMNS)
        placement = run.setup.placement()
        roles = [
            {"nodes": nodes, "rank": rank, "role": run.setup.role(rank), "fabric_rank": int(placement[rank])}
            for rank in range(run.setup.plan.ranks)
        ]
        write_csv(out / "roles.csv", roles, ("nodes", "rank", "role", "fabric_rank"))
        written = ["trace.csv", "roles.csv"]
        if run.result.servers:
            write_csv(out / "staleness.csv", run.result.staleness_histogram(), ("nodes", "staleness", "count"))
            written.append("staleness.csv")
        print(f"# wrote {', '.join(str(out / name) for name in written)}")
