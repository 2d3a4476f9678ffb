"""Validation tables: every row's prediction against its measurement, and their summary.

Two ways to get predictions:

* ``validate_table``: one profile (fitted on calibration rows, or loaded) predicts every row;
* ``leave_one_source_out``: each source (the ``source`` column: one table, spreadsheet or log
  set; ``by="family"``: the id prefix, TFBENCH, DEEPBENCH, ...) is predicted by a profile fitted to
  all the other sources' rows: the issue-13 measure of predicting what was never measured. Nor
  does a catalog value derived from the source's rows reach the fold (``unseen.without``).

``summarise`` gives what ``validate`` prints: rows predicted, median and p90 |error|, the signed
median error as optimism (``optimism``: + when the model is faster than measured, whatever the
metric: predicted / measured - 1 for rates, measured / predicted - 1 for times), the median
interval width (high / low) and coverage (fractions, not percent).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlsim.hardware_models.profile import Profile
from ddlsim.simulator.calibration.intervals import Estimate, Estimator
from ddlsim.simulator.calibration.measurements import Measurement, Rejected

VALIDATION_COLUMNS = (
    "id",
    "source",
    "kind",
    "metric",
    "workload",
    "collective",
    "algorithm",
    "device",
    "devices_per_node",
    "nodes",
    "message_bytes",
    "per_device_batch",
    "precision",
    "measured",
    "predicted",
    "error_pct",
    "ci_low",
    "ci_high",
    "ci_width",
    "in_ci",
    "basis",
    "status",
    "note",
    "reason",
)
SUMMARY_KEYS = (
    "split",
    "n_rows",
    "n_calibration",
    "n_predicted",
    "n_cannot_model",
    "predicted_fraction",
    "median_ape",
    "p90_ape",
    "max_ape",
    "signed_median_error",
    "median_ci_width",
    "ci_level",
    "ci_coverage",
    "tolerance",
    "passed",
)
Progress = Callable[[int, int], None]


def group_key(row: Measurement, by: str = "source") -> str:
    """The fold of ``row``: its ``source`` (or its id, without one), or its family (the id prefix)."""
    family = row.id.split("-")[0]
    return family if by == "family" else (row.source or family)


def table_row(row: Measurement, estimate: Estimate | None, status: str) -> dict[str, Any]:
    """One validation row (``VALIDATION_COLUMNS``) from a measurement and its estimate."""
    out: dict[str, Any] = {column: getattr(row, column) for column in VALIDATION_COLUMNS if hasattr(row, column)}
    for column in ("message_bytes", "per_device_batch", "nics_per_node"):
        value = out.get(column)
        out[column] = "" if value is None else int(value) if float(value).is_integer() else value
    out.update(measured=row.value, predicted="", error_pct="", ci_low="", ci_high="", ci_width="", in_ci="")
    out.update(basis="", note="", reason="", status=status)
    if estimate is None or estimate.value is None:
        out.update(status="cannot_model", reason=estimate.reason if estimate else "")
        return out
    jitter = estimate.detail.partition(", rank jitter ")[2]  # the named cost terms, where they applied
    per_call = estimate.detail.partition(", fixed cost per call ")[2]
    out.update(
        predicted=estimate.value,
        error_pct=100.0 * (estimate.value - row.value) / row.value,
        basis=estimate.kind,
        note="; ".join(
            part
            for part in (
                estimate.note,
                f"rank jitter {jitter}" if jitter else "",
                f"fitted fixed cost per call {per_call}" if per_call else "",
            )
            if part
        ),
    )
    if estimate.low is not None and estimate.high is not None:
        out.update(
            ci_low=estimate.low,
            ci_high=estimate.high,
            ci_width=estimate.high / estimate.low,
            in_ci=estimate.low <= row.value <= estimate.high,
        )
    return out


def rejected_row(rejected: Rejected) -> dict[str, Any]:
    """A row that could not be read, as a ``cannot_model`` validation row."""
    out: dict[str, Any] = {column: "" for column in VALIDATION_COLUMNS}
    out.update(id=rejected.id or f"line {rejected.line}", status="cannot_model", reason=rejected.reason)
    return out


def validate_table(
    rows: Sequence[Measurement],
    calibration_ids: set[str],
    profile: Profile,
    ci: float,
    executor: str = "analytic",
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every row predicted by ``profile``; rows in ``calibration_ids`` get status ``calibration``."""
    estimator = Estimator(profile, ci, executor)
    table = []
    for done, row in enumerate(rows, start=1):
        status = "calibration" if row.id in calibration_ids else "predicted"
        table.append(table_row(row, estimator.estimate(row), status))
        if progress and (done % 500 == 0 or done == len(rows)):
            progress(done, len(rows))
    return table


@dataclass(frozen=True)
class Fold:
    """One fold of ``leave_one_source_out``: calibrate on ``others``, predict ``members``."""

    others: list[Measurement]
    members: list[Measurement]
    ci: float
    bootstrap: int
    seed: int
    executor: str
    ideal: bool


