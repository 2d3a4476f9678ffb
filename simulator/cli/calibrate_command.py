"""``ddlsim calibrate``: fit a calibration profile to measurements and print the fit residuals.

Rows that cannot calibrate (unreadable, unmodelable, or with a field their source leaves open) are
listed with the reason; the rest are fitted. Implausible fits are reported as warnings on stderr.
The profile is checked by the same loader ``--profile`` uses before it is written, so a written
profile always loads.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from ddlsim.hardware_models.profile import ProfileError, parse_profile, profile_to_toml
from ddlsim.simulator.calibration.fit import CalibrationError, calibrate
from ddlsim.simulator.calibration.measurements import MeasurementError, read_measurements
from ddlsim.simulator.cli.common import Progress, print_table
from ddlsim.simulator.records import atomic_open

RESIDUAL_COLUMNS = ("id", "group", "metric", "measured", "fitted", "unit", "error_pct")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit compute across devices, link alpha/beta per message size, overlap interference and noise",
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
    if args.out.is_dir():
        raise InputError(
            f"--out {args.out}: is a directory; give the profile's file name, e.g. {args.out}/profile.toml"
        )
    parent = next((p for p in args.out.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise InputError(f"--out {args.out}: {parent} is not a directory")
    try:
        measured = read_measurements(args.measurements)
        for notice in measured.notices:
            print(f"ddlsim: warning: {notice}", file=sys.stderr)
        result = calibrate(measured.rows, bootstrap=args.bootstrap, seed=args.seed, progress=Progress("calibrate"))
    except (MeasurementError, CalibrationError) as error:
        raise InputError(str(error)) from None
    table = [
        {
            "id": r.id,
            "group": r.group,
            "metric": r.metric,
            "measured": r.measured,
            "fitted": r.fitted,
            "unit": r.unit or "-",
            "error_pct": r.error_pct,
        }
        for r in result.residuals
    ]
    print(f"# fit residuals ({len(table)} rows used)")
    print_table(table, RESIDUAL_COLUMNS)
    for rejected in measured.rejected:
        print(f"# not used: {rejected.id or f'line {rejected.line}'}: {rejected.reason}")
    for identifier, reason in result.unused:
        print(f"# not used: {identifier}: {reason}")
    profile = result.profile
    print(
        f"# noise sigma {profile.noise_sigma:.4f} in-sample"
        + "".join(f"; {kind} {sigma:.3f}" for kind, sigma in sorted(profile.noise.items()))
        + f"; overlap interference {profile.overlap_interference:.3f}, {len(profile.bootstrap)} bootstrap samples"
    )
    for warning in result.warnings:
        print(f"ddlsim: warning: {warning}", file=sys.stderr)
    text = profile_to_toml(profile)
    try:  # what we write must load back through the loader that reads it
        parse_profile(tomllib.loads(text), args.out)
    except (ProfileError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"the fitted profile would not load back, nothing written: {error}") from None
    with atomic_open(args.out) as handle:
        handle.write(text)
    print(f"# wrote {args.out}")
    return 0
