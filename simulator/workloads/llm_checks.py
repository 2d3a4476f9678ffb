"""The published large-model runs as checks of the FLOPs and memory models.

``flops_checks``: our FLOP counts against every row that gives a second figure (NeMo's TFLOP/s over
tokens/s, Korthikanti et al.'s MFU, Narayanan et al.'s parameter counts). ``memory_checks``: the
fullest pipeline rank of every row whose memory can be checked (no run that really ran may be
refused), and ``largest_fragmentation``, the allowance those runs bound
(``benchmarks/llm_runs_check.py`` prints both; ``tests/test_llm_runs.py`` holds them).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.workloads.flops_formulas import model_flops_utilization
from ddlsim.simulator.workloads.llm_runs import MappedRun
from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks
from ddlsim.simulator.workloads.transformer_memory import stage_memory


@dataclass(frozen=True)
class FlopsCheck:
    """Our FLOPs against a row's own: ``published`` and ``modelled`` in the row's unit; ``what`` names it."""

    run_id: str
    what: str
    published: float
    modelled: float

    @property
    def relative_error(self) -> float:
        return self.modelled / self.published - 1.0


def flops_checks(mapped: list[MappedRun]) -> tuple[list[FlopsCheck], list[tuple[str, str]]]:
    """Rows where both our FLOPs and the source's can be compared, and the others with the reason.

    - NeMo rows: model FLOPs per token (ours) against TFLOP/s per GPU / tokens/s per GPU (theirs).
    - Korthikanti et al. rows with an MFU in the notes: ours per iteration / (time x GPUs x peak).
    - Narayanan et al. rows: the parameter count (billions) against table 1.
    """
    checks: list[FlopsCheck] = []
    skipped: list[tuple[str, str]] = []
    for row in mapped:
        run, family = row.run, row.run.source_family
        if family == "nemo" and run.metric == "tflops_per_gpu" and row.tokens_per_s_per_gpu:
            if "SFT" in run.model:
                skipped.append((run.id, "packed fine-tuning sequences: the source counts attention per packed sample"))
                continue
            if row.layout is not None and row.layout.frozen_weights:
                reason = ("LoRA: the source counts the frozen pass its own way (62 % of full training's model "
                          "FLOPs); it is compared as the tokens/s measured")  # fmt: skip
                skipped.append((run.id, reason))
                continue
            blocks = transformer_blocks(row.model)
            ours = model_flops_per_sample(blocks) / row.model.seq_len
            published = run.value * 1e12 / row.tokens_per_s_per_gpu
            checks.append(FlopsCheck(run.id, "model FLOPs per token", published, ours))
        elif family == "korthikanti" and run.metric == "iteration_s" and "MFU" in run.notes:
            mfu = float(re.search(r"MFU ([0-9.]+)%", run.notes).group(1)) / 100.0  # type: ignore[union-attr]
            flops = row.flops_per_iteration()
            peak = load_device(row.device).peak_flops_for(row.layout.precision if row.layout else "bf16")
            assert flops is not None and run.gpus is not None
            checks.append(FlopsCheck(run.id, "MFU", mfu, model_flops_utilization(flops, run.value, run.gpus, peak)))
        elif family == "narayanan" and run.params_b is not None:
            parameters = sum(block.parameters for block in transformer_blocks(row.model)) / 1e9
            checks.append(FlopsCheck(run.id, "parameters (billions)", run.params_b, parameters))
        else:
            skipped.append((run.id, "the row gives no second FLOPs figure to compare with"))
    return checks, skipped


@dataclass(frozen=True)
class MemoryCheck:
    """The fullest pipeline rank of a row: its bytes before the allowances and the device's capacity."""

    run_id: str
    stage: int
    before_allowances_bytes: float
    capacity_bytes: float
    total_bytes: float  # with the default allowances

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


def memory_checks(
    mapped: list[MappedRun], settings_changes: dict | None = None
) -> tuple[list[MemoryCheck], list[tuple[str, str]]]:
    """Every row whose memory can be checked, at the fullest rank; the others with the reason."""
    checks: list[MemoryCheck] = []
    skipped: list[tuple[str, str]] = []
    for row in mapped:
        if row.memory_unchecked or row.layout is None:
            skipped.append((row.run.id, row.memory_unchecked))
            continue
        settings = dataclasses.replace(row.memory_settings, **(settings_changes or {}))
        bare = dataclasses.replace(settings, fragmentation=0.0, runtime_reserve_bytes=0.0)
        stages = stage_memory(row.model, row.layout, bare)
        full = stage_memory(row.model, row.layout, settings)
        worst = max(range(len(stages)), key=lambda i: full[i].total)
        capacity = load_device(row.device).memory_capacity_bytes
        checks.append(MemoryCheck(row.run.id, worst, stages[worst].total, capacity, full[worst].total))
    return checks, skipped


def largest_fragmentation(checks: list[MemoryCheck], reserve_bytes: float) -> float:
    """The largest fragmentation fraction that refuses none of the rows, rounded down to 0.01.

    Each row that ran bounds it: before x (1 + f) + reserve <= capacity.
    """
    bound = min((check.capacity_bytes - reserve_bytes) / check.before_allowances_bytes - 1.0 for check in checks)
    return int(bound * 100.0) / 100.0
