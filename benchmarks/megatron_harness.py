"""Issue 14's harness loop: megatron layouts trained for real on this machine, predicted by the model.

1. ``ddlsim bench`` measures ping-pong and the ring collectives on 2 and 4 ranks, at the sizes the
   layouts move (tensor-parallel activations of 64 KiB, gradient and weight shards up to a few MB);
   ``ddlsim calibrate`` fits this machine's links from them;
2. ``ddlsim run --algorithm megatron --model gpt_tiny`` trains one rank and every layout below for
   real; a point's time is the median iteration after ``WARMUP`` iterations, the median over
   ``--repeats`` launches, and its spread (max - min) / median over the launches;
3. compute is calibrated per rank count on data-parallel runs only (dp = ranks, ZeRO 0, at
   micro-batches 1 and 4; the layouts run 2): two numbers, a factor on the transformer's
   efficiencies and the framework's fixed cost per kernel (``launch_s``: Python and autograd
   dispatch, which does not shrink when tensor parallelism narrows the products), by least squares
   on T = R x + K launch_s + C (R: the modeled roofline seconds, K: the kernels of an iteration, C:
   the modeled gradient all-reduce). Runs with every rank computing carry the host's sharing (two
   processes on one memory system, four on two cores), as the data-parallel harness prediction
   times its layers with every rank computing;
4. each layout, the one-rank run at micro-batch 2 included, is predicted by the megatron closed
   form with its rank count's profile (ZeRO-3 without prefetch, as the harness runs it), and
   compared.

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
# ranks -> calibration points (name -> layout): data parallelism only, at two micro-batch sizes
CALIBRATION: dict[int, dict[str, dict[str, int]]] = {
    ranks: {
        f"dp{ranks}, micro-batch 1": {"dp": ranks, "micro_batch": 1, "global_batch": 8},
        f"dp{ranks}, micro-batch 4": {"dp": ranks, "micro_batch": 4, "global_batch": 16},
    }
    for ranks in (1, 2, 4)
}
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

    # the harness's ZeRO-3 gathers a chunk's weights as each work item starts (no prefetch)
    values = {"precision": "fp32", "zero3_prefetch": False, **with_batch(layout)}
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


def fit_compute(links, ranks: int, measured: dict[str, float]) -> tuple[float, float]:
    """(efficiency factor, launch_s) from the data-parallel calibration runs on ``ranks``, by least squares."""
    import numpy as np

    from ddlsim.simulator.closed_form.training import closed_form_result

    def modeled(layout: dict[str, int], factor: float, launch_s: float) -> float:
        return closed_form_result(scenario(ranks, layout, with_compute(links, factor, launch_s)), ranks).iteration_s

    rows, times = [], []
    for name, layout in CALIBRATION[ranks].items():
        communication = modeled(layout, 1e9, 0.0)  # compute free: what the all-reduce costs
        roofline = modeled(layout, 1.0, 0.0) - communication
        kernels = (modeled(layout, 1.0, 1e-3) - communication - roofline) / 1e-3
        rows.append([roofline, kernels])
        times.append(measured[name] - communication)
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
    points = {name: (ranks, layout) for ranks, table in CALIBRATION.items() for name, layout in table.items()}
    for name, (ranks, layout) in {**points, **LAYOUTS}.items():
        measured[name] = measure(work, name, ranks, layout, args.iterations, args.repeats)
        print(f"measured {name}: {measured[name][0] * 1e3:.2f} ms", file=sys.stderr, flush=True)
    compute = {ranks: fit_compute(links, ranks, {name: measured[name][0] for name in table})
               for ranks, table in CALIBRATION.items()}  # fmt: skip
    print(f"# {MODEL}, micro-batch 2, global batch 8; links from ddlsim bench; {cores} cores, load average "
          f"{load_before:.2f} before; compute fitted per rank count on data-parallel runs at micro-batches 1 and 4:")
    for ranks, (factor, launch_s) in compute.items():
        times = ", ".join(f"{name} {measured[name][0] * 1e3:.1f} ms" for name in CALIBRATION[ranks])
        print(f"#   {ranks} rank(s): efficiencies x {factor:.3f}, launch_s {launch_s * 1e6:.1f} us/kernel ({times})")
    print(f"{'layout':22s} {'ranks':>5s} {'measured':>10s} {'predicted':>10s} {'error':>7s} {'spread':>7s}")
    errors, spreads = [], []
    for name, (ranks, layout) in LAYOUTS.items():
        profile = with_compute(links, *compute[ranks])
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
