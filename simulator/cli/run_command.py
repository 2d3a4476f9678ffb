"""``ddlsim run``: synchronous data-parallel SGD for real, on N ranks, traced.

    ddlsim run -n 4 --model resnet_small --dataset digits --algorithm ring --iterations 50 --out runs/real

Writes ``trace.rank{r}.jsonl`` (the simulator's trace schema), ``metadata.json`` and
``results.csv`` (iteration, loss, iteration_s) into ``--out``. See ``docs/real_runs.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.units import parse_bytes
from ddlsim.simulator.cli.common import parse_options

DEFAULT_OUT = Path("runs/real")


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every real-run command shares: how many ranks, and how to start them."""
    group = parser.add_argument_group("launching")
    group.add_argument("-n", "--ranks", type=int, default=2, help="number of ranks (default 2)")
    group.add_argument("--backend", choices=("mpi", "gloo"), default="mpi", help="mpi (mpi4py) or gloo (torch)")
    group.add_argument("--mpiexec", help="the mpiexec to use (default: the mpich wheel's, else the PATH's)")
    group.add_argument("--hostfile", help="passed to mpiexec as -hostfile, for runs across machines")
    group.add_argument("--timeout", type=float, help="seconds before the run is stopped and stuck ranks named")
    group.add_argument(
        "--emulate-network",
        metavar="RATE",
        help="run the ranks in network namespaces joined by links of RATE (e.g. 100mbit; needs root)",
    )
    group.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")


def launch_from_args(args: argparse.Namespace, mode: str, scenario: dict[str, Any]) -> int:
    from ddlsim.real_runs.launcher import LaunchError, launch
    from ddlsim.simulator.cli.common import InputError

    if args.ranks < 1:
        raise InputError(f"--ranks must be at least 1, got {args.ranks}")
    if args.timeout is not None and not args.timeout > 0:
        raise InputError(f"--timeout must be positive, got {args.timeout}")
    scenario = {**scenario, "backend": args.backend}
    try:
        return launch(mode, scenario, args.out, args.ranks, backend=args.backend, mpiexec=args.mpiexec,
                      hostfile=args.hostfile, timeout_s=args.timeout, emulate_network=args.emulate_network)  # fmt: skip
    except LaunchError as error:
        raise InputError(str(error)) from None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="train for real (torch + MPI or gloo) on N ranks and trace every op",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_launch_arguments(parser)
    training = parser.add_argument_group("training")
    training.add_argument("--model", default="small_cnn", help="small_cnn or resnet_small")
    training.add_argument("--dataset", default="digits", help="digits (scikit-learn) or synthetic")
    training.add_argument("--algorithm", default="ring", help="a registered all-reduce algorithm")
    training.add_argument("--algorithm-option", action="append", metavar="KEY=VALUE", help="algorithm option")
    training.add_argument("--per-device-batch", type=int, default=32)
    training.add_argument("--iterations", type=int, default=30)
    training.add_argument("--learning-rate", type=float, default=0.1)
    training.add_argument("--bucket-bytes", default="25MB", help="gradient bucket size (default 25MB)")
    training.add_argument("--no-overlap", action="store_true", help="all-reduce only after backward")
    training.add_argument("--gradient-precision", choices=("fp32", "fp16"), default="fp32")
    training.add_argument("--seed", type=int, default=0)
    training.add_argument("--samples", type=int, default=0, help="dataset samples (0: the dataset's default)")
    training.add_argument("--image-size", type=int, default=0, help="synthetic image side (0: default)")
    debug = parser.add_argument_group("debugging the harness")
    debug.add_argument("--fail-rank", type=int, default=-1, help="this rank kills itself (SIGKILL)...")
    debug.add_argument("--fail-at-iteration", type=int, default=-1, help="...when it reaches this iteration")
    parser.set_defaults(func=run)


def train_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings from the arguments, validated here (unknown names fail before launching)."""
    from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
    from ddlsim.real_runs.data import DATASETS
    from ddlsim.real_runs.models import MODELS
    from ddlsim.real_runs.schedule_executor import build_schedule
    from ddlsim.simulator.cli.common import InputError

    MODELS.get(args.model)
    DATASETS.get(args.dataset)
    COLLECTIVE_ALGORITHMS.get(args.algorithm)
    options = parse_options(args.algorithm_option)
    build_schedule(args.algorithm, "allreduce", args.ranks, **options)
    for name in ("per_device_batch", "iterations"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    bucket_bytes = parse_bytes(args.bucket_bytes, "--bucket-bytes")
    if not bucket_bytes > 0:
        raise InputError(f"--bucket-bytes must be positive, got {args.bucket_bytes!r}")
    return {
        "model": args.model, "dataset": args.dataset, "algorithm": args.algorithm, "algorithm_options": options,
        "per_device_batch": args.per_device_batch, "iterations": args.iterations,
        "learning_rate": args.learning_rate, "bucket_bytes": bucket_bytes, "overlap": not args.no_overlap,
        "gradient_precision": args.gradient_precision, "seed": args.seed, "samples": args.samples,
        "image_size": args.image_size, "fail_rank": args.fail_rank, "fail_at_iteration": args.fail_at_iteration,
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    return launch_from_args(args, "train", {"train": train_scenario(args)})
