"""Calibration: fit the model's free parameters to measurements (the procedure in docs/calibration.md).

1. Compute, per device, from single-device training rows: the efficiencies of the roofline
   (``compute_efficiency`` for convolutions and every layer type without its own value,
   ``layer_efficiency.linear``, ``memory_efficiency``) by least squares on log(model/measured);
   then each run shape (workload, precision, per-device batch) is pinned: ``workload_scale`` =
   geometric mean of measured / modeled compute time over its rows.
2. Links, per (link, device), from collective rows: intra-node links from one-node rows first,
   then networks from multi-node rows (which run over the fitted intra-node links). The model's
   time for a row is linear in the link's alpha and 1/beta while the bottleneck does not move:
   T = a + b alpha + c / beta, with a, b, c read off the model itself by probing (three model
   runs per row). Every split of the sorted message sizes into at most three segments is fitted
   by weighted linear least squares (relative error); the split with the lowest BIC wins, so a
   protocol switch (eager/rendezvous, NCCL LL/Simple) gets its own segment only when the data
   demand it. The coefficients are re-read at the fitted point twice.
3. The overlap interference factor, from multi-device training rows whose compute and links are
   both pinned by steps 1-2 (a grid search on [0, 1]); 0 when no such row exists.
4. Noise: the lognormal sigma of measured/fitted over the rows with residual degrees of freedom.
5. Uncertainty: ``bootstrap`` resamples of the rows; each resample refits the link segments
   (with the linear coefficients of step 2) and the pinned compute scales; the samples go into
   the profile and give the confidence intervals of ``validate``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ddlsim.hardware_models.catalog import load_device, load_link
from ddlsim.hardware_models.profile import DeviceFit, LinkFit, Profile, workload_key
from ddlsim.simulator.calibration.measurements import Measurement, rows_sha256
from ddlsim.simulator.calibration.predict import MODEL_ERRORS, predict, static_reason, training_scenario
from ddlsim.simulator.collective_sim import bus_factor
from ddlsim.simulator.training.trainers import single_device_step_s

MAX_SEGMENTS = 3
NOISE_FLOOR = 0.02  # run-to-run spread below which published means are not resolved (DeepBench ~1%)
DEFAULT_NOISE = 0.05  # used when no residual has degrees of freedom left
LINK_PROBE_ALPHA = 0.5  # relative alpha step of the coefficient probes
LINK_PROBE_BETA = 0.25  # relative 1/beta step
# candidate receiver reduction rates (inf = free) and host core counts for ranks sharing a CPU
REDUCE_GRID_BPS = (math.inf, 32e9, 16e9, 8e9, 4e9, 2e9, 1e9, 0.5e9)
CORES_GRID = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)


class CalibrationError(ValueError):
    """The measurements cannot calibrate anything (the message says what is missing)."""


@dataclass
class Residual:
    id: str
    group: str
    measured: float
    fitted: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.fitted - self.measured) / self.measured


@dataclass
class Calibration:
    profile: Profile
    residuals: list[Residual] = field(default_factory=list)
    unused: list[tuple[str, str]] = field(default_factory=list)  # (id, why the row was not used)


# --- helpers -------------------------------------------------------------------------------------


def measured_compute_s(row: Measurement) -> float:
    """Seconds per iteration of a single-device training row."""
    assert row.per_device_batch is not None
    return row.per_device_batch / row.value if row.metric == "throughput_samples_per_s" else row.value


def collective_time_s(row: Measurement, value: float) -> float:
    """A collective or point-to-point row's value (time or bus bandwidth) as seconds."""
    if row.metric == "time_s":
        return value
    assert row.message_bytes is not None
    factor = bus_factor(row.collective, row.devices) if row.kind == "collective" else 1.0
    return row.message_bytes * factor / value


def distinct_measurements(rows: list[Measurement]) -> list[Measurement]:
    """One row per measured run: a bus bandwidth row that restates a time row of the same run
    (nccl-tests prints both; the harness writes both) is the same number and would count twice."""
    timed = {_run_key(row) for row in rows if row.metric == "time_s"}
    return [row for row in rows if row.metric == "time_s" or _run_key(row) not in timed]


