"""The training-algorithm option flags, one declaration for every command that takes an algorithm
(``simulate`` and ``run``): a user who knows one algorithm's flags knows them all.

Each flag maps to one ``AlgorithmOptions`` field; a flag given to an algorithm that does not read it
is refused with the list of the flags it does read (``--tau`` for sync_sgd, say).
"""

from __future__ import annotations

import argparse
from typing import Any

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, AlgorithmOptions, make_options
from ddlsim.hardware_models.units import parse_bytes
from ddlsim.simulator.cli.common import InputError, parse_options

# flag (argparse dest) -> AlgorithmOptions field
OPTION_FLAGS: dict[str, str] = {
    "collective": "collective",
    "collective_option": "collective_options",
    "bucket_bytes": "bucket_bytes",
    "no_overlap": "overlap",
    "tau": "tau",
    "alpha": "alpha",
    "servers": "servers",
    "threads": "threads",
    "split": "split",
    "staleness": "staleness",
    "overlap_grad_reduce": "overlap_grad_reduce",
    "overlap_param_gather": "overlap_param_gather",
}


# flag (argparse dest) -> ParallelLayout field: megatron's layout, one flag per field
LAYOUT_FLAGS: dict[str, str] = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "micro_batch": "micro_batch",
    "global_batch": "global_batch", "virtual_stages": "virtual_stages", "sequence_parallel": "sequence_parallel",
    "zero_stage": "zero_stage", "recompute": "recompute", "schedule": "schedule",
    "no_flash_attention": "flash_attention", "first_stage_layers": "first_stage_layers",
    "last_stage_layers": "last_stage_layers", "no_grad_reduce_in_fp32": "grad_reduce_in_fp32",
    "tp_comm_overlap": "tp_comm_overlap", "no_zero3_prefetch": "zero3_prefetch",
    "fp8_attention_and_logits": "fp8_attention_and_logits", "frozen_weights": "frozen_weights",
}  # fmt: skip


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """megatron's layout as flags (each sets one field of the ``layout`` option; a scenario file's
    layout keeps the fields no flag names)."""
    group = parser.add_argument_group("megatron layout (a transformer split over GPUs; ddlsim plan searches them)")
    for dest in ("tp", "pp", "cp", "ep"):
        group.add_argument(flag(dest), type=int, default=None, help=f"{dest.upper()} size")
    group.add_argument("--dp", type=int, default=None, help="data-parallel size (default: what the GPUs leave)")
    group.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch (default 1)")
    group.add_argument("--global-batch", type=int, default=None, help="sequences per iteration")
    group.add_argument("--virtual-stages", type=int, default=None, help="model chunks per pipeline rank (interleaved)")
    group.add_argument("--sequence-parallel", action="store_true", default=None, help="Megatron sequence parallelism")
    group.add_argument("--zero-stage", type=int, default=None, help="ZeRO stage 0-3 (1: the distributed optimizer)")
    group.add_argument("--recompute", default=None, help="activation recomputation: none, selective, full")
    group.add_argument("--schedule", default=None, help="pipeline schedule: gpipe, 1f1b (default)")
    group.add_argument("--no-flash-attention", action="store_true", default=None, help="materialise the scores")
    group.add_argument("--first-stage-layers", type=int, default=None, help="layers on the first pipeline stage")
    group.add_argument("--last-stage-layers", type=int, default=None, help="layers on the last pipeline stage")
    group.add_argument("--tp-comm-overlap", action="store_true", default=None,
                       help="overlap tensor-parallel collectives with their matrix products (userbuffers)")
    group.add_argument("--no-zero3-prefetch", action="store_true", default=None,
                       help="ZeRO-3: gather each block's weights when it starts, not during the block before")
    group.add_argument("--no-grad-reduce-in-fp32", action="store_true", default=None,
                       help="reduce gradients in the weights' 16-bit type, not fp32 (NeMo's performance recipes)")
    group.add_argument("--fp8-attention-and-logits", action="store_true", default=None,
                       help="fp8: run the attention core and the output logits in fp8 too (default: bf16)")
    group.add_argument("--frozen-weights", action="store_true", default=None,
                       help="fine-tune with the base weights frozen (LoRA): input gradients only, no weight "
                            "gradients, reductions, optimizer states or update")


