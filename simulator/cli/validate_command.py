"""``ddlsim validate``: calibrate on some rows, predict the others, and fail past a tolerance.

Writes ``OUT/validation.csv`` (one row per measurement, ``VALIDATION_COLUMNS``: the prediction,
its interval, what it rests on, what was assumed, or why there is none) and ``OUT/summary.json``
(``SUMMARY_KEYS``; fractions, not percent); exits 1 when the median absolute percentage error of
the predicted rows exceeds ``--tolerance`` (a fraction: 0.10 = 10 %), so it can gate CI.

Splits: ``--calibration FILES`` (fit on those rows, predict every row of ``--measurements``),
``--profile P`` (a saved profile), ``--leave-one-source-out`` (each source of ``--measurements``
predicted from a fit to the others; ``--by family`` for whole id-prefix families), or neither (the
datasheets alone).

Every row gets an answer: a row that cannot be read or modeled is listed with its reason, and a
row whose source leaves a field open is predicted with the documented default (its note says
which, and its interval spans the alternatives). Intervals: see ``simulator/calibration/intervals.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddlsim.hardware_models.profile import Profile, load_profile
from ddlsim.simulator.calibration.crossval import (
    SUMMARY_KEYS,
    VALIDATION_COLUMNS,
    leave_one_source_out,
    rejected_row,
    summarise,
    summary_line,
    validate_table,
)
from ddlsim.simulator.calibration.fit import CalibrationError, calibrate
from ddlsim.simulator.calibration.measurements import Measurement, MeasurementError, Rejected, read_measurements
from ddlsim.simulator.calibration.unseen import without
from ddlsim.simulator.cli.common import Progress, is_published, print_table, read_profile
from ddlsim.simulator.records import write_csv, write_json
from ddlsim.simulator.sweep import POOLS

__all__ = ["PRINTED", "SUMMARY_KEYS", "VALIDATION_COLUMNS", "register", "validate_rows"]

PRINTED = (
    "id",
    "device",
    "devices_per_node",
    "nodes",
    "measured",
    "predicted",
    "error_pct",
    "ci_width",
    "in_ci",
    "status",
)
FULL_TABLE_ROWS = 200  # above this many rows, print the largest errors only (the CSV has them all)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="predict measurements after calibrating on others; exit 1 past --tolerance",
        description="Calibrate on the --calibration rows only (or load --profile, or leave each source out in "
        "turn), predict every row of --measurements, print and write the error table and summary.",
    )
    parser.add_argument("--measurements", nargs="+", type=Path, required=True, help="rows to predict")
    parser.add_argument("--calibration", nargs="*", type=Path, default=[], help="rows to calibrate on")
    parser.add_argument(
        "--profile", type=Path, default=None, metavar="TOML|published",
        help="use this profile instead of fitting: a file from 'ddlsim calibrate', or 'published' (a fit to "
        "the published runs ddlsim ships, made now: published_dev.csv, or llm_dev.csv for large-model files; "
        "in-sample for their rows)",
    )  # fmt: skip
    parser.add_argument(
        "--leave-one-source-out",
        action="store_true",
        help="predict each source of --measurements from a fit to the other sources",
    )
    parser.add_argument("--by", choices=("source", "family"), default="source", help="what a left-out source is")
    parser.add_argument("--tolerance", type=float, default=0.10, help="max median |error| (fraction)")
    parser.add_argument("--ci", type=float, default=0.9, help="confidence level of the intervals")
    parser.add_argument("--bootstrap", type=int, default=20, help="bootstrap resamples when calibrating")
    parser.add_argument("--executor", choices=("analytic", "des"), default="analytic")
    parser.add_argument(
        "--ideal", action="store_true",
        help="switch off the fitted step-level cost terms (rank jitter: the slowest of N ranks; overlap "
        "interference; a link's fixed cost per collective call)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers", type=int, default=None,
        help="processes running --leave-one-source-out's folds at once (default: one per fold, up to the cores)",
    )  # fmt: skip
    parser.add_argument("--executor-pool", choices=POOLS, default="auto",
                        help="who runs --workers: process (local), mpi (mpi4py.futures), serial; auto: process "
                        "for 2+")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="directory for validation.csv, summary.json")
    parser.set_defaults(func=run)


def validate_rows(
    rows: list[Measurement],
    calibration_ids: set[str],
    profile: Profile,
    tolerance: float,
    ci: float,
    executor: str = "analytic",
    progress=None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The validation table and summary of ``rows`` under ``profile``."""
    table = validate_table(rows, calibration_ids, profile, ci, executor, progress)
    return table, summarise(table, ci, tolerance, "calibration rows" if calibration_ids else "profile")


