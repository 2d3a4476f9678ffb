"""Issue 6's harness target: predict real training iterations on this machine from microbenchmarks.

For each rank count:

1. ``ddlsim bench`` measures the collective microbenchmarks (every algorithm below, sizes around
   the models' gradient buckets) and the per-layer compute of the real_runs models;
2. ``ddlsim run`` trains each model with each algorithm and bucket size for real; the median
   iteration of each run (after 5 warm-up iterations) goes to ``WORK/runs.csv``;
3. ``simulator.harness_prediction`` predicts each run's iteration time from (1) only: a profile
   fitted to the collective rows (``ddlsim calibrate``'s fitting) and the measured layers.

It prints measured and predicted median iteration times, the error of each run, and the median,
90th-percentile and largest absolute errors; exit status 1 when the median is over 10 %.
``--predict-only`` skips the measuring and predicts the runs already in ``WORK``.

The noise floor (issue 13, item 6): each point is run ``--repeats`` times (separate launches, one
after another); its measured time is the median of the repeats and its spread the relative range
(max - min) / median. The floor is the median spread over the points: a model cannot be checked
more finely than the machine repeats itself, so the error is also printed in units of the floor,
with the machine's load average before and after.

    python benchmarks/harness_accuracy.py [--ranks 2,4] [--iterations 30] [--repeats 2] [--work runs/harness_accuracy]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

ALGORITHMS = ("ring", "recursive_doubling", "halving_doubling", "binomial_tree")
MODELS = ("small_cnn", "resnet_small")
BUCKETS = ("25MB", "64KB")  # one bucket per iteration, and several overlapping backward
BATCH = 32
SIZES = "16KiB,64KiB,128KiB,256KiB,512KiB,1MiB"
WARMUP_ITERATIONS = 5


def ddlsim(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "ddlsim", *argv], check=True, stdout=subprocess.DEVNULL)


def median_iteration_s(run: Path) -> float:
    with (run / "results.csv").open() as handle:
        times = [float(row["iteration_s"]) for row in csv.DictReader(handle)][WARMUP_ITERATIONS:]
    return statistics.median(times)


def measure(work: Path, ranks: int, iterations: int, repeats: int) -> list:
    from ddlsim.hardware_models.units import parse_bytes
    from ddlsim.simulator.calibration.harness import HarnessRun

    ddlsim("bench", "-n", str(ranks), "--benchmarks", "collectives,layers", "--algorithms", ",".join(ALGORITHMS),
           "--collective-sizes", SIZES, "--rank-counts", str(ranks), "--models", ",".join(MODELS),
           "--batch-sizes", str(BATCH), "--repeats", "15", "--out", str(work / f"bench_{ranks}"))  # fmt: skip
    runs = []
    for model in MODELS:
        for algorithm in ALGORITHMS:
            for bucket in BUCKETS:
                for repeat in range(repeats):
                    out = work / f"run_{ranks}_{model}_{algorithm}_{bucket}_{repeat}"
                    ddlsim("run", "-n", str(ranks), "--model", model, "--dataset", "synthetic", "--collective",
                           algorithm, "--bucket-bytes", bucket, "--per-device-batch", str(BATCH), "--updates",
                           str(iterations), "--out", str(out))  # fmt: skip
                    measured = median_iteration_s(out)
                    runs.append(HarnessRun(ranks, model, algorithm, parse_bytes(bucket), BATCH, measured))
                    print(f"measured {out.name}: {measured * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2, help="launches per point, for the noise floor (default 2)")
    parser.add_argument("--work", type=Path, default=Path("runs/harness_accuracy"))
    parser.add_argument("--predict-only", action="store_true", help="predict the runs already measured in WORK")
    args = parser.parse_args()

    from ddlsim.simulator.calibration.harness import error_summary, predict_runs, read_runs, repeat_points, write_runs

    if args.repeats < 1:
        parser.error(f"--repeats must be a positive integer, got {args.repeats}")
    rank_counts = [int(r) for r in args.ranks.split(",")]
    runs_csv = args.work / "runs.csv"
    load_before = os.getloadavg()
    if args.predict_only:
        runs = [run for run in read_runs(runs_csv) if run.ranks in rank_counts]
    else:
        runs = [run for ranks in rank_counts for run in measure(args.work, ranks, args.iterations, args.repeats)]
        write_runs(runs_csv, runs)  # a row per repeat: --predict-only finds the spread again
    points = [point for point, _ in repeat_points(runs)]
    spread = {(p.ranks, p.model, p.algorithm, p.bucket_bytes, p.per_device_batch): s for p, s in repeat_points(runs)}
    cores = os.cpu_count() or 1
    predictions = predict_runs(points, {ranks: args.work / f"bench_{ranks}" for ranks in rank_counts}, cores)
    for run, predicted in predictions:
        shape = f"{run.ranks} ranks  {run.model:13s} {run.algorithm:19s} bucket {run.bucket_bytes:>10.0f} B"
        times = f"measured {run.measured_s * 1e3:8.2f} ms  predicted {predicted * 1e3:8.2f} ms"
        own = spread[(run.ranks, run.model, run.algorithm, run.bucket_bytes, run.per_device_batch)]
        noise = f"  repeats spread {100 * own:5.1f} %" if own is not None else ""
        print(f"{shape}  {times}  error {100 * run.error(predicted):+6.1f} %{noise}")
    median, p90, largest = error_summary(predictions)
    print(f"# {len(predictions)} points on {cores} cores: median |error| {100 * median:.1f} %, p90 {100 * p90:.1f} %, "
          f"max {100 * largest:.1f} % (target: median <= 10 %)")  # fmt: skip
    spreads = [value for value in spread.values() if value is not None]
    if spreads:
        floor = statistics.median(spreads)
        print(f"# noise floor (median spread of {len(runs) // len(points)} repeats over {len(spreads)} points): "
              f"{100 * floor:.1f} %, max {100 * max(spreads):.1f} %; median |error| = "
              f"{median / floor if floor > 0 else float('inf'):.2f} x the floor")  # fmt: skip
    else:
        print("# noise floor: one run per point (--repeats 2 or more to measure it)")
    load_after = os.getloadavg()
    print(f"# machine load (1-min average) before {load_before[0]:.1f}, after {load_after[0]:.1f} on {cores} cores")
    return 0 if median <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
