"""Issue 14's harness loop: megatron layouts trained for real on this machine, predicted by the model.

1. ``ddlsim bench`` measures ping-pong and the ring collectives on 2 and 4 ranks, at the sizes the
   layouts move (tensor-parallel activations of 64 KiB, gradient and weight shards up to a few MB);
   ``ddlsim calibrate`` fits this machine's links from them;
2. ``ddlsim run --algorithm megatron --model gpt_tiny`` trains one rank and every layout below for
   real; a point's time is the median iteration after ``WARMUP`` iterations, the median over
   ``--repeats`` launches, and its spread (max - min) / median over the launches;
3. compute is calibrated on one-rank runs only, at micro-batches 1 and 4 (the layouts run 2): two
   numbers, a factor on the transformer's efficiencies and the framework's fixed cost per kernel
   (``launch_s``: Python and autograd dispatch, which does not shrink when tensor parallelism
   narrows the products), by least squares on T = R x + K launch_s (R: the modeled roofline
   seconds, K: the kernels of an iteration); compute is stretched by max(1, ranks / cores) on a host
   running more ranks than it has cores, as the data-parallel harness prediction does;
4. each layout, the one-rank run at micro-batch 2 included, is predicted by the megatron closed
   form with that profile, and compared.

Prints each layout's measured and predicted iteration, the error, the median and largest absolute
errors, the noise floor (median spread) and the machine's load average before and after.

    python benchmarks/megatron_harness.py [--iterations 20] [--repeats 2] [--work runs/megatron_harness]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import statistics
import subprocess
import sys
from pathlib import Path

MODEL = "gpt_tiny"
WARMUP = 3
CALIBRATION = {"1 rank, micro-batch 1": {"micro_batch": 1}, "1 rank, micro-batch 4": {"micro_batch": 4}}
LAYOUTS: dict[str, tuple[int, dict[str, int]]] = {
    "1 rank": (1, {}),
    "tp2": (2, {"tp": 2}),
    "pp2": (2, {"pp": 2}),
    "dp2 zero1": (2, {"dp": 2, "zero_stage": 1}),
    "dp2 zero3": (2, {"dp": 2, "zero_stage": 3}),
    "tp2 pp2": (4, {"tp": 2, "pp": 2}),
    "tp2 dp2 zero3": (4, {"tp": 2, "dp": 2, "zero_stage": 3}),
    "pp2 dp2 zero1": (4, {"pp": 2, "dp": 2, "zero_stage": 1}),
    "pp2 interleaved dp2": (4, {"pp": 2, "dp": 2, "virtual_stages": 2}),
    "tp4": (4, {"tp": 4}),
    "dp4 zero1": (4, {"dp": 4, "zero_stage": 1}),
}


def ddlsim(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "ddlsim", *argv], check=True, stdout=subprocess.DEVNULL)


def with_batch(layout: dict[str, int]) -> dict[str, int]:
    return {"micro_batch": 2, "global_batch": 8, **layout}


def flags(layout: dict[str, int]) -> list[str]:
    return [item for key, value in layout.items() for item in (f"--{key.replace('_', '-')}", str(value))]


def measure(work: Path, name: str, ranks: int, layout: dict[str, int], iterations: int, repeats: int):
    """(median over launches of each launch's median iteration after the warm-up, relative spread)."""
    medians = []
    for repeat in range(repeats):
        out = work / f"run_{name.replace(' ', '_')}_{repeat}"
        ddlsim("run", "-n", str(ranks), "--algorithm", "megatron", "--model", MODEL, *flags(with_batch(layout)),
               "--updates", str(iterations), "--learning-rate", "0.003", "--out", str(out))  # fmt: skip
        with (out / "results.csv").open() as handle:
            times = [float(row["iteration_s"]) for row in csv.DictReader(handle)][WARMUP:]
        medians.append(statistics.median(times))
    middle = statistics.median(medians)
    return middle, (max(medians) - min(medians)) / middle


def scenario(ranks: int, layout: dict[str, int], profile):
    from ddlsim.algorithms.training_algorithm import make_options
    from ddlsim.simulator.scenario import Scenario

    values = {"precision": "fp32", **with_batch(layout)}
    return Scenario(workload=MODEL, algorithm="megatron", device="local_cpu", devices_per_node=1, network="local_shm",
                    host_link=None, nodes=(ranks,), precision="fp32", profile=profile, enforce_memory=False,
                    options=make_options("megatron", {"layout": values}))  # fmt: skip


def with_compute(profile, factor: float, launch_s: float):
    """``profile`` with local_cpu's transformer and memory efficiencies times ``factor`` and a fixed
    cost of ``launch_s`` per kernel on CPUs."""
    from ddlsim.hardware_models.catalog import load_device
    from ddlsim.hardware_models.profile import ComputeFit, DeviceFit

    device = load_device("local_cpu")
    fit = DeviceFit(memory_efficiency=device.memory_efficiency * factor,
                    layer_efficiency={"transformer": device.efficiency_for("transformer") * factor})  # fmt: skip
    compute = ComputeFit(values={"launch_s.cpu": launch_s})
    return dataclasses.replace(profile, devices={**profile.devices, "local_cpu": fit}, compute=compute)


def fit_compute(links, measured: dict[str, float]) -> tuple[float, float]:
    """(efficiency factor, launch_s) from the one-rank calibration runs, by least squares."""
    import numpy as np

    from ddlsim.simulator.closed_form.training import closed_form_result

    rows, times = [], []
    for name, layout in CALIBRATION.items():
        roofline = closed_form_result(scenario(1, layout, with_compute(links, 1.0, 0.0)), 1).iteration_s
        kernels = closed_form_result(scenario(1, layout, with_compute(links, 1.0, 1e-3)), 1).iteration_s
        rows.append([roofline, (kernels - roofline) / 1e-3])
        times.append(measured[name])
    (inverse, launch_s), *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    return 1.0 / float(inverse), max(float(launch_s), 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("runs/megatron_harness"))
    args = parser.parse_args()

    from ddlsim.hardware_models.profile import load_profile
    from ddlsim.simulator.closed_form.training import closed_form_result

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    ddlsim("bench", "-n", "4", "--benchmarks", "ping_pong,collectives", "--algorithms", "ring",
           "--collective-sizes", "16KiB,64KiB,256KiB,1MiB,4MiB", "--rank-counts", "2,4", "--p2p-max-bytes", "4MiB",
           "--repeats", "10", "--out", str(work / "bench"))  # fmt: skip
    ddlsim("calibrate", "--measurements", str(work / "bench" / "measurements.csv"), "--out", str(work / "links.toml"))
    links = load_profile(work / "links.toml")
    measured = {}
    points = {**{name: (1, layout) for name, layout in CALIBRATION.items()}, **LAYOUTS}
    for name, (ranks, layout) in points.items():
        measured[name] = measure(work, name, ranks, layout, args.iterations, args.repeats)
        print(f"measured {name}: {measured[name][0] * 1e3:.2f} ms", file=sys.stderr, flush=True)
    factor, launch_s = fit_compute(links, {name: measured[name][0] for name in CALIBRATION})
    print(f"# {MODEL}, micro-batch 2, global batch 8; compute fitted on one rank at micro-batches 1 and 4 "
          f"({', '.join(f'{measured[name][0] * 1e3:.1f} ms' for name in CALIBRATION)}): efficiencies x {factor:.3f}, "
          f"launch_s {launch_s * 1e6:.1f} us per kernel; links from ddlsim bench; {cores} cores, load average "
          f"{load_before:.2f} before")  # fmt: skip
    print(f"{'layout':22s} {'ranks':>5s} {'measured':>10s} {'predicted':>10s} {'error':>7s} {'spread':>7s}")
    errors, spreads = [], []
    for name, (ranks, layout) in LAYOUTS.items():
        stretch = max(1.0, ranks / cores)
        profile = with_compute(links, factor / stretch, launch_s * stretch)
        predicted = closed_form_result(scenario(ranks, layout, profile), ranks)
        seconds, spread = measured[name]
        error = 100 * (predicted.iteration_s - seconds) / seconds
        errors.append(abs(error))
        spreads.append(100 * spread)
        print(f"{name:22s} {ranks:5d} {seconds * 1e3:8.2f}ms {predicted.iteration_s * 1e3:8.2f}ms {error:+6.1f}% "
              f"{100 * spread:6.1f}%")  # fmt: skip
    floor = statistics.median(spreads)
    median = statistics.median(errors)
    print(f"\nmedian |error| {median:.1f} % over {len(errors)} layouts on 1-4 ranks (largest {max(errors):.1f} %); "
          f"noise floor {floor:.1f} % (median spread of repeated launches): {median / max(floor, 1e-9):.1f}x the "
          f"floor; load average {os.getloadavg()[0]:.2f} after")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