def _check_destination(out: Path) -> None:
    from ddlsim.simulator.cli.common import InputError

    if out.exists() and not out.is_dir():
        raise InputError(
            f"--out {out}: exists and is not a directory (validate writes validation.csv and summary.json)"
        )
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise InputError(f"--out {out}: {parent} is not a directory")


def _calibration_ids(rows: list[Measurement], calibration_rows: list[Measurement]) -> tuple[set[str], int]:
    """Ids of ``rows`` that are calibration rows (same id and content), and how many ids collide
    with a different calibration row (two runs that reuse ids)."""
    by_id = {row.id: row for row in calibration_rows}
    same, collide = set(), 0
    for row in rows:
        other = by_id.get(row.id)
        if other is None:
            continue
        if other.to_row() == row.to_row():
            same.add(row.id)
        else:
            collide += 1
    return same, collide


def run(args: argparse.Namespace) -> int:
    from ddlsim.simulator.cli.common import InputError

    if not 0 < args.ci < 1:
        raise InputError(f"--ci must be in (0, 1), got {args.ci}")
    if not args.tolerance > 0:
        raise InputError(f"--tolerance must be > 0 (a fraction: 0.10 = 10 %), got {args.tolerance}")
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers must be a positive integer, got {args.workers}")
    if args.leave_one_source_out and (args.profile or args.calibration):
        raise InputError("--leave-one-source-out fits its own profiles: drop --profile and --calibration")
    _check_destination(args.out)
    from ddlsim.simulator.calibration.llm_validation import is_llm_file

    if any(is_llm_file(path) for path in args.measurements):
        return _run_llm(args)
    try:
        measured = read_measurements(args.measurements)
        calibration = read_measurements(args.calibration) if args.calibration else None
        for notice in measured.notices + (calibration.notices if calibration else []):
            print(f"ddlsim: warning: {notice}", file=sys.stderr)
        rows = measured.rows
        calibration_ids: set[str] = set()
        if args.leave_one_source_out:
            table = leave_one_source_out(
                rows, args.ci, args.by, args.bootstrap, args.seed, args.executor, Progress("validate: sources"),
                ideal=args.ideal, workers=args.workers, pool=args.executor_pool,
            )  # fmt: skip
            split = f"leave one {args.by} out"
        else:
            if args.profile is not None:
                profile = read_profile(args.profile)
            elif calibration and calibration.rows:
                calibration_ids, collide = _calibration_ids(rows, calibration.rows)
                if collide:
                    print(
                        f"ddlsim: warning: {collide} id(s) of --measurements name different rows in --calibration "
                        "(two runs that reuse ids?): they are predicted as held-out rows",
                        file=sys.stderr,
                    )
                # no catalog value derived from the held-out rows (simulator/calibration/unseen.py)
                base = without(Profile(), [row.id for row in rows if row.id not in calibration_ids])
                profile = calibrate(calibration.rows, bootstrap=args.bootstrap, seed=args.seed, base=base).profile
            else:
                profile = without(Profile(), [row.id for row in rows])  # the datasheets alone, none derived from these
            if args.ideal:
                profile = profile.ideal()
            table = validate_table(rows, calibration_ids, profile, args.ci, args.executor, Progress("validate"))
            split = "profile" if args.profile else "calibration rows" if calibration else "datasheets"
    except (MeasurementError, CalibrationError) as error:
        raise InputError(str(error)) from None
    table += [rejected_row(rejected) for rejected in measured.rejected]
    summary = summarise(table, args.ci, args.tolerance, split)
    _print(table)
    print(summary_line(summary))
    write_csv(args.out / "validation.csv", table, VALIDATION_COLUMNS)
    write_json(args.out / "summary.json", summary)
    print(f"# wrote {args.out / 'validation.csv'} and {args.out / 'summary.json'}")
    return 0 if summary["passed"] else 1


