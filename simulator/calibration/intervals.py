"""One row's answer: the prediction, its interval, the kind of prediction it is, and its note.

The interval at level ``ci`` is p x exp(-/+ z sigma) with sigma^2 = sigma_kind^2 + sigma_param^2:

* ``sigma_kind``: the lognormal scatter of predictions of the same kind about their measurements
  when the measurement's whole source was left out of the fit (``Profile.sigma``, fitted by
  ``noise.loso_noise``). The kinds (``prediction_kind``) separate what the model knows well (a
  run shape whose compute a calibration row pins, a link fitted on the same device and library)
  from what it transfers (compute fitted across devices, the datasheets).
* ``sigma_param``: the spread of log p over the profile's bootstrap samples, and, for compute
  predicted by the cross-device model, the prior uncertainty of every factor no calibration row
  informed (a generation, precision class, device or workload the data did not contain): one
  prior standard deviation of each moves log p by the amount added (in quadrature).
* ``sigma_scale``: a row with more devices than any calibration row of its kind, device and
  algorithm (``Profile.calibrated_scale``) extrapolates. The change the model predicts from the
  largest calibrated scale to the row's (per device, for a throughput) is what no calibration row
  has checked, so it is taken as uncertain by its own size: it is the interval's half-width at
  level ``ci`` (sigma_scale = |log change| / z), added in quadrature. Within the calibrated scale,
  and for a device or algorithm no calibration row has, it is 0 (the kind's sigma carries those).

A field the source leaves open is filled with its default (``open_fields``); the interval then
spans every alternative's interval too, and the note says what was assumed. Likewise a link fitted
at one scale, where a fixed cost per call and a per-step alpha fit alike (``link_fit``: the per-call
reading is kept): the interval spans the per-step reading's prediction too, which grows with the
ranks where the kept one does not (``Profile.per_step_reading``). Predictions are cached
per distinct configuration (repeated measurements of one setup are predicted once).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddlsim.hardware_models.catalog import load_device
from ddlsim.hardware_models.profile import ComputeFit, Profile
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.open_fields import open_choices, with_choice
from ddlsim.simulator.calibration.predict import (
    Prediction,
    is_transformer_row,
    needs_input_pipeline,
    predict,
    stack_reduction,
)
from ddlsim.simulator.calibration.unseen import unseen_note

PER_STEP_SPREAD = 0.005  # the per-step reading widens an interval where it moves the prediction more

CONFIG_FIELDS = (
    "kind",
    "metric",
    "device",
    "devices_per_node",
    "nodes",
    "workload",
    "collective",
    "algorithm",
    "intra_node_link",
    "network",
    "nics_per_node",
    "sockets",
    "socket_link",
    "message_bytes",
    "per_device_batch",
    "precision",
)


def scale_key(row: Measurement) -> str:
    """The ``Profile.calibrated_scale`` key of ``row``: ``"kind/device/algorithm"``."""
    return f"{row.kind}/{row.device}/{row.algorithm}"


def per_device(value: float, row: Measurement) -> float:
    """``value`` made comparable across scales: a throughput per device; times, efficiencies and
    bus bandwidths as they are."""
    return value / row.devices if row.metric == "throughput_samples_per_s" else value


def config_key(row: Measurement) -> tuple[Any, ...]:
    """What a prediction depends on: the row without its id, value and provenance."""
    return tuple(getattr(row, name) for name in CONFIG_FIELDS)


def prediction_kind(row: Measurement, profile: Profile | None) -> str:
    """What the prediction of ``row`` rests on, e.g. ``"training, 1 node, real data: pinned compute"``
    or ``"collective, 1 node: datasheet link"`` (parents: the text before the last ':' or ',').

    Training rows are told apart by scale (one device, one node, several nodes: communication and
    its missing costs grow with it), by real input data (the input pipeline is not modeled) and by
    what their compute rests on (a pinned shape, the compute model fitted across devices, the
    datasheets); collective rows by scale (one node: the intra-node link and the library alone) and
    by their link (fitted for the device and library, or datasheet).
    """
    data = ", real data" if needs_input_pipeline(row) else ""
    row = row.modeled()
    if row.kind == "training":
        if row.metric == "scaling_efficiency":
            return "training: scaling efficiency"
        scale = "1 device" if row.devices == 1 else "1 node" if row.nodes == 1 else "several nodes"
        if is_transformer_row(row):  # the megatron model's own compute, which no layer-table fit informs
            source = "transformer model compute"
        elif profile and profile.pins(row.device, row.workload, row.precision, row.per_device_batch or 0):
            source = "pinned compute"
        elif profile and profile.compute:
            source = "compute fitted across devices"
        else:
            source = "datasheet compute"
        return f"training, {scale}{data}: {source}"
    token = row.network if row.nodes > 1 else row.intra_node_link
    # one node: only the intra-node link and the library; several nodes add the network and its software
    scale = "1 node" if row.nodes == 1 else "several nodes"
    key = profile.link_fit_key(token, f"{row.device}@{row.algorithm}@{row.collective}") if profile else None
    if key is None:
        return f"collective, {scale}: datasheet link"
    if key.startswith(f"{token}@{row.device}"):
        return f"collective, {scale}: fitted link"
    if key.split("@")[1:2] == [load_device(row.device).kind]:
        return f"collective, {scale}: link pooled over its kind"
    return f"collective, {scale}: link fitted for any device"


UNSIZED_NOTE = "no interval: nothing was calibrated to size one (the datasheets alone)"


@dataclass(frozen=True)
class Estimate:
    """A row's prediction in its metric's unit with its interval (None without residuals to size
    one), or None and the reason."""

    value: float | None
    low: float | None = None
    high: float | None = None
    kind: str = ""
    sigma: float = 0.0
    note: str = ""
    reason: str = ""
    detail: str = ""

    @property
    def width(self) -> float:
        """high / low (nan without an interval)."""
        return self.high / self.low if self.high and self.low else math.nan


@dataclass
class Estimator:
    """Estimates under one profile at one interval level, cached per configuration."""

    profile: Profile
    ci: float = 0.9
    executor: str = "analytic"
    intervals: bool = True  # False: point predictions only (no bootstrap, no alternatives)
    _samples: list[Profile] = field(default_factory=list)
    _cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.z = statistics.NormalDist().inv_cdf(0.5 + self.ci / 2)
        self._samples = self.profile.samples() if self.intervals else []
        # a link measured at one scale: per step or per call undecided, and the interval spans both;
        # asked only of rows on a device such a link was fitted for (links are scoped token@device@...)
        self._per_step = self.profile.per_step_reading() if self.intervals else None
        self._undecided = self.profile.undecided_devices()
        # residuals to size an interval with: none in a profile that calibrated nothing (the datasheets
        # alone), whose "interval" would be the prediction itself, x1.00 wide and never covering
        self.sized = bool(self.profile.noise) or self.profile.noise_sigma > 0 or bool(self._samples)

    def predict(self, row: Measurement, sample: int = -1) -> Prediction:
        """``predict`` under the profile (``sample`` -1) or one bootstrap sample, cached."""
        key = (config_key(row), stack_reduction(row), sample)
        if key not in self._cache:
            profile = self.profile if sample < 0 else self._samples[sample]
            self._cache[key] = predict(row, profile, self.executor)
        return self._cache[key]

    def estimate(self, row: Measurement) -> Estimate:
        """The prediction of ``row`` with its interval, kind and note (cached per configuration)."""
        key = ("estimate", config_key(row), needs_input_pipeline(row), stack_reduction(row))
        if key not in self._cache:
            self._cache[key] = self._estimate(row)
        return self._cache[key]

    def _estimate(self, row: Measurement) -> Estimate:
        choices = open_choices(row)
        if isinstance(choices, str):
            return Estimate(None, reason=choices)
        resolved = with_choice(row, choices)
        prediction = self.predict(resolved)
        if prediction.value is None:
            return Estimate(None, reason=prediction.reason)
        value = prediction.value
        kind = prediction_kind(resolved, self.profile)
        sigma_kind = self.profile.sigma(kind)
        logs = [math.log(p.value) for i in range(len(self._samples)) if (p := self.predict(resolved, i)).value]
        sigma_param = float(np.std(logs, ddof=1)) if len(logs) >= 2 else 0.0
        unfitted, sigma_prior = self._unfitted_compute(resolved, kind, value)
        sigma_scale, scale_note = self._beyond_scale(resolved, value)
        sigma_within = math.sqrt(sigma_kind**2 + sigma_param**2 + sigma_prior**2)
        sigma = math.hypot(sigma_within, sigma_scale)
        spread = math.exp(self.z * sigma)
        low, high = value / spread, value * spread
        notes = [choice.note for choice in choices]
        if scale_note:
            within = math.exp(2 * self.z * sigma_within)
            notes.append(f"{scale_note} (interval x{spread**2:.2f} wide, x{within:.2f} without)")
        if self.intervals:
            for choice in choices:
                for alternative in choice.alternatives:
                    other = self.predict(with_choice(row, choices, (choice.column, alternative))).value
                    if other is not None:
                        low, high = min(low, other / spread), max(high, other * spread)
        undecided = {"", resolved.device, load_device(resolved.device).kind} & self._undecided
        if self._per_step is not None and undecided:
            other = predict(resolved, self._per_step, self.executor).value
            if other is not None and abs(other / value - 1) > PER_STEP_SPREAD:
                low, high = min(low, other / spread), max(high, other * spread)
                notes.append(
                    "a link measured at one scale: per step or per call not told apart, the interval spans the "
                    f"per-step reading (x{other / value:.2f} of this prediction)"
                )
        replaced = unseen_note(self.profile, resolved.device)
        if replaced:
            notes.append(replaced)
        if needs_input_pipeline(row):
            notes.append("real data: the input pipeline is not modeled (assumed to keep up)")
        reduction = stack_reduction(row)
        if reduction:
            notes.append(reduction.note)
        if kind.endswith("compute fitted across devices") or kind.endswith("datasheet compute"):
            pinned = self.profile.sigma(kind.rsplit(":", 1)[0] + ": pinned compute")
            notes.append(
                f"compute not measured for this device and shape: {kind.rsplit(': ', 1)[1]}"
                + (f", no calibration row informs {', '.join(unfitted)}" if unfitted else "")
                + f" (interval x{spread**2:.2f} wide, x{math.exp(2 * self.z * math.hypot(pinned, sigma_param)):.2f} "
                "for a pinned shape)"
            )
        if not self.sized:
            notes.append(UNSIZED_NOTE)
            return Estimate(value, None, None, kind, 0.0, "; ".join(notes), detail=prediction.detail)
        return Estimate(value, low, high, kind, sigma, "; ".join(notes), detail=prediction.detail)

    def _beyond_scale(self, row: Measurement, value: float) -> tuple[float, str]:
        """(sigma_scale, note) of ``row`` predicted as ``value`` (module docstring)."""
        calibrated = self.profile.calibrated_scale.get(scale_key(row))
        if not self.intervals or calibrated is None or row.devices <= calibrated:
            return 0.0, ""
        nodes = int(calibrated) // row.devices_per_node
        # the largest calibrated scale in whole nodes of this row's size, else one smaller node
        base = (
            dataclasses.replace(row, nodes=nodes)
            if nodes >= 1
            else dataclasses.replace(row, nodes=1, devices_per_node=int(calibrated))
        )
        reference = self.predict(base).value
        if reference is None or reference <= 0:
            return 0.0, ""
        change = per_device(value, row) / per_device(reference, base)
        what = "per-device rate" if row.metric == "throughput_samples_per_s" else row.metric
        note = (
            f"{row.devices} devices, beyond the {int(calibrated)} of the calibration rows of this device and "
            f"algorithm: the modelled change from {base.devices} ({what} {100 * (change - 1):+.1f} %) is taken "
            "as uncertain by its own size"
        )
        return abs(math.log(change)) / self.z, note

    def _unfitted_compute(self, row: Measurement, kind: str, value: float) -> tuple[list[str], float]:
        """(compute parameters of ``row`` that no calibration row informed, the sigma they add to log p)."""
        from ddlsim.simulator.calibration.compute_fit import prior_sigma

        compute = self.profile.compute
        if compute is None or not kind.endswith("compute fitted across devices"):
            return [], 0.0
        device = self.profile.device(load_device(row.device))
        names = [
            name
            for name in ComputeFit.factor_names(device, row.precision, row.workload)
            if name not in compute.values and not name.startswith("factor.layer.")
        ]
        total = 0.0
        for name in names:
            key = ("prior", config_key(row), name)
            if key not in self._cache:
                sigma = prior_sigma(name)
                values = {**compute.values, name: math.exp(sigma)}
                trial = dataclasses.replace(self.profile, compute=dataclasses.replace(compute, values=values))
                shifted = predict(row, trial, self.executor).value
                self._cache[key] = math.log(shifted / value) if shifted else sigma
            total += self._cache[key] ** 2
        return names, math.sqrt(total)
