"""Validation of large-model runs: files with ``llm_dev.csv``'s columns, read as they are.

Each row is mapped onto a catalog transformer, device, links and ``ParallelLayout``
(``simulator.workloads.llm_runs.map_run``: every value the source leaves open is filled in and
named in the row's note) and predicted with the ``megatron`` closed form
(``simulator.closed_form.training``). A row that cannot be mapped is listed with its reason.

Calibration is one named parameter, ``transformer_slowdown``: the factor between the measured
iteration time and the closed form's on the calibration rows (the geometric median: what the
datasheet efficiencies, kernels and software stacks the model does not have cost on these rows).
The interval of a prediction is the spread of the calibration rows' residuals around it (their
``ci`` quantiles in log space), each row's residual taken from a fit without its source family, so
that the band also holds the bias of a family the fit has not seen. ``leave_one_source_out`` fits it
on the other source families and predicts each family in turn: the honest split. No prediction of
a row uses a catalog value derived from it (``unseen.without``; ``Refits``).

Published metrics and how a prediction becomes one: ``iteration_s`` as is; ``tflops_per_gpu``
with the source's own FLOP count (Narayanan et al. count hardware FLOPs with recomputation) over
the predicted iteration; ``mfu`` with model FLOPs and the device's peak at the run's precision.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ddlsim.simulator.calibration.intervals import UNSIZED_NOTE
from ddlsim.simulator.records import Rejected
from ddlsim.simulator.workloads.llm_open_fields import recompute_of, zero_stage_of
from ddlsim.simulator.workloads.llm_runs import (
    COLUMNS,
    LAYOUT_NOT_STATED,
    LlmRun,
    MappedRun,
    is_lora,
    load_llm_runs,
    map_run,
    nearest_multiple,
)

SOURCE_NOTE = "transformer_slowdown: fitted on the calibration rows (geometric median of measured / predicted time)"
TIME_METRICS = ("iteration_s", "time_to_train_min")
MODELLED_METRICS = ("tflops_per_gpu", "mfu", "iteration_s", "time_to_train_min")


def is_llm_file(path: Path | str) -> bool:
    """Whether ``path``'s header is exactly ``llm_dev.csv``'s columns."""
    try:
        with Path(path).open(newline="", encoding="utf-8-sig") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError):
        return False
    return tuple(name.strip() for name in header) == COLUMNS


@dataclass
class LlmPrediction:
    """One row: its mapping and the closed form's iteration seconds (or why there is none)."""

    run: LlmRun
    mapped: MappedRun | None
    iteration_s: float = math.nan  # the closed form's, before calibration
    reason: str = ""
    # the row's metric under the other readings of what it leaves open, over the chosen reading's
    spread: tuple[float, float] = (1.0, 1.0)

    @property
    def family(self) -> str:
        return self.run.source_family

    @property
    def guessed(self) -> bool:
        """Whether the mapping chose among readings of an open shape or batch (such a row is predicted,
        not fitted: its residual would measure the choice, not the costs the model leaves out)."""
        return self.mapped is not None and bool(self.mapped.alternatives or self.mapped.alternative_layouts)


def scenario_of(mapped: MappedRun, profile: Any = None) -> Any:
    """The ``megatron`` scenario of a mapped run (memory not enforced: the run really ran), with
    ``profile`` (a ``Profile``: its devices replace the catalog's, ``unseen.without``)."""
    from ddlsim.simulator import planner

    assert mapped.layout is not None
    cluster = cluster_of(mapped, mapped.layout.gpus, mapped.options)
    scenario = planner.scenario_of(mapped.model.name, cluster, mapped.layout, transformer_changes(mapped.model))
    return dataclasses.replace(scenario, profile=profile) if profile is not None else scenario


def cluster_of(mapped: MappedRun, gpus: int, stack: tuple[tuple[str, Any], ...]) -> Any:
    """``gpus`` of the row's device as a ``planner.Cluster``, in its catalog node (an 8-card server
    for a PCIe card), on the row's network (HDR InfiniBand where it names none), with ``stack``."""
    from ddlsim.simulator import planner
    from ddlsim.simulator.workloads.llm_open_fields import node_of

    per_node = node_of(mapped.device)[0]
    per_node = gpus if gpus % per_node else per_node  # fewer GPUs than a node: one node holds them
    return planner.Cluster(mapped.device, gpus, per_node, mapped.intra_node_link if per_node > 1 else None,
                           mapped.network or "ib_hdr", min(mapped.nics_per_node, per_node), mapped.precision,
                           stack)  # fmt: skip