def _run_llm(args: argparse.Namespace) -> int:
    """Files with llm_dev.csv's columns: large-model runs predicted by the megatron closed form
    (``simulator.calibration.llm_validation``); the same table, summary and files."""
    from ddlsim.simulator.calibration import llm_validation
    from ddlsim.simulator.cli.common import InputError
    from ddlsim.simulator.workloads.llm_runs import LlmRunsError

    every = [*args.measurements, *args.calibration]
    mixed = [path for path in every if not llm_validation.is_llm_file(path)]
    if mixed:
        raise InputError(f"{mixed[0]}: not llm_dev.csv's columns; give large-model and data-parallel files "
                         "to separate validate runs")  # fmt: skip
    try:
        unread: list[Rejected] = []  # rows of --measurements that cannot be read: listed, not fatal
        measured = llm_validation.read_llm_runs(args.measurements, unread)
        unused: list[Rejected] = []
        calibration = llm_validation.read_llm_runs(args.calibration, unused) if args.calibration else None
    except (LlmRunsError, OSError) as error:
        raise InputError(str(error)) from None
    for bad in unused:
        print(f"ddlsim: warning: not calibrated on: {bad.reason}", file=sys.stderr)
    progress = Progress("validate: large-model rows")
    if args.leave_one_source_out:
        table, _ = llm_validation.leave_one_source_out(measured, args.ci, progress)
        split = "leave one source out"
    elif args.profile is not None and is_published(args.profile):
        shipped = llm_validation.read_llm_runs([llm_validation.packaged_llm_dev()])
        print(f"ddlsim: --profile published: calibrating on the {len(shipped)} rows of the packaged llm_dev.csv "
              "(ddlsim calibrate --measurements ... --out FILE saves one to reuse)", file=sys.stderr)  # fmt: skip
        fitted, fit = llm_validation.fit_runs(shipped, args.ci, Progress("validate: the packaged large-model rows"))
        basis = f"transformer_slowdown {fit.slowdown:.3f} fitted to the packaged llm_dev.csv ({fit.rows} rows)"
        known = {p.run.id: p for p in fitted}

        def reused(run: Any) -> Any:  # a packaged row given again is not predicted twice
            prediction = known.get(run.id)
            return prediction if prediction is not None and prediction.run == run else None

        fresh = iter(llm_validation.predict_runs([run for run in measured if reused(run) is None], progress))
        predictions = [reused(run) or next(fresh) for run in measured]
        table = [llm_validation.table_row(p, fit, basis=basis) for p in predictions]
        split = "profile"
    elif args.profile is not None:  # a profile ddlsim calibrate wrote from large-model rows
        saved = load_profile(args.profile)
        fit = llm_validation.LlmFit(saved.transformer_slowdown, *saved.transformer_band)
        basis = f"transformer_slowdown {fit.slowdown:.3f} from {args.profile}"
        table = [llm_validation.table_row(p, fit, basis=basis) for p in llm_validation.predict_runs(measured, progress)]
        split = "profile"
    else:
        table, _ = llm_validation.validate_llm(measured, calibration, args.ci, progress)
        split = "calibration rows" if calibration else "datasheets"
    table += [rejected_row(bad) for bad in unread]
    summary = summarise(table, args.ci, args.tolerance, split)
    _print(table)
    print(summary_line(summary))
    write_csv(args.out / "validation.csv", table, VALIDATION_COLUMNS)
    write_json(args.out / "summary.json", summary)
    print(f"# wrote {args.out / 'validation.csv'} and {args.out / 'summary.json'}")
    return 0 if summary["passed"] else 1


def _print(table: list[dict[str, Any]]) -> None:
    shown = [row for row in table if row["status"] != "cannot_model"]
    if len(shown) > FULL_TABLE_ROWS:
        shown = sorted(shown, key=lambda row: -abs(row["error_pct"]))[:20]
        print(f"# the 20 largest errors of {len(table)} rows (validation.csv has every row)")
    print_table(shown, PRINTED)
    reasons = [row for row in table if row["status"] == "cannot_model"]
    for row in reasons[:50]:
        print(f"# cannot model {row['id']}: {row['reason']}")
    if len(reasons) > 50:
        print(f"# ... and {len(reasons) - 50} more rows that cannot be modeled (see validation.csv)")
    for row in table:
        if row["note"] and row["status"] != "cannot_model" and len(table) <= FULL_TABLE_ROWS:
            print(f"# note {row['id']}: {row['note']}")
