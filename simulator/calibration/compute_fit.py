"""Compute across devices: one model of efficiencies fitted to every training row at once.

The model (``hardware_models.compute.layer_time_s`` with a ``ComputeFit``): a layer pass takes

    max(FLOP / (peak x e x b / (b + half_batch)), bytes / (bandwidth x memory efficiency), kernels x launch_s)
    e = datasheet efficiency x factor[precision class] x factor[architecture] x factor[device]
          x factor[layer kind] x factor[workload]

so a device without a measurement of its own gets the efficiency of its generation, and a generation
without one the efficiency fitted across all of them (the factors shrink to 1 under their
priors). The update adds its memory traffic and one kernel per parameter tensor.

Rows: training rows (iteration time or throughput). A device with single-device rows is fitted
on those; a device with only multi-device rows (MLPerf's one-node runs) on those, with the
communication the model exposes at the current parameters held fixed and re-read twice.

The fit: ``scipy.optimize.least_squares`` on log(model / measured) with the priors as extra
residuals (a ridge in the transformed parameters), the analytic Jacobian, bounds on every
parameter. The transformed parameters are the logs of the profile's values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import least_squares

from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.compute import (
    architecture,
    kernels_per_pass,
    layer_kind,
    parameter_tensors,
    precision_class,
)
from ddlsim.hardware_models.profile import COMPUTE_BOUNDS, ComputeFit, Profile
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.predict import predict, training_scenario

# Priors on the transformed parameters: (mean, standard deviation). Wide on the base efficiencies
# (the data decide), tighter on the offsets (a generation or device differs from the rest by tens of
# percent, not by factors), and on the fixed costs what the literature reports: kernel launch plus
# framework dispatch of 5-50 us per op (PyTorch/TensorFlow op overheads, e.g. the TF executor's
# ~10-20 us and CUDA launch ~5 us), half-saturation at a few samples per device.
PRIORS: dict[str, tuple[float, float]] = {
    "factor.precision.": (0.0, 0.5),
    "factor.architecture.": (0.0, 0.5),
    "factor.device.": (0.0, 0.25),
    "factor.layer.": (0.0, 1.0),
    "factor.workload.": (0.0, 0.5),
    "memory_factor.": (0.0, 0.5),
    "half_batch.": (math.log(2.0), 1.0),
    "launch_s.": (math.log(20e-6), 1.5),
}
FIT_METRICS = ("throughput_samples_per_s", "time_s")
# The scatter of a row about the model (lognormal sigma) that weighs rows against the priors: the
# spread between repeated publications of the same run (TFBENCH GCE vs AWS K80, MLPerf DGX-1 v0.6 vs
# v0.7) is 1-7 %, the model's own structural error more; 0.1 lets data move a prior after a few rows.
ROW_SIGMA = 0.1
REREADS = 2  # re-reads of the exposed communication of multi-device rows


def iteration_s(row: Measurement, value: float) -> float:
    """A training row's value (iteration time or total throughput) as seconds per iteration."""
    assert row.per_device_batch is not None
    if row.metric == "throughput_samples_per_s":
        return row.devices * row.per_device_batch / value
    return value


def compute_rows(rows: Sequence[Measurement]) -> list[Measurement]:
    """The training rows that calibrate compute: single-device rows of a device that has them, and
    every multi-device row of a device that has none."""
    usable = [row for row in rows if row.kind == "training" and row.metric in FIT_METRICS]
    single = {row.device for row in usable if row.devices == 1}
    return [row for row in usable if row.devices == 1 or row.device not in single]


@dataclass
class Passes:
    """Every layer pass of every row, flattened (whole-batch FLOP and bytes, SI units)."""

    row: np.ndarray  # row index of each pass
    flops: np.ndarray
    memory_bytes: np.ndarray
    kernels: np.ndarray
    kind: np.ndarray  # index into LAYER_NAMES
    batch: np.ndarray
    peak: np.ndarray
    bandwidth: np.ndarray
    memory_efficiency: np.ndarray  # the datasheet's
    base_log: np.ndarray  # log of the datasheet's compute efficiency of the layer
    update: np.ndarray  # 1 for the optimizer update's pass (not scaled by a pin), else 0
    groups: dict[str, np.ndarray]  # parameter name -> passes it applies to (boolean)


LAYER_NAMES = ("conv", "matmul", "other")


def _config(row: Measurement) -> Measurement:
    """The row without what does not change its passes (id, value, provenance): a cache key."""
    return dataclasses.replace(row, id="", value=1.0, quote="", source="", notes="", file="", line=0)


Efficiencies = tuple[float, tuple[tuple[str, float], ...]]


