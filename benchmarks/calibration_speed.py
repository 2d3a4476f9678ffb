"""Issue 15 item 10: ``calibrate`` on 2,000 rows and ``validate`` on 200,000 rows, each under 60 s.

The rows are a month of a cluster's microbenchmarks in miniature: the harness's bench rows
(``tests/data/harness_bench.csv``: ping-pong and five collectives, 2-4 ranks, 64 KB-16 MB)
repeated with lognormal run-to-run scatter (5 %), each repetition with its own ids. The script
writes them to a temporary directory, runs the two commands in fresh processes (``python -m
ddlsim.simulator.cli.main``) three times each and prints the minimum and median wall time.

    python benchmarks/calibration_speed.py [--calibrate-rows 2000] [--validate-rows 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HARNESS = Path(__file__).resolve().parent.parent / "tests" / "data" / "harness_bench.csv"


def write_rows(path: Path, count: int, seed: int) -> Path:
    """``count`` rows: the harness file's rows repeated, values scattered, ids made unique."""
    with HARNESS.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        template = list(reader)
        columns = reader.fieldnames or []
    rng = np.random.default_rng(seed)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for index in range(count):
            row = dict(template[index % len(template)])
            row["id"] = f"{row['id']}-r{index // len(template):05d}"
            row["value"] = repr(float(row["value"]) * float(np.exp(rng.normal(0.0, 0.05))))
            writer.writerow(row)
    return path


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ddlsim.simulator.cli.main", *argv], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):  # validate exits 1 past its tolerance: still a finished run
        raise SystemExit(f"ddlsim {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrate-rows", type=int, default=2000)
    parser.add_argument("--validate-rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        small = write_rows(folder / "calibrate.csv", args.calibrate_rows, seed=1)
        large = write_rows(folder / "validate.csv", args.validate_rows, seed=2)
        profile = folder / "profile.toml"
        cases = [
            (
                f"calibrate {args.calibrate_rows:,} rows",
                ["calibrate", "--measurements", str(small), "--out", str(profile)],
            ),
            (
                f"validate {args.validate_rows:,} rows",
                ["validate", "--measurements", str(large), "--profile", str(profile), "--out", str(folder / "v")],
            ),
        ]
        failed = False
        for label, command in cases:
            walls = [timed(command) for _ in range(args.runs)]
            ok = min(walls) < 60.0
            failed |= not ok
            print(
                f"{label}: wall min {min(walls):.1f} s, median {statistics.median(walls):.1f} s over {args.runs} "
                f"runs (target < 60 s); {'OK' if ok else 'MISSED'}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
