"""Calibration step 2: links, per (link, device, software), from collective and ping-pong rows.

Intra-node links from one-node rows first, then networks from multi-node rows (which run over the
fitted intra-node links). The model's time for a row is linear in the link's alpha, 1/beta and
per-call cost while the bottleneck does not move: T = a + b alpha + c / beta + d call, with a, b,
c, d read off the model itself by probing (four model runs per distinct configuration: repeated
measurements of one setup are probed once). Every split of the sorted message sizes into at most
three segments is fitted by bounded linear least squares on the relative error (alpha and call >=
0, beta within the profile's range; one or two free columns in closed form, ``_box_least_squares``,
more with ``scipy.optimize.lsq_linear``); the split is
chosen by extrapolation to the largest scale, or by BIC. The coefficients are re-read at the
fitted point twice.

Per step or per call. A ring pays alpha at each of its 2 (p - 1) steps; a library may also pay a
fixed cost once per call (set-up, buffer registration, its large-message path). Both raise the
time at the scale measured; only the first grows with the ranks. Each segment is read both ways,
with two free parameters each: (alpha, beta) with no per-call cost, or beta and a per-call cost
with alpha kept at the datasheet's. Rows at two or more scales tell the readings apart and the
better fit wins (DeepBench's MLSL all-reduces on KNL at 2 and 4 nodes: the large-message segment's
time is 18 ms above its bandwidth term at both scales, where a per-step alpha would have to triple
from 2 to 4 nodes). At one scale both fit alike and the per-call reading is kept: extrapolated in
ranks, it adds nothing the data did not show. (Fitting both at once, three parameters, let noise
buy a per-call cost in the harness's 8-row groups: their held-out median went from 21.5 % to 23.3 %.)

A device without rows of its own gets the datasheets, not another device's fit: in the published
data one box's PCIe (8 TitanX behind PLX switches, 8.8 GB/s bus bandwidth) says little about another's
(8 P100 on a workstation board, 5.9 GB/s); leaving each DeepBench spreadsheet out, a fit pooled over
the others predicted it worse than the datasheet did (median |error| 58 % against 9 % for TitanX). The
exception is a GPU's network under software that stages through host memory (``link_group``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import COLLECTIVES
from ddlsim.algorithms.selectors import LIBRARIES, select
from ddlsim.hardware_models.catalog import load_device, load_link
from ddlsim.hardware_models.profile import LinkFit, Profile
from ddlsim.simulator.calibration.intervals import config_key
from ddlsim.simulator.calibration.measurements import Measurement
from ddlsim.simulator.calibration.predict import predict
from ddlsim.simulator.collective_sim import bus_factor

MAX_SEGMENTS = 3
# Message sizes (bytes) at which a library changes how it runs a collective, from its source: every
# fit of that library's rows breaks there. MLSL sends an all-reduce of 128 MiB or more as 4 pieces
# per endpoint instead of one (intel/MLSL src/comm_ep.cpp: allreduce bufSize >= LARGE_MSG_SIZE_MB
# (128) x ONE_MB (1048576, src/common.hpp) -> epNum x LARGE_MSG_CHUNK_COUNT (4) requests; epNum is
# MLSL_NUM_SERVERS: 4 by default, 16 in DeepBench's KNL runs, code/osu_allreduce/run_allreduce_ia.sh).
LIBRARY_BREAKPOINTS = {"mlsl": (128.0 * 2**20,)}
LINK_PROBE_ALPHA = 0.5  # relative alpha step of the coefficient probes
LINK_PROBE_BETA = 0.25  # relative 1/beta step
LINK_PROBE_CALL_S = 1e-3  # per-call cost step (the time is exactly linear in it)
# candidate receiver reduction rates (inf = free) and host core counts for ranks sharing a CPU
REDUCE_GRID_BPS = (math.inf, 32e9, 16e9, 8e9, 4e9, 2e9, 1e9, 0.5e9)
CORES_GRID = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
# the profile loader's ranges: a fit never leaves them (issue 15: calibrate must not write a profile
# its own loader rejects)
ALPHA_MAX_S = 1e3
BETA_RANGE_BPS = (1.0, 1e15)


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
        row.sockets,
        row.socket_link,
        row.message_bytes,
        row.source,
    )


def stages_through_host(software: str) -> bool:
    """Whether ``software`` moves a GPU's buffers between nodes through host memory whatever the GPU:
    Open MPI (its openib BTL leaves GPUDirect RDMA off by default, ``btl_openib_want_cuda_gdr``
    false in opal/mca/btl/openib/btl_openib_mca.c, and even with it on sends a GPU buffer above
    ``btl_openib_cuda_rdma_limit``, 30,000 B, through a host copy pipeline) and an algorithm token
    (in the published rows a hand-written schedule of MPI point-to-point calls on CUDA-aware Open
    MPI: DeepBench's baidu-allreduce). NCCL reads a GPU's memory from the NIC where the GPU and the
    board allow (GPUDirect RDMA), so its network rate is the box's; so may MPICH's CUDA path."""
    return software == "openmpi" or (software not in LIBRARIES and software in COLLECTIVE_ALGORITHMS)


def link_group(row: Measurement) -> str:
    """The (link, device, software) key a collective row calibrates: its network if multi-node, else intra-node.

    A GPU's network fit is pooled over GPUs (``network@gpu@software``) where the software stages
    through host memory (``stages_through_host``): the path is then the software's and the host's,
    not the GPU box's. In the published rows DeepBench's ring all-reduce over Open MPI takes 56 ms
    for 64 MB on 2 nodes of 8 TitanX and 62 ms on 2 nodes of 8 P100, where NCCL 2 on the same
    boxes and network reaches 5.5 and 2.1 GB/s of bus bandwidth (the TitanX, a GeForce part, has
    no GPUDirect RDMA)."""
    modeled = row.modeled()
    token = modeled.network if modeled.nodes > 1 else modeled.intra_node_link
    if modeled.nodes > 1 and load_device(row.device).kind == "gpu" and stages_through_host(row.algorithm):
        return f"{token}@gpu@{row.algorithm}"
    if shares_host_cpu([row]):
        # ranks sharing a CPU run software whose per-byte costs differ per collective (a library's
        # code paths, our executor's receive-then-reduce or copy): one fit per collective
        return f"{token}@{row.device}@{row.algorithm}@{row.collective}"
    return f"{token}@{row.device}@{row.algorithm}"


def with_link(profile: Profile, key: str, fit: LinkFit) -> Profile:
    return dataclasses.replace(profile, links={**profile.links, key: fit})


# --- step 2: links -------------------------------------------------------------------------------


@dataclass
class LinearRows:
    """T_i ~= a_i + b_i alpha + c_i u + d_i call (u = 1/beta) for the rows of one link group."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    d: np.ndarray
    y: np.ndarray  # measured seconds
    sizes: np.ndarray  # message bytes
    scales: np.ndarray  # devices in the run


@dataclass(frozen=True)
class Segment:
    """One message-size segment's fit: alpha (s per step), beta (bytes/s), the fixed cost per call
    (s) and the weighted residual sum of squares."""

    alpha: float
    beta: float
    call: float
    rss: float
    # the per-step reading's alpha where it fitted as well and the per-call reading was kept (one
    # scale: the two cannot be told apart); 0 where the rows decided
    step_alpha: float = 0.0


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
    call: np.ndarray,
    host: tuple[float, float] = (math.inf, math.inf),
) -> LinearRows:
    """Linear coefficients of each row at its own (alpha_i, beta_i, call_i), with ``host`` =
    (reduce_Bps, cores) held.

    Rows of one configuration probed at the same point share their coefficients (computed once).
    """
    reduce_Bps, cores = host
    done: dict[tuple, tuple[float, float, float, float]] = {}
    a, b, c, d = [], [], [], []
    for row, alpha_i, beta_i, call_i in zip(rows, alpha, beta, call, strict=True):
        point = (config_key(row), row.devices_per_node, float(alpha_i), float(beta_i), float(call_i))
        if point not in done:

            def time(al: float, be: float, ca: float, row=row) -> float:
                fit = LinkFit((), (al,), (be,), "probe", reduce_Bps=reduce_Bps, cores=cores, call_s=(ca,))
                return _model_time(row, with_link(profile, key, fit))

            base = time(alpha_i, beta_i, call_i)
            d_alpha = LINK_PROBE_ALPHA * alpha_i + 1e-7
            slope_alpha = (time(alpha_i + d_alpha, beta_i, call_i) - base) / d_alpha
            u = 1.0 / beta_i
            d_u = LINK_PROBE_BETA * u
            slope_u = (time(alpha_i, 1.0 / (u + d_u), call_i) - base) / d_u
            slope_call = (time(alpha_i, beta_i, call_i + LINK_PROBE_CALL_S) - base) / LINK_PROBE_CALL_S
            intercept = base - slope_alpha * alpha_i - slope_u * u - slope_call * call_i
            done[point] = (intercept, slope_alpha, slope_u, slope_call)
        coefficients = done[point]
        a.append(coefficients[0])
        b.append(coefficients[1])
        c.append(coefficients[2])
        d.append(coefficients[3])
    return LinearRows(
        np.array(a),
        np.array(b),
        np.array(c),
        np.array(d),
        np.array([collective_time_s(row, row.value) for row in rows]),
        np.array([float(row.message_bytes or 0) for row in rows]),
        np.array([float(row.devices) for row in rows]),
    )


