"""``ddlsim run``: a training algorithm for real, on N ranks, traced: the role programs the simulator
runs, with torch compute and MPI (or gloo) messages.

    ddlsim run -n 4 --model resnet_small --dataset digits --collective ring --updates 50 --out runs/real
    ddlsim run -n 4 --algorithm async_easgd --tau 2 --model small_cnn --out runs/easgd

Takes the algorithm flags of ``ddlsim simulate`` (``--algorithm``, default sync_sgd, ``--collective``,
``--bucket-bytes``, ``--tau``...). Writes ``trace.rank{r}.jsonl`` (the simulator's trace schema),
``metadata.json`` and ``results.csv`` (iteration, loss, iteration_s) into ``--out``.
See ``docs/real_runs.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ddlsim.simulator.cli.algorithm_options import add_algorithm_arguments, options_from_args

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
    add_algorithm_arguments(parser)
    training = parser.add_argument_group("training")
    training.add_argument("--model", default=None,
                          help="small_cnn (default), resnet_small or digits_mlp; megatron: a GPT-style transformer "
                          "of the catalog (default gpt_tiny)")
    training.add_argument("--dataset", default="digits", help="digits (scikit-learn) or synthetic")
    training.add_argument("--per-device-batch", type=int, default=32)
    training.add_argument("--updates", "--iterations", dest="updates", type=int, default=30,
                          help="gradient steps per worker (default 30)")  # fmt: skip
    training.add_argument(
        "--learning-rate", type=float, default=1.0,
        help="SGD step (algorithms with momentum 0.9 take learning_rate x (1 - 0.9) per heavy-ball step, "
        "so that every algorithm's steady step has this size)",
    )  # fmt: skip
    training.add_argument("--gradient-precision", choices=("fp32", "fp16"), default="fp32")
    training.add_argument("--seed", type=int, default=0)
    training.add_argument("--samples", type=int, default=0, help="dataset samples (0: the dataset's default)")
    training.add_argument("--image-size", type=int, default=0, help="synthetic image side (0: default)")
    debug = parser.add_argument_group("debugging the harness")
    debug.add_argument("--fail-rank", type=int, default=-1, help="this rank kills itself (SIGKILL)...")
    debug.add_argument("--fail-at-iteration", type=int, default=-1, help="...when it reaches this step")
    parser.set_defaults(func=run)


def train_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings from the arguments, validated here (unknown names fail before launching)."""
    from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS
    from ddlsim.real_runs.algorithm_runs import MODELS, RunSettings
    from ddlsim.real_runs.data import DATASETS
    from ddlsim.simulator.cli.common import InputError

    options = options_from_args(args)
    transformer = None
    if args.algorithm == "megatron":
        args.model = args.model or "gpt_tiny"
        transformer = harness_transformer(args.model, options, args.ranks)
    else:
        args.model = args.model or "small_cnn"
        MODELS.get(args.model)
    DATASETS.get(args.dataset)
    for name in ("per_device_batch", "updates"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.learning_rate > 0:
        raise InputError(f"--learning-rate must be positive, got {args.learning_rate}")
    TRAINING_ALGORITHMS.get(args.algorithm).plan_exactly(args.ranks, args.updates, options)  # roles fit the ranks
    settings = RunSettings(
        algorithm=args.algorithm, options=options, steps=args.updates, model=args.model, dataset=args.dataset,
        batch=args.per_device_batch, learning_rate=args.learning_rate, seed=args.seed,
        gradient_precision=args.gradient_precision, samples=args.samples, image_size=args.image_size,
        fail_rank=args.fail_rank, fail_at_step=args.fail_at_iteration, transformer=transformer,
    )  # fmt: skip
    return settings.to_dict()


def harness_transformer(name: str, options: Any, ranks: int) -> dict[str, int]:
    """The shape of catalog transformer ``name`` for the harness's GPT, checked against the layout."""
    from ddlsim.algorithms.megatron_training import resolved_layout
    from ddlsim.algorithms.parallel_layout import LayoutError, check_layout
    from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError
    from ddlsim.real_runs.megatron_trainer import check_runnable
    from ddlsim.simulator.cli.common import InputError
    from ddlsim.simulator.workloads.transformer import load_transformer

    config = load_transformer(name)
    gpt = (config.architecture, config.norm, config.activation, config.position_embedding, config.moe)
    if gpt != ("decoder", "layernorm", "gelu", "learned", None) or config.kv_heads != config.heads:
        raise InputError(f"--model {name}: the harness trains GPT-style decoders (layernorm, gelu, learned positions, "
                         f"no experts, no grouped queries), e.g. gpt_tiny or gpt2")  # fmt: skip
    try:
        check_layout(resolved_layout(options.layout, ranks), config, ranks)
        check_runnable(options)
    except (LayoutError, TrainingAlgorithmError) as error:
        raise InputError(f"--algorithm megatron --model {name}: {error}") from None
    return {"layers": config.layers, "hidden": config.hidden, "heads": config.heads,
            "ffn_hidden": config.ffn_hidden, "vocabulary": config.vocabulary, "seq_len": config.seq_len}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ddlsim.simulator.cli.common import check_output

    check_output(args.out, "directory", files=("results.csv", "metadata.json"))
    return launch_from_args(args, "train", {"train": train_scenario(args)})