def _efficiencies(row: Measurement, profile: Profile | None) -> Efficiencies:
    """The compute and layer-type efficiencies the fit starts from for ``row``'s device: the
    datasheet's, or the profile's where it holds its own (``unseen.without``)."""
    device = load_device(row.device)
    device = profile.device(device) if profile else device
    return device.compute_efficiency, tuple(sorted(device.layer_efficiency.items()))


@functools.lru_cache(maxsize=4096)
def _row_passes(
    row: Measurement, efficiencies: Efficiencies
) -> tuple[dict[str, np.ndarray], tuple[str, str, str, str, str]]:
    """One row's layer passes (forward and backward of each layer, then the update) as arrays, and
    its labels (precision class, architecture, device, device kind, workload), at the base
    ``efficiencies`` (``_efficiencies``)."""
    scenario = training_scenario(row, None, "analytic")
    compute, by_layer = efficiencies
    device = dataclasses.replace(scenario.device_spec, compute_efficiency=compute, layer_efficiency=dict(by_layer))
    element = scenario.bytes_per_element / 4.0
    batch = scenario.per_device_batch
    workload = scenario.workload_spec
    layers = workload.layers
    weights = np.array([layer.parameters for layer in layers], dtype=float) * scenario.bytes_per_element
    activations = batch * np.array([layer.input_bytes + layer.output_bytes for layer in layers]) * element
    forward = batch * np.array([layer.forward_flops for layer in layers])
    backward = batch * np.array([layer.backward_flops for layer in layers])
    types = [layer.layer_type for layer in layers]
    kernels_forward = [kernels_per_pass(layer.layer_type, layer.parameters, False) for layer in layers]
    kernels_backward = [kernels_per_pass(layer.layer_type, layer.parameters, True) for layer in layers]
    # the update: memory traffic only (no FLOP), one kernel per parameter tensor (5 fp32 arrays: SGD
    # with momentum, as hardware_models.compute.optimizer_update_time_s)
    update_bytes = workload.parameter_count * (4.0 * 5 + (2.0 if row.precision != "fp32" else 0.0))
    tensors = sum(parameter_tensors(layer.layer_type, layer.parameters) for layer in layers)
    n = 2 * len(layers) + 1

    def interleave(a, b, last) -> np.ndarray:
        out = np.empty(n)
        out[0 : n - 1 : 2], out[1 : n - 1 : 2], out[-1] = a, b, last
        return out

    kinds = [LAYER_NAMES.index(layer_kind(t)) for t in types]
    base = [math.log(device.efficiency_for(t)) for t in types]
    arrays = {
        "flops": interleave(forward, backward, 0.0),
        "memory_bytes": interleave(activations + weights, 2 * (activations + weights), update_bytes),
        "kernels": interleave(kernels_forward, kernels_backward, tensors),
        "kind": interleave(kinds, kinds, LAYER_NAMES.index("other")),
        "batch": np.full(n, float(batch)),
        "peak": np.full(n, device.peak_flops_for(row.precision)),
        "bandwidth": np.full(n, device.memory_bandwidth_Bps),
        "memory_efficiency": np.full(n, device.memory_efficiency),
        "base_log": interleave(base, base, math.log(device.compute_efficiency)),
        "update": interleave(np.zeros(len(layers)), np.zeros(len(layers)), 1.0),
    }
    label = (precision_class(device, row.precision), architecture(device), device.token, device.kind, row.workload)
    return arrays, label


def _passes(rows: Sequence[Measurement], profile: Profile | None = None) -> Passes:
    """The passes of each row's scenario, as ``simulator.training.trainers`` builds them
    (a test holds the two equal), at the base efficiencies of ``profile``'s devices."""
    parts = [_row_passes(_config(row), _efficiencies(row, profile)) for row in rows]
    columns: dict[str, list[np.ndarray]] = {name: [] for name in Passes.__dataclass_fields__ if name != "groups"}
    labels: list[tuple[str, str, str, str, str]] = []
    for index, (arrays, label) in enumerate(parts):
        size = arrays["flops"].size
        columns["row"].append(np.full(size, index))
        for name, values in arrays.items():
            columns[name].append(values)
        labels.extend([label] * size)
    arrays_ = {name: np.concatenate(values).astype(float) for name, values in columns.items()}
    arrays_["row"] = arrays_["row"].astype(int)
    arrays_["kind"] = arrays_["kind"].astype(int)
    groups: dict[str, np.ndarray] = {}
    pclass = np.array([label[0] for label in labels])
    arch = np.array([label[1] for label in labels])
    token = np.array([label[2] for label in labels])
    device_kind = np.array([label[3] for label in labels])
    workload_name = np.array([label[4] for label in labels])
    for value in sorted(set(pclass)):
        groups[f"factor.precision.{value}"] = pclass == value
    for value in sorted(set(arch)):
        groups[f"factor.architecture.{value}"] = arch == value
    for value in sorted(set(token)):
        groups[f"factor.device.{value}"] = token == value
    for index, name in enumerate(LAYER_NAMES[1:], start=1):
        if np.any(arrays_["kind"] == index):
            groups[f"factor.layer.{name}"] = arrays_["kind"] == index
    for value in sorted(set(workload_name)):
        groups[f"factor.workload.{value}"] = workload_name == value
    for value in sorted(set(pclass)):
        groups[f"memory_factor.{value}"] = pclass == value
    for value in sorted(set(device_kind)):
        groups[f"half_batch.{value}"] = device_kind == value
        groups[f"launch_s.{value}"] = device_kind == value
    return Passes(groups=groups, **arrays_)


