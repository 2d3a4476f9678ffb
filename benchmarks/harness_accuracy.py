"""Issue 6's harness target: predict real training iterations on this machine from microbenchmarks.

For each rank count:

1. ``ddlsim bench`` measures the collective microbenchmarks (every algorithm below, sizes around
   the models' gradient buckets) and the per-layer compute of the real_runs models;
2. ``ddlsim calibrate``'s fitting turns the collective rows into a profile;
3. ``ddlsim run`` trains each model with each algorithm and bucket size for real;
4. ``simulator.harness_prediction`` predicts each run's iteration time from (1) and (2) only.

It prints measured and predicted median iteration times, the error of each run, and the median
and 90th-percentile absolute errors; exit status 1 when the median is over 10 %.

    python benchmarks/harness_accuracy.py [--ranks 2,4] [--iterations 30] [--work runs/harness_accuracy]
"""

from __future__ import annotations

import argparse
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


def ddlsim(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "simulator.cli", *argv], check=True, stdout=subprocess.DEVNULL)


def measured_iteration_s(run: Path, skip: int) -> float:
    import csv

    with (run / "results.csv").open() as handle:
        times = [float(row["iteration_s"]) for row in csv.DictReader(handle)][skip:]
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("runs/harness_accuracy"))
    args = parser.parse_args()

    from hardware_models.units import parse_bytes
    from simulator.calibration import calibrate
    from simulator.harness_prediction import allreduce_time, predict_iteration_s, read_layer_times
    from simulator.measurements import load_measurements

    cores = os.cpu_count() or 1
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        bench = args.work / f"bench_{ranks}"
        ddlsim("bench", "-n", str(ranks), "--benchmarks", "collectives,layers", "--algorithms", ",".join(ALGORITHMS),
               "--collective-sizes", SIZES, "--rank-counts", str(ranks), "--models", ",".join(MODELS),
               "--batch-sizes", str(BATCH), "--repeats", "15", "--out", str(bench))  # fmt: skip
        profile = calibrate(load_measurements([bench / "measurements.csv"])).profile
        for model in MODELS:
            layers = read_layer_times(bench / "layers.csv", model, BATCH)
            for algorithm in ALGORITHMS:
                for bucket in BUCKETS:
                    run = args.work / f"run_{ranks}_{model}_{algorithm}_{bucket}"
                    ddlsim("run", "-n", str(ranks), "--model", model, "--dataset", "synthetic", "--algorithm",
                           algorithm, "--bucket-bytes", bucket, "--per-device-batch", str(BATCH), "--iterations",
                           str(args.iterations), "--out", str(run))  # fmt: skip
                    measured = measured_iteration_s(run, skip=5)
                    predicted = predict_iteration_s(
                        layers, ranks, cores, parse_bytes(bucket), allreduce_time(profile, algorithm, ranks),
                        measured_ranks=ranks,
                    )
                    error = 100 * (predicted - measured) / measured
                    rows.append((ranks, model, algorithm, bucket, measured, predicted, error))
                    print(f"{ranks} ranks  {model:13s} {algorithm:19s} bucket {bucket:5s}  measured "
                          f"{measured * 1e3:8.2f} ms  predicted {predicted * 1e3:8.2f} ms  error {error:+6.1f} %",
                          flush=True)  # fmt: skip
    errors = sorted(abs(row[-1]) for row in rows)
    median = statistics.median(errors)
    p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
    print(f"# {len(rows)} runs on {cores} cores: median |error| {median:.1f} %, p90 {p90:.1f} %, max {errors[-1]:.1f} %"
          f" (target: median <= 10 %)")  # fmt: skip
    return 0 if median <= 10.0 else 1


if __name__ == "__main__":
    sys.exit(main())
