"""Calibration: fit the model's free parameters to measurements (the procedure in docs/calibration.md).

1. Rows: a row the model cannot express, or whose source leaves a field open, calibrates nothing
   (it is listed with the reason; ``validate`` still predicts it).
2. Links, per (link, device, software), from collective rows (``link_fit.py``).
3. Compute across devices (``compute_fit.py``): the datasheets' efficiencies times factors per
   precision class, architecture generation, device, layer kind and workload, a batch-size
   dependence and a fixed cost per kernel, fitted to every training row at once.
4. Pins: each run shape (device, workload, precision, per-device batch) with measurements is pinned
   to them: ``workload_scale`` = geometric mean of measured / modeled compute time, from single-device
   rows, or from multi-device rows (through the communication model) for a device without any.
5. The overlap interference factor, from multi-device training rows whose compute (single-device
   pins) and links are both pinned (a grid search on [0, 1]); 0 when no such row exists.
6. Noise: the lognormal sigma of measured/fitted over the rows with residual degrees of freedom
   (``noise_sigma``), and per kind of prediction from the residuals of a leave-one-source-out refit
   (``noise.py``): the sigma the intervals of ``validate`` use. Training or collective predictions
   when no row of that kind calibrated get ``UNCALIBRATED_SIGMA``.
7. Uncertainty: ``bootstrap`` resamples of the rows refit the link segments, the compute model and
   the pinned scales; the samples go into the profile.
8. Checks: implausible fits are reported as warnings (``Calibration.warnings``); every number stays
   inside the range the profile loader accepts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ddlsim.hardware_models.profile import DeviceFit, Profile, workload_key
from ddlsim.simulator.calibration.compute_fit import ROW_SIGMA, ComputeModelFit, fit_compute_model
from ddlsim.simulator.calibration.intervals import Estimator, scale_key
from ddlsim.simulator.calibration.link_fit import distinct_measurements, fit_links
from ddlsim.simulator.calibration.measurements import Measurement, rows_sha256
from ddlsim.simulator.calibration.open_fields import open_choices
from ddlsim.simulator.calibration.predict import is_transformer_row, needs_input_pipeline, predict, static_reason
from ddlsim.simulator.scenario import link_scope

NOISE_FLOOR = 0.02  # run-to-run spread below which published means are not resolved (DeepBench ~1%)
DEFAULT_NOISE = 0.05  # used when no residual has degrees of freedom left
NOISE_MAX = 5.0  # the profile loader's bound on every sigma
UNCALIBRATED_SIGMA = 0.4  # sigma of a kind of prediction no calibration row covers
TRANSFORMER_ROW_REASON = (
    "a catalog transformer: predicted by the megatron model, whose compute the layer-table fit does not "
    "cover (its one parameter, transformer_slowdown, is fitted by validate on llm_dev.csv-format files)"
)

Progress = Callable[[int, int], None]

# (metric, unit) of the residual table
UNITS = {"time_s": "s", "throughput_samples_per_s": "samples/s", "scaling_efficiency": "", "bus_bandwidth_Bps": "B/s"}


class CalibrationError(ValueError):
    """The measurements cannot calibrate anything (the message says what is missing)."""


@dataclass
class Residual:
    id: str
    group: str
    measured: float
    fitted: float
    metric: str = "time_s"

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.fitted - self.measured) / self.measured

    @property
    def unit(self) -> str:
        return UNITS.get(self.metric, "")


@dataclass
class Calibration:
    profile: Profile
    residuals: list[Residual] = field(default_factory=list)
    unused: list[tuple[str, str]] = field(default_factory=list)  # (id, why the row was not used)
    warnings: list[str] = field(default_factory=list)


def usable_rows(rows: Sequence[Measurement]) -> tuple[list[Measurement], list[tuple[str, str]]]:
    """(rows that can calibrate, (id, reason) of the others)."""
    usable: list[Measurement] = []
    unused: list[tuple[str, str]] = []
    for row in rows:
        # rows stay as measured (predict models them itself): a one-host row's devices per node is
        # the number of ranks sharing that host's cores
        choices = open_choices(row) if row.device else "device not stated"
        if isinstance(choices, str) or choices:
            what = choices if isinstance(choices, str) else ", ".join(choice.column for choice in choices)
            unused.append((row.id, f"calibration needs every field stated; open: {what}"))
            continue
        reason = static_reason(row.modeled())
        if reason:
            unused.append((row.id, reason))
        elif is_transformer_row(row):
            unused.append((row.id, TRANSFORMER_ROW_REASON))
        elif row.kind != "training" and row.message_bytes is None:
            unused.append((row.id, "no message size: a plateau figure cannot fit alpha and beta"))
        else:
            usable.append(row)
    return usable, unused


# --- steps 3-5: compute and overlap ----------------------------------------------------------------


def run_shape(row: Measurement) -> tuple[str, str]:
    """(device, workload/precision/batch): what a pinned compute scale is kept per."""
    return row.device, workload_key(row.workload, row.precision, row.per_device_batch or 0)


def pin_shapes(
    profile: Profile, model: ComputeModelFit | None, rng: np.random.Generator, bootstrap: int
) -> tuple[Profile, list[dict[str, float]]]:
    """Step 4 (pins from the compute fit's rows at its fitted parameters). A multi-device row's
    layers ran at the pace of the slowest of its ranks: with the profile's rank jitter, that factor
    (``Stragglers.expected_slowest``) is divided out, so the pin is one rank's mean pace and the
    prediction, which multiplies it back, reproduces the row."""
    from ddlsim.simulator.scenario import Stragglers

    samples: list[dict[str, float]] = [{} for _ in range(bootstrap)]
    if model is None:
        return profile, samples
    jitter = Stragglers(profile.rank_jitter_sigma)
    compute, _ = model.times(model.theta)
    update = model.update_times(model.theta)
    scales: dict[tuple[str, str], list[tuple[str, float]]] = {}
    through_comm: set[tuple[str, str]] = set()
    for index, row in enumerate(model.rows):
        busy = model.measured[index] - model.exposed[index]
        if busy < 0.3 * model.measured[index]:  # mostly communication: the row says little about compute
            continue
        key = run_shape(row)
        # the pin scales the layers' time (simulator.training.trainers.layer_times), not the update's
        layers_s = compute[index] - update[index]
        slowest = jitter.expected_slowest(row.devices)
        scales.setdefault(key, []).append((row.id, (busy - update[index]) / (layers_s * slowest)))
        if row.devices > 1:
            through_comm.add(key)
    devices = dict(profile.devices)
    for (device, shape), items in sorted(scales.items()):
        values = np.log([scale for _, scale in items])
        fit = devices.get(device, DeviceFit())
        how = "through the communication model, of multi-device rows " if (device, shape) in through_comm else ""
        fit = dataclasses.replace(
            fit,
            workload_scale={**fit.workload_scale, shape: float(np.exp(values.mean()))},
            sources={
                **fit.sources,
                f"workload_scale.{shape}": f"pinned by ddlsim calibrate: geometric mean of measured / modeled "
                f"compute time {how}" + ", ".join(identifier for identifier, _ in items),
            },
        )
        devices[device] = fit
        for sample in samples:
            drawn = values[rng.integers(0, values.size, values.size)]
            sample[f"devices.{device}.workload_scale.{shape}"] = float(np.exp(drawn.mean()))
    return dataclasses.replace(profile, devices=devices), samples


def multi_device_rows(profile: Profile, usable: list[Measurement], single: list[Measurement]) -> list[Measurement]:
    """Multi-device training rows whose compute (a single-device row of the same shape) and links are
    pinned independently, and whose input is synthetic: what the overlap interference is fitted to
    (a real-data row's unmodeled input pipeline would read as interference, as it would as jitter)."""
    pinned_by_single = {run_shape(row) for row in single}
    rows = [
        row
        for row in usable
        if row.kind == "training"
        and row.devices > 1
        and row.metric in ("throughput_samples_per_s", "time_s")
        and not needs_input_pipeline(row)
        and run_shape(row) in pinned_by_single
        and all(
            profile.link_fit(token, link_scope(row.device, row.algorithm)) is not None  # as its prediction
            for token in (
                row.modeled().intra_node_link if row.modeled().devices_per_node > 1 else "",
                row.modeled().network if row.modeled().nodes > 1 else "",
            )
            if token
        )
    ]
    return rows


def fit_interference(profile: Profile, usable: list[Measurement], single: list[Measurement]):
    """Step 5: the overlap interference factor from multi-device training rows with pinned compute and links."""
    rows = multi_device_rows(profile, usable, single)
    sources = dict(profile.sources)
    if not rows:
        sources["overlap_interference"] = (
            "not identifiable: no multi-device training calibration row with compute and links pinned "
            "independently; 0 (no interference)"
        )
        return dataclasses.replace(profile, sources=sources, overlap_interference=0.0), []

    def cost(factor: float) -> float:
        trial = dataclasses.replace(profile, overlap_interference=factor)
        total = 0.0
        for row in rows:
            value = predict(row, trial).value
            total += math.log(value / row.value) ** 2 if value else 1e9
        return total

    grid = np.linspace(0.0, 1.0, 21)
    best = float(grid[int(np.argmin([cost(float(f)) for f in grid]))])
    fine = np.linspace(max(best - 0.05, 0.0), min(best + 0.05, 1.0), 11)
    best = float(fine[int(np.argmin([cost(float(f)) for f in fine]))])
    sources["overlap_interference"] = (
        f"fitted by ddlsim calibrate (grid search) to {len(rows)} multi-device training rows: "
        + ", ".join(row.id for row in rows)
    )
    profile = dataclasses.replace(profile, overlap_interference=best, sources=sources)
    fitted = [(row, predict(row, profile).value or float("nan")) for row in rows]
    return profile, fitted


JITTER_BOUNDS = (0.0, 0.3)


def fit_rank_jitter(profile: Profile, usable: list[Measurement]) -> Profile:
    """Step 6: ``rank_jitter_sigma``, the lognormal sigma of each rank's compute per step, from the
    multi-device training rows: a synchronous step waits for the slowest of its N ranks, which the
    model pays as E[max of N multipliers] (``Stragglers.expected_slowest``). The sigma in [0, 0.3]
    with the least soft-L1 loss of the log errors (quadratic within ``ROW_SIGMA`` of the row, linear
    beyond); 0 where no row identifies it.

    Two kinds of row would otherwise set it with a cost it does not stand for. Real-data rows are
    left out: the input pipeline is not modeled, and what it costs grows with the devices one host
    feeds, which the fit would read as jitter (on published_dev.csv the TFBENCH real-data rows
    alone moved sigma from 0.0575 to 0.065). And a row off by tens of percent at any sigma (TF's
    replicated all-reduce of AlexNet, +27 % at 8 P100 without jitter) weighs linearly, not
    quadratically: under squared error the few such rows moved it from 0.0525 to 0.0575."""
    # multi-device training rows: the cross-device compute model predicts each row's compute, so no
    # single-device row of the same shape is needed (interference needs one; jitter grows with N); but a
    # shape that only multi-device rows pin is pinned to those rows whatever the jitter (the pin
    # absorbs it, step 4), so they say nothing about it and are left out
    training = [row for row in usable if row.kind == "training"]
    single = {run_shape(row) for row in training if row.devices == 1}
    pinned = {(device, shape) for device, fit in profile.devices.items() for shape in fit.workload_scale}
    self_pinned = ({run_shape(row) for row in training if row.devices > 1} & pinned) - single
    candidates = [row for row in training if row.devices > 1 and row.metric in ("throughput_samples_per_s", "time_s")
                  and run_shape(row) not in self_pinned]  # fmt: skip
    rows = [row for row in candidates if not needs_input_pipeline(row)]
    sources = dict(profile.sources)
    real = len(candidates) - len(rows)
    left_out = f"{real} real-data row{'s' if real > 1 else ''} left out" if real else ""
    if not rows:
        sources["rank_jitter_sigma"] = "not identifiable: no multi-device training row" + (
            f" with synthetic input ({left_out}: the input pipeline is not modeled)" if real else ""
        ) + "; 0"
        return dataclasses.replace(profile, rank_jitter_sigma=0.0, sources=sources)

    # A row's prediction depends on sigma only through the factor E[max of N multipliers] on its
    # compute, and piecewise linearly in that factor: predict each row at a few sigmas, interpolate
    # in the factor, and search sigma on the interpolants (a few predictions per row, not dozens).
    from ddlsim.simulator.scenario import Stragglers

    knots = (0.0, 0.05, 0.1, 0.2, JITTER_BOUNDS[1])
    factors: dict[tuple[float, int], float] = {}

    def factor(sigma: float, ranks: int) -> float:
        key = (round(sigma, 6), ranks)
        if key not in factors:
            factors[key] = Stragglers(sigma).expected_slowest(ranks)
        return factors[key]

    curves = []
    for row in rows:
        values = [predict(row, dataclasses.replace(profile, rank_jitter_sigma=sigma)).value for sigma in knots]
        logs = [math.log(value) for value in values if value]
        if len(logs) == len(knots):
            curves.append((row, [factor(sigma, row.devices) for sigma in knots], logs))

    def cost(sigma: float) -> float:
        total = 0.0
        for row, at, logs in curves:
            error = (float(np.interp(factor(sigma, row.devices), at, logs)) - math.log(row.value)) / ROW_SIGMA
            total += math.sqrt(1.0 + error * error) - 1.0  # soft-L1
        return total

    grid = np.linspace(*JITTER_BOUNDS, 121)
    best = float(grid[int(np.argmin([cost(float(sigma)) for sigma in grid]))])
    sources["rank_jitter_sigma"] = (
        f"fitted by ddlsim calibrate (grid search on interpolated predictions, soft-L1 loss) to {len(curves)} "
        f"multi-device training rows ({min(row.devices for row in rows)}-{max(row.devices for row in rows)} "
        f"devices{', ' + left_out if real else ''})"
    )
    return dataclasses.replace(profile, rank_jitter_sigma=best, sources=sources)


# --- the procedure -------------------------------------------------------------------------------


@dataclass
class Fitted:
    """Steps 2-5 on one set of rows (the whole calibration, or one leave-one-source-out fold)."""

    profile: Profile
    samples: list[dict[str, float]]
    link_groups: dict[str, list[Measurement]]
    link_parameters: int
    compute: ComputeModelFit | None
    interference_rows: list[tuple[Measurement, float]]
    unused: list[tuple[str, str]]


def fit_rows(
    usable: list[Measurement],
    base: Profile,
    rng: np.random.Generator,
    bootstrap: int,
    reuse: Fitted | None = None,
    progress: Progress | None = None,
) -> Fitted:
    """Steps 2-5. ``reuse``: the full fit, when refitting without one source (its untouched link
    groups, its exposed communication and its interference factor are kept)."""
    collectives = [row for row in usable if row.kind != "training"]
    changed: set[str] | None = None
    if reuse is not None:
        ids = {row.id for row in usable}
        changed = {key for key, rows in reuse.link_groups.items() if any(row.id not in ids for row in rows)}
    links = fit_links(base, collectives, rng, bootstrap, reuse.profile if reuse else None, changed, progress)
    profile = links.profile
    exposed = (
        {row.id: float(value) for row, value in zip(reuse.compute.rows, reuse.compute.exposed, strict=True)}
        if reuse and reuse.compute
        else None
    )
    compute, model, compute_samples = fit_compute_model(usable, profile, bootstrap, rng, exposed)
    profile = dataclasses.replace(profile, compute=compute)
    interference_rows: list[tuple[Measurement, float]] = []
    if reuse is not None:  # the noise estimate's inner folds keep the step-level terms of the whole fit
        profile = dataclasses.replace(
            profile,
            overlap_interference=reuse.profile.overlap_interference,
            rank_jitter_sigma=reuse.profile.rank_jitter_sigma,
        )
    profile, pin_samples = pin_shapes(profile, model, rng, bootstrap)  # with the jitter known: one rank's pace
    if reuse is None:
        single = [row for row in usable if row.kind == "training" and row.devices == 1]
        profile, interference_rows = fit_interference(profile, usable, single)
        profile = fit_rank_jitter(profile, usable)
        if profile.rank_jitter_sigma > 0:  # multi-device pins are one rank's pace: divide the jitter out
            profile, pin_samples = pin_shapes(profile, model, rng, bootstrap)
    compute_samples = compute_samples or [{} for _ in range(bootstrap)]
    samples = [{**a, **b, **c} for a, b, c in zip(links.samples, compute_samples, pin_samples, strict=True)]
    return Fitted(profile, samples, links.groups, links.parameters, model, interference_rows, links.unused)


def calibrate(
    rows: Sequence[Measurement],
    bootstrap: int = 20,
    seed: int = 0,
    base: Profile | None = None,
    description: str = "",
    progress: Progress | None = None,
    noise_by_source: bool = True,
) -> Calibration:
    """Fit a profile to ``rows`` (steps 1-8 of the module docstring)."""
    from ddlsim.simulator.calibration.noise import check_fit, loso_noise

    rng = np.random.default_rng(seed)
    usable, unused = usable_rows(rows)
    if not any(row.kind == "training" for row in usable) and not any(row.kind != "training" for row in usable):
        raise CalibrationError(
            "nothing to calibrate: give training rows that state device, batch, precision and algorithm "
            "(compute), or collective rows with a message size (links)"
        )
    fitted = fit_rows(usable, base or Profile(), rng, bootstrap, progress=progress)
    profile = fitted.profile
    unused += fitted.unused
    residuals, informative = _residuals(fitted, usable)
    dof = len(informative) - fitted.link_parameters - (1 if fitted.interference_rows else 0)
    sources = dict(profile.sources)
    if dof > 0:
        sigma = min(max(math.sqrt(sum(r * r for r in informative) / dof), NOISE_FLOOR), NOISE_MAX)
        sources["noise_sigma"] = (
            f"lognormal sigma of measured/fitted over {len(informative)} calibration rows with {dof} degrees "
            f"of freedom (floor {NOISE_FLOOR})"
        )
    else:
        sigma = DEFAULT_NOISE
        sources["noise_sigma"] = "default: no calibration residual has degrees of freedom left"
    profile = dataclasses.replace(
        profile,
        noise_sigma=sigma,
        data_sha256=rows_sha256(list(rows)),
        description=description or f"calibrated by ddlsim on {len(rows)} measurement rows",
        bootstrap=tuple(fitted.samples) if bootstrap else (),
        sources=sources,
    )
    warnings: list[str] = []
    noise: dict[str, float] = {}
    noise_sources: dict[str, str] = {}
    if noise_by_source:
        noise, noise_sources, notes = loso_noise(usable, fitted, profile, rng, base)
        warnings += notes
    for root, present in (("training", "training"), ("collective", "collective")):
        if not any((row.kind == "training") == (present == "training") for row in usable) and root not in noise:
            # nothing of this kind calibrated: the datasheets' typical miss, not the other kind's scatter
            noise[root] = UNCALIBRATED_SIGMA
            noise_sources[f"noise.{root}"] = (
                f"no {root} row calibrated: {UNCALIBRATED_SIGMA} (a typical datasheet-only prediction in the "
                "published data is 20-30 % off, some a factor of 2)"
            )
    scale, scale_sources = calibrated_scale(usable)
    profile = dataclasses.replace(
        profile, noise=noise, calibrated_scale=scale, sources={**profile.sources, **noise_sources, **scale_sources}
    )
    warnings += check_fit(profile, residuals)
    return Calibration(profile, residuals, unused, warnings)


def calibrated_scale(usable: Sequence[Measurement]) -> tuple[dict[str, float], dict[str, str]]:
    """The largest device count of the calibration rows per ``intervals.scale_key`` (kind, device,
    algorithm), and each entry's source: what a prediction beyond it extrapolates from."""
    largest: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in usable:
        key = scale_key(row)
        largest[key] = max(largest.get(key, 0.0), float(row.devices))
        counts[key] = counts.get(key, 0) + 1
    sources = {
        f"calibrated_scale.{key}": f"largest device count among the {counts[key]} calibration rows of this "
        "kind, device and algorithm; a prediction beyond it widens its interval by the modelled change from it"
        for key in largest
    }
    return largest, sources


def _residuals(fitted: Fitted, usable: list[Measurement]) -> tuple[list[Residual], list[float]]:
    """The fit residuals (one per calibration row), and the log residuals that count for the noise."""
    estimator = Estimator(fitted.profile, intervals=False)
    residuals: list[Residual] = []
    informative: list[float] = []
    for key, members in sorted(fitted.link_groups.items()):
        if key not in fitted.profile.links:
            continue
        for row in members:
            value = estimator.predict(row).value
            if value is not None:
                residuals.append(Residual(row.id, f"link {key}", row.value, value, row.metric))
        for row in distinct_measurements(members):  # a time and its bus bandwidth are one measurement
            value = estimator.predict(row).value
            if value is not None:
                informative.append(math.log(value / row.value))
    if fitted.compute is not None:
        for row in fitted.compute.rows:
            value = estimator.predict(row).value
            if value is not None:
                group = "compute (pinned)" if row.devices == 1 else "compute (pinned through communication)"
                residuals.append(Residual(row.id, f"{group} {row.device}", row.value, value, row.metric))
    for row, value in fitted.interference_rows:
        residuals.append(Residual(row.id, "overlap interference", row.value, value, row.metric))
        informative.append(math.log(value / row.value))
    return residuals, informative
