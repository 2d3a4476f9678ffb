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

    python benchmarks/harness_accuracy.py [--ranks 2,4] [--iterations 30] [--work runs/harness_accuracy]
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


def measure(work: Path, ranks: int, iterations: int) -> list:
    from ddlsim.hardware_models.units import parse_bytes
    from ddlsim.simulator.calibration.harness import HarnessRun

    ddlsim("bench", "-n", str(ranks), "--benchmarks", "collectives,layers", "--algorithms", ",".join(ALGORITHMS),
           "--collective-sizes", SIZES, "--rank-counts", str(ranks), "--models", ",".join(MODELS),
           "--batch-sizes", str(BATCH), "--repeats", "15", "--out", str(work / f"bench_{ranks}"))  # fmt: skip
    runs = []
    for model in MODELS:
        for algorithm in ALGORITHMS:
            for bucket in BUCKETS:
                out = work / f"run_{ranks}_{model}_{algorithm}_{bucket}"
                ddlsim("run", "-n", str(ranks), "--model", model, "--dataset", "synthetic", "--collective", algorithm,
                       "--bucket-bytes", bucket, "--per-device-batch", str(BATCH), "--updates", str(iterations),
                       "--out", str(out))  # fmt: skip
                runs.append(HarnessRun(ranks, model, algorithm, parse_bytes(bucket), BATCH, median_iteration_s(out)))
                print(f"measured {out.name}: {runs[-1].measured_s * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("runs/harness_accuracy"))
    parser.add_argument("--predict-only", action="store_true", help="predict the runs already measured in WORK")
    args = parser.parse_args()

    from ddlsim.simulator.calibration.harness import error_summary, predict_runs, read_runs, write_runs

    rank_counts = [int(r) for r in args.ranks.split(",")]
    runs_csv = args.work / "runs.csv"
    if args.predict_only:
        runs = [run for run in read_runs(runs_csv) if run.ranks in rank_counts]
    else:
        runs = [run for ranks in rank_counts for run in measure(args.work, ranks, args.iterations)]
        write_runs(runs_csv, runs)
    cores = os.cpu_count() or 1
    predictions = predict_runs(runs, {ranks: args.work / f"bench_{ranks}" for ranks in rank_counts}, cores)
    for run, predicted in predictions:
        shape = f"{run.ranks} ranks  {run.model:13s} {run.algorithm:19s} bucket {run.bucket_bytes:>10.0f} B"
        times = f"measured {run.measured_s * 1e3:8.2f} ms  predicted {predicted * 1e3:8.2f} ms"
        print(f"{shape}  {times}  error {100 * run.error(predicted):+6.1f} %")
    median, p90, largest = error_summary(predictions)
    print(f"# {len(predictions)} runs on {cores} cores: median |error| {100 * median:.1f} %, p90 {100 * p90:.1f} %, "
          f"max {100 * largest:.1f} % (target: median <= 10 %)")  # fmt: skip
    return 0 if median <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
