"""``ddlsim plan``: every valid layout of a transformer on N GPUs, screened for memory, ranked.

    ddlsim plan --model llama3_70b --gpus 1024 --device h100_sxm5 --global-batch 1024
    ddlsim plan --model megatron_76b --gpus 1024 --device a100_sxm4_80gb --global-batch 1792 \\
        --tp 8 --top 10 --recheck 3 --out plans/76b

The search is ``simulator.planner``'s: every valid layout gets a lower bound on its iteration time
(microseconds each); layouts are timed by the closed form of the ``megatron`` algorithm best bound
first, and the search stops when no remaining bound can beat the ``--top`` best found, so the top
layouts are exactly the exhaustive search's (``--exhaustive`` times every layout that fits). It
prints the best ``--top`` layouts with tokens/s, TFLOP/s per GPU, MFU and the days and cost to
train ``--train-tokens``, then the winner's time and memory breakdown. ``--out DIR`` writes
``layouts.csv`` (the top layouts) and ``layouts.parquet`` (every layout: the ones timed, the ones
that did not fit and the ones pruned by their bound, with the reason: a table pandas reads with
``pd.read_parquet``). ``--workers K`` times the layouts of ``--exhaustive`` and event-simulates the
``--recheck`` layouts over K processes, the pools ``simulate`` sweeps use: local ones, or a cluster's
MPI with ``mpiexec -n K+1 python -m mpi4py.futures -m ddlsim plan ... --executor-pool mpi``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ddlsim.simulator.cli.common import check_output, print_table
from ddlsim.simulator.parsing import InputError
from ddlsim.simulator.sweep import POOLS

OUTPUT_FILES = ("layouts.csv", "layouts.parquet")
FIXABLE = {"tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "micro_batch": int, "virtual_stages": int,
           "zero_stage": int, "recompute": str}  # fmt: skip
TOP_COLUMNS = ("rank", "layout", "iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu_pct", "memory_GB",
               "train_days", "train_cost")  # fmt: skip


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="search every TP x PP x DP x CP x EP layout of a transformer on N GPUs: fits, ranked by throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="catalog transformer (ddlsim list workloads)")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in all (a multiple of the device's node)")
    parser.add_argument("--device", default="h100_sxm5", help="catalog device with a node shape (default h100_sxm5)")
    parser.add_argument("--global-batch", type=int, default=1024, help="sequences per iteration (default 1024)")
    parser.add_argument("--precision", default=None, choices=("bf16", "fp16", "fp8"),
                        help="default: bf16, or fp16 on a device without fast bf16 (V100, P100)")  # fmt: skip
    for name, kind in FIXABLE.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=None, help=f"fix {name} instead of searching it")
    stack = parser.add_argument_group("software stack (every layout runs with it; default: Megatron-LM's defaults)")
    stack.add_argument("--overlap-grad-reduce", action="store_true", help="reduce gradient buckets during backward")
    stack.add_argument("--overlap-param-gather", action="store_true",
                       help="ZeRO 1-2: gather updated weights during the next forward")  # fmt: skip
    stack.add_argument("--tp-comm-overlap", action="store_true", help="hide TP collectives under their products")
    stack.add_argument("--fp8-attention-and-logits", action="store_true",
                       help="--precision fp8: attention core and output logits in fp8 too (default: bf16)")
    stack.add_argument("--no-grad-reduce-in-fp32", action="store_true", help="reduce gradients in 16 bits")
    stack.add_argument("--frozen-weights", action="store_true",
                       help="LoRA-style fine-tuning: base weights frozen (no weight gradients, optimizer states or "
                            "update; ZeRO 1-2 are then ZeRO 0)")  # fmt: skip
    stack.add_argument("--bucket-bytes", default=None, help="gradient bucket of the overlapped reductions (25MB)")
    stack.add_argument("--collective", default=None,
                       help="algorithm of the data-parallel reductions and gathers (default on GPUs nccl: "
                            "its channels over every NIC; ring: one ring per group, through one NIC)")  # fmt: skip
    parser.add_argument("--top", type=int, default=10, help="layouts to print and write to layouts.csv (default 10)")
    parser.add_argument("--train-tokens", type=float, default=1e12, help="tokens to train, for days and cost (1e12)")
    parser.add_argument("--price-per-gpu-hour", type=float, default=2.0, help="for the cost column (default 2.0)")
    parser.add_argument("--recheck", type=int, default=0, help="event-simulate the best K layouts (default 0)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes timing layouts (--exhaustive) and event-simulating --recheck (default 1)")
    parser.add_argument("--executor-pool", choices=POOLS, default="auto",
                        help="who runs --workers: process (local), mpi (mpi4py.futures: launch under mpiexec "
                        "-n K python -m mpi4py.futures -m ddlsim plan ...), serial; auto: process for 2+")  # fmt: skip
    parser.add_argument(
        "--tolerance", type=float, default=0.0,
        help="also skip layouts that could beat the --top best by at most this fraction (default 0: exact)",
    )  # fmt: skip
    parser.add_argument(
        "--exhaustive", action="store_true",
        help="time every layout that fits (default: only those whose lower bound can beat the --top best)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="directory for layouts.csv and layouts.parquet")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress on stderr")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> dict[str, Any]:
    for name in ("gpus", "global_batch", "top", "workers"):
        value = getattr(args, name)
        if value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.recheck < 0:
        raise InputError(f"--recheck must be 0 or more, got {args.recheck}")
    if not 0 <= args.tolerance < 1:
        raise InputError(f"--tolerance must be a fraction in [0, 1), got {args.tolerance}")
    if args.fp8_attention_and_logits and args.precision != "fp8":
        given = f"--precision {args.precision}" if args.precision else "the default precision"
        raise InputError(f"--fp8-attention-and-logits needs --precision fp8, got {given}")
    for name in ("train_tokens", "price_per_gpu_hour"):
        value = getattr(args, name)
        if not value >= 0 or value == float("inf"):
            raise InputError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}")
    fixed = {name: getattr(args, name) for name in FIXABLE if getattr(args, name) is not None}
    for name, value in fixed.items():
        if name == "recompute":
            if value not in ("none", "selective", "full"):
                raise InputError(f"--recompute must be one of none, selective, full, got {value!r}")
        elif value < (0 if name == "zero_stage" else 1) or (name == "zero_stage" and value > 3):
            allowed = "0, 1, 2 or 3" if name == "zero_stage" else "a positive integer"
            raise InputError(f"--{name.replace('_', '-')} must be {allowed}, got {value}")
    return fixed


def stack_of(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """The software-stack flags as ``Cluster.stack`` pairs (only those given)."""
    from ddlsim.hardware_models.units import parse_bytes

    switches = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "fp8_attention_and_logits",
                "frozen_weights")  # fmt: skip
    stack: list[tuple[str, Any]] = [(name, True) for name in switches if getattr(args, name)]
    if args.no_grad_reduce_in_fp32:
        stack.append(("grad_reduce_in_fp32", False))
    if args.collective is not None:
        from ddlsim.algorithms.collective import collective_tokens, is_collective_token

        if not is_collective_token(args.collective):
            raise InputError(f"--collective {args.collective!r} is unknown; valid: {', '.join(collective_tokens())}")
        stack.append(("collective", args.collective))
    if args.bucket_bytes is not None:
        bucket = parse_bytes(args.bucket_bytes, "--bucket-bytes")
        if not bucket > 0:
            raise InputError(f"--bucket-bytes must be a size > 0, got {args.bucket_bytes!r}")
        stack.append(("bucket_bytes", bucket))
    return tuple(stack)


def run(args: argparse.Namespace) -> int:
    from ddlsim.algorithms.parallel_layout import LayoutError, ParallelLayout, check_layout
    from ddlsim.hardware_models.catalog import load_device
    from ddlsim.simulator import planner
    from ddlsim.simulator.progress import Progress

    fixed = _check(args)
    out = args.out
    check_output(out, "directory", files=OUTPUT_FILES)
    config = planner.load_model(args.model)
    precision, precision_note = _precision(args.precision, load_device(args.device))
    cluster = planner.Cluster.of(args.device, args.gpus, precision, stack_of(args))
    if "tp" in fixed:  # a fixed TP the model cannot take: say which rule, not just "nothing fits"
        if fixed["tp"] > cluster.devices_per_node:
            raise InputError(f"--tp {fixed['tp']} is larger than a node's {cluster.devices_per_node} GPUs "
                             "(tensor parallelism stays inside the NVLink domain)")  # fmt: skip
        try:
            check_layout(ParallelLayout(tp=fixed["tp"], sequence_parallel=fixed["tp"] > 1), config)
        except LayoutError as error:
            raise InputError(f"--tp {fixed['tp']}: {error}") from None
    layouts = list(planner.candidate_layouts(config, cluster, args.global_batch, fixed))
    if not layouts:
        raise InputError(
            f"no valid layout of {config.name} on {args.gpus} GPUs with global batch {args.global_batch}"
            + (f" and {', '.join(f'{k}={v}' for k, v in fixed.items())}" if fixed else "")
            + " (the batch must split into micro-batches x DP; layers, heads and GPUs must divide)"
        )
    progress = Progress("planning", args.progress, unit="layouts")
    capacity = load_device(args.device).memory_capacity_bytes
    if args.exhaustive:
        progress.stage("memory screen", len(layouts), "layouts")
        candidates = []
        for index in range(0, len(layouts), 256):  # in blocks: the progress line moves on long screens
            candidates += planner.screen(config, cluster, layouts[index : index + 256])
            progress(min(index + 256, len(layouts)), len(layouts))
        fitting = sum(1 for candidate in candidates if not candidate.reason)
        if fitting:
            progress.stage("closed form", fitting, "layouts")
            ranked = planner.evaluate(args.model, cluster, candidates, args.workers, progress, args.executor_pool)
    else:
        progress.stage("bounds, then the closed form best first", len(layouts), "layouts", estimate=False)
        keep = max(args.top, args.recheck, 1)
        ranked, candidates = planner.branch_and_bound(
            args.model, config, cluster, layouts, keep, progress, tolerance=args.tolerance
        )
        fitting = len(ranked)
    progress.close()
    if not fitting:
        smallest = min(candidates, key=lambda candidate: candidate.memory_bytes)
        raise InputError(
            f"none of the {len(candidates)} layouts of {config.name} on {args.gpus} {args.device} fits: the "
            f"smallest needs {smallest.memory_bytes / 1e9:.1f} GB of {capacity / 1e9:.1f} GB "
            f"({planner.layout_text(smallest.layout)})"
        )
    pruned = sum(1 for candidate in candidates if candidate.pruned)
    too_big = sum(1 for candidate in candidates if candidate.reason and not candidate.pruned)
    top = ranked[: args.top]
    rows = []
    for rank, candidate in enumerate(top, start=1):
        figures = candidate.figures
        cost = planner.train_time(candidate, args.train_tokens, args.gpus, args.price_per_gpu_hour)
        rows.append({"rank": rank, "layout": planner.layout_text(candidate.layout),
                     "iteration_s": figures["iteration_s"], "tokens_per_s": figures["tokens_per_s"],
                     "tflops_per_gpu": figures["tflops_per_gpu"], "mfu_pct": 100 * figures["mfu"],
                     "memory_GB": candidate.memory_bytes / 1e9, **cost})  # fmt: skip
    searched = (
        f"{fitting} fit"
        if args.exhaustive
        else f"{fitting} timed by the closed form, {pruned} pruned by their bound, {too_big} did not fit"
    )
    print(f"# {config.name} on {args.gpus} {args.device} ({cluster.nodes} nodes of {cluster.devices_per_node}, "
          f"{cluster.intra_node}, {cluster.nics_per_node} x {cluster.network}), global batch {args.global_batch}: "
          f"{len(layouts)} valid layouts, {searched}; best {len(top)} by tokens/s")  # fmt: skip
    print(f"# {precision_note}; data-parallel reductions and gathers: {cluster.collective}"
          + (" (one ring per group, through one NIC of a node)" if cluster.collective == "ring" else "")
          + ("; base weights frozen (LoRA-style fine-tuning)" if cluster.stack_value("frozen_weights", False) else ""))
    print_table(rows, TOP_COLUMNS)
    _explain(top[0], config, capacity)
    if args.recheck:
        checked = planner.recheck(args.model, cluster, top[: args.recheck], args.workers, args.executor_pool)
        print("\n# event simulation of the best layouts (contention the closed form does not see)")
        print_table([{"rank": i, **row} for i, row in enumerate(checked, start=1)],
                    ("rank", "des_iteration_s", "closed_form_iteration_s", "path"))  # fmt: skip
    if out is not None:
        _write(out, rows, candidates)
        print(f"# wrote {out / 'layouts.csv'}, {out / 'layouts.parquet'}")
    return 0


def _precision(given: str | None, device: Any) -> tuple[str, str]:
    """The precision the layouts run in, and a line saying why (or what it costs on this device)."""
    native = device.mixed_precision()
    if given is None:
        why = "" if native == "bf16" else f": {device.token} has no fast bf16 units"
        return native, f"precision {native} (the default{why})"
    rate, fast = device.peak_flops_for(given) / 1e12, device.peak_flops_for(native) / 1e12
    if given in device.peak_flops and rate >= fast:
        return given, f"precision {given}"
    units = f" has no {given} units:" if given not in device.peak_flops else ""
    faster = f", --precision {native} at {fast:.1f}" if fast > rate else ""
    return given, f"precision {given} as asked; {device.token}{units} runs it at {rate:.1f} TFLOP/s{faster}"


def _explain(best: Any, config: Any, capacity: float) -> None:
    from ddlsim.simulator import planner
    from ddlsim.simulator.workloads.transformer_memory import peak_memory

    figures = best.figures
    parts = ("compute_s", "tp_s", "cp_s", "ep_s", "zero3_s", "pipeline_wait_s", "dp_wait_s")
    shown = ", ".join(f"{name[:-2]} {figures[name]:.3f} s" for name in parts if figures.get(name))
    waits = figures["iteration_s"] - sum(figures.get(name, 0.0) for name in parts)
    shown += f", waits (pipeline bubble, messages, exposed DP) {waits:.3f} s" if waits > 1e-9 else ""
    print(f"\n# the best layout, {planner.layout_text(best.layout)}: {figures['iteration_s']:.3f} s per iteration = "
          f"{shown}")  # fmt: skip
    print(peak_memory(config, best.layout).describe(capacity))


def _write(out: Path, rows: list[dict[str, Any]], candidates: list[Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ddlsim.simulator.records import atomic_open, write_csv

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "layouts.csv", rows, TOP_COLUMNS)
    everything = [candidate.row() for candidate in candidates]
    columns = sorted({key for row in everything for key in row}, key=lambda k: (k == "reason", k))
    table = pa.table({key: [row.get(key) for row in everything] for key in columns})
    with atomic_open(out / "layouts.parquet", "wb") as handle:
        pq.write_table(table, handle)
