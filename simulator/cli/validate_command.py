"""``ddlsim validate``: calibrate on some rows, predict the others, and fail past a tolerance.

Writes ``OUT/validation.csv`` (one row per measurement, ``VALIDATION_COLUMNS``) and
``OUT/summary.json`` (``SUMMARY_KEYS``); exits 1 when the median absolute percentage error of the
predicted rows exceeds ``--tolerance`` (a fraction: 0.10 = 10 %), so it can gate CI.

Confidence intervals: the prediction p under the fitted profile and p_b under each bootstrap
sample give sigma_param = std(log p_b); with the profile's noise sigma_noise the interval at level
``--ci`` is p x exp(-/+ z sigma), sigma = sqrt(sigma_noise^2 + sigma_param^2), z the normal quantile.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from ddlsim.hardware_models.profile import Profile, load_profile
from ddlsim.simulator.calibration.fit import CalibrationError, calibrate
from ddlsim.simulator.calibration.measurements import Measurement, MeasurementError, load_measurements
from ddlsim.simulator.calibration.predict import ape_summary, predict
from ddlsim.simulator.cli.common import print_table
from ddlsim.simulator.records import write_csv, write_json

VALIDATION_COLUMNS = (
    "id",
    "kind",
    "metric",
    "workload",
    "collective",
    "algorithm",
    "device",
    "devices_per_node",
    "nodes",
    "message_bytes",
    "per_device_batch",
    "precision",
    "measured",
    "predicted",
    "error_pct",
    "ci_low",
    "ci_high",
    "in_ci",
    "status",
    "reason",
)
SUMMARY_KEYS = (
    "n_predicted",
    "n_cannot_model",
    "median_ape",
    "p90_ape",
    "max_ape",
    "ci_level",
    "ci_coverage",
    "tolerance",
    "passed",
)
PRINTED = ("id", "device", "devices_per_node", "nodes", "measured", "predicted", "error_pct", "in_ci", "status")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="predict measurements after calibrating on others; exit 1 past --tolerance",
        description="Calibrate on the --calibration rows only (or load --profile), predict every row of "
        "--measurements, print and write the error table and summary.",
    )
    parser.add_argument("--measurements", nargs="+", type=Path, required=True, help="rows to predict")
    parser.add_argument("--calibration", nargs="*", type=Path, default=[], help="rows to calibrate on")
    parser.add_argument("--profile", type=Path, default=None, help="use this profile instead of fitting")
    parser.add_argument("--tolerance", type=float, default=0.10, help="max median |error| (fraction)")
    parser.add_argument("--ci", type=float, default=0.9, help="confidence level of the intervals")
    parser.add_argument("--bootstrap", type=int, default=20, help="bootstrap resamples when calibrating")
    parser.add_argument("--executor", choices=("analytic", "des"), default="analytic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="directory for validation.csv, summary.json")
    parser.set_defaults(func=run)


def validate_rows(
    rows: list[Measurement],
    calibration_ids: set[str],
    profile: Profile,
    tolerance: float,
    ci: float,
    executor: str = "analytic",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The validation table and summary (see the module docstring)."""
    z = statistics.NormalDist().inv_cdf(0.5 + ci / 2)
    samples = profile.samples()
    table = []
    apes: list[float] = []
    covered = 0
    for row in rows:
        out: dict[str, Any] = {
            column: getattr(row, column, "") for column in VALIDATION_COLUMNS if hasattr(row, column)
        }
        if row.message_bytes is not None and float(row.message_bytes).is_integer():
            out["message_bytes"] = int(row.message_bytes)
        out.update(measured=row.value, predicted="", error_pct="", ci_low="", ci_high="", in_ci="", reason="")
        prediction = predict(row, profile, executor)
        if prediction.value is None:
            out.update(status="cannot_model", reason=prediction.reason)
            table.append(out)
            continue
        value = prediction.value
        logs = [math.log(p.value) for p in (predict(row, s, executor) for s in samples) if p.value]
        sigma_param = float(np.std(logs, ddof=1)) if len(logs) >= 2 else 0.0
        sigma = math.hypot(profile.noise_sigma, sigma_param)
        low, high = value * math.exp(-z * sigma), value * math.exp(z * sigma)
        inside = low <= row.value <= high
        out.update(
            predicted=value,
            error_pct=100.0 * (value - row.value) / row.value,
            ci_low=low,
            ci_high=high,
            in_ci=inside,
        )
        if row.id in calibration_ids:
            out["status"] = "calibration"
        else:
            out["status"] = "predicted"
            apes.append(abs(value - row.value) / row.value)
            covered += inside
        table.append(out)
    n = len(apes)
    median, p90, largest = ape_summary(apes)
    summary = {
        "n_predicted": n,
        "n_cannot_model": sum(1 for out in table if out["status"] == "cannot_model"),
        "median_ape": median,
        "p90_ape": p90,
        "max_ape": largest,
        "ci_level": ci,
        "ci_coverage": covered / n if n else math.nan,
        "tolerance": tolerance,
        "passed": bool(n and median <= tolerance),
    }
    return table, summary


def run(args: argparse.Namespace) -> int:
    from ddlsim.simulator.cli.common import InputError

    if not 0 < args.ci < 1:
        raise InputError(f"--ci must be in (0, 1), got {args.ci}")
    if not args.tolerance > 0:
        raise InputError(f"--tolerance must be > 0 (a fraction: 0.10 = 10 %), got {args.tolerance}")
    try:
        rows = load_measurements(args.measurements)
        calibration_rows = load_measurements(args.calibration) if args.calibration else []
        if args.profile is not None:
            profile = load_profile(args.profile)
        elif calibration_rows:
            profile = calibrate(calibration_rows, bootstrap=args.bootstrap, seed=args.seed).profile
        else:
            profile = Profile()  # the datasheets alone
    except (MeasurementError, CalibrationError) as error:
        raise InputError(str(error)) from None
    calibration_ids = {row.id for row in calibration_rows}
    table, summary = validate_rows(rows, calibration_ids, profile, args.tolerance, args.ci, args.executor)
    print_table(table, PRINTED)
    for out in table:
        if out["status"] == "cannot_model":
            print(f"# cannot model {out['id']}: {out['reason']}")
    print(
        f"# {summary['n_predicted']} predicted, {summary['n_cannot_model']} cannot be modeled; "
        f"median |error| {100 * summary['median_ape']:.1f} %, p90 {100 * summary['p90_ape']:.1f} %, "
        f"max {100 * summary['max_ape']:.1f} %; {100 * summary['ci_coverage']:.0f} % inside the "
        f"{100 * args.ci:.0f} % interval; tolerance {100 * args.tolerance:.1f} %: "
        + ("PASSED" if summary["passed"] else "FAILED")
    )
    write_csv(args.out / "validation.csv", table, VALIDATION_COLUMNS)
    write_json(args.out / "summary.json", summary)
    print(f"# wrote {args.out / 'validation.csv'} and {args.out / 'summary.json'}")
    return 0 if summary["passed"] else 1