def _prior(name: str) -> tuple[float, float]:
    return next(prior for prefix, prior in PRIORS.items() if name.startswith(prefix))


def prior_sigma(name: str) -> float:
    """The prior standard deviation of parameter ``name`` (log units): its uncertainty without data."""
    return _prior(name)[1]


def _transformed_bounds(name: str) -> tuple[float, float]:
    low, high = next(bounds for prefix, bounds in COMPUTE_BOUNDS.items() if name.startswith(prefix))
    return math.log(max(low, 1e-12)), math.log(high)


def to_values(names: Sequence[str], theta: np.ndarray) -> dict[str, float]:
    """Transformed parameters (logs) -> the profile's values."""
    return {name: math.exp(x) for name, x in zip(names, theta, strict=True)}


class ComputeModelFit:
    """Vectorised model times of the fit's rows and their derivatives (the analytic Jacobian)."""

    def __init__(self, rows: Sequence[Measurement], profile: Profile) -> None:
        self.rows = list(rows)
        self.passes = _passes(self.rows, profile)
        self.names = sorted(self.passes.groups)
        self.measured = np.array([iteration_s(row, row.value) for row in self.rows])
        self.exposed = np.zeros(len(self.rows))
        self.theta = np.zeros(len(self.names))  # the fitted transformed parameters
        self._last: tuple[bytes, tuple[np.ndarray, np.ndarray]] | None = None

    def update_times(self, theta: np.ndarray) -> np.ndarray:
        """The optimizer update's seconds per row (a pin scales the layers, not the update)."""
        total, _ = self._times(theta, self.passes.update > 0)
        return total

    def times(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(compute seconds per row, d compute / d theta per row and parameter). The answer for the
        last theta is kept: the optimizer asks for the residuals and then the Jacobian at one point."""
        key = np.asarray(theta, dtype=float).tobytes()
        if self._last is None or self._last[0] != key:
            self._last = (key, self._times(theta, None))
        total, jacobian = self._last[1]
        return total.copy(), jacobian.copy()

    def _times(self, theta: np.ndarray, only: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``times`` computed afresh, counting only the passes in ``only`` where given."""
        p = self.passes
        g = p.groups
        log_efficiency = p.base_log.copy()
        log_memory = np.zeros(p.row.size)
        half = np.zeros(p.row.size)
        launch = np.zeros(p.row.size)
        for name, x in zip(self.names, theta, strict=True):
            if name.startswith("factor."):
                log_efficiency[g[name]] += x
            elif name.startswith("memory_factor."):
                log_memory[g[name]] += x
            elif name.startswith("half_batch."):
                half[g[name]] = math.exp(x)
            elif name.startswith("launch_s."):
                launch[g[name]] = math.exp(x)
        efficiency = np.exp(log_efficiency)
        saturation = p.batch / (p.batch + half)
        compute_s = p.flops / (p.peak * efficiency * saturation)
        memory_efficiency = p.memory_efficiency * np.exp(log_memory)
        memory_s = p.memory_bytes / (p.bandwidth * memory_efficiency)
        launch_s = p.kernels * launch
        compute_bound = (compute_s >= memory_s) & (compute_s >= launch_s)
        launch_bound = (launch_s > compute_s) & (launch_s > memory_s)
        memory_bound = ~compute_bound & ~launch_bound
        pass_s = np.where(compute_bound, compute_s, np.where(launch_bound, launch_s, memory_s))
        rows = len(self.rows)
        if only is not None:
            pass_s = np.where(only, pass_s, 0.0)
        total = np.bincount(p.row, weights=pass_s, minlength=rows)
        d_log_efficiency = np.where(compute_bound, -compute_s, 0.0)
        d_half = np.where(compute_bound, compute_s * half / (p.batch + half), 0.0)
        d_memory = np.where(memory_bound, -memory_s, 0.0)
        d_launch = np.where(launch_bound, launch_s, 0.0)
        jacobian = np.empty((rows, len(self.names)))
        for column, name in enumerate(self.names):
            if name.startswith("factor."):
                weights = np.where(g[name], d_log_efficiency, 0.0)
            elif name.startswith("memory_factor."):
                weights = np.where(g[name], d_memory, 0.0)
            elif name.startswith("half_batch."):
                weights = np.where(g[name], d_half, 0.0)
            else:
                weights = np.where(g[name], d_launch, 0.0)
            jacobian[:, column] = np.bincount(p.row, weights=weights, minlength=rows)
        return total, jacobian

    def fit(self, rows: np.ndarray | None = None, start: np.ndarray | None = None) -> np.ndarray:
        """Transformed parameters fitted on ``rows`` (indices; default all), from ``start``."""
        index = np.arange(len(self.rows)) if rows is None else rows
        priors = np.array([_prior(name) for name in self.names])
        bounds = np.array([_transformed_bounds(name) for name in self.names])
        x0 = np.clip(priors[:, 0] if start is None else start, bounds[:, 0] + 1e-9, bounds[:, 1] - 1e-9)

        def residuals(theta: np.ndarray) -> np.ndarray:
            total, _ = self.times(theta)
            predicted = total[index] + self.exposed[index]
            data = np.log(predicted / self.measured[index]) / ROW_SIGMA
            return np.concatenate([data, (theta - priors[:, 0]) / priors[:, 1]])

        def jacobian(theta: np.ndarray) -> np.ndarray:
            total, d_total = self.times(theta)
            predicted = total[index] + self.exposed[index]
            return np.vstack([d_total[index] / predicted[:, None] / ROW_SIGMA, np.diag(1.0 / priors[:, 1])])

        result = least_squares(residuals, x0, jac=jacobian, bounds=(bounds[:, 0], bounds[:, 1]), method="trf")
        return np.asarray(result.x)

    def read_exposed(self, profile: Profile, theta: np.ndarray) -> None:
        """The communication each multi-device row exposes under ``profile`` with ``theta``'s compute."""
        trial = dataclasses.replace(profile, compute=ComputeFit(to_values(self.names, theta)))
        total, _ = self.times(theta)
        for index, row in enumerate(self.rows):
            if row.devices == 1:
                continue
            value = predict(row, trial, require_pinned=False).value
            if value is not None:
                self.exposed[index] = max(iteration_s(row, value) - total[index], 0.0)


def fit_compute_model(
    rows: Sequence[Measurement],
    profile: Profile,
    bootstrap: int = 0,
    rng: np.random.Generator | None = None,
    exposed: dict[str, float] | None = None,
) -> tuple[ComputeFit | None, ComputeModelFit | None, list[dict[str, float]]]:
    """(the compute fit, the fitted rows' model, bootstrap samples ``compute.<name>``) from ``rows``.

    ``exposed``: the exposed communication of multi-device rows by id, known from an earlier fit
    (then it is not re-read).
    """
    chosen = compute_rows(rows)
    if not chosen:
        return None, None, []
    model = ComputeModelFit(chosen, profile)
    if exposed is not None:
        model.exposed = np.array([exposed.get(row.id, 0.0) for row in chosen])
    theta = model.fit()
    rereads = REREADS if exposed is None and any(row.devices > 1 for row in chosen) else 0
    for _ in range(rereads):
        model.read_exposed(profile, theta)
        theta = model.fit(start=theta)
    model.theta = theta
    values = to_values(model.names, theta)
    ids = ", ".join(row.id for row in chosen[:6]) + (" ..." if len(chosen) > 6 else "")
    source = (
        f"fitted by ddlsim calibrate across devices (least squares on log time with priors) to {len(chosen)} "
        f"training rows: {ids}"
    )
    sources = {name: source for name in values}
    samples: list[dict[str, float]] = []
    if bootstrap >= 2 and len(chosen) >= 2:
        # resampled rows refit from the fitted point; the percentile interval goes into each source
        result = stats.bootstrap(
            (np.arange(len(chosen)),),
            lambda drawn: model.fit(np.asarray(drawn, dtype=int), start=theta),
            n_resamples=bootstrap,
            vectorized=False,
            method="percentile",
            confidence_level=0.9,
            rng=rng or np.random.default_rng(0),
        )
        distribution = np.exp(np.atleast_2d(result.bootstrap_distribution))  # (parameters, resamples)
        samples = [
            {f"compute.{name}": float(value) for name, value in zip(model.names, column, strict=True)}
            for column in distribution.T
        ]
        low, high = np.exp(result.confidence_interval.low), np.exp(result.confidence_interval.high)
        for index, name in enumerate(model.names):
            sources[name] += f"; 90 % bootstrap interval {low[index]:.3g} to {high[index]:.3g}"
    return ComputeFit(values, sources), model, samples