def _run_key(row: Measurement) -> tuple:
    return (
        row.kind,
        row.collective,
        row.algorithm,
        row.device,
        row.devices_per_node,
        row.nodes,
        row.intra_node_link,
        row.network,
        row.nics_per_node,
        row.message_bytes,
        row.source,
    )


def link_group(row: Measurement) -> str:
    """The (link, device, software) key a collective row calibrates: its network if multi-node, else intra-node."""
    modeled = row.modeled()
    token = modeled.network if modeled.nodes > 1 else modeled.intra_node_link
    if shares_host_cpu([row]):
        # ranks sharing a CPU run software whose per-byte costs differ per collective (a library's
        # code paths, our executor's receive-then-reduce or copy): one fit per collective
        return f"{token}@{row.device}@{row.algorithm}@{row.collective}"
    return f"{token}@{row.device}@{row.algorithm}"


def _with_device(profile: Profile, token: str, fit: DeviceFit) -> Profile:
    return dataclasses.replace(profile, devices={**profile.devices, token: fit})


def _with_link(profile: Profile, key: str, fit: LinkFit) -> Profile:
    return dataclasses.replace(profile, links={**profile.links, key: fit})


def least_squares_log(
    residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, upper: np.ndarray, iterations: int = 30
) -> np.ndarray:
    """Levenberg-Marquardt on ``residuals(x)`` with a forward-difference Jacobian, x <= upper."""
    x = np.minimum(np.asarray(x0, dtype=float), upper)
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(iterations):
        step = 1e-4
        jacobian = np.empty((r.size, x.size))
        for k in range(x.size):
            probe = x.copy()
            probe[k] += step if probe[k] + step <= upper[k] else -step
            jacobian[:, k] = (residuals(probe) - r) / (probe[k] - x[k])
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ r
        improved = False
        for _ in range(8):
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            candidate = np.minimum(x + delta, upper)
            r_new = residuals(candidate)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                x, r, cost, damping, improved = candidate, r_new, cost_new, damping / 3, True
                break
            damping *= 10
        if not improved or float(np.abs(delta).max()) < 1e-6:
            break
    return x


# --- step 1: compute -----------------------------------------------------------------------------

COMPUTE_PARAMETERS_RICH = ("compute_efficiency", "layer_efficiency.linear", "memory_efficiency")
COMPUTE_PARAMETERS_POOR = ("compute_efficiency",)


def _device_fit(names: Sequence[str], values: Sequence[float], sources: dict[str, str]) -> DeviceFit:
    settings: dict[str, float] = dict(zip(names, values, strict=True))
    layer = {name.split(".", 1)[1]: value for name, value in settings.items() if name.startswith("layer_efficiency.")}
    return DeviceFit(
        compute_efficiency=settings.get("compute_efficiency"),
        memory_efficiency=settings.get("memory_efficiency"),
        layer_efficiency=layer,
        sources=sources,
    )


