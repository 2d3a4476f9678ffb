"""``ddlsim bench``: microbenchmarks for calibration, on N ranks.

    ddlsim bench -n 4 --benchmarks ping_pong,collectives --out runs/bench

Ping-pong and streaming bandwidth between ranks 0 and 1 (1 B to 64 MB), every registered
collective (and the MPI library's own) over sizes and rank counts, per-layer forward/backward of
the real_runs models. Writes ``measurements.csv`` (the measurement schema of data/README.md),
``layers.csv``, the per-rank traces and ``metadata.json`` into ``--out``. Row ids are unique per
run (``BENCH-<UTC start>-<tag>-00001``), so one run's rows can be validated against another's.
Rank 0 reports each benchmark's progress on stderr (``--no-progress`` to silence it).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.units import SIZE_UNITS, parse_bytes, parse_sizes
from ddlsim.simulator.cli.run_command import add_launch_arguments, launch_from_args
from ddlsim.simulator.parsing import bounded

BENCHMARKS = ("ping_pong", "streaming_bandwidth", "collectives", "layers")
DEFAULT_COLLECTIVE_SIZES = "1KiB,64KiB,1MiB,16MiB"
OUTPUT_FILES = ("measurements.csv", "layers.csv", "metadata.json")
MAX_BENCH_BYTES = 2**34  # 16 GiB: a buffer per rank past any host memory this harness runs on


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
    bench.add_argument(
        "--collective-sizes", default=DEFAULT_COLLECTIVE_SIZES,
        help=f"full buffer sizes, e.g. 1KiB,1MiB or 1KiB:16MiB:x4 (whole bytes > 0); units {SIZE_UNITS}",
    )  # fmt: skip
    bench.add_argument("--algorithms", help="collective algorithms (default: every registered one)")
    bench.add_argument("--rank-counts", help="rank counts to measure collectives at (default: 2..N)")
    bench.add_argument("--models", default="small_cnn,resnet_small", help="models for per-layer times")
    bench.add_argument("--batch-sizes", default="16,64", help="batch sizes for per-layer times")
    bench.add_argument("--repeats", type=bounded(int, 1, 100_000, "--repeats"), default=10)
    bench.add_argument("--warmup", type=bounded(int, 0, 10_000, "--warmup"), default=2)
    bench.add_argument("--device-token", default="local_cpu", help="device column of the measurement rows")
    bench.add_argument("--network-token", default="local_shm", help="network column of the measurement rows")
    bench.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="rank 0's progress on stderr, a line per benchmark (default: on, after the first second)",
    )  # fmt: skip
    parser.set_defaults(func=run)


def bench_scenario(args: argparse.Namespace) -> dict[str, Any]:
    from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
    from ddlsim.real_runs.microbench import power_sizes
    from ddlsim.real_runs.models import MODELS
    from ddlsim.simulator.cli.common import InputError
    from ddlsim.simulator.parsing import parse_counts

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
    rank_counts = list(parse_counts(args.rank_counts, "--rank-counts")) if args.rank_counts else []
    rank_counts = rank_counts or list(range(2, args.ranks + 1))
    beyond = [count for count in rank_counts if not 2 <= count <= args.ranks]
    if beyond:
        raise InputError(f"--rank-counts: {beyond[0]} is not between 2 and the {args.ranks} ranks of -n")
    batch_sizes = list(parse_counts(args.batch_sizes, "--batch-sizes", maximum=65_536))
    p2p_max = parse_bytes(args.p2p_max_bytes, "--p2p-max-bytes")
    collective_sizes = parse_sizes(args.collective_sizes, "--collective-sizes")
    for what, largest in (("--p2p-max-bytes", p2p_max), ("--collective-sizes", max(collective_sizes))):
        if not 1 <= largest <= MAX_BENCH_BYTES:
            raise InputError(f"{what}: {largest:g} B is outside 1 B to 16 GiB, the buffers a bench can hold")
    return {
        "benchmarks": chosen,
        "p2p_sizes": power_sizes(1, int(p2p_max)),
        "collective_sizes": [int(size) for size in collective_sizes],
        "algorithms": algorithms, "rank_counts": rank_counts, "models": models, "batch_sizes": batch_sizes,
        "repeats": args.repeats, "warmup": args.warmup, "device": args.device_token, "network": args.network_token,
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ddlsim.simulator.cli.common import check_output

    check_output(args.out, "directory", files=OUTPUT_FILES)
    scenario = {"bench": bench_scenario(args)}
    # the ranks inherit this environment and their stderr is a pipe through the launcher: a line per
    # benchmark (a bar's carriage returns would garble the launcher's record of their last lines)
    # (--progress asked for explicitly: from the first point, not after a quiet first second)
    wanted = {"DDLSIM_PROGRESS": "off" if args.progress is False else "lines",
              "DDLSIM_PROGRESS_DELAY": "0" if args.progress else "1"}  # fmt: skip
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        return launch_from_args(args, "bench", scenario)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
