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


def _input_error(error: Exception | str):
    from ddlsim.simulator.cli.common import InputError

    return InputError(str(error))


def _llm_files(files: list[Path]) -> list[Path]:
    from ddlsim.simulator.calibration.llm_validation import is_llm_file

    return [path for path in files if is_llm_file(path)]


def _check_llm(files: list[Path]) -> int:
    """Large-model files (``llm_dev.csv``'s columns): read as ``validate`` and ``calibrate`` read them."""
    from ddlsim.simulator.calibration.llm_validation import read_llm_runs
    from ddlsim.simulator.records import Rejected
    from ddlsim.simulator.workloads.llm_runs import LlmRunsError

    unread: list[Rejected] = []
    try:
        runs = read_llm_runs(files, unread)
    except (LlmRunsError, OSError) as error:
        raise _input_error(error) from None
    for bad in unread:
        print(f"ddlsim: error: {bad.reason}", file=sys.stderr)
    metrics: dict[str, int] = {}
    for run in runs:
        metrics[run.metric] = metrics.get(run.metric, 0) + 1
    print(
        f"# {len(runs)} valid large-model rows (llm_dev.csv's columns): "
        + ", ".join(f"{count} {metric}" for metric, count in sorted(metrics.items()))
        + (f"; {len(unread)} bad rows" if unread else "")
    )
    return 2 if unread else 0


def run_check(args: argparse.Namespace) -> int:
    """Every problem of every file, one line each; exit 2 if any row is bad."""
    llm = _llm_files(args.files)
    if llm and len(llm) < len(args.files):
        other = next(path for path in args.files if path not in llm)
        raise _input_error(
            f"{other}: not llm_dev.csv's columns while {llm[0]} has them; check large-model and "
            "data-parallel files in separate runs"
        )
    if llm:
        return _check_llm(llm)
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
    llm = _llm_files(args.files)
    if llm:
        raise _input_error(
            f"{llm[0]}: a large-model file (llm_dev.csv's columns); split by scale reads data-parallel files "
            "only: give it to 'ddlsim validate --leave-one-source-out' or as --calibration/--measurements"
        )
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