def transformer_changes(model: Any) -> tuple[tuple[str, int], ...]:
    """How ``model`` differs from its catalog entry, as ``Scenario.transformer_changes``."""
    from ddlsim.simulator.scenario import TRANSFORMER_CHANGES
    from ddlsim.simulator.workloads.transformer import load_transformer

    base = load_transformer(model.name)
    return tuple((name, int(getattr(model, name))) for name in TRANSFORMER_CHANGES
                 if getattr(model, name) != getattr(base, name))  # fmt: skip


STACK_FLAGS = ("overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap")  # Megatron flags a row may name


def planned(mapped: MappedRun) -> MappedRun | str:
    """A row that gives no complete layout: ``ddlsim plan``'s best for its model, GPUs and global batch
    (what the row does give held fixed; the Megatron flags its notes name as the stack), with the next
    two as the alternatives the interval spans. A published run is a tuned one, so the best is the
    default; or why no layout can be chosen."""
    from ddlsim.simulator import planner

    run = mapped.run
    if not run.gpus or not run.global_batch:
        return f"{mapped.layout_missing}, nor both the GPUs and the global batch to choose one"
    stack = dict(mapped.options) | {flag.replace("-", "_"): True for flag in STACK_FLAGS if f"--{flag}" in run.notes}
    if is_lora(run.model):
        stack["frozen_weights"] = True
    cluster = cluster_of(mapped, run.gpus, tuple(stack.items()))
    stated = ("tp", "pp", "dp", "micro_batch")
    fixed: dict[str, Any] = {name: getattr(run, name) for name in stated if getattr(run, name)}
    if run.zero_stage:
        fixed["zero_stage"] = zero_stage_of(run.zero_stage, [])
    if run.recompute:
        fixed["recompute"] = recompute_of(run.recompute, [])
    layouts = list(planner.candidate_layouts(mapped.model, cluster, run.global_batch, fixed))
    rounded = ""
    if not layouts:  # the batch divides into no layout's replicas: each layout runs its nearest multiple
        layouts = _nearest_batch_layouts(mapped.model, cluster, run.global_batch, fixed)
        rounded = f"; global batch {run.global_batch} rounded to the nearest multiple of micro-batch x dp"
    if not layouts:
        return f"{mapped.layout_missing}, and no layout of its model divides its {run.gpus} GPUs and global batch"
    ranked, _ = planner.branch_and_bound(mapped.model.name, mapped.model, cluster, layouts, keep=3,
                                         changes=transformer_changes(mapped.model))  # fmt: skip
    if not ranked:
        return f"{mapped.layout_missing}, and none of the {len(layouts)} layouts of its model fits its GPUs"
    ranked = ranked[:3]
    best = ranked[0].layout
    note = (f"layout not stated: {planner.layout_text(best)}, the best of {len(layouts)} for its GPUs and batch by "
            f"ddlsim plan (flags from the notes: {', '.join(sorted(stack)) or 'none'}); the interval spans the next "
            f"{len(ranked) - 1}{rounded}")  # fmt: skip
    options = tuple(item for item in stack.items() if item[0] in planner.STACK_OPTIONS)  # the rest are layout fields
    return dataclasses.replace(mapped, layout=best, layout_missing="", assumptions=(*mapped.assumptions, note),
                               alternative_layouts=tuple(candidate.layout for candidate in ranked[1:]),
                               options=options)  # fmt: skip


def _nearest_batch_layouts(model: Any, cluster: Any, batch: int, fixed: dict[str, Any]) -> list[Any]:
    """Every layout whose global batch is ``batch`` rounded to the nearest multiple of its own
    micro-batch x dp (the planner's candidates at each such batch, kept where the rounding is theirs)."""
    from ddlsim.simulator import planner

    replicas = [dp for dp in range(1, cluster.gpus + 1) if cluster.gpus % dp == 0]
    steps = {dp * micro for dp in replicas for micro in planner.MICRO_BATCHES}
    layouts = []
    for size in sorted({nearest_multiple(batch, step) for step in steps}):
        layouts += [layout for layout in planner.candidate_layouts(model, cluster, size, fixed)
                    if layout.global_batch == nearest_multiple(batch, layout.micro_batch * layout.dp)]  # fmt: skip
    return layouts


