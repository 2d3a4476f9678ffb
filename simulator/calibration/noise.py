"""How far off a prediction is, per kind of prediction, and whether a fit is plausible at all.

``loso_noise``: every source (the ``source`` column: one table, spreadsheet or log set) is left
out in turn, the rest refitted (``fit.fit_rows``, reusing the full fit where the source did not
contribute), and the source's rows predicted. The log residuals r are grouped by the kind of
prediction (``intervals.prediction_kind``); a kind's sigma is the 90th percentile of |r| divided by
1.645, so its 90 % interval holds 90 % of those held-out residuals whatever their distribution
(a split-conformal interval; a root mean square would let a few outliers, the rows of a mechanism
the model lacks, widen every interval of the kind). Each parent (``"training, 1 node"``,
``"training"``, ``"collective"``) gets one from all of its kinds' residuals together. A kind
needs ``MIN_RESIDUALS`` residuals, else it takes its parent's; a link fitted for the same device
and library, which no left-out source exercises, takes the in-sample ``noise_sigma`` of the link
fits instead of its parent's (which holds only datasheet predictions).

``check_fit``: warnings for fits no physical system gives (a noise sigma that means a factor of 2
per standard deviation, a link beta far above its line rate, compute far from its datasheet).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ddlsim.hardware_models.catalog import load_link
from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.intervals import Estimator, prediction_kind
from ddlsim.simulator.calibration.measurements import Measurement

if TYPE_CHECKING:
    from ddlsim.simulator.calibration.fit import Fitted, Residual

MIN_RESIDUALS = 4
QUANTILE = 0.9  # the interval level the per-kind sigma reproduces exactly
Z_QUANTILE = 1.6448536269514722  # the standard normal quantile at 0.5 + QUANTILE / 2
FLOOR = 0.02
# kinds whose parent pools only transfers (the datasheet links): without held-out residuals of
# their own they take the in-sample sigma of the link fits
WELL_PINNED = ("collective, 1 node: fitted link", "collective, several nodes: fitted link")
SIGMA_WARN = 0.4  # a factor exp(0.4) = 1.5 per standard deviation
BETA_WARN = 1.5  # fitted beta above 1.5 x the datasheet's port bandwidth
SCALE_WARN = 3.0  # pinned compute 3 x off the model's, or a compute factor 3 x off the datasheet


def source_of(row: Measurement) -> str:
    return row.source or row.id.rsplit("-", 1)[0]


def loso_residuals(
    usable: list[Measurement], fitted: Fitted, rng: np.random.Generator, base: Profile | None = None
) -> dict[str, list[float]]:
    """Log residuals log(predicted / measured) of every row predicted with its source left out, by kind
    (each fold, like the whole fit, starts from ``base``'s devices, without the catalog values derived
    from the rows it predicts: ``unseen.without``)."""
    from ddlsim.simulator.calibration.fit import fit_rows
    from ddlsim.simulator.calibration.unseen import without

    sources = sorted({source_of(row) for row in usable})
    out: dict[str, list[float]] = {}
    if len(sources) < 2:
        return out
    for source in sources:
        rest = [row for row in usable if source_of(row) != source]
        predicted = [row.id for row in usable if source_of(row) == source]
        start = without(Profile(devices=base.devices if base else {}), predicted)
        fold = fit_rows(rest, start, rng, 0, reuse=fitted)
        estimator = Estimator(fold.profile, intervals=False)
        for row in usable:
            if source_of(row) != source:
                continue
            value = estimator.predict(row).value
            if value is not None and value > 0:
                out.setdefault(prediction_kind(row, fold.profile), []).append(math.log(value / row.value))
    return out


def _parents(kind: str) -> list[str]:
    out: list[str] = []
    while True:
        cut = max(kind.rfind(":"), kind.rfind(","))
        if cut <= 0:
            return out
        kind = kind[:cut]
        out.append(kind)


def loso_noise(
    usable: list[Measurement], fitted: Fitted, profile: Profile, rng: np.random.Generator, base: Profile | None = None
) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """(sigma per kind, their sources, notes) from ``loso_residuals``; empty with fewer than two sources."""
    residuals = loso_residuals(usable, fitted, rng, base)
    pools: dict[str, list[float]] = {}
    for kind, values in residuals.items():
        for name in (kind, *_parents(kind)):
            pools.setdefault(name, []).extend(values)
    noise: dict[str, float] = {}
    sources: dict[str, str] = {}
    for kind, values in sorted(pools.items()):
        if len(values) < MIN_RESIDUALS:
            continue
        sigma = float(np.quantile(np.abs(values), QUANTILE)) / Z_QUANTILE
        noise[kind] = min(max(sigma, FLOOR), 5.0)
        bias = 100 * (math.exp(float(np.median(values))) - 1)
        sources[f"noise.{kind}"] = (
            f"90th percentile of |log(predicted / measured)| / 1.645 over {len(values)} rows, each predicted "
            f"with its source left out of the fit (median error {bias:+.1f} %)"
        )
    for kind in WELL_PINNED:
        if kind not in noise:
            noise[kind] = profile.noise_sigma
            sources[f"noise.{kind}"] = (
                "in-sample noise sigma of the link fits: no left-out source had its rows predicted this way (a "
                "device's link fit comes from its own source)"
            )
    return noise, sources, []


def check_fit(profile: Profile, residuals: Sequence[Residual]) -> list[str]:
    """Warnings for implausible fitted values (none for a plausible fit)."""
    warnings: list[str] = []
    for kind, sigma in [("all rows", profile.noise_sigma), *sorted(profile.noise.items())]:
        if sigma > SIGMA_WARN:
            warnings.append(
                f"noise sigma {sigma:.2f} for {kind}: a typical prediction is off by a factor {math.exp(sigma):.1f}; "
                "the model does not describe these rows (check units, tokens and the rows' notes)"
            )
    for key, fit in sorted(profile.links.items()):
        line = load_link(key.partition("@")[0]).port_bandwidth_Bps
        for beta in fit.beta_Bps:
            if beta > BETA_WARN * line:
                warnings.append(
                    f"link {key}: fitted bandwidth {beta / 1e9:.3g} GB/s is {beta / line:.1f}x the datasheet's "
                    f"{line / 1e9:.3g} GB/s per port (a library that is not a plain ring, or a wrong link token)"
                )
        for alpha in fit.alpha_s:
            if alpha > 0.01:
                warnings.append(f"link {key}: fitted per-message time {alpha * 1e3:.3g} ms is above 10 ms")
    if profile.compute:
        for name, value in sorted(profile.compute.values.items()):
            if name.startswith("factor.") and not 1 / SCALE_WARN <= value <= SCALE_WARN:
                warnings.append(f"compute {name} = {value:.3g}: {SCALE_WARN:g}x or more away from the datasheet")
    for device, device_fit in sorted(profile.devices.items()):
        for shape, scale in sorted(device_fit.workload_scale.items()):
            if not 1 / SCALE_WARN <= scale <= SCALE_WARN:
                warnings.append(
                    f"{device} {shape}: measured compute is {scale:.2f}x the model's (check the batch, precision "
                    "and workload tokens)"
                )
    far = [r for r in residuals if abs(r.error_pct) > 50]
    if far:
        warnings.append(
            f"{len(far)} calibration row(s) stay more than 50 % off after fitting, e.g. {far[0].id} "
            f"({far[0].error_pct:+.0f} %)"
        )
    return warnings
