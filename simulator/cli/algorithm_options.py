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
}


def add_algorithm_arguments(parser: argparse.ArgumentParser, default: str = "sync_sgd") -> None:
    parser.add_argument(
        "--algorithm",
        default=default,
        help=f"training algorithm: {', '.join(TRAINING_ALGORITHMS.names())} (ddlsim list training-algorithms)",
    )
    group = parser.add_argument_group("algorithm options (each applies to the algorithms that read it)")
    group.add_argument(
        "--collective", default=None, help="all-reduce algorithm or library (ring, hierarchical, nccl, mpich...; "
        "default ring): sync_sgd, sync_easgd, hybrid_parallel",
    )  # fmt: skip
    group.add_argument(
        "--collective-option", action="append", metavar="KEY=VALUE", help="option of the collective, repeatable"
    )
    group.add_argument("--bucket-bytes", default=None, help="sync_sgd: gradient fusion bucket (default 25MB)")
    group.add_argument("--no-overlap", action="store_true", default=None, help="sync_sgd: all-reduce after backward")
    group.add_argument("--tau", type=int, default=None, help="EASGD family: communication period in local steps")
    group.add_argument("--alpha", type=float, default=None, help="EASGD family: elastic coefficient in (0, 1)")
    group.add_argument("--servers", type=int, default=None, help="parameter servers (at most one per node)")
    group.add_argument("--threads", type=int, default=None, help="Hogwild threads per worker node")
    group.add_argument("--split", default=None, help="hybrid_parallel: layers per device of a node, e.g. 80,81")
    group.add_argument("--staleness", type=int, default=None, help="async_sgd: artificial extra staleness (pulls)")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def options_from_args(args: argparse.Namespace, extra_flags: dict[str, set[str]] | None = None) -> AlgorithmOptions:
    """The algorithm options the user gave; a flag the algorithm does not read is refused.

    ``extra_flags``: a command's own algorithm-specific flags, {dest: algorithms that read it}.
    """
    return make_options(args.algorithm, options_values(args, args.algorithm, extra_flags))


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
    unused = [dest for dest in given if OPTION_FLAGS[dest] not in algorithm.options]
    unused += [dest for dest, readers in extra.items() if getattr(args, dest) and algorithm.name not in readers]
    if unused:
        valid = [flag(dest) for dest, name in OPTION_FLAGS.items() if name in algorithm.options]
        valid += [flag(dest) for dest, readers in extra.items() if algorithm.name in readers]
        raise InputError(
            f"{', '.join(flag(dest) for dest in unused)} do(es) not apply to --algorithm {algorithm.name}; "
            f"its options: {', '.join(valid) or 'none'}"
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
    return values
