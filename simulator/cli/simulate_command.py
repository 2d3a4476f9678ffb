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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ddlsim.algorithms.training_algorithm import make_options
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.cli.algorithm_options import add_algorithm_arguments, options_values
from ddlsim.simulator.cli.common import (
    PROFILE_HELP,
    InputError,
    Progress,
    add_topology_arguments,
    check_output,
    given_flags,
    print_table,
    read_profile,
    topology_options,
)
from ddlsim.simulator.parsing import parse_counts
from ddlsim.simulator.records import TRACE_COLUMNS, layout_columns, write_csv, write_json
from ddlsim.simulator.scenario import EXECUTORS, STRAGGLER_FORMS, Scenario, ScenarioError
from ddlsim.simulator.sweep import POOLS, run_sweep
from ddlsim.simulator.training.result import RESULT_COLUMNS, SCALING_COLUMNS

if TYPE_CHECKING:
    from ddlsim.hardware_models.profile import Profile

DEFAULT = Scenario()

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
    p.add_argument(
        "--profile", type=Path, default=None, metavar="TOML|published",
        help=f"{PROFILE_HELP}: its fitted compute, links and rank jitter replace the datasheets' "
        "(the jitter as --stragglers lognormal:SIGMA:expected unless --stragglers is given)",
    )  # fmt: skip
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
    p.add_argument(
        "--scenario", type=Path, default=None, metavar="FILE",
        help="start from a saved scenario (a run's scenario.json, or JSON/TOML of its fields); flags given change it",
    )  # fmt: skip
    p.add_argument(
        "--memory-check", action=argparse.BooleanOptionalAction, default=True,
        help="refuse a batch whose weights, optimizer state and activations exceed the device's memory",
    )  # fmt: skip
    p.set_defaults(func=run, command_parser=p)


def load_scenario_file(path: Path) -> dict[str, Any]:
    """The scenario fields of a file: a ``scenario.json`` that simulate wrote (its ``scenario``), or
    a JSON or TOML file of the same fields (top level, or under ``scenario``)."""
    import json
    import tomllib

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"--scenario {path}: cannot read it ({error.strerror})") from None
    toml = path.suffix == ".toml"
    try:
        data = tomllib.loads(text) if toml else json.loads(text)
    except ValueError as error:  # tomllib.TOMLDecodeError and json's errors are ValueErrors
        raise InputError(f"--scenario {path}: not valid {'TOML' if toml else 'JSON'}: {error}") from None
    if not isinstance(data, dict):
        raise InputError(f"--scenario {path}: expected a table of scenario fields")
    data = data.get("scenario", data)
    if not isinstance(data, dict):
        raise InputError(f"--scenario {path}: 'scenario' must be a table of scenario fields")
    return data


