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

from ddlsim.hardware_models.profile import LinkFit, ProfileError, parse_profile, profile_to_toml
from ddlsim.reports.formatting import format_size
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
    from ddlsim.simulator.calibration.llm_validation import is_llm_file

    if any(is_llm_file(path) for path in args.measurements):
        return _calibrate_llm(args)
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
    for key in sorted(profile.links):
        print(f"# link {key}: {describe_link(profile.links[key])}")
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


def describe_link(fit: LinkFit) -> str:
    """A fitted link, one segment after the other: ``below 14.42 MB: alpha 22.1 us, 10.19 GB/s;
    14.42 MB-128 MiB: ..., 0.439 ms a call``."""
    cuts = [format_size(size) for size in fit.breakpoints_bytes]
    edges = ["", *cuts, ""]
    parts = []
    for index, (alpha, beta) in enumerate(zip(fit.alpha_s, fit.beta_Bps, strict=True)):
        low, high = edges[index], edges[index + 1]
        where = (
            f"{low}-{high}" if low and high
            else f"below {high}" if high
            else f"from {low}" if low
            else "all sizes"
        )  # fmt: skip
        text = f"{where}: alpha {1e6 * alpha:.3g} us, {beta / 1e9:.4g} GB/s"
        if fit.call_s and fit.call_s[index]:
            text += f", {1e3 * fit.call_s[index]:.3g} ms a call"
        parts.append(text)
    return "; ".join(parts)


def _calibrate_llm(args: argparse.Namespace) -> int:
    """Files with llm_dev.csv's columns: ``transformer_slowdown``, the geometric median of measured over
    closed-form iteration time (``simulator.calibration.llm_validation``), written into a profile."""
    import dataclasses

    from ddlsim.hardware_models.profile import Profile
    from ddlsim.simulator.calibration import llm_validation
    from ddlsim.simulator.cli.common import InputError
    from ddlsim.simulator.records import Rejected
    from ddlsim.simulator.workloads.llm_runs import LlmRunsError

    mixed = [path for path in args.measurements if not llm_validation.is_llm_file(path)]
    if mixed:
        raise InputError(f"{mixed[0]}: not llm_dev.csv's columns; calibrate large-model and data-parallel files apart")
    try:
        unread: list[Rejected] = []
        runs = llm_validation.read_llm_runs(args.measurements, unread)
    except (LlmRunsError, OSError) as error:
        raise InputError(str(error)) from None
    for bad in unread:
        print(f"# not used: {bad.id or f'line {bad.line}'}: {bad.reason}")
    # the band's residuals: each family predicted without the catalog values derived from its rows
    predictions, fit = llm_validation.fit_runs(runs, 0.9, Progress("calibrate: large-model rows"))
    if not fit.rows:
        raise InputError("nothing to calibrate: no large-model row could be predicted")
    table = [
        {"id": p.run.id, "metric": p.run.metric, "measured": p.run.value,
         "closed_form": llm_validation.metric_of(p, p.iteration_s), "slowdown": llm_validation.slowdown(p)}
        for p in predictions if not p.reason
    ]  # fmt: skip
    print_table(table, ("id", "metric", "measured", "closed_form", "slowdown"))
    for p in predictions:
        if p.reason:
            print(f"# not used: {p.run.id}: {p.reason}")
        elif p.guessed:
            print(f"# not fitted: {p.run.id}: the shape or batch is ddlsim's reading of what the row leaves open")
    source = (
        f"fitted by ddlsim calibrate: geometric median of measured / closed-form iteration time over {fit.rows} "
        f"large-model rows; 90 % of them within x{fit.low:.3f} to x{fit.high:.3f} of it"
    )
    profile = Profile(transformer_slowdown=fit.slowdown, transformer_band=(fit.low, fit.high),
                      description="large-model rows (llm_dev.csv columns)")  # fmt: skip
    band_source = "the 5 % and 95 % quantiles of the rows' measured / fitted time"
    sources = {**profile.sources, "transformer_slowdown": source, "transformer_band": band_source}
    profile = dataclasses.replace(profile, sources=sources)
    print(f"# transformer_slowdown {fit.slowdown:.4f} from {fit.rows} rows (90 % band x{fit.low:.3f}-x{fit.high:.3f})")
    text = profile_to_toml(profile)
    parse_profile(tomllib.loads(text), args.out)  # what we write must load back
    with atomic_open(args.out) as handle:
        handle.write(text)
    print(f"# wrote {args.out}")
    return 0