def fit_compute(profile: Profile, rows: list[Measurement], rng: np.random.Generator, samples: int):
    """Step 1 for every device with single-device rows; returns (profile, residuals, bootstrap scales)."""
    residuals: list[Residual] = []
    boot: list[dict[str, float]] = [{} for _ in range(samples)]
    by_device: dict[str, list[Measurement]] = {}
    for row in rows:
        by_device.setdefault(row.device, []).append(row)
    for device, group in sorted(by_device.items()):
        measured = np.array([measured_compute_s(row) for row in group])
        workloads = {row.workload for row in group}
        names = COMPUTE_PARAMETERS_RICH if len(workloads) >= 3 and len(group) >= 4 else COMPUTE_PARAMETERS_POOR
        ids = ", ".join(row.id for row in group)

        def model(values: np.ndarray, names=names, group=group, profile=profile, device=device) -> np.ndarray:
            trial = _with_device(profile, device, _device_fit(names, np.exp(values), {}))
            return np.array([_step_s(training_scenario(row, trial)) for row in group])

        def log_error(values: np.ndarray, measured=measured, model=model) -> np.ndarray:
            return np.log(model(values) / measured)

        x = least_squares_log(log_error, np.log(np.full(len(names), 0.5)), np.zeros(len(names)))
        source = f"fitted by ddlsim calibrate (least squares on log time) to {len(group)} single-device rows: {ids}"
        fit = _device_fit(names, np.exp(x), {name: source for name in names})
        modeled = model(x)
        scales: dict[str, list[tuple[str, float]]] = {}
        for row, time_s, model_s in zip(group, measured, modeled, strict=True):
            key = workload_key(row.workload, row.precision, row.per_device_batch or 0)
            scales.setdefault(key, []).append((row.id, time_s / model_s))
        workload_scale = {key: math.exp(np.mean(np.log([s for _, s in items]))) for key, items in scales.items()}
        for key, items in scales.items():
            fit.sources[f"workload_scale.{key}"] = (
                "pinned by ddlsim calibrate: geometric mean of measured / modeled compute time of "
                + ", ".join(identifier for identifier, _ in items)
            )
            values = np.log([s for _, s in items])
            for sample in boot:
                drawn = values[rng.integers(0, values.size, values.size)]
                sample[f"devices.{device}.workload_scale.{key}"] = float(np.exp(drawn.mean()))
        fit = dataclasses.replace(fit, workload_scale=workload_scale)
        profile = _with_device(profile, device, fit)
        for row, time_s, model_s in zip(group, measured, modeled, strict=True):
            key = workload_key(row.workload, row.precision, row.per_device_batch or 0)
            pinned = model_s * workload_scale[key]
            value = row.per_device_batch / pinned if row.metric == "throughput_samples_per_s" else pinned
            residuals.append(Residual(row.id, f"compute {device} (pinned)", row.value, float(value)))
            del time_s
    return profile, residuals, boot


# --- step 2: links -------------------------------------------------------------------------------


