"""``ddlsim calibrate``: fit a calibration profile to measurements and print the fit residuals."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlsim.hardware_models.profile import profile_to_toml
from ddlsim.simulator.calibration.fit import CalibrationError, calibrate
from ddlsim.simulator.calibration.measurements import MeasurementError, load_measurements
from ddlsim.simulator.cli.common import print_table
from ddlsim.simulator.records import atomic_open


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit device efficiencies, link alpha/beta per message size, overlap interference and noise",
        description="Fit the model's free parameters to measurement rows (docs/calibration.md) and write a "
        "profile in the hardware catalog's TOML format.",
    )
    parser.add_argument("--measurements", nargs="+", type=Path, required=True, help="measurement CSV files")
    parser.add_argument("--out", type=Path, required=True, help="profile TOML to write")
    parser.add_argument("--bootstrap", type=int, default=20, help="bootstrap resamples for uncertainty")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddlsim.simulator.cli.common import InputError

    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    try:
        rows = load_measurements(args.measurements)
        result = calibrate(rows, bootstrap=args.bootstrap, seed=args.seed)
    except (MeasurementError, CalibrationError) as error:
        raise InputError(str(error)) from None
    table = [
        {
            "id": r.id,
            "group": r.group,
            "measured": r.measured,
            "fitted": r.fitted,
            "error_pct": r.error_pct,
        }
        for r in result.residuals
    ]
    print(f"# fit residuals ({len(table)} rows used)")
    print_table(table, ("id", "group", "measured", "fitted", "error_pct"))
    for identifier, reason in result.unused:
        print(f"# not used: {identifier}: {reason}")
    profile = result.profile
    print(
        f"# noise sigma {profile.noise_sigma:.4f}, overlap interference {profile.overlap_interference:.3f}, "
        f"{len(profile.bootstrap)} bootstrap samples"
    )
    with atomic_open(args.out) as handle:
        handle.write(profile_to_toml(profile))
    print(f"# wrote {args.out}")
    return 0