def add_algorithm_arguments(parser: argparse.ArgumentParser, default: str = "sync_sgd") -> None:
    names = ", ".join(TRAINING_ALGORITHMS.names_from_files())  # without importing every algorithm
    parser.add_argument(
        "--algorithm", default=default, help=f"training algorithm: {names} (ddlsim list training-algorithms)"
    )
    group = parser.add_argument_group("algorithm options (each applies to the algorithms that read it)")
    group.add_argument(
        "--collective", default=None, help="all-reduce algorithm or library (ring, hierarchical, nccl, mpich...; "
        "default ring, for megatron on GPUs nccl): sync_sgd, sync_easgd, hybrid_parallel, megatron",
    )  # fmt: skip
    group.add_argument(
        "--collective-option", action="append", metavar="KEY=VALUE", help="option of the collective, repeatable"
    )
    group.add_argument("--bucket-bytes", default=None,
                       help="sync_sgd, megatron (overlapped): gradient fusion bucket (default 25MB)")
    group.add_argument("--no-overlap", action="store_true", default=None, help="sync_sgd: all-reduce after backward")
    group.add_argument("--tau", type=int, default=None, help="EASGD family: communication period in local steps")
    group.add_argument("--alpha", type=float, default=None, help="EASGD family: elastic coefficient in (0, 1)")
    group.add_argument("--servers", type=int, default=None, help="parameter servers (at most one per node)")
    group.add_argument("--threads", type=int, default=None, help="Hogwild threads per worker node")
    group.add_argument("--split", default=None, help="hybrid_parallel: layers per device of a node, e.g. 80,81")
    group.add_argument("--staleness", type=int, default=None, help="async_sgd: artificial extra staleness (pulls)")
    group.add_argument("--overlap-grad-reduce", action="store_true", default=None,
                       help="megatron: reduce gradient buckets while the last backward runs")
    group.add_argument("--overlap-param-gather", action="store_true", default=None,
                       help="megatron, ZeRO 1-2: gather updated weights while the next forward runs")
    add_layout_arguments(parser)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def options_from_args(args: argparse.Namespace, extra_flags: dict[str, set[str]] | None = None) -> AlgorithmOptions:
    """The algorithm options the user gave; a flag the algorithm does not read is refused.

    ``extra_flags``: a command's own algorithm-specific flags, {dest: algorithms that read it}.
    """
    values = options_values(args, args.algorithm, extra_flags)
    if "layout" in values:
        values["layout"] = {"dp": 0, **values["layout"]}  # dp: what the GPUs leave, unless given
    return make_options(args.algorithm, values)


def _readers(dest: str, extra: dict[str, set[str]]) -> set[str]:
    """The training algorithms that read the flag ``dest``."""
    if dest in extra:
        return set(extra[dest])
    if dest in LAYOUT_FLAGS:
        return {name for name in TRAINING_ALGORITHMS.names() if "layout" in TRAINING_ALGORITHMS.get(name).options}
    option = OPTION_FLAGS.get(dest)
    return {name for name in TRAINING_ALGORITHMS.names() if option in TRAINING_ALGORITHMS.get(name).options}


def options_values(
    args: argparse.Namespace, name: str, extra_flags: dict[str, set[str]] | None = None
) -> dict[str, Any]:
    """The ``AlgorithmOptions`` fields the user gave as flags for algorithm ``name`` (checked as
    ``options_from_args`` says)."""
    if name not in TRAINING_ALGORITHMS and name in COLLECTIVE_ALGORITHMS:
        raise InputError(
            f"{name!r} is a collective algorithm, not a training algorithm: use --collective "
            f"{name} (with --algorithm sync_sgd, the default)"
        )
    algorithm = TRAINING_ALGORITHMS.get(name)
    extra = extra_flags or {}
    given = [dest for dest in OPTION_FLAGS if getattr(args, dest) is not None]
    layout = {LAYOUT_FLAGS[dest]: getattr(args, dest) for dest in LAYOUT_FLAGS if getattr(args, dest, None) is not None}
    for negated in ("flash_attention", "grad_reduce_in_fp32", "zero3_prefetch"):  # the --no-... layout flags
        if negated in layout:
            layout[negated] = False
    unused = [dest for dest in given if OPTION_FLAGS[dest] not in algorithm.options]
    if layout and "layout" not in algorithm.options:
        unused += [dest for dest in LAYOUT_FLAGS if getattr(args, dest, None) is not None]
    unused += [dest for dest, readers in extra.items() if getattr(args, dest) and algorithm.name not in readers]
    if unused:
        valid = [flag(dest) for dest, name in OPTION_FLAGS.items() if name in algorithm.options]
        valid += [flag(dest) for dest in LAYOUT_FLAGS] if "layout" in algorithm.options else []
        valid += [flag(dest) for dest, readers in extra.items() if algorithm.name in readers]
        readers = sorted(_readers(unused[0], extra))
        hint = f" ({flag(unused[0])} is read by --algorithm {', '.join(readers)})" if readers else ""
        raise InputError(
            f"{', '.join(flag(dest) for dest in unused)} do(es) not apply to --algorithm {algorithm.name}; "
            f"its options: {', '.join(valid) or 'none'}{hint}"
        )
    values: dict[str, Any] = {}
    for dest in given:
        value = getattr(args, dest)
        if dest == "collective_option":
            value = parse_options(value, "--collective-option")
        elif dest == "bucket_bytes":
            value = parse_bytes(value, "--bucket-bytes")
        elif dest == "no_overlap":
            value = not value
        values[OPTION_FLAGS[dest]] = value
    if layout:
        values["layout"] = layout  # the fields given; callers merge them into a layout (dp 0 unless given)
    return values
