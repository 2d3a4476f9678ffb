"""``ddlsim simulate-algorithm``: one training algorithm (async SGD, Hogwild, the EASGD family, hybrid
parallel...) on a modeled cluster: throughput, communication share, server load, staleness, and
time to a target accuracy.

Example::

    ddlsim simulate-algorithm --algorithm easgd --tau 4 --alpha 0.5 --workload alexnet \\
        --device knl_7250 --network opa_100 --nodes 16 --updates 200 --stragglers lognormal:0.2 \\
        --target-accuracy 0.5 --seed 0
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, make_options
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.algorithm_sim import STRAGGLER_FORMS, AlgorithmSetup, best_hybrid_split, simulate_algorithm
from ddlsim.simulator.cli.common import print_table
from ddlsim.simulator.records import TRACE_COLUMNS, write_csv, write_json
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.statistical_efficiency import profile_for, time_to_accuracy

SUMMARY_COLUMNS = (
    "algorithm",
    "nodes",
    "workers",
    "servers",
    "updates_per_worker",
    "time_s",
    "throughput_samples_per_s",
    "comm_share",
    "server_utilisation",
    "server_queue_s",
    "staleness_mean",
    "staleness_p99",
)
TTA_COLUMNS = ("target_accuracy", "batch_per_step", "steps_to_target", "seconds_per_step", "time_to_accuracy_s")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate-algorithm",
        help="simulate a training algorithm (async, Hogwild, EASGD family, hybrid) on a modeled cluster",
        description="Simulate one training algorithm for a number of updates per worker; report throughput, "
        "communication share, server utilisation and queueing, staleness and (with --target-accuracy) "
        "time to accuracy.",
    )
    p.add_argument("--algorithm", required=True, help=f"one of: {', '.join(TRAINING_ALGORITHMS.names())}")
    p.add_argument("--tau", type=int, default=None, help="EASGD communication period (local steps, >= 1)")
    p.add_argument("--alpha", type=float, default=None, help="EASGD elastic coefficient, in (0, 1)")
    p.add_argument("--servers", type=int, default=None, help="parameter servers (at most one per node)")
    p.add_argument("--threads", type=int, default=None, help="Hogwild threads per worker node")
    p.add_argument("--collective", default=None, help="all-reduce algorithm for sync_sgd, sync_easgd, hybrid")
    p.add_argument("--split", default=None, help="hybrid_parallel: layers per device of a node, e.g. 80,81")
    p.add_argument("--best-split", action="store_true", help="hybrid_parallel: search the fastest split")
    p.add_argument("--workload", default="resnet50", help="DNN (ddlsim list workloads)")
    p.add_argument("--device", default="knl_7250", help="device token (ddlsim list devices)")
    p.add_argument("--devices-per-node", type=int, default=1)
    p.add_argument("--intra-node", default=None, help="link between the devices of a node")
    p.add_argument("--network", default="opa_100", help="network between nodes")
    p.add_argument("--host-link", default="auto")
    p.add_argument("--nodes", type=int, default=4, help="nodes (servers take one device of a node each)")
    p.add_argument("--per-device-batch", type=int, default=32)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--updates", type=int, default=50, help="gradient steps per worker")
    p.add_argument("--stragglers", default="none", help=STRAGGLER_FORMS)
    p.add_argument("--target-accuracy", type=float, default=None, help="report time to this accuracy")
    p.add_argument("--seed", type=int, default=0, help="seed of the straggler draws")
    p.add_argument("--out", type=Path, default=None, help="directory for summary, trace, staleness, roles")
    p.set_defaults(func=run)


def setup_from_args(args: argparse.Namespace) -> AlgorithmSetup:
    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("tau", "alpha", "servers", "threads", "collective", "split")
        if getattr(args, name) is not None
    }
    options = make_options(args.algorithm, values)
    device = load_device(args.device)
    intra = args.intra_node
    if args.devices_per_node > 1 and intra is None:
        intra = "nvlink2" if device.kind == "gpu" else "upi"
    if args.nodes < 1:
        raise ScenarioError(f"--nodes must be >= 1, got {args.nodes}")
    scenario = Scenario(
        workload=args.workload,
        device=args.device,
        devices_per_node=args.devices_per_node,
        intra_node=intra if args.devices_per_node > 1 else None,
        host_link=args.host_link if args.host_link != "none" else None,
        network=args.network if args.nodes > 1 else None,
        nodes=(args.nodes,),
        per_device_batch=args.per_device_batch,
        precision=args.precision,
        seed=args.seed,
    )
    return AlgorithmSetup(args.algorithm, scenario, args.nodes, args.updates, options, args.stragglers, args.seed)


def run(args: argparse.Namespace) -> int:
    setup = setup_from_args(args)
    if args.target_accuracy is not None:
        # fail on an unreachable target before simulating
        profile = profile_for(setup.scenario.workload)
        time_to_accuracy("synchronous", args.target_accuracy, 1.0, 1, 1, 1, profile=profile)
    note = ""
    if args.best_split:
        if setup.algorithm != "hybrid_parallel":
            raise ScenarioError("--best-split applies to --algorithm hybrid_parallel only")
        split, seconds = best_hybrid_split(setup)
        setup = dataclasses.replace(setup, options=dataclasses.replace(setup.options, split=split))
        note = f"# best split {','.join(map(str, split))}: {seconds:.6g} s per step"
    result = simulate_algorithm(setup)
    summary = result.summary()
    scenario = setup.scenario
    print(
        f"# {setup.algorithm} on {setup.nodes} x {scenario.device} ({scenario.devices_per_node}/node), "
        f"{scenario.network or '-'}, {scenario.workload} batch {scenario.per_device_batch}/worker, "
        f"{setup.updates} updates/worker, stragglers {setup.stragglers}, seed {setup.seed}"
    )
    if note:
        print(note)
    print_table([summary], SUMMARY_COLUMNS)
    rows_tta: list[dict[str, Any]] = []
    if args.target_accuracy is not None:
        algorithm = TRAINING_ALGORITHMS.get(setup.algorithm)
        workers = result.workers
        if algorithm.name == "hybrid_parallel":
            workers = result.workers // result.plan.options.stages
        estimate = time_to_accuracy(
            algorithm.family,
            args.target_accuracy,
            result.time_s,
            workers,
            result.updates_per_worker,
            scenario.per_device_batch,
            result.mean_staleness,
            setup.options.tau,
            profile_for(scenario.workload),
        )
        rows_tta.append(
            {
                "target_accuracy": args.target_accuracy,
                "batch_per_step": estimate.batch_per_step,
                "steps_to_target": estimate.steps_to_target,
                "seconds_per_step": estimate.seconds_per_step,
                "time_to_accuracy_s": estimate.time_to_accuracy_s,
            }
        )
        print_table(rows_tta, TTA_COLUMNS)
    if args.out is not None:
        out: Path = args.out
        write_csv(out / "summary.csv", [summary | (rows_tta[0] if rows_tta else {})], (*summary, *TTA_COLUMNS))
        write_csv(out / "trace.csv", result.trace_rows(), TRACE_COLUMNS)
        write_csv(out / "staleness.csv", result.staleness_histogram(), ("staleness", "count"))
        write_csv(
            out / "roles.csv",
            [
                {"rank": rank, "role": role, "device": int(device)}
                for rank, (role, device) in enumerate(zip(result.roles, result.placement, strict=True))
            ],
            ("rank", "role", "device"),
        )
        resolved = scenario.resolved()
        resolved["algorithm"] = {
            "name": setup.algorithm,
            "options": dataclasses.asdict(setup.options),
            "updates_per_worker": setup.updates,
            "stragglers": setup.stragglers,
            "seed": setup.seed,
        }
        write_json(out / "scenario.json", resolved)
        print(f"# wrote summary.csv, trace.csv, staleness.csv, roles.csv, scenario.json to {out}")
    return 0
