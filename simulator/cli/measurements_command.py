"""``ddlsim measurements``: check measurement files, split them by scale, convert harness traces."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddlsim.simulator.calibration.measurements import (
    MEASUREMENT_COLUMNS,
    MeasurementError,
    check_rows,
    failed_ranks,
    from_trace,
    load_measurements,
    read_measurements,
    split_by_scale,
)
from ddlsim.simulator.records import write_csv


def register(subparsers) -> None:
    parser = subparsers.add_parser("measurements", help="check, split or convert measurement files (CSV schema)")
    commands = parser.add_subparsers(dest="measurements_command", metavar="ACTION", required=True)

    check = commands.add_parser("check", help="validate measurement files and count their rows")
    check.add_argument("files", nargs="+", type=Path)
    check.set_defaults(func=run_check)

    split = commands.add_parser(
        "split", help="split rows into small-scale calibration rows and larger-scale held-out rows"
    )
    split.add_argument("files", nargs="+", type=Path)
    split.add_argument("--calibration-out", type=Path, required=True)
    split.add_argument("--heldout-out", type=Path, required=True)
    split.set_defaults(func=run_split)

    trace = commands.add_parser("from-trace", help="convert a harness trace directory to measurement rows")
    trace.add_argument("trace_dir", type=Path)
    trace.add_argument("--out", type=Path, required=True, help="measurement CSV to write")
    trace.add_argument("--warmup", type=int, default=1, help="repetitions to drop at the start")
    for column in ("id", "device", "network", "intra_node_link", "algorithm", "workload", "precision"):
        trace.add_argument(
            f"--{column.replace('_', '-')}",
            dest=column,
            default=None,
            help=f"the rows' {column} (default: from metadata.json)",
        )
    for column in ("devices_per_node", "nodes", "per_device_batch"):
        trace.add_argument(f"--{column.replace('_', '-')}", dest=column, type=int, default=None)
    trace.set_defaults(func=run_from_trace)


def _input_error(error: Exception):
    from ddlsim.simulator.cli.common import InputError

    return InputError(str(error))


def run_check(args: argparse.Namespace) -> int:
    """Every problem of every file, one line each; exit 2 if any row is bad."""
    try:
        measured = read_measurements(args.files)
    except MeasurementError as error:
        raise _input_error(error) from None
    for notice in measured.notices:
        print(f"ddlsim: warning: {notice}", file=sys.stderr)
    for rejected in measured.rejected:
        print(f"ddlsim: error: {rejected.reason}", file=sys.stderr)
    kinds: dict[str, int] = {}
    for row in measured.rows:
        kinds[row.kind] = kinds.get(row.kind, 0) + 1
    print(
        f"# {len(measured.rows)} valid rows: "
        + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        + (f"; {len(measured.rejected)} bad rows" if measured.rejected else "")
    )
    return 2 if measured.rejected else 0


def run_split(args: argparse.Namespace) -> int:
    try:
        rows = load_measurements(args.files)
    except MeasurementError as error:
        raise _input_error(error) from None
    calibration, held_out = split_by_scale(rows)
    write_csv(args.calibration_out, [row.to_row() for row in calibration], MEASUREMENT_COLUMNS)
    write_csv(args.heldout_out, [row.to_row() for row in held_out], MEASUREMENT_COLUMNS)
    print(f"# {len(calibration)} calibration rows -> {args.calibration_out}")
    print(f"# {len(held_out)} held-out rows -> {args.heldout_out}")
    return 0


def run_from_trace(args: argparse.Namespace) -> int:
    overrides = {
        column: getattr(args, column)
        for column in (
            "id",
            "device",
            "network",
            "intra_node_link",
            "algorithm",
            "workload",
            "precision",
            "devices_per_node",
            "nodes",
            "per_device_batch",
        )
    }
    try:
        rows = from_trace(args.trace_dir, overrides, warmup=args.warmup)
        check_rows(rows, args.trace_dir)  # what we write must load back through the same checks
    except MeasurementError as error:
        raise _input_error(error) from None
    failure = failed_ranks(args.trace_dir)
    if failure:
        print(
            f"ddlsim: warning: {args.trace_dir} is a failed run ({failure}): converted the repetitions every "
            "rank finished only; the rows' notes say so",
            file=sys.stderr,
        )
    write_csv(args.out, rows, MEASUREMENT_COLUMNS)
    print(f"# {len(rows)} rows from {args.trace_dir} -> {args.out}")
    return 0