@dataclass
class LinearRows:
    """T_i ~= a_i + b_i alpha + c_i u (u = 1/beta) for the rows of one link group."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    y: np.ndarray  # measured seconds
    sizes: np.ndarray  # message bytes


def _model_time(row: Measurement, profile: Profile) -> float:
    prediction = predict(row, profile)
    assert prediction.value is not None
    return collective_time_s(row, prediction.value)


def _probe(
    rows: list[Measurement],
    profile: Profile,
    key: str,
    alpha: np.ndarray,
    beta: np.ndarray,
    host: tuple[float, float] = (math.inf, math.inf),
) -> LinearRows:
    """Linear coefficients of each row at its own (alpha_i, beta_i), with ``host`` = (reduce_Bps, cores) held."""
    a, b, c = [], [], []
    reduce_Bps, cores = host
    for row, alpha_i, beta_i in zip(rows, alpha, beta, strict=True):

        def time(al: float, be: float, row=row) -> float:
            fit = LinkFit((), (al,), (be,), "probe", reduce_Bps=reduce_Bps, cores=cores)
            return _model_time(row, _with_link(profile, key, fit))

        base = time(alpha_i, beta_i)
        d_alpha = LINK_PROBE_ALPHA * alpha_i + 1e-7
        slope_alpha = (time(alpha_i + d_alpha, beta_i) - base) / d_alpha
        u = 1.0 / beta_i
        d_u = LINK_PROBE_BETA * u
        slope_u = (time(alpha_i, 1.0 / (u + d_u)) - base) / d_u
        a.append(base - slope_alpha * alpha_i - slope_u * u)
        b.append(slope_alpha)
        c.append(slope_u)
    return LinearRows(
        np.array(a),
        np.array(b),
        np.array(c),
        np.array([collective_time_s(row, row.value) for row in rows]),
        np.array([float(row.message_bytes or 0) for row in rows]),
    )


def _solve_segment(lin: LinearRows, index: np.ndarray, fallback: tuple[float, float]) -> tuple[float, float, float]:
    """(alpha, beta, weighted RSS) minimising sum ((a + b alpha + c u - y) / y)^2, alpha >= 0, u > 0."""
    w = 1.0 / lin.y[index]
    target = (lin.y[index] - lin.a[index]) * w
    design = np.column_stack([lin.b[index] * w, lin.c[index] * w])
    alpha0, beta0 = fallback

    def rss(alpha: float, u: float) -> float:
        r = design @ np.array([alpha, u]) - target
        return float(r @ r)

    candidates = []
    scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
    if index.size >= 2 and np.linalg.matrix_rank(design / scale, tol=1e-9) == 2:
        solution, *_ = np.linalg.lstsq(design, target, rcond=None)
        if solution[0] >= 0 and solution[1] > 0:
            candidates.append((float(solution[0]), float(solution[1])))
    # one-parameter fits on the boundary: alpha = 0, or beta kept at its prior
    if float(design[:, 1] @ design[:, 1]) > 0:
        u = float(design[:, 1] @ target / (design[:, 1] @ design[:, 1]))
        if u > 0:
            candidates.append((0.0, u))
    if float(design[:, 0] @ design[:, 0]) > 0:
        u0 = 1.0 / beta0
        alpha = float(design[:, 0] @ (target - design[:, 1] * u0) / (design[:, 0] @ design[:, 0]))
        candidates.append((max(alpha, 0.0), u0))
    candidates.append((alpha0, 1.0 / beta0))
    alpha, u = min(candidates, key=lambda pair: rss(*pair))
    return alpha, 1.0 / u, rss(alpha, u)


def _segmentations(sizes: np.ndarray) -> list[tuple[float, ...]]:
    distinct = np.unique(sizes)
    cuts = [math.sqrt(lo * hi) for lo, hi in itertools.pairwise(distinct)]
    out: list[tuple[float, ...]] = []
    for count in range(MAX_SEGMENTS):
        out.extend(itertools.combinations(cuts, count))
    return out


def _fit_segments(
    lin: LinearRows, breakpoints: tuple[float, ...], prior: tuple[float, float], rows: np.ndarray, minimum: int
):
    """Per-segment (alphas, betas, weighted RSS) fitted on ``rows``; None if a segment has too few."""
    segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
    alphas, betas, total = [], [], 0.0
    for s in range(len(breakpoints) + 1):
        index = rows[segment[rows] == s]
        if index.size < minimum:
            return None
        alpha, beta, rss = _solve_segment(lin, index, prior)
        alphas.append(alpha)
        betas.append(beta)
        total += rss
    return tuple(alphas), tuple(betas), total


def _extrapolation_error(lin: LinearRows, breakpoints: tuple[float, ...], fitted, test: np.ndarray) -> float:
    alphas, betas, _ = fitted
    segment = np.searchsorted(np.array(breakpoints), lin.sizes[test], side="right")
    predicted = lin.a[test] + lin.b[test] * np.array(alphas)[segment] + lin.c[test] / np.array(betas)[segment]
    return float(np.sum(np.log(np.maximum(predicted, 1e-300) / lin.y[test]) ** 2))


def choose_segments(lin: LinearRows, scales: np.ndarray, prior: tuple[float, float]) -> tuple[float, ...]:
    """The message-size breakpoints of one link group.

    With rows at two or more scales (rank counts), the split is the one whose fit on the smaller
    scales best predicts the largest scale: the same extrapolation validate asks for. With one
    scale, the lowest BIC among splits with at least three rows per segment.
    """
    n = lin.y.size
    everything = np.arange(n)
    largest = scales == scales.max()
    candidates = _segmentations(lin.sizes)
    if len(np.unique(scales)) >= 2:
        train, test = everything[~largest], everything[largest]
        scored = []
        for breakpoints in candidates:
            fitted = _fit_segments(lin, breakpoints, prior, train, 2)
            if fitted is not None and _fit_segments(lin, breakpoints, prior, everything, 2) is not None:
                scored.append((_extrapolation_error(lin, breakpoints, fitted, test), len(breakpoints), breakpoints))
        if scored:
            return min(scored)[2]
    best: tuple[float, tuple[float, ...]] | None = None
    for breakpoints in candidates:
        fitted = _fit_segments(lin, breakpoints, prior, everything, 3)
        if fitted is None:
            continue
        params = 2 * (len(breakpoints) + 1) + len(breakpoints)
        bic = n * math.log(fitted[2] / n + 1e-12) + params * math.log(n)
        if best is None or bic < best[0]:
            best = (bic, breakpoints)
    return best[1] if best else ()


def _fit_alpha_beta(
    profile: Profile,
    key: str,
    rows: list[Measurement],
    prior: tuple[float, float],
    host: tuple[float, float],
    rereads: int,
):
    """Segmented alpha/beta of one group with (reduce_Bps, cores) held: (breakpoints, alphas, betas, RSS, lin)."""
    n = len(rows)
    everything = np.arange(n)
    lin = _probe(rows, profile, key, np.full(n, prior[0]), np.full(n, prior[1]), host)
    breakpoints = choose_segments(lin, np.array([row.devices for row in rows]), prior)
    fitted = _fit_segments(lin, breakpoints, prior, everything, 1)
    assert fitted is not None
    alphas, betas, rss = fitted
    for _ in range(rereads):  # re-read the coefficients at the fitted point
        segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
        lin = _probe(rows, profile, key, np.array(alphas)[segment], np.array(betas)[segment], host)
        refit = _fit_segments(lin, breakpoints, prior, everything, 1)
        if refit is not None:
            alphas, betas, rss = refit
    return breakpoints, alphas, betas, rss, lin


def shares_host_cpu(rows: list[Measurement]) -> bool:
    """Rows of several ranks on one host's CPU (the harness): reduction and core sharing show in them."""
    return any(row.devices_per_node > 1 for row in rows) and all(load_device(row.device).kind == "cpu" for row in rows)


