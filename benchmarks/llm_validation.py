"""Issue 14's validation: the large-model rows of ``llm_dev.csv`` predicted by the megatron closed form.

    python benchmarks/llm_validation.py [--ci 0.9] [--rows]

Two splits, each printed by source family (the unit left out) and overall: the datasheets alone
(no fitted parameter), and leave-one-source-out (``transformer_slowdown`` fitted on the other
families, this one predicted). Target: median |error| <= 10 % and coverage >= 85 % on the honest
split; rows refused for memory: none (the memory check is not applied to rows that really ran, and
``benchmarks/llm_runs_check.py`` checks that the memory model would admit them).
"""

from __future__ import annotations

import argparse
import math
import sys

from ddlsim.simulator.calibration.crossval import summarise


def table(rows: list[dict], title: str, ci: float) -> None:
    print(f"\n## {title}")
    heads = ("rows", 4), ("pred", 4), ("median", 7), ("p90", 6), ("signed", 7), ("width", 6), ("cover", 6)
    print(f"{'family':16s} " + " ".join(f"{name:>{size}s}" for name, size in heads))
    families: dict[str, list[dict]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    families["all"] = rows
    for family, members in families.items():
        s = summarise(members, ci, math.inf, "")  # the figures ``ddlsim validate`` prints
        if not s["n_predicted"]:
            print(f"{family:16s} {len(members):4d} {0:4d}")
            continue
        band = "     -      -"  # no intervals: nothing calibrated to size them
        if s["median_ci_width"] is not None:
            band = f"{s['median_ci_width']:6.2f} {100 * s['ci_coverage']:5.0f}%"
        print(f"{family:16s} {len(members):4d} {s['n_predicted']:4d} {100 * s['median_ape']:6.1f}% "
              f"{100 * s['p90_ape']:5.1f}% {100 * s['signed_median_error']:+6.1f}% {band}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ci", type=float, default=0.9)
    parser.add_argument("--rows", action="store_true", help="also print every row of the honest split")
    args = parser.parse_args(argv)

    from ddlsim.simulator.calibration import llm_validation

    runs = llm_validation.load_llm_runs()
    family = {run.id: run.source_family for run in runs}
    datasheets, _ = llm_validation.validate_llm(runs, None, args.ci)
    loso, fits = llm_validation.leave_one_source_out(runs, args.ci)
    for rows in (datasheets, loso):
        for row in rows:
            row["family"] = family[row["id"]]
    print(f"# {len(runs)} rows of llm_dev.csv; signed: + = model faster than published; width: high/low of the "
          f"{100 * args.ci:.0f} % interval")  # fmt: skip
    table(datasheets, "datasheets alone (nothing fitted)", args.ci)
    table(loso, "leave one source family out (transformer_slowdown fitted on the others)", args.ci)
    print("\nfitted transformer_slowdown without each family: "
          + ", ".join(f"{name} {fit.slowdown:.3f} ({fit.rows} rows)" for name, fit in fits.items()))
    if args.rows:
        print("\n# error: (predicted - published) / published in the row's metric: + is faster for TFLOP/s, slower "
              "for iteration_s")  # fmt: skip
        print(f"{'id':8s} {'family':12s} {'model':14s} {'metric':15s} {'published':>10s} {'predicted':>10s} "
              f"{'error':>7s} {'interval':>21s}")  # fmt: skip
        for row in loso:
            if row["status"] == "predicted":
                band = f"{row['ci_low']:.4g}-{row['ci_high']:.4g}" + ("" if row["in_ci"] else " (out)")
                values = f"{row['measured']:10.4g} {row['predicted']:10.4g} {row['error_pct']:+6.1f}%"
                where = f"{row['id']:8s} {row['family']:12s} {row['workload']:14s} {row['metric']:15s}"
                print(f"{where} {values} {band:>21s}")
    for row in loso:
        if row["status"] != "predicted":
            print(f"# cannot model {row['id']}: {row['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
