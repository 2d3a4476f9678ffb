"""``ddlsim collective``: time one collective over a sweep of sizes and rank counts on a modeled fabric."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddlsim.hardware_models.units import SIZE_UNITS, parse_sizes
from ddlsim.reports.formatting import format_size
from ddlsim.simulator.cli.common import (
    PROFILE_HELP,
    InputError,
    Progress,
    add_topology_arguments,
    check_output,
    parse_counts,
    parse_options,
    print_table,
    read_profile,
    topology_options,
)
from ddlsim.simulator.collective_sim import CollectiveSetup, simulate_collective
from ddlsim.simulator.parsing import bounded
from ddlsim.simulator.progress import format_duration
from ddlsim.simulator.records import write_csv, write_json

MAX_RANKS = 2**20  # 1,048,576: about 4 GB and minutes per point for the DES (see ``reach_note``)
NOTE_RANKS = 2**16  # past this, say up front what a point costs
COLUMNS = (
    "algorithm",
    "resolved_algorithm",
    "resolved_options",
    "collective",
    "ranks",
    "message_bytes",
    "time_s",
    "algbw_Bps",
    "busbw_Bps",
    "closed_form_s",
    "launch_s",
    "call_s",
    "execution_path",
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "collective",
        help="simulate one collective: time, algbw and busbw (nccl-tests definitions) per message size",
    )
    p.add_argument("--algorithm", default="ring",
                   help="algorithm token, or a library: nccl, mpich, mlsl, openmpi, gloo")  # fmt: skip
    p.add_argument("--collective", default="allreduce", help="allreduce, reduce_scatter, allgather, broadcast, reduce")
    p.add_argument(
        "--message-bytes", default="100MB",
        help=f"sizes per rank: 100MB, 1KiB,4KiB or a range 1KiB:1GiB:x2 (ends at its END); units {SIZE_UNITS}",
    )  # fmt: skip
    p.add_argument("--ranks", default="64", help="rank counts: 64, 2,4,...,4096 or 2:4096:x2")
    p.add_argument("--devices-per-node", type=bounded(int, 1, 1024, "--devices-per-node"), default=1)
    p.add_argument("--intra-node", default=None, help="intra-node link when devices-per-node > 1")
    p.add_argument("--host-link", default=None, help="device-to-NIC link (e.g. pcie3_x16); none by default")
    p.add_argument("--network", default="ib_edr")
    add_topology_arguments(p)
    p.add_argument("--algorithm-option", action="append", metavar="KEY=VALUE")
    p.add_argument(
        "--profile", type=Path, default=None, metavar="TOML|published",
        help=f"{PROFILE_HELP}: its fitted links (alpha, bandwidth, fixed cost per call per "
        "message size) replace the datasheets' for --device's rows of this algorithm and collective",
    )  # fmt: skip
    p.add_argument(
        "--device", default=None,
        help="the device the profile's link fits were measured on (with --profile), e.g. knl_7250",
    )  # fmt: skip
    p.add_argument(
        "--mode", default="auto", choices=("auto", "vectorised", "fluid", "message"), help="DES execution path"
    )
    p.add_argument("--out", type=Path, default=None, help="directory for results.csv and setup.json")
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="progress on stderr (default: a bar on a terminal, a line per stage otherwise after 1 s)",
    )  # fmt: skip
    p.set_defaults(func=run)


def reach_note(ranks: int) -> str:
    """What one point of ``ranks`` ranks costs, scaled from what was measured on a 2-core machine:
    65,536 ranks took 3 s and 270 MB (halving-doubling, log-many rounds: time and memory grow with
    the ranks) and 7 s (ring: 2(P-1) rounds, time grows with the square of the ranks)."""
    scale = ranks / 2**16
    return (
        f"about {format_duration(3 * scale)} and {4.1e3 * ranks / 1e9:.1f} GB per point for schedules of "
        f"log-many rounds, up to {format_duration(7 * scale**2)} for a ring (65,536 ranks: 3 s to 7 s here)"
    )


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "directory", files=("results.csv", "setup.json"))
    if args.profile is not None and args.device is None:
        raise InputError(
            "--profile and --device go together: the profile's links are fitted per device (add e.g. --device knl_7250)"
        )
    if args.device is not None and args.profile is None:
        raise InputError(
            "--profile and --device go together: --device picks which of a profile's fitted links to use; "
            "without --profile the collective runs on the datasheet links (drop --device, or add --profile TOML)"
        )
    profile, scope = None, None
    if args.profile is not None:
        from ddlsim.hardware_models.catalog import load_device

        load_device(args.device)  # an unknown token: one line naming the valid ones
        profile = read_profile(args.profile)
        scope = f"{args.device}@{args.algorithm}@{args.collective}"  # as validate scopes a collective row
    setup = CollectiveSetup(
        devices_per_node=args.devices_per_node,
        intra_node=args.intra_node,
        host_link=args.host_link,
        network=args.network,
        profile=profile,
        device=scope,
        **topology_options(args),
    )
    sizes = parse_sizes(args.message_bytes, "--message-bytes")
    rank_counts = parse_counts(args.ranks, "ranks")
    if max(rank_counts) > MAX_RANKS:
        raise InputError(
            f"ranks: {max(rank_counts):,} ranks is beyond reach of the message-level simulation (at most "
            f"{MAX_RANKS:,}: {reach_note(MAX_RANKS)})"
        )
    if max(rank_counts) > NOTE_RANKS:
        largest = max(rank_counts)
        print(f"ddlsim: note: {largest:,} ranks: {reach_note(largest)}; Ctrl-C stops", file=sys.stderr)
    options = parse_options(args.algorithm_option)
    points = [(ranks, size) for ranks in rank_counts for size in sizes]
    progress = Progress(f"simulating {args.collective} ({args.algorithm})", args.progress, unit="points")
    rows = []
    for index, (ranks, size) in enumerate(points, start=1):
        rows.append(simulate_collective(setup, args.algorithm, args.collective, ranks, size, options, args.mode))
        progress(index, len(points))
    # time in µs as nccl-tests prints it, so that small and large messages read in one format
    shown = [row | {"size": format_size(row["message_bytes"]), "time_us": 1e6 * row["time_s"]} for row in rows]
    launch = max(row["launch_s"] for row in rows)
    included = f"; times include {args.algorithm}'s launch, {1e6 * launch:g} us a call" if launch else ""
    calls = sorted({row["call_s"] for row in rows if row["call_s"]})
    if calls:
        span = f"{1e3 * calls[0]:.3g} ms" + (f" to {1e3 * calls[-1]:.3g} ms" if len(calls) > 1 else "")
        included += f"; and the profile's fixed cost per call, {span}"
    where = f"{args.topology} ({args.network})" + (f", links calibrated in {args.profile}" if profile else "")
    print(f"# {args.collective} with {args.algorithm} on {where}, busbw as nccl-tests{included}")
    chosen = ("resolved_options",) if any(row["resolved_options"] for row in rows) else ()
    print_table(
        shown,
        ("ranks", "size", "time_us", "algbw_Bps", "busbw_Bps", "resolved_algorithm", *chosen, "execution_path"),
    )
    if args.out is not None:
        write_csv(args.out / "results.csv", rows, COLUMNS)
        write_json(
            args.out / "setup.json",
            {
                "setup": vars(setup) | {"torus_dims": setup.torus_dims, "profile": str(args.profile or "")},
                "algorithm": args.algorithm,
                "collective": args.collective,
                "options": options,
            },
        )
        print(f"# wrote {args.out / 'results.csv'}, {args.out / 'setup.json'}")
    return 0