# flag (argparse destination) -> Scenario field, for the flags that set one field as they are
PLAIN_FLAGS = {
    "workload": "workload", "device": "device", "devices_per_node": "devices_per_node", "intra_node": "intra_node",
    "host_link": "host_link", "network": "network", "algorithm": "algorithm", "per_device_batch": "per_device_batch",
    "precision": "precision", "updates": "updates", "stragglers": "stragglers", "seed": "seed",
    "executor": "executor",
}  # fmt: skip


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The scenario of the command line: a ``--scenario`` file (or the defaults), then every flag given.

    A device given (by flag or in the file) without its node's shape takes its catalog system's
    (devices per node, intra-node link, network, NICs: an H100 SXM5 comes in DGX nodes of 8 on
    NVSwitch with 8 NDR NICs); a device without one takes 8 per node for a GPU (on NVLink for the
    SXM parts, PCIe otherwise), 1 otherwise.
    """
    given = given_flags(args) if args.scenario is None else given_flags(args) | {"scenario"}
    from_file = load_scenario_file(args.scenario) if args.scenario is not None else {}
    base = Scenario().to_dict() | from_file
    values = {key: value for key, value in base.items() if key != "profile"}
    for flag, field in PLAIN_FLAGS.items():
        if flag in given:
            values[field] = getattr(args, flag)
    if "host_link" in given and args.host_link == "none":
        values["host_link"] = None
    if "nodes" in given or args.scenario is None:
        values["nodes"] = list(parse_counts(args.nodes))
    topology = topology_options(args)
    for field in topology:
        flag = "torus_dims" if field == "torus_dims" else field
        if flag in given:
            values[field] = topology[field]
    if "device" in given or "device" in from_file:  # a file naming a device but not its node: the catalog's
        _device_defaults(values, given | set(from_file))
    options = dict(values.get("options") or {}) if args.scenario is not None else {}
    if "algorithm" in given and args.scenario is not None and values["algorithm"] != base.get("algorithm"):
        options = {}  # another algorithm: the file's options were the old one's
    given_options = options_values(args, values["algorithm"], {"best_split": {"hybrid_parallel"}})
    if "layout" in given_options:  # layout flags change the file's layout field by field
        base_layout = options.get("layout")
        given_options["layout"] = {**(base_layout if isinstance(base_layout, dict) else {"dp": 0}),
                                   **given_options["layout"]}  # fmt: skip
    options.update(given_options)
    if values["algorithm"] == "megatron" and "collective" not in options:  # the planner's stack (NCCL on GPUs)
        from ddlsim.simulator.planner import default_collective

        options["collective"] = default_collective(values["device"])
    values["options"] = make_options(values["algorithm"], _applicable(values["algorithm"], options)).to_dict()
    if values["algorithm"] == "megatron" and "precision" not in given and "precision" not in from_file:
        values["precision"] = "bf16"  # transformers train in bf16 (fp32 runs H100s at a 15th of their peak)
    if not args.memory_check:
        values["enforce_memory"] = False
    scenario = Scenario.from_dict(values)
    if args.profile is not None:
        if scenario.is_transformer:  # a layout that cannot run fails now, not after --profile published's fit
            from ddlsim.simulator.training.setup import setup_of

            for nodes in scenario.nodes:
                setup_of(scenario, nodes)
        scenario = with_profile(scenario, read_profile(args.profile), stragglers_given="stragglers" in given)
    return scenario


def with_profile(scenario: Scenario, profile: Profile, stragglers_given: bool = False) -> Scenario:
    """``scenario`` under a calibrated profile; its rank jitter becomes the expected slowest of N ranks
    (what ``validate`` predicts with) unless stragglers were asked for explicitly. Not for a
    transformer layout: its calibration (``transformer_slowdown``) is of the closed form without rank
    jitter, which the rows' measured time already holds, and the jitter was fitted on data-parallel
    steps (the published fit's 0.0525 would add 12 % to 64 GPUs of GPT-3 175B, whose Korthikanti et al.
    row the closed form already meets within 2 %)."""
    scenario = dataclasses.replace(scenario, profile=profile)
    if not stragglers_given and profile.rank_jitter_sigma > 0 and not scenario.is_transformer:
        scenario = dataclasses.replace(scenario, stragglers=f"lognormal:{profile.rank_jitter_sigma!r}:expected")
    return scenario


def _applicable(algorithm: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options ``algorithm`` reads (a saved scenario carries every option, at its defaults too)."""
    from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, AlgorithmOptions

    reads = TRAINING_ALGORITHMS.get(algorithm).options
    default = AlgorithmOptions().to_dict()
    return {key: value for key, value in options.items() if key in reads and value != default.get(key)}


def _device_defaults(values: dict[str, Any], given: set[str]) -> None:
    """The node shape of ``values["device"]`` where the user gave none."""
    device = load_device(values["device"])
    system = device.system
    if system is not None:
        shape = {"devices_per_node": system.devices_per_node, "intra_node": system.intra_node_link,
                 "network": system.network, "nics_per_node": system.nics_per_node}  # fmt: skip
    else:
        per_node = 8 if device.kind == "gpu" else 1
        intra = "pcie3_x16" if device.kind == "gpu" else "upi"
        shape = {"devices_per_node": per_node, "intra_node": intra, "nics_per_node": 1}
    if "devices_per_node" in given:
        shape.pop("nics_per_node")
        if values["devices_per_node"] > 1:
            shape["devices_per_node"] = values["devices_per_node"]
    for field, value in shape.items():
        if field not in given:
            values[field] = value
    if values["devices_per_node"] == 1 and "intra_node" not in given:
        values["intra_node"] = None


def batch_text(scenario: Scenario) -> str:
    """The batch as the header states it: per device, or a transformer layout's micro and global batch."""
    layout = scenario.options.layout if scenario.is_transformer else None
    if layout is None:
        return f"batch {scenario.per_device_batch}/device"
    splits = (("tp", layout.tp), ("pp", layout.pp), ("cp", layout.cp), ("ep", layout.ep))
    shape = "x".join(f"{name}{value}" for name, value in splits if value > 1)
    global_batch = layout.global_batch if layout.global_batch is not None else "at least pp micro-batches per rank"
    return f"{shape or 'dp only'}, micro-batch {layout.micro_batch}, global batch {global_batch} sequences"


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