def _run_fold(fold: Fold) -> list[dict[str, Any]]:
    """The validation rows of one fold (a top-level function: process pools pickle it)."""
    from ddlsim.simulator.calibration.fit import CalibrationError, calibrate
    from ddlsim.simulator.calibration.unseen import without

    base = without(Profile(), [row.id for row in fold.members])  # no catalog value derived from these rows
    try:
        profile = calibrate(fold.others, bootstrap=fold.bootstrap, seed=fold.seed, base=base).profile
    except CalibrationError:
        profile = base  # nothing else to fit to: the datasheets alone
    estimator = Estimator(profile.ideal() if fold.ideal else profile, fold.ci, fold.executor)
    return [table_row(row, estimator.estimate(row), "predicted") for row in fold.members]


def leave_one_source_out(
    rows: Sequence[Measurement],
    ci: float,
    by: str = "source",
    bootstrap: int = 20,
    seed: int = 0,
    executor: str = "analytic",
    progress: Progress | None = None,
    ideal: bool = False,
    workers: int | None = 1,
    pool: str = "auto",
) -> list[dict[str, Any]]:
    """Each source's rows predicted by a profile calibrated on every other source's rows (``ideal``:
    with the fitted step-level cost terms switched off, ``Profile.ideal``).

    The folds are independent, so ``workers`` processes run them at once (``pool`` as
    ``simulator.sweep.run_tasks``: ``auto`` is a local process pool for two or more; None: one per fold
    up to the cores); each fold is the same pure function of the rows, so the table is the same
    whichever pool ran it."""
    from ddlsim.simulator.sweep import run_tasks

    groups: dict[str, list[Measurement]] = {}
    for row in rows:
        groups.setdefault(group_key(row, by), []).append(row)
    tasks = [
        Fold([row for row in rows if group_key(row, by) != key], members, ci, bootstrap, seed, executor, ideal)
        for key, members in groups.items()
    ]
    out = {entry["id"]: entry for fold in run_tasks(_run_fold, tasks, workers, pool, progress) for entry in fold}
    return [out[row.id] for row in rows]


def optimism(row: dict[str, Any]) -> float:
    """How much faster the model is than the measurement (a fraction; negative: slower)."""
    if row["metric"] in ("time_s", "iteration_s", "time_to_train_min"):
        return row["measured"] / row["predicted"] - 1.0
    return row["predicted"] / row["measured"] - 1.0


def has_interval(row: dict[str, Any]) -> bool:
    """Whether a predicted validation row has an interval (a profile that calibrated nothing gives none)."""
    width = row.get("ci_width", "")
    return width != "" and not (isinstance(width, float) and math.isnan(width))


def _nan_to_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def summarise(table: Sequence[dict[str, Any]], ci: float, tolerance: float, split: str) -> dict[str, Any]:
    """The summary of a validation table over its held-out rows (not its calibration rows)."""
    held_out = [row for row in table if row["status"] != "calibration"]
    predicted = [row for row in held_out if row["status"] == "predicted"]
    errors = [(row["predicted"] - row["measured"]) / row["measured"] for row in predicted]
    apes = [abs(error) for error in errors]
    sized = [row for row in predicted if has_interval(row)]
    widths = [row["ci_width"] for row in sized]
    median = statistics.median(apes) if apes else math.nan
    summary = {
        "split": split,
        "n_rows": len(table),
        "n_calibration": len(table) - len(held_out),
        "n_predicted": len(predicted),
        "n_cannot_model": len(held_out) - len(predicted),
        "predicted_fraction": len(predicted) / len(held_out) if held_out else math.nan,
        "median_ape": median,
        "p90_ape": float(np.percentile(apes, 90)) if apes else math.nan,
        "max_ape": max(apes) if apes else math.nan,
        "signed_median_error": statistics.median(optimism(row) for row in predicted) if predicted else math.nan,
        "median_ci_width": statistics.median(widths) if widths else math.nan,
        "ci_level": ci,
        "ci_coverage": sum(bool(row["in_ci"]) for row in sized) / len(sized) if sized else math.nan,
        "tolerance": tolerance,
        "passed": bool(apes) and median <= tolerance,
    }
    return {key: _nan_to_none(value) for key, value in summary.items()}


def summary_line(summary: dict[str, Any]) -> str:
    """The one-line summary ``validate`` prints."""

    def pct(key: str, digits: int = 1) -> str:
        value = summary[key]
        return "-" if value is None else f"{100 * value:.{digits}f} %"

    width = summary["median_ci_width"]
    return (
        f"# {summary['n_predicted']} of {summary['n_predicted'] + summary['n_cannot_model']} held-out rows predicted "
        f"({pct('predicted_fraction')}), {summary['n_cannot_model']} cannot be modeled; median |error| "
        f"{pct('median_ape')}, p90 {pct('p90_ape')}, max {pct('max_ape')}; signed median error "
        f"{pct('signed_median_error')} (+ = model faster); "
        + (
            "no intervals (nothing calibrated to size them)"
            if width is None
            else f"median {100 * summary['ci_level']:.0f} % interval x{width:.2f} wide (high / low), "
            f"{pct('ci_coverage', 0)} of measurements inside"
        )
        + "; tolerance "
        f"{100 * summary['tolerance']:.1f} %: " + ("PASSED" if summary["passed"] else "FAILED")
    )