def predict_runs(
    runs: Sequence[LlmRun], progress: Callable[[int, int], None] | None = None, predicted: Collection[str] = ()
) -> list[LlmPrediction]:
    """The closed form's iteration for every row that maps onto a layout (the others with their
    reason), without the catalog values derived from the rows in ``predicted`` (``unseen.without``)."""
    from ddlsim.hardware_models.profile import Profile
    from ddlsim.simulator.calibration.unseen import unseen_note, without
    from ddlsim.simulator.closed_form.training import closed_form_result
    from ddlsim.simulator.scenario import ScenarioError

    blind = without(Profile(), predicted)
    profile = blind if blind.devices else None

    out = []
    for done, run in enumerate(runs, start=1):
        mapped = map_run(run)
        if isinstance(mapped, MappedRun) and mapped.layout is None and mapped.layout_missing == LAYOUT_NOT_STATED:
            plan = planned(mapped)
            mapped = plan if isinstance(plan, MappedRun) else dataclasses.replace(mapped, layout_missing=plan)
        if not isinstance(mapped, MappedRun):
            out.append(LlmPrediction(run, None, reason=mapped.reason))
        elif mapped.layout is None:
            out.append(LlmPrediction(run, mapped, reason=mapped.layout_missing))
        elif run.metric == "time_to_train_min" and mapped.train_tokens is None:
            out.append(LlmPrediction(run, mapped, reason="time to train needs the tokens trained ('300B tokens' in "
                                                         "the notes), which the row does not give"))  # fmt: skip
        elif run.metric not in MODELLED_METRICS:
            out.append(LlmPrediction(run, mapped, reason=f"metric {run.metric!r} is not one ddlsim predicts "
                                                         f"({', '.join(MODELLED_METRICS)})"))  # fmt: skip
        else:
            try:
                scenario = scenario_of(mapped, profile)
                seconds = closed_form_result(scenario, scenario.nodes[0]).iteration_s
                replaced = unseen_note(blind, mapped.device)
                if replaced:
                    mapped = dataclasses.replace(mapped, assumptions=(*mapped.assumptions, replaced))
                prediction = LlmPrediction(run, mapped, iteration_s=seconds)
                readings = [dataclasses.replace(mapped, model=model) for model in mapped.alternatives]
                readings += [dataclasses.replace(mapped, layout=layout)
                             for layout in (*mapped.alternative_layouts, *mapped.open_layouts)]  # fmt: skip
                if readings:
                    chosen = metric_of(prediction, seconds)
                    ratios = []
                    for reading in readings:
                        other = closed_form_result(scenario_of(reading, profile), scenario.nodes[0]).iteration_s
                        ratios.append(metric_of(LlmPrediction(run, reading), other) / chosen)
                    prediction.spread = (min(1.0, *ratios), max(1.0, *ratios))
            except ScenarioError as error:
                out.append(LlmPrediction(run, mapped, reason=str(error)))
            else:
                out.append(prediction)
        if progress is not None:
            progress(done, len(runs))
    return out


def metric_of(prediction: LlmPrediction, iteration_s: float) -> float:
    """The row's published metric for an iteration of ``iteration_s`` seconds."""
    from ddlsim.hardware_models.catalog import load_device
    from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks

    run, mapped = prediction.run, prediction.mapped
    assert mapped is not None and mapped.layout is not None
    if run.metric == "iteration_s":
        return iteration_s
    gpus = mapped.layout.gpus
    batch = mapped.layout.global_batch or mapped.layout.dp * mapped.layout.micro_batch
    if run.metric == "time_to_train_min":  # the iterations that train the row's tokens
        assert mapped.train_tokens is not None
        return mapped.train_tokens / (batch * mapped.model.seq_len) * iteration_s / 60.0
    model_flops = model_flops_per_sample(transformer_blocks(mapped.model)) * batch
    if run.metric == "mfu":  # in percent, as the data sets give it
        peak = load_device(mapped.device).peak_flops_for(mapped.layout.precision)
        return 100.0 * model_flops / iteration_s / gpus / peak
    flops = mapped.flops_per_iteration() or model_flops  # the source's own count where known
    return flops / iteration_s / gpus / 1e12


def slowdown(prediction: LlmPrediction) -> float:
    """Measured over predicted iteration time (the closed form, uncalibrated)."""
    value = metric_of(prediction, prediction.iteration_s)
    ratio = prediction.run.value / value
    return ratio if prediction.run.metric in TIME_METRICS else 1.0 / ratio


