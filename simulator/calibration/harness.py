"""Predict a harness training run's iteration time from microbenchmarks only (issue 6).

Inputs, all measured by ``ddlsim bench`` on the same machine, none by the run being predicted:

* per-layer forward and backward medians and gradient bytes of the model at the run's batch
  (``layers.csv``: one torch thread per rank, every rank of the bench computing at once), with
  the whole-model pass that rescales the layers' sum to what a training step costs;
* a calibration profile fitted to the collective microbenchmarks (``ddlsim calibrate``), which
  the model uses to time each gradient bucket's all-reduce on the run's rank count.

The iteration is sync SGD's own closed form (``algorithms.gradient_buckets.step_time_s``):
buckets filled in backward order, each all-reduced when ready and after the previous one, the
update after the last. Layers timed with as many ranks computing as the run has already carry the
host's sharing; otherwise compute stretches by the change in max(1, ranks / cores), the same
oversubscription rule the profile applies to message costs.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlsim.algorithms.gradient_buckets import StepProfile, step_time_s
from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.compute import optimizer_update_time_s
from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.fit import calibrate
from ddlsim.simulator.calibration.measurements import Measurement, load_measurements
from ddlsim.simulator.calibration.predict import ape_summary, predict
from ddlsim.simulator.training.trainers import LayerTime


class HarnessPredictionError(ValueError):
    """The microbenchmarks lack what the prediction needs (the message says what)."""


def read_layer_times(path: Path, workload: str, batch: int) -> tuple[LayerTime, ...]:
    """Layers of ``workload`` at ``batch`` from a bench ``layers.csv``, in forward order."""
    forward: dict[str, float] = {}
    backward: dict[str, float] = {}
    gradient: dict[str, float] = {}
    with Path(path).open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] != workload or int(row["per_device_batch"]) != batch:
                continue
            table = forward if row["phase"] == "forward" else backward
            table[row["layer"]] = float(row["median_s"])
            gradient[row["layer"]] = float(row.get("parameter_bytes") or 0.0)
    if not forward:
        raise HarnessPredictionError(f"{path}: no layer times for {workload} at batch {batch}")
    order = sorted((name for name in forward if name != "total"), key=lambda name: int(name.split("_", 1)[0]))
    # Timing layer by layer costs overhead per layer; the whole-model pass ("total") is what a
    # training step runs, so the layers keep their shares of it.
    forward_scale = forward["total"] / sum(forward[n] for n in order) if "total" in forward else 1.0
    backward_sum = sum(backward.get(n, 0.0) for n in order)
    backward_scale = backward["total"] / backward_sum if "total" in backward and backward_sum > 0 else 1.0
    return tuple(
        LayerTime(name, forward[name] * forward_scale, backward.get(name, 0.0) * backward_scale, gradient[name])
        for name in order
    )


def allreduce_time(profile: Profile, algorithm: str, ranks: int) -> Callable[[float], float]:
    """Seconds of one all-reduce of n bytes on ``ranks`` ranks of this host, from the profile."""

    def time_s(nbytes: float) -> float:
        row = Measurement(
            id="harness-bucket", kind="collective", metric="time_s", value=1.0, device="local_cpu",
            devices_per_node=ranks, nodes=1, collective="allreduce", algorithm=algorithm, network="local_shm",
            message_bytes=nbytes,
        )  # fmt: skip
        prediction = predict(row, profile)
        if prediction.value is None:
            raise HarnessPredictionError(f"cannot time a {nbytes:.0f} B {algorithm} all-reduce: {prediction.reason}")
        return prediction.value

    return time_s


def predict_iteration_s(
    layers: tuple[LayerTime, ...],
    ranks: int,
    cores: int,
    bucket_bytes: float,
    collective_s: Callable[[float], float],
    overlap: bool = True,
    measured_ranks: int = 1,
) -> float:
    """Iteration seconds of synchronous SGD over ``layers`` on ``ranks`` ranks of one ``cores``-core host.

    ``layers`` were timed with ``measured_ranks`` ranks computing at once on the host; compute
    stretches by the change in oversubscription, max(1, ranks / cores) / max(1, measured / cores).
    """
    stretch = max(1.0, ranks / cores) / max(1.0, measured_ranks / cores)
    scaled = tuple(
        LayerTime(layer.name, layer.forward_s * stretch, layer.backward_s * stretch, layer.gradient_bytes)
        for layer in layers
    )
    parameters = sum(layer.gradient_bytes for layer in layers) / 4.0
    update = optimizer_update_time_s(parameters, load_device("local_cpu"), "fp32") * stretch
    profile = StepProfile.of_layers(
        [layer.forward_s for layer in scaled],
        [layer.backward_s for layer in scaled],
        [layer.gradient_bytes for layer in scaled],
        bucket_bytes,
        update,
    )
    if not overlap:
        profile = profile.without_overlap()
    iteration, _ = step_time_s(profile, collective_s if ranks > 1 else (lambda _nbytes: 0.0))
    return iteration


@dataclass(frozen=True)
class HarnessRun:
    """One measured ``ddlsim run`` of sync SGD: its shape and median iteration seconds."""

    ranks: int
    model: str
    algorithm: str
    bucket_bytes: float
    per_device_batch: int
    measured_s: float

    def error(self, predicted_s: float) -> float:
        """Signed relative error of a prediction of this run."""
        return (predicted_s - self.measured_s) / self.measured_s


RUN_COLUMNS: dict[str, Callable[[str], Any]] = {
    "ranks": int, "model": str, "algorithm": str, "bucket_bytes": float, "per_device_batch": int, "measured_s": float,
}  # fmt: skip


def write_runs(path: Path, runs: Iterable[HarnessRun]) -> None:
    from ddlsim.simulator.records import write_csv

    write_csv(path, [{column: getattr(run, column) for column in RUN_COLUMNS} for run in runs], list(RUN_COLUMNS))


def read_runs(path: Path) -> list[HarnessRun]:
    with Path(path).open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [HarnessRun(**{column: kind(row[column]) for column, kind in RUN_COLUMNS.items()}) for row in rows]


def repeat_points(runs: Iterable[HarnessRun]) -> list[tuple[HarnessRun, float | None]]:
    """One run per point (shape), measured as the median of its repeats, with the repeats' spread
    ``(max - min) / median`` (None for a point run once): the noise floor the model is judged against."""
    groups: dict[tuple, list[float]] = {}
    for run in runs:
        key = (run.ranks, run.model, run.algorithm, run.bucket_bytes, run.per_device_batch)
        groups.setdefault(key, []).append(run.measured_s)
    points: list[tuple[HarnessRun, float | None]] = []
    for key, times in groups.items():
        middle = statistics.median(times)
        points.append((HarnessRun(*key, middle), (max(times) - min(times)) / middle if len(times) > 1 else None))
    return points


def predict_runs(runs: Iterable[HarnessRun], benches: Mapping[int, Path], cores: int) -> list[tuple[HarnessRun, float]]:
    """Each run with its predicted iteration seconds, from the bench of its rank count only.

    ``benches[ranks]`` is a ``ddlsim bench`` output of that many ranks (``measurements.csv`` with the
    collective microbenchmarks, ``layers.csv`` with the models' compute); the profile is fitted to
    its collective rows (``simulator.calibration.calibrate``), the compute read from its layers.
    """
    profiles: dict[int, Profile] = {}
    predictions = []
    for run in runs:
        if run.ranks not in benches:
            raise HarnessPredictionError(f"no bench of {run.ranks} ranks for the {run.ranks}-rank run of {run.model}")
        bench = Path(benches[run.ranks])
        if run.ranks not in profiles:
            profiles[run.ranks] = calibrate(load_measurements([bench / "measurements.csv"])).profile
        layers = read_layer_times(bench / "layers.csv", run.model, run.per_device_batch)
        collective = allreduce_time(profiles[run.ranks], run.algorithm, run.ranks)
        predictions.append(
            (run, predict_iteration_s(layers, run.ranks, cores, run.bucket_bytes, collective, measured_ranks=run.ranks))
        )
    return predictions


def error_summary(predictions: Iterable[tuple[HarnessRun, float]]) -> tuple[float, float, float]:
    """Median, 90th-percentile and largest absolute relative error, as ``ddlsim validate`` reports them."""
    errors = [abs(run.error(predicted)) for run, predicted in predictions]
    if not errors:
        raise HarnessPredictionError("no runs to summarise")
    return ape_summary(errors)