def fit_host(profile: Profile, key: str, rows: list[Measurement], prior: tuple[float, float]) -> tuple[float, float]:
    """(reduce_Bps, cores) of a group whose ranks share a host CPU: coordinate search by BIC.

    Each candidate refits alpha/beta (one coefficient re-read); the reduction rate and the core count
    enter the model nonlinearly through the schedule (only REDUCE receivers pay gamma; only hosts with
    more ranks than cores stretch), so they are searched on grids rather than solved for.
    """
    n = len(rows)
    host_ranks = max(row.devices_per_node for row in rows)
    cores_grid = [math.inf] + [c for c in CORES_GRID if c < host_ranks]

    def score(host: tuple[float, float]) -> float:
        _, alphas, _, rss, _ = _fit_alpha_beta(profile, key, rows, prior, host, 1)
        extra = sum(math.isfinite(value) for value in host)
        return n * math.log(rss / n + 1e-12) + (2 * len(alphas) + extra) * math.log(n)

    best = (math.inf, math.inf)
    for _ in range(2):
        reduce_Bps = min(REDUCE_GRID_BPS, key=lambda r: score((r, best[1])))
        cores = min(cores_grid, key=lambda c: score((reduce_Bps, c)))
        if (reduce_Bps, cores) == best:
            break
        best = (reduce_Bps, cores)
    return best


def fit_link_group(
    profile: Profile, key: str, rows: list[Measurement], rng: np.random.Generator, samples: int
) -> tuple[LinkFit, list[dict[str, float]]]:
    """Step 2 for one (link, device, software) group: alpha/beta per message-size segment."""
    token, _, scope = key.partition("@")
    link = load_link(token)
    prior = (link.per_message_overhead_s + link.latency_s, link.port_bandwidth_Bps)
    broader = profile.link_fit(token, scope.rpartition("@")[0] or None)
    if broader is not None:
        prior = (broader.alpha_s[-1], broader.beta_Bps[-1])
    n = len(rows)
    host = fit_host(profile, key, rows, prior) if shares_host_cpu(rows) else (math.inf, math.inf)
    breakpoints, alphas, betas, _, lin = _fit_alpha_beta(profile, key, rows, prior, host, 2)
    source = (
        f"fitted by ddlsim calibrate to {n} collective rows ({rows[0].id} ... {rows[-1].id}); "
        f"{len(alphas)} message-size segment(s)"
    )
    if shares_host_cpu(rows):
        source += "; reduce_Bps and cores by grid search (BIC), inf = not supported by the data"
    fit = LinkFit(
        tuple(float(b) for b in breakpoints), tuple(alphas), tuple(betas), source, reduce_Bps=host[0], cores=host[1]
    )
    boot: list[dict[str, float]] = []
    segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
    for _ in range(samples):
        drawn = rng.integers(0, n, n)
        sample: dict[str, float] = {}
        for s in range(len(alphas)):
            index = drawn[segment[drawn] == s]
            alpha, beta = alphas[s], betas[s]
            if np.unique(index).size >= 2:
                alpha, beta, _ = _solve_segment(lin, index, (alphas[s], betas[s]))
            sample[f"links.{key}.alpha_s.{s}"] = alpha
            sample[f"links.{key}.beta_Bps.{s}"] = beta
        boot.append(sample)
    return fit, boot