@dataclass(frozen=True)
class LlmFit:
    """``transformer_slowdown`` and the residual band (factors) for intervals at level ``ci``."""

    slowdown: float = 1.0
    low: float = 1.0
    high: float = 1.0
    rows: int = 0

    @property
    def sized(self) -> bool:
        """Whether residuals sized the band (the datasheets alone have none: no interval)."""
        return self.rows > 0 or (self.low, self.high) != (1.0, 1.0)

    @classmethod
    def of(
        cls, predictions: Sequence[LlmPrediction], ci: float, refits: Refits | None = None, held: Collection[str] = ()
    ) -> LlmFit:
        """The factor is the median over all rows; the band, the residuals of each source family
        predicted from the others (what a family the fit has not seen is off by: between-family bias
        included), or the in-sample residuals where the rows come from one family. With ``refits``,
        each family's residuals come from predictions without the catalog values derived from its
        rows or from ``held`` (the rows the fit will predict)."""
        done = [p for p in predictions if not p.reason and not p.guessed]
        if not done:
            return cls()
        logs = {p.run.id: math.log(slowdown(p)) for p in done}
        centre = statistics.median(logs.values())
        families = {p.family for p in done}
        if len(families) > 1:
            residuals = []
            for family in families:
                members = [p.run.id for p in done if p.family == family]
                fold = refits.without([*held, *members]) if refits else {}
                log = {key: math.log(slowdown(fold[key])) if key in fold else value for key, value in logs.items()}
                others = statistics.median(log[p.run.id] for p in done if p.family != family)
                residuals += [log[p.run.id] - others for p in done if p.family == family]
        else:
            residuals = [value - centre for value in logs.values()]
        tail = (1 - ci) / 2
        low, high = np.quantile(residuals, [tail, 1 - tail]) if len(residuals) > 1 else (0.0, 0.0)
        return cls(math.exp(centre), math.exp(float(low)), math.exp(float(high)), len(done))


class Refits:
    """``predict_runs`` of ``runs`` without the catalog values derived from a set of rows, run once
    per distinct set of values that replaces them (``unseen.unseen_devices``) and only for the runs
    on a device it replaces; ``predictions``: the runs predicted with the catalog as it is."""

    def __init__(self, runs: Sequence[LlmRun], predictions: Sequence[LlmPrediction]) -> None:
        self.runs = list(runs)
        self.cache: dict[tuple, dict[str, LlmPrediction]] = {(): {p.run.id: p for p in predictions}}

    def without(self, predicted: Collection[str]) -> dict[str, LlmPrediction]:
        """Every run's prediction (by id) without the catalog values derived from ``predicted``."""
        from ddlsim.simulator.calibration.unseen import unseen_devices

        replaced = unseen_devices(predicted)
        key = tuple(sorted((token, fit.compute_efficiency, tuple(sorted(fit.layer_efficiency.items())))
                           for token, fit in replaced.items()))  # fmt: skip
        if key not in self.cache:  # only the runs on a replaced device change
            base = self.cache[()]
            touched = [run for run in self.runs
                       if (mapped := base[run.id].mapped) is not None and mapped.device in replaced]  # fmt: skip
            self.cache[key] = {**base, **{p.run.id: p for p in predict_runs(touched, None, predicted)}}
        return self.cache[key]


def fit_runs(runs: Sequence[LlmRun], ci: float = 0.9, progress=None) -> tuple[list[LlmPrediction], LlmFit]:
    """``ddlsim calibrate`` on large-model rows: every run's prediction and the ``transformer_slowdown``
    fitted to them, its band from each family predicted without the catalog values derived from its
    rows (``Refits``)."""
    predictions = predict_runs(runs, progress)
    return predictions, LlmFit.of(predictions, ci, Refits(runs, predictions))


def packaged_llm_dev() -> Path:
    """The large-model development set shipped with the package (see its README)."""
    return Path(__file__).parent / "data" / "llm_dev.csv"


