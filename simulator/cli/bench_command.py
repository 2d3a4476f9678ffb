"""``ddlsim bench``: microbenchmarks for calibration, on N ranks.

    ddlsim bench -n 4 --benchmarks ping_pong,collectives --out runs/bench

Ping-pong and streaming bandwidth between ranks 0 and 1 (1 B to 64 MB), every registered
collective (and the MPI library's own) over sizes and rank counts, per-layer forward/backward of
the real_runs models. Writes ``measurements.csv`` (the measurement schema of data/README.md),
``layers.csv``, the per-rank traces and ``metadata.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.units import parse_bytes
from ddlsim.simulator.cli.run_command import add_launch_arguments, launch_from_args

BENCHMARKS = ("ping_pong", "streaming_bandwidth", "collectives", "layers")
DEFAULT_COLLECTIVE_SIZES = "1KiB,64KiB,1MiB,16MiB"


def _list(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure point-to-point, collectives and per-layer compute for calibration",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_launch_arguments(parser)
    parser.set_defaults(out=Path("runs/bench"))
    bench = parser.add_argument_group("benchmarks")
    bench.add_argument("--benchmarks", default=",".join(BENCHMARKS), help=f"any of {', '.join(BENCHMARKS)}")
    bench.add_argument("--p2p-max-bytes", default="64MiB", help="largest point-to-point message (from 1 B, x4)")
    bench.add_argument("--collective-sizes", default=DEFAULT_COLLECTIVE_SIZES, help="full buffer sizes")
    bench.add_argument("--algorithms", help="collective algorithms (default: every registered one)")
    bench.add_argument("--rank-counts", help="rank counts to measure collectives at (default: 2..N)")
    bench.add_argument("--models", default="small_cnn,resnet_small", help="models for per-layer times")
    bench.add_argument("--batch-sizes", default="16,64", help="batch sizes for per-layer times")
    bench.add_argument("--repeats", type=int, default=10)
    bench.add_argument("--warmup", type=int, default=2)
    bench.add_argument("--device-token", default="local_cpu", help="device column of the measurement rows")
    bench.add_argument("--network-token", default="local_shm", help="network column of the measurement rows")
    parser.set_defaults(func=run)


def bench_scenario(args: argparse.Namespace) -> dict[str, Any]:
    from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
    from ddlsim.real_runs.microbench import power_sizes
    from ddlsim.real_runs.models import MODELS
    from ddlsim.simulator.cli.common import InputError

    chosen = _list(args.benchmarks)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown or not chosen:
        raise InputError(f"unknown benchmark(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(BENCHMARKS)}")
    algorithms = _list(args.algorithms)
    for name in algorithms:
        COLLECTIVE_ALGORITHMS.get(name)
    models = _list(args.models)
    for name in models:
        MODELS.get(name)
    try:
        rank_counts = [int(item) for item in _list(args.rank_counts)] or list(range(2, args.ranks + 1))
        batch_sizes = [int(item) for item in _list(args.batch_sizes)]
    except ValueError as error:
        raise InputError(f"--rank-counts and --batch-sizes take integers: {error}") from None
    if args.repeats < 1 or args.warmup < 0:
        raise InputError("--repeats must be at least 1 and --warmup at least 0")
    return {
        "benchmarks": chosen,
        "p2p_sizes": power_sizes(1, int(parse_bytes(args.p2p_max_bytes, "--p2p-max-bytes"))),
        "collective_sizes": [int(parse_bytes(size, "--collective-sizes")) for size in _list(args.collective_sizes)],
        "algorithms": algorithms, "rank_counts": rank_counts, "models": models, "batch_sizes": batch_sizes,
        "repeats": args.repeats, "warmup": args.warmup, "device": args.device_token, "network": args.network_token,
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    return launch_from_args(args, "bench", {"bench": bench_scenario(args)})