# --- the procedure -------------------------------------------------------------------------------


def calibrate(
    rows: Sequence[Measurement],
    bootstrap: int = 20,
    seed: int = 0,
    base: Profile | None = None,
    description: str = "",
) -> Calibration:
    """Fit a profile to ``rows`` (steps 1-5 of the module docstring)."""
    rng = np.random.default_rng(seed)
    profile = base or Profile()
    unused: list[tuple[str, str]] = []
    usable: list[Measurement] = []
    # rows stay as measured (predict models them itself): a one-host row's devices per node is the
    # number of ranks sharing that host's cores
    for row in rows:
        reason = static_reason(row.modeled())
        if reason:
            unused.append((row.id, reason))
        else:
            usable.append(row)
    single = [
        row
        for row in usable
        if row.kind == "training" and row.devices == 1 and row.metric in ("throughput_samples_per_s", "time_s")
    ]
    collectives = [
        row
        for row in usable
        if row.kind != "training" and row.message_bytes is not None and predict(row, profile).value is not None
    ]
    for row in usable:
        if row.kind != "training" and row.message_bytes is None:
            unused.append((row.id, "no message size: a plateau figure cannot fit alpha and beta"))
    if not single and not collectives:
        raise CalibrationError(
            "nothing to calibrate: give single-device training rows (compute) or collective rows with a "
            "message size (links)"
        )
    profile, residuals, boot = fit_compute(profile, single, rng, bootstrap)
    groups: dict[str, list[Measurement]] = {}
    for row in collectives:
        groups.setdefault(link_group(row), []).append(row)
    # intra-node groups before networks: multi-node rows run over the fitted intra-node links
    order = sorted(groups, key=lambda key: (any(row.modeled().nodes > 1 for row in groups[key]), key))
    informative: list[float] = []
    parameters = 0
    for key in order:
        members = sorted(groups[key], key=lambda row: (row.message_bytes or 0, row.devices))
        distinct = distinct_measurements(members)
        try:
            fit, samples = fit_link_group(profile, key, distinct, rng, bootstrap)
        except MODEL_ERRORS as error:
            unused.extend((row.id, f"link fit failed: {error}") for row in members)
            continue
        profile = _with_link(profile, key, fit)
        parameters += 2 * len(fit.alpha_s) + len(fit.breakpoints_bytes)
        for index, sample in enumerate(samples):
            boot[index].update(sample)
        for row in members:
            fitted = predict(row, profile).value
            assert fitted is not None
            residuals.append(Residual(row.id, f"link {key}", row.value, fitted))
        for row in distinct:  # a time and its bus bandwidth are one measurement, one residual
            fitted = predict(row, profile).value
            assert fitted is not None
            informative.append(math.log(fitted / row.value))
    profile, interference_rows = fit_interference(profile, usable, single)
    for row, fitted in interference_rows:
        residuals.append(Residual(row.id, "overlap interference", row.value, fitted))
        informative.append(math.log(fitted / row.value))
    dof = len(informative) - parameters - (1 if interference_rows else 0)
    sources = dict(profile.sources)
    if dof > 0:
        sigma = max(math.sqrt(sum(r * r for r in informative) / dof), NOISE_FLOOR)
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
        bootstrap=tuple(boot) if bootstrap else (),
        sources=sources,
    )
    return Calibration(profile, residuals, unused)


def fit_interference(profile: Profile, usable: list[Measurement], single: list[Measurement]):
    """Step 3: the overlap interference factor from multi-device training rows with pinned compute and links."""
    rows = [
        row
        for row in usable
        if row.kind == "training"
        and row.devices > 1
        and row.metric in ("throughput_samples_per_s", "time_s")
        and profile.pins(row.device, row.workload, row.precision, row.per_device_batch or 0)
        and all(
            profile.link_fit(token, row.device) is not None
            for token in (
                row.modeled().intra_node_link if row.modeled().devices_per_node > 1 else "",
                row.modeled().network if row.modeled().nodes > 1 else "",
            )
            if token
        )
    ]
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


def _step_s(scenario) -> float:
    """One device's training step (forward, backward, update) as the training model prices it."""
    return single_device_step_s(scenario, scenario.training_algorithm)