OUTPUT_FILES = ("results.csv", "scenario.json", "scaling_efficiency.png", "trace.csv", "roles.csv", "staleness.csv")


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "directory", files=OUTPUT_FILES)
    check_output(args.trace, "file", "--trace")
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
    progress = Progress("simulating", args.progress if args.progress is not None else None, unit="points")
    written: dict[int, dict] = {}

    def keep(index: int, row: dict) -> None:
        """Write every finished point at once: an interrupted sweep leaves its finished rows."""
        written[index] = row
        if args.out is not None:
            done = [written[i] for i in sorted(written)]
            write_csv(args.out / "results.csv", done, RESULT_COLUMNS)

    rows = run_sweep(scenario, workers=args.workers, pool=args.executor_pool, progress=progress, on_row=keep)
    columns: tuple[str, ...] = SCALING_COLUMNS
    if scenario.is_transformer:  # rates and where the iteration goes; speedup against one device does not apply
        columns = layout_columns(rows)
    if any(row["servers"] for row in rows):
        columns = (*columns, *SERVER_COLUMNS)
    if args.target_accuracy is not None:
        add_time_to_accuracy(rows, scenario, args.target_accuracy)
        columns = (*columns, *TTA_COLUMNS)
    collective = f", {scenario.collective} all-reduce" if "collective" in scenario.training_algorithm.options else ""
    print(
        f"# {scenario.algorithm}{collective}: {scenario.workload} on {scenario.device} x "
        f"{scenario.devices_per_node}/node ({scenario.intra_node or '-'}), {scenario.network or '-'} "
        f"{scenario.topology}, {batch_text(scenario)}, {scenario.precision}, "
        f"{scenario.steps} update(s)/worker, executor {scenario.executor}"
    )
    if scenario.profile is not None:
        print(f"# profile {args.profile}: {profile_text(scenario)}")
    print_table(rows, columns)
    if args.out is not None:
        write_outputs(args.out, scenario, rows, columns, args.plot)
    if args.trace is not None:
        write_timeline(args.trace, scenario, trace_nodes, args.out)
    return 0


def profile_text(scenario: Scenario) -> str:
    """What of the scenario's profile the run uses: fitted compute and links, the rank jitter as its
    stragglers, a transformer's slowdown and band; or that nothing in it applies (a large-model
    profile on a data-parallel run, or a data-parallel one without fits for this hardware)."""
    profile = scenario.profile
    assert profile is not None
    used = []
    if profile.devices or profile.compute:
        used.append("calibrated compute")
    fitted = [token for token in (scenario.intra_node, scenario.network)
              if token and profile.link_fit(token, scenario.link_scope)]  # fmt: skip
    if fitted:
        used.append(f"calibrated links ({', '.join(fitted)})")
    if scenario.is_transformer and profile.transformer_slowdown != 1.0:
        text = f"every transformer time x{profile.transformer_slowdown:.3f} (its transformer_slowdown)"
        low, high = profile.transformer_band
        if (low, high) != (1.0, 1.0):  # what the calibration rows say of such a prediction
            text += f"; 90 % of its calibration rows measured x{low:.3f}-x{high:.3f} of such a time"
        used.append(text)
    jitter_left = scenario.is_transformer and profile.rank_jitter_sigma > 0 and scenario.stragglers in ("", "none")
    if not used and scenario.stragglers in ("", "none"):
        kind = "large-model" if profile.transformer_slowdown != 1.0 else "data-parallel"
        text = f"nothing in it applies to this run (a {kind} calibration), the datasheets' figures"
    else:
        text = "; ".join(used or ["no fitted compute or links"]) + f"; stragglers {scenario.stragglers}"
    if jitter_left:
        text += "; its rank jitter not applied (fitted on data-parallel steps)"
    return text


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


class TraceRow(Mapping):
    """A trace row (``TRACE_COLUMNS`` and ``kind``) read from an operation record without copying it
    into a dict: a traced point of 4096 nodes has about 300,000 of them."""

    __slots__ = ("_record",)
    _FIELDS: ClassVar[dict[str, str]] = {
        "rank": "rank", "iteration": "iteration", "op": "op", "kind": "kind", "peer": "peer",
        "bytes": "nbytes", "start_s": "start_s", "end_s": "end_s",
    }  # fmt: skip

    def __init__(self, record: Any) -> None:
        self._record = record

    def __getitem__(self, key: str) -> Any:
        return getattr(self._record, self._FIELDS[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._FIELDS)

    def __len__(self) -> int:
        return len(self._FIELDS)


def timeline(scenario: Scenario, nodes: int, mode: str = "auto") -> tuple[dict, list[Any], Any]:
    """Simulate one point with every operation recorded: (the Chrome/Perfetto trace object, the trace
    rows, the DES run). ``otherData`` holds the simulated ``iteration_s`` and each rank's end time
    ``rank_end_s`` (seconds)."""
    from ddlsim.reports.chrome_trace import Transfers, trace_events
    from ddlsim.simulator.executor.des import run_des

    run = run_des(scenario, nodes, mode, record=True, log_transfers=True)
    assert run.records is not None and run.transfer_log is not None
    rows: list[Any] = [TraceRow(record) for record in run.records]
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