def _box_least_squares(a: np.ndarray, y: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """argmin |a x - y|^2 with low <= x <= high. One or two columns (every fit here) exactly and
    without an iterative solver: the unconstrained solution if inside the box, else the best of
    the box's edges, each a one-column fit clipped to its bounds. More columns: ``lsq_linear``."""

    def one(column: np.ndarray, target: np.ndarray, lo: float, hi: float) -> float:
        norm = float(column @ column)
        return float(np.clip(column @ target / norm, lo, hi)) if norm > 0 else float(np.clip(0.0, lo, hi))

    if a.shape[1] == 1:
        return np.array([one(a[:, 0], y, low[0], high[0])])
    solution = np.linalg.lstsq(a, y, rcond=None)[0]
    if np.all((low <= solution) & (solution <= high)):
        return solution
    if a.shape[1] > 2:
        return lsq_linear(a, y, bounds=(low, high)).x
    edges = []
    for held in (0, 1):
        free = 1 - held
        for bound in (low[held], high[held]):
            x = np.empty(2)
            x[held] = bound
            x[free] = one(a[:, free], y - a[:, held] * bound, low[free], high[free])
            edges.append(x)
    return min(edges, key=lambda x: float(np.sum((a @ x - y) ** 2)))


def _solve_segment(
    lin: LinearRows, index: np.ndarray, fallback: tuple[float, float], datasheet_alpha: float | None = None
) -> Segment:
    """The segment's (alpha, beta, call) minimising sum ((a + b alpha + c u + d call - y) / y)^2
    within the profile's ranges (module docstring: per step or per call). ``fallback``: (alpha,
    beta) where the rows decide nothing; ``datasheet_alpha`` (default: the fallback's) is the alpha
    the per-call reading keeps."""
    w = 1.0 / lin.y[index]
    target = (lin.y[index] - lin.a[index]) * w
    design = np.column_stack([lin.b[index] * w, lin.c[index] * w, lin.d[index] * w])
    alpha0, beta0 = fallback
    u_range = (1.0 / BETA_RANGE_BPS[1], 1.0 / BETA_RANGE_BPS[0])
    upper = np.array([ALPHA_MAX_S, u_range[1], ALPHA_MAX_S])
    lower = np.array([0.0, u_range[0], 0.0])

    def rss(x: np.ndarray) -> float:
        r = design @ x - target
        return float(r @ r)

    def bounded(columns: list[int], fixed: np.ndarray) -> np.ndarray | None:
        """Least squares over ``columns`` with the others held at ``fixed``; None if not full rank."""
        sub = design[:, columns]
        scale = np.maximum(np.abs(sub).max(axis=0), 1e-300)
        if index.size < len(columns) or np.linalg.matrix_rank(sub / scale, tol=1e-9) < len(columns):
            return None
        rest = target - np.delete(design, columns, axis=1) @ np.delete(fixed, columns)
        x = fixed.copy()
        x[columns] = _box_least_squares(sub / scale, rest, lower[columns] * scale, upper[columns] * scale) / scale
        return x

    prior = np.array([alpha0, 1.0 / beta0, 0.0])
    candidates = [prior]
    # without a per-call cost: alpha and 1/beta, alpha = 0, or beta kept at its prior
    for columns in ([0, 1], [1], [0]):
        x = bounded(columns, np.array([0.0 if columns == [1] else alpha0, 1.0 / beta0, 0.0]))
        # alpha = 0 and a free beta only where the rows ask for a positive time per byte: a row the
        # model's other parts already overrun would otherwise clip beta to the range's top (1e15 B/s)
        if x is not None and not (columns == [1] and float(design[:, 1] @ target) <= 0):
            candidates.append(x)
    best = min(candidates, key=rss)
    if np.any(lin.d[index] > 0):
        # the per-call reading: alpha at the datasheet's, the excess a fixed cost per call; as many
        # free parameters as the per-step reading, so the better fit wins, and a tie (one scale,
        # where the two cannot be told apart) goes to it
        at = datasheet_alpha if datasheet_alpha is not None else alpha0
        x = bounded([1, 2], np.array([at, 1.0 / beta0, 0.0]))
        if x is not None and rss(x) <= rss(best) * (1 + 1e-9) + 1e-18:
            tie = rss(x) >= rss(best) * (1 - 1e-6) - 1e-18 and best[0] > at * (1 + 1e-6) and x[2] > 0
            step_alpha = float(best[0]) if tie else 0.0
            return Segment(float(x[0]), float(1.0 / x[1]), float(x[2]), rss(x), step_alpha)
    return Segment(float(best[0]), float(1.0 / best[1]), float(best[2]), rss(best))


def library_breakpoints(key: str) -> tuple[float, ...]:
    """The protocol thresholds (bytes) of the library in a link group's key (``link@device@library...``)."""
    parts = key.split("@")
    return LIBRARY_BREAKPOINTS.get(parts[2], ()) if len(parts) > 2 else ()


def forced_breakpoints(key: str, rows: list[Measurement]) -> tuple[float, ...]:
    """Every threshold a link group's fit breaks at whatever the rows say: the library's protocol
    changes and where its selector changes algorithm (taken from the library, not fitted)."""
    return tuple(sorted({*library_breakpoints(key), *algorithm_breakpoints(key, rows)}))


def algorithm_breakpoints(key: str, rows: list[Measurement]) -> tuple[float, ...]:
    """Where the library in ``key`` changes algorithm between two measured sizes of ``rows`` (its
    selector, ``algorithms.selectors``, at each row's ranks): a break between them, at their geometric
    mean. One segment's alpha is a cost per step of one schedule; a ring's 2 (p - 1) steps and a
    halving-doubling's 2 log2 p extrapolate differently in ranks, so no segment holds both."""
    parts = key.split("@")
    library = parts[2] if len(parts) > 2 else ""
    if library not in LIBRARIES:
        return ()
    modeled = [row.modeled() for row in rows if row.collective in COLLECTIVES]  # not a ping-pong's pattern
    configurations = {(row.collective, row.devices, row.devices_per_node, row.nics_per_node or 1) for row in modeled}

    def chosen(size: float) -> frozenset[str]:
        return frozenset(select(library, collective, size, *shape)[0] for collective, *shape in configurations)

    sizes = sorted({float(row.message_bytes or 0) for row in modeled})
    return tuple(math.sqrt(lo * hi) for lo, hi in itertools.pairwise(sizes) if lo > 0 and chosen(lo) != chosen(hi))


def _segmentations(sizes: np.ndarray, forced: tuple[float, ...] = ()) -> list[tuple[float, ...]]:
    """Every split of the sizes into at most ``MAX_SEGMENTS`` segments that breaks at each ``forced``
    threshold the sizes straddle (a size equal to a threshold is above it, as ``searchsorted`` puts it)."""
    distinct = np.unique(sizes)
    forced = tuple(b for b in forced if distinct[0] < b <= distinct[-1])
    cuts = [math.sqrt(lo * hi) for lo, hi in itertools.pairwise(distinct) if not any(lo < b <= hi for b in forced)]
    out: list[tuple[float, ...]] = []
    for count in range(MAX_SEGMENTS - len(forced)):
        out.extend(tuple(sorted(forced + combination)) for combination in itertools.combinations(cuts, count))
    return out


def _fit_segments(
    lin: LinearRows,
    breakpoints: tuple[float, ...],
    prior: tuple[float, float],
    rows: np.ndarray,
    minimum: int,
    forced: tuple[float, ...] = (),
) -> list[Segment] | None:
    """Each segment's fit on ``rows``; None if a segment has too few (fewer than ``minimum``, or none
    where both its ends are ``forced`` thresholds or the sizes' ends: the library's thresholds, not
    the fit, made it that small)."""
    segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
    ends = (-math.inf, *breakpoints, math.inf)
    fits = []
    for s in range(len(breakpoints) + 1):
        index = rows[segment[rows] == s]
        fixed = all(end in forced or math.isinf(end) for end in ends[s : s + 2])
        if index.size < (1 if fixed else minimum):
            return None
        fits.append(_solve_segment(lin, index, prior))
    return fits


def _rss(fits: list[Segment]) -> float:
    return sum(fit.rss for fit in fits)


def _per_row(fits: list[Segment], segment: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(alpha, beta, call) of each row, from the fit of its message-size segment."""
    alpha, beta, call = (np.array([getattr(fit, name) for fit in fits]) for name in ("alpha", "beta", "call"))
    return alpha[segment], beta[segment], call[segment]


def _extrapolation_error(
    lin: LinearRows, breakpoints: tuple[float, ...], fits: list[Segment], test: np.ndarray
) -> float:
    segment = np.searchsorted(np.array(breakpoints), lin.sizes[test], side="right")
    alpha, beta, call = _per_row(fits, segment)
    predicted = lin.a[test] + lin.b[test] * alpha + lin.c[test] / beta + lin.d[test] * call
    return float(np.sum(np.log(np.maximum(predicted, 1e-300) / lin.y[test]) ** 2))


def choose_segments(
    lin: LinearRows, scales: np.ndarray, prior: tuple[float, float], forced: tuple[float, ...] = ()
) -> tuple[float, ...]:
    """The message-size breakpoints of one link group.

    With rows at two or more scales (rank counts), the split is the one whose fit on the smaller
    scales best predicts the largest scale: the same extrapolation validate asks for. With one
    scale, the lowest BIC among splits with at least three rows per segment (two, or one, where the
    library's thresholds leave no split with three). Every split breaks at the library's own
    thresholds inside the sizes (``forced``: its protocol changes, ``LIBRARY_BREAKPOINTS``, and where
    its selector changes algorithm, ``algorithm_breakpoints``); a segment between two of them needs
    only one row.
    """
    n = lin.y.size
    everything = np.arange(n)
    largest = scales == scales.max()
    candidates = _segmentations(lin.sizes, forced)
    if len(np.unique(scales)) >= 2:
        train, test = everything[~largest], everything[largest]
        scored = []
        for breakpoints in candidates:
            fitted = _fit_segments(lin, breakpoints, prior, train, 2, forced)
            if fitted is not None and _fit_segments(lin, breakpoints, prior, everything, 2, forced) is not None:
                scored.append((_extrapolation_error(lin, breakpoints, fitted, test), len(breakpoints), breakpoints))
        if scored:
            return min(scored)[2]
    for minimum in (3, 2, 1):  # fewer rows a segment only where the library's thresholds leave fewer
        best: tuple[float, tuple[float, ...]] | None = None
        for breakpoints in candidates:
            fitted = _fit_segments(lin, breakpoints, prior, everything, minimum, forced)
            if fitted is None:
                continue
            params = 2 * (len(breakpoints) + 1) + len(breakpoints)
            bic = n * math.log(_rss(fitted) / n + 1e-12) + params * math.log(n)
            if best is None or bic < best[0]:
                best = (bic, breakpoints)
        if best:
            return best[1]
    return ()


def _fit_alpha_beta(
    profile: Profile,
    key: str,
    rows: list[Measurement],
    prior: tuple[float, float],
    host: tuple[float, float],
    rereads: int,
):
    """Segmented alpha/beta/call of one group with (reduce_Bps, cores) held: (breakpoints, fits, lin)."""
    n = len(rows)
    everything = np.arange(n)
    lin = _probe(rows, profile, key, np.full(n, prior[0]), np.full(n, prior[1]), np.zeros(n), host)
    breakpoints = choose_segments(lin, lin.scales, prior, forced_breakpoints(key, rows))
    fits = _fit_segments(lin, breakpoints, prior, everything, 1)
    assert fits is not None
    for _ in range(rereads):  # re-read the coefficients at the fitted point
        segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
        lin = _probe(rows, profile, key, *_per_row(fits, segment), host)
        refit = _fit_segments(lin, breakpoints, prior, everything, 1)
        if refit is not None:
            fits = refit
    return breakpoints, fits, lin


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

    scores: dict[tuple[float, float], float] = {}  # the second pass meets candidates of the first again

    def score(host: tuple[float, float]) -> float:
        if host not in scores:
            _, fits, _ = _fit_alpha_beta(profile, key, rows, prior, host, 1)
            extra = sum(math.isfinite(value) for value in host)
            scores[host] = n * math.log(_rss(fits) / n + 1e-12) + (2 * len(fits) + extra) * math.log(n)
        return scores[host]

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
    breakpoints, fits, lin = _fit_alpha_beta(profile, key, rows, prior, host, 2)
    source = (
        f"fitted by ddlsim calibrate to {n} collective rows ({rows[0].id} ... {rows[-1].id}); "
        f"{len(fits)} message-size segment(s)"
    )
    if shares_host_cpu(rows):
        source += "; reduce_Bps and cores by grid search (BIC), inf = not supported by the data"
    calls = tuple(fit.call for fit in fits)
    steps = tuple(fit.step_alpha for fit in fits)
    fit = LinkFit(
        tuple(float(b) for b in breakpoints),
        tuple(fit.alpha for fit in fits),
        tuple(fit.beta for fit in fits),
        source,
        reduce_Bps=host[0],
        cores=host[1],
        call_s=calls if any(calls) else (),
        step_alpha_s=steps if any(steps) else (),
    )
    boot: list[dict[str, float]] = []
    segment = np.searchsorted(np.array(breakpoints), lin.sizes, side="right")
    for _ in range(samples):
        drawn = rng.integers(0, n, n)
        sample: dict[str, float] = {}
        for s, fitted in enumerate(fits):
            index = drawn[segment[drawn] == s]
            if np.unique(index).size >= 2:
                fitted = _solve_segment(lin, index, (fitted.alpha, fitted.beta), prior[0])
            sample[f"links.{key}.alpha_s.{s}"] = fitted.alpha
            sample[f"links.{key}.beta_Bps.{s}"] = fitted.beta
            if fit.call_s:
                sample[f"links.{key}.call_s.{s}"] = fitted.call
        boot.append(sample)
    return fit, boot


@dataclass
class LinkFits:
    """Step 2's result: the profile with every fit, the rows of each group, bootstrap samples."""

    profile: Profile
    groups: dict[str, list[Measurement]]
    samples: list[dict[str, float]]
    parameters: int  # fitted numbers of the device groups (for the noise's degrees of freedom)
    unused: list[tuple[str, str]]


def fit_links(
    profile: Profile,
    rows: list[Measurement],
    rng: np.random.Generator,
    bootstrap: int,
    reuse: Profile | None = None,
    changed: set[str] | None = None,
    progress=None,
) -> LinkFits:
    """Every link group of ``rows`` (collective and point-to-point rows with a message size),
    intra-node groups before networks.

    ``reuse``/``changed``: take a group's fit from ``reuse`` unless its key is in ``changed`` (a
    refit without one source refits only the groups that source contributed to).
    """
    from ddlsim.simulator.calibration.predict import MODEL_ERRORS

    groups: dict[str, list[Measurement]] = {}
    for row in rows:
        groups.setdefault(link_group(row), []).append(row)
    samples: list[dict[str, float]] = [{} for _ in range(bootstrap)]
    unused: list[tuple[str, str]] = []
    parameters = 0
    order = sorted(groups, key=lambda key: (any(row.modeled().nodes > 1 for row in groups[key]), key))
    for done, key in enumerate(order, start=1):
        members = sorted(groups[key], key=lambda row: (row.message_bytes or 0, row.devices))
        if reuse is not None and key in reuse.links and key not in (changed or set()):
            fit, boot = reuse.links[key], [_reused(reuse, key, index) for index in range(bootstrap)]
        else:
            try:
                fit, boot = fit_link_group(profile, key, distinct_measurements(members), rng, bootstrap)
            except MODEL_ERRORS as error:
                unused.extend((row.id, f"link fit failed: {error}") for row in members)
                continue
        profile = with_link(profile, key, fit)
        fitted_breaks = set(fit.breakpoints_bytes) - set(forced_breakpoints(key, members))  # the others are given
        parameters += (3 if fit.call_s else 2) * len(fit.alpha_s) + len(fitted_breaks)
        for index, sample in enumerate(boot):
            samples[index].update(sample)
        if progress:
            progress(done, len(order))
    return LinkFits(profile, groups, samples, parameters, unused)


def _reused(profile: Profile, key: str, index: int) -> dict[str, float]:
    if index >= len(profile.bootstrap):
        return {}
    prefix = f"links.{key}."
    return {name: value for name, value in profile.bootstrap[index].items() if name.startswith(prefix)}
