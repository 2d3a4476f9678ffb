"""Predict each source's largest runs from a fit to everything smaller: the check the kept-back data asks for.

The final check of issue 13 is a set of larger published runs of the same families as
``published_dev.csv``, predicted from a profile calibrated on the development rows. This script
makes the same kind of split inside the development data: from every source with runs at two or
more device counts, the rows at its largest device count are held out; one profile is calibrated
on all the other rows (the smaller runs of those sources and every row of the others) and predicts
the held-out rows. Unlike leave-one-source-out, the source's own smaller runs are in the fit, so
what is measured is how the fitted parameters (link alpha/beta per message-size segment, the
per-call cost of a library, rank jitter) extrapolate in scale.

    python benchmarks/scale_extrapolation.py [--ci 0.9] [--out table.csv]

It prints the held-out rows' figures overall, by source and by kind, and each row's prediction
beside the datasheets' alone (``--calibration`` with no rows), so a fitted parameter that
extrapolates worse than no fit at all shows.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.crossval import VALIDATION_COLUMNS, validate_table
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import Measurement, packaged_published_dev, read_measurements
from ddlsim.simulator.calibration.unseen import without
from ddlsim.simulator.records import write_csv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loso_validation import group_labels, print_breakdown


def largest_runs(rows: Sequence[Measurement]) -> set[str]:
    """Ids of the rows at their source's largest device count, for sources with two or more counts."""
    by_source: dict[str, list[Measurement]] = {}
    for row in rows:
        by_source.setdefault(row.source or row.id, []).append(row)
    held: set[str] = set()
    for members in by_source.values():
        counts = {row.devices for row in members}
        if len(counts) >= 2:
            top = max(counts)
            held.update(row.id for row in members if row.devices == top)
    return held


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=None, help="also write the held-out rows' table here (CSV)")
    args = parser.parse_args(argv)
    rows = read_measurements([packaged_published_dev()]).rows
    held = largest_runs(rows)
    started = time.perf_counter()
    base = without(Profile(), held)  # no catalog value derived from the held-out rows
    profile = calibrate([row for row in rows if row.id not in held], bootstrap=0, base=base).profile
    targets = [row for row in rows if row.id in held]
    table = validate_table(targets, set(), profile, args.ci)
    datasheets = {row["id"]: row for row in validate_table(targets, set(), base, args.ci)}
    elapsed = time.perf_counter() - started
    labels = group_labels(rows, "source")
    for row, result in zip(targets, table, strict=True):
        result["group"] = labels[row.source or row.id]
    if args.out:
        write_csv(args.out, table, (*VALIDATION_COLUMNS, "group"))
    print(
        f"# {len(targets)} rows at their source's largest device count, "
        f"predicted from a fit to the other {len(rows) - len(targets)}"
    )
    print_breakdown("by source", table, lambda row: row["group"], args.ci)
    print_breakdown("by kind", table, lambda row: row["kind"], args.ci)
    print_breakdown("datasheets alone, by kind", list(datasheets.values()), lambda row: row["kind"], args.ci)
    print("\n## rows: fitted profile and datasheets alone, error % (+ = predicted value higher)")
    for result in sorted(table, key=lambda r: r["id"]):
        if result["status"] == "cannot_model":
            print(f"{result['id']:16} cannot be modelled: {result['reason']}")
            continue
        alone = datasheets[result["id"]]
        alone_error = f"{alone['error_pct']:+7.1f}" if alone["status"] != "cannot_model" else "      -"
        print(
            f"{result['id']:16} {result['devices_per_node']:>2} x {result['nodes']:<3} "
            f"{str(result['algorithm'] or result['workload'])[:16]:16} {result['error_pct']:+7.1f} {alone_error}"
        )
    print(f"\n# {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