def table_row(prediction: LlmPrediction, fit: LlmFit, status: str = "predicted", basis: str = "") -> dict[str, Any]:
    """One row of ``validate``'s table (``crossval.VALIDATION_COLUMNS``)."""
    run, mapped = prediction.run, prediction.mapped
    row: dict[str, Any] = {
        "id": run.id, "source": run.source, "kind": "llm", "metric": run.metric,
        "workload": mapped.model.name if mapped else run.model, "collective": "", "algorithm": "megatron",
        "device": mapped.device if mapped else run.gpu_type, "devices_per_node": "", "nodes": run.gpus or "",
        "message_bytes": "", "per_device_batch": run.micro_batch or "", "precision": run.precision,
        "measured": run.value, "predicted": math.nan, "error_pct": math.nan, "ci_low": math.nan,
        "ci_high": math.nan, "ci_width": math.nan, "in_ci": "", "basis": basis, "status": status,
        "note": "; ".join(mapped.assumptions) if mapped else "", "reason": prediction.reason,
    }  # fmt: skip
    if prediction.reason:
        row["status"] = "cannot_model"
        return row
    iteration = prediction.iteration_s * fit.slowdown
    band = (iteration * fit.low, iteration * fit.high)
    values = sorted(metric_of(prediction, seconds) for seconds in band)
    values = [values[0] * prediction.spread[0], values[1] * prediction.spread[1]]  # the open fields' readings
    predicted = metric_of(prediction, iteration)
    row.update(predicted=predicted, error_pct=100 * (predicted - run.value) / run.value)
    if not fit.sized:
        row["note"] = "; ".join(part for part in (row["note"], UNSIZED_NOTE) if part)
        return row
    row.update(ci_low=values[0], ci_high=values[1], ci_width=values[1] / values[0],
               in_ci=values[0] <= run.value <= values[1])  # fmt: skip
    return row


def validate_llm(
    measured: Sequence[LlmRun], calibration: Sequence[LlmRun] | None, ci: float, progress=None
) -> tuple[list[dict[str, Any]], LlmFit]:
    """Rows of ``measured`` predicted after fitting on ``calibration`` (None: the datasheets alone),
    without the catalog values derived from the rows it predicts (``unseen.without``)."""
    calibration_ids = {run.id for run in calibration or ()}
    held = [run.id for run in measured if run.id not in calibration_ids]
    predictions = predict_runs(measured, progress, held)
    if calibration is None:
        fit = LlmFit()
        return [table_row(p, fit, basis="datasheets") for p in predictions], fit
    by_id = {p.run.id: p for p in predictions}
    fitted = [by_id.get(run.id) for run in calibration]
    fresh = predict_runs([run for run, p in zip(calibration, fitted, strict=True) if p is None], None, held)
    known = [p for p in fitted if p is not None] + fresh
    fit = LlmFit.of(known, ci, Refits([p.run for p in known], known) if held else None, held)
    basis = f"transformer_slowdown {fit.slowdown:.3f} from {fit.rows} calibration rows"
    return [table_row(p, fit, "calibration" if p.run.id in calibration_ids else "predicted", basis)
            for p in predictions], fit  # fmt: skip


def leave_one_source_out(
    runs: Sequence[LlmRun], ci: float, progress=None
) -> tuple[list[dict[str, Any]], dict[str, LlmFit]]:
    """Each source family predicted with ``transformer_slowdown`` fitted on the others, every row of
    the fold without the catalog values derived from the family's rows (``unseen.without``; a fold
    that replaces none reuses the catalog's predictions)."""
    predictions = predict_runs(runs, progress)
    refits = Refits(runs, predictions)
    fits: dict[str, LlmFit] = {}
    folds: dict[str, dict[str, LlmPrediction]] = {}
    table = []
    for prediction in predictions:
        family = prediction.family
        if family not in fits:  # once per family: its fold's predictions and the fit without it
            members = [p.run.id for p in predictions if p.family == family]
            fold = folds[family] = refits.without(members)
            fits[family] = LlmFit.of([fold[p.run.id] for p in predictions if p.family != family], ci, refits, members)
        fit = fits[family]
        table.append(table_row(folds[family][prediction.run.id], fit,
                               basis=f"transformer_slowdown {fit.slowdown:.3f} fitted without {family} "
                                     f"({fit.rows} rows)"))  # fmt: skip
    return table, fits


def read_llm_runs(paths: Sequence[Path], rejected: list[Rejected] | None = None) -> list[LlmRun]:
    """Every row of ``paths`` (each with ``llm_dev.csv``'s columns); with a ``rejected`` list, a row
    that cannot be read goes there instead of failing the whole read."""
    return [run for path in paths for run in load_llm_runs(path, rejected)]
