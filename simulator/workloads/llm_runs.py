"""The published large-model training runs (``llm_dev.csv``), read row by row and mapped onto ddlsim.

``load_llm_runs`` reads the file as it is (its columns exactly) into ``LlmRun`` records; a
malformed row is one error line naming the file, the row id and the column. ``map_run`` maps
one row onto a catalog transformer, a device, links and a ``ParallelLayout`` (a ``MappedRun``),
or says in one sentence why it cannot (an ``Unmapped``). Every value the source leaves open and
this mapping fills in is listed in ``MappedRun.assumptions``.

Why here (``simulator/workloads``): a row is a workload under a layout; mapping it needs the
transformer catalog and the layout rules beside it, and the calibration and validation commands
(``simulator/calibration``) read the mapped records without knowing the sources' conventions.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlsim.algorithms.parallel_layout import LayoutError, ParallelLayout, check_layout, default_grad_reduce_in_fp32
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.records import Rejected
from ddlsim.simulator.workloads.flops_formulas import narayanan_flops_per_iteration
from ddlsim.simulator.workloads.llm_open_fields import (
    catalog_model_by_name,
    device_from_text,
    links_from_text,
    precision_of,
    recompute_of,
    shape_from_dimensions,
    shape_from_parameters,
    zero_stage_of,
)
from ddlsim.simulator.workloads.transformer import TransformerConfig, load_transformer, transformer_names
from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks
from ddlsim.simulator.workloads.transformer_memory import MemorySettings, peak_memory, settings_for

DATA_FILE = Path(__file__).resolve().parent.parent / "calibration" / "data" / "llm_dev.csv"

COLUMNS = (
    "id", "source", "model", "params_b", "layers", "hidden", "heads", "seq_len", "global_batch", "micro_batch",
    "gpus", "gpu_type", "interconnect", "tp", "pp", "dp", "cp_or_sp", "ep", "zero_stage", "recompute", "precision",
    "metric", "value", "notes",
)  # fmt: skip
_INTEGERS = ("layers", "hidden", "heads", "seq_len", "global_batch", "micro_batch", "gpus", "tp", "pp", "dp", "ep")


class LlmRunsError(ValueError):
    """A malformed row; the message names the file, the row id and the column."""


@dataclass(frozen=True)
class LlmRun:
    """One row of llm_dev.csv as published: integers parsed, open fields None or ''."""

    id: str
    source: str
    model: str
    params_b: float | None
    layers: int | None
    hidden: int | None
    heads: int | None
    seq_len: int | None
    global_batch: int | None
    micro_batch: int | None
    gpus: int | None
    gpu_type: str
    interconnect: str
    tp: int | None
    pp: int | None
    dp: int | None
    cp_or_sp: str
    ep: int | None
    zero_stage: str
    recompute: str
    precision: str
    metric: str
    value: float
    notes: str
    line: int

    @property
    def source_family(self) -> str:
        """``narayanan``, ``korthikanti``, ``zero``, ``nemo`` or ``megatron_readme``: the unit left out together."""
        for prefix, family in (("Narayanan", "narayanan"), ("Korthikanti", "korthikanti"), ("ZeRO", "zero"),
                               ("NVIDIA NeMo", "nemo"), ("Megatron-LM README", "megatron_readme")):  # fmt: skip
            if self.source.startswith(prefix):
                return family
        return "other"


def load_llm_runs(path: Path | str = DATA_FILE, rejected: list[Rejected] | None = None) -> list[LlmRun]:
    """Read ``path`` (the llm_dev.csv columns exactly) into records, in file order.

    A row that cannot be read raises ``LlmRunsError``, or, with a ``rejected`` list, is added to it
    and left out (a wrong header always raises: that is not a file of these rows)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise LlmRunsError(f"{path}: the header must be exactly {','.join(COLUMNS)}")
        runs: list[LlmRun] = []
        seen: set[str] = set()
        for row in reader:
            try:
                runs.append(_parse_row(path, row, reader.line_num, seen))
            except LlmRunsError as error:
                if rejected is None:
                    raise
                rejected.append(Rejected((row.get("id") or "").strip(), str(path), reader.line_num, str(error)))
    return runs


def _parse_row(path: Path, row: dict[Any, Any], line: int, seen: set[str]) -> LlmRun:
    """One row of the file as an ``LlmRun`` (``LlmRunsError`` naming file, row, line and column).
    ``csv.DictReader`` puts a row's fields beyond the header under the key None and gives the
    columns it lacks the value None."""
    row_id = (row.get("id") or "").strip()
    extra = len(row.get(None) or ())
    missing = sum(1 for column in COLUMNS if row.get(column) is None)
    if extra or missing:
        got = len(COLUMNS) - missing + extra
        raise LlmRunsError(f"{path}: row {row_id!r} (line {line}): {got} fields, the header has {len(COLUMNS)}")
    if not row_id or row_id in seen:
        raise LlmRunsError(f"{path}: line {line}, column 'id': empty or repeated id {row_id!r}")
    seen.add(row_id)

    def fail(column: str, message: str) -> LlmRunsError:
        return LlmRunsError(f"{path}: row {row_id!r} (line {line}), column {column!r}: {message}")

    values: dict[str, object] = {}
    for column in _INTEGERS:
        text = re.sub(r"(?<=\d)[,_ ](?=\d{3}\b)", "", row[column].strip())  # "1,024" is 1024
        if text and not re.fullmatch(r"[1-9][0-9]*", text):
            raise fail(column, f"must be a whole number >= 1 or empty, got {text!r}")
        values[column] = int(text) if text else None
    for column in ("params_b", "value"):
        text = row[column].strip()
        try:
            number = float(text) if text else None
        except ValueError:
            raise fail(column, f"must be a number, got {text!r}") from None
        if number is not None and not number > 0:
            raise fail(column, f"must be > 0, got {text!r}")
        values[column] = number
    if values["value"] is None:
        raise fail("value", "must not be empty")
    text_columns = ("id", "source", "model", "gpu_type", "interconnect", "cp_or_sp", "zero_stage",
                    "recompute", "precision", "metric", "notes")  # fmt: skip
    values.update({column: row[column].strip() for column in text_columns})
    return LlmRun(line=line, **values)  # type: ignore[arg-type]


# --- mapping onto the catalog ---------------------------------------------------------------------

# Published model names -> catalog tokens (and the row-level changes the source states).
_MODELS = {
    "GPT (Megatron) 22B": "megatron_22b",
    "GPT-3": "gpt3_175b",
    "MT-NLG 530B": "megatron_530b",
    "GPT (Megatron) 1T": "megatron_1t",
    "GPT3-5B": "nemo_gpt3_5b",
    "GPT3-20B": "nemo_gpt3_20b",
    "Llama 2 7B": "llama2_7b",
    "Llama 2 13B": "llama2_13b",
    "Llama 2 70B": "llama2_70b",
    "Llama 2 70B SFT": "llama2_70b",
    "Llama 3 8B": "llama3_8b",
    "Llama 3 70B": "llama3_70b",
    "Nemotron-8B": "nemotron_8b",
    "Nemotron-22B": "nemotron_22b",
    "GPT-3 175B (vocab 131072)": "gpt3_175b",
}
LORA_NOTE = ("LoRA: base weights frozen (the backward computes input gradients only; no weight gradients, "
             "optimizer states or update); the adapters' own small products and states are left out")  # fmt: skip
_DEVICES = {"A100-80GB": "a100_sxm4_80gb", "H100-80GB SXM (DGX H100)": "h100_sxm5", "H100-80GB": "h100_sxm5",
            "V100-32GB (DGX-2)": "v100_sxm3"}  # fmt: skip
# interconnect text -> (intra-node link, network or None, NICs per node, assumption or '')
_INTERCONNECTS = {
    "NVLink3/NVSwitch 600GB/s; 8x HDR IB 200Gb/s per node (Selene)": ("nvswitch2", "ib_hdr", 8, ""),
    "NVLink3/NVSwitch; 8x HDR IB (Selene)": ("nvswitch2", "ib_hdr", 8, ""),
    "NVLink3/NVSwitch; HDR IB (Selene)": ("nvswitch2", "ib_hdr", 8, "8 HDR NICs per node, as Selene's DGX A100"),
    "NVLink4/NVSwitch; IB NDR400": ("nvswitch3", "ib_ndr", 8, "8 NDR NICs per node, as the DGX H100"),
    "NVLink4/NVSwitch; IB": ("nvswitch3", "ib_ndr", 8, "NDR InfiniBand with 8 NICs per node, as the DGX H100"),
    "NVLink4/NVSwitch": ("nvswitch3", None, 8, ""),
    "NVLink4; IB (NVIDIA Eos-class)": ("nvswitch3", "ib_ndr", 8, "DGX H100 nodes (NVSwitch, 8 NDR NICs), as Eos"),
    "NVSwitch intra (16 GPU/node); 800 Gbps IB inter": ("nvswitch", "ib_edr", 8, "800 Gb/s = 8 EDR NICs per DGX-2"),
}
_PRECISIONS = {"fp16 mixed": "fp16", "fp8": "fp8", "bf16 (FP8 not stated)": "bf16"}


LAYOUT_NOT_STATED = "tp, pp or dp is not in the row"
_LORA = re.compile(r"\s*\blora\b", re.IGNORECASE)


def is_lora(model_name: str) -> bool:
    """Whether a published model name is a LoRA fine-tuning run (its base weights frozen)."""
    return bool(_LORA.search(model_name))


def row_precision(run: LlmRun, assumptions: list[str]) -> str:
    """The layout precision a row names: the data set's wording first, then its words."""
    return _PRECISIONS.get(run.precision) or precision_of(run.precision, assumptions)


def nearest_multiple(batch: int, step: int) -> int:
    """``batch`` rounded to the nearest multiple of ``step`` (at least ``step``): the global batch of
    whole micro-batches on every replica nearest a published one."""
    return max(step, round(batch / step) * step)


@dataclass(frozen=True)
class MappedRun:
    """A row in ddlsim's terms. ``flops_per_iteration`` counts as the source counts (None if it does not say)."""

    run: LlmRun
    model: TransformerConfig
    device: str
    intra_node_link: str
    network: str | None
    nics_per_node: int
    layout: ParallelLayout | None  # None when the row gives no complete layout
    memory_settings: MemorySettings
    assumptions: tuple[str, ...]
    layout_missing: str = ""  # why ``layout`` is None
    options: tuple[tuple[str, Any], ...] = ()  # megatron's options beyond the layout (the stack's overlaps)
    # other readings of what the row leaves open (shapes of a model given by its size): the interval spans them
    alternatives: tuple[TransformerConfig, ...] = ()
    alternative_layouts: tuple[ParallelLayout, ...] = ()  # other readings of an open batch or layout
    # other readings of a setting the row leaves open beside a stated layout (its micro-batch, the chunk count
    # of an interleaved schedule): they widen the interval, and the row is still fitted at ``layout``
    open_layouts: tuple[ParallelLayout, ...] = ()

    @property
    def precision(self) -> str:
        """The layout's precision, or the one the row names while its layout is still to be chosen."""
        return self.layout.precision if self.layout is not None else row_precision(self.run, [])

    @property
    def memory_unchecked(self) -> str:
        """Why this row's memory cannot be checked ('' when it can)."""
        if self.layout is None:
            return self.layout_missing
        if self.alternative_layouts:
            return "ddlsim chose the row's batch or layout to fit, so the row cannot check memory"
        if not self.run.zero_stage and not self.run.recompute:
            return "the source states neither the optimizer sharding nor the recomputation (fine-tuning table)"
        return ""

    @property
    def train_tokens(self) -> float | None:
        """The tokens a time-to-train row trained, from its notes ('300B tokens'), or None."""
        match = re.search(r"(\d+(?:\.\d+)?)\s*([MBT])\s*tokens(?!\s*/)", self.run.notes)
        return float(match.group(1)) * {"M": 1e6, "B": 1e9, "T": 1e12}[match.group(2)] if match else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """The NeMo rows' published tokens/s per GPU, from the notes."""
        match = re.search(r"([0-9][0-9.]*) tokens/s/GPU", self.run.notes)
        return float(match.group(1)) if match else None

    def flops_per_iteration(self) -> float | None:
        """FLOPs of one iteration as the source counts them, or None where its convention is not known.

        Narayanan et al. SC21 count hardware FLOPs with full recomputation (their eq. 3);
        Korthikanti et al. and NeMo count model FLOPs (no recomputation). The exact per-part
        counts equal the GPT formulas, so the exact counts serve for both.
        """
        family, run, model = self.run.source_family, self.run, self.model
        if run.global_batch is None or family not in ("narayanan", "korthikanti", "nemo"):
            return None
        if family == "narayanan":
            return narayanan_flops_per_iteration(run.global_batch, model.seq_len, model.layers, model.hidden,
                                                 model.vocabulary, recompute=True)  # fmt: skip
        tokens_per_s = self.tokens_per_s_per_gpu
        if family == "nemo" and run.metric == "tflops_per_gpu" and tokens_per_s:
            # NeMo publishes both figures: its own count per token is their ratio (for pretraining it
            # equals ours to 0.1 %; the fine-tuning table counts 7.8 % less), so TFLOP/s compares as
            # the tokens/s that were measured
            return run.value * 1e12 / tokens_per_s * run.global_batch * model.seq_len
        return model_flops_per_sample(transformer_blocks(model)) * run.global_batch


@dataclass(frozen=True)
class Unmapped:
    run: LlmRun
    reason: str


def _megatron_by_dimensions(run: LlmRun) -> str | None:
    for name in transformer_names():
        if name.startswith("megatron_"):
            config = load_transformer(name)
            if (config.layers, config.hidden, config.heads) == (run.layers, run.hidden, run.heads):
                return name
    return None


# NeMo's distributed optimizer overlaps its communication with compute: the NeMo-Framework-Launcher
# training configs set ``overlap_grad_sync: true``, ``overlap_param_sync: true`` and ``bucket_cap_mb``
# 125-400 for distributed_fused_adam, and NeMo 2.0's performance recipes set Megatron-Core's
# ``overlap_grad_reduce`` and ``overlap_param_gather`` (NVIDIA/NeMo, nemo/collections/llm/recipes).
TORCH_DDP_OVERLAP: tuple[tuple[str, Any], ...] = (("overlap_grad_reduce", True), ("bucket_bytes", 25 * 2**20))
NEMO_OVERLAPS: tuple[tuple[str, Any], ...] = (
    ("overlap_grad_reduce", True), ("overlap_param_gather", True), ("bucket_bytes", 125e6),
)  # fmt: skip


# Korthikanti et al. 2022's pipeline schedule per model (the paper's tables give TP and PP only): the
# interleaved chunks of Calculon's reconstruction of its Table 5 runs (calculon-ai/calculon,
# validation/seqsel/tab5/*.json and fig7/*.json: pipeline_interleaving 3 for GPT-3 175B and
# MT-NLG 530B, both recomputation settings; 1 for the 1T model).
KORTHIKANTI_CHUNKS = {"gpt3_175b": 3, "megatron_530b": 3, "megatron_1t": 1}

# Narayanan et al. SC21's Table 1 runs as the authors' script for that table sets them (NVIDIA/Megatron-LM,
# examples/sc21/run_table_1.sh, 10 Aug 2021: --micro-batch-size and --num-layers-per-virtual-pipeline-stage;
# the paper's table gives TP, PP, DP and the batch only): model -> (tp, pp, micro-batch, layers per chunk,
# 0 for plain 1F1B). The script's other settings are the rows' own: its batches, --fp16, full recomputation.
NARAYANAN_TABLE_1 = {
    "megatron_1_7b": (1, 1, 16, 0), "megatron_3_6b": (2, 1, 16, 0), "megatron_7_5b": (4, 1, 16, 0),
    "megatron_18b": (8, 1, 8, 0), "megatron_39b": (8, 2, 4, 0), "megatron_76b": (8, 4, 2, 5),
    "megatron_146b": (8, 8, 2, 5), "megatron_310b": (8, 16, 1, 3), "megatron_530b": (8, 35, 1, 1),
    "megatron_1t": (8, 64, 1, 0),
}  # fmt: skip
NARAYANAN_SCRIPT = "Narayanan et al.'s script for their Table 1 (Megatron-LM examples/sc21/run_table_1.sh)"


FLASH_WORDS = re.compile(r"flash[\s_-]*attn|flash[\s_-]*attention|xformers|memory[\s_-]*efficient attention|\bsdpa\b")
NO_FLASH_WORDS = re.compile(r"(?:no|without)\s+flash")


def _flash_attention(run: LlmRun, family: str, device: str, assumptions: list[str]) -> bool:
    """Whether the row's attention core is fused (FlashAttention or the like), and the assumption said.

    FlashAttention (May 2022) postdates the 2020-2022 papers' runs; NeMo and Megatron-LM's current runs
    use it. A row of another source: as its words say (FlashAttention, flash-attn, xFormers' or
    PyTorch's memory-efficient attention, SDPA; or "no flash"); else on Hopper or later (after it), yes;
    on A100 yes where the source is dated 2023 or later (PyTorch 2.0's SDPA, March 2023, and the stacks'
    adoption) and no before, whose flagship runs (Megatron, MT-NLG, OPT, BLOOM) predate it; never on
    Volta or older."""
    words = f"{run.source} {run.notes}".lower()
    if family in ("nemo", "megatron_readme"):
        assumptions.append("FlashAttention")
        return True
    if family != "other":
        assumptions.append("no FlashAttention (it postdates the source)")
        return False
    denied = NO_FLASH_WORDS.search(words) is not None
    if denied or FLASH_WORDS.search(words):
        assumptions.append(("no FlashAttention" if denied else "FlashAttention") + " (as the row says)")
        return not denied
    if device.startswith(("h100", "h200", "b200", "gb200", "gb300", "mi300x", "gaudi2")):
        assumptions.append("FlashAttention")
        return True
    years = [int(year) for year in re.findall(r"\b(20[0-9]{2})\b", run.source)]
    if device.startswith("a100") and years and max(years) >= 2023:
        assumptions.append(f"FlashAttention (on {device}, a source of {max(years)}: after FlashAttention and "
                           "PyTorch 2.0's fused attention)")  # fmt: skip
        return True
    assumptions.append(f"no FlashAttention (on {device} a run of another source is taken to predate it)")
    return False


def _narayanan_script(run: LlmRun, model: TransformerConfig) -> tuple[int, int, int, int] | None:
    """The Table 1 script's settings of a Narayanan et al. row in the script's layout, else None."""
    script = NARAYANAN_TABLE_1.get(model.name) if run.source_family == "narayanan" else None
    return script if script is not None and script[:2] == (run.tp, run.pp) else None


def _model_of(run: LlmRun) -> tuple[TransformerConfig, tuple[TransformerConfig, ...], str] | str:
    """The row's model (a catalog entry, or a catalog decoder reshaped to what the row gives), other
    readings of it, and the assumption made; or why there is none."""
    name = _LORA.sub("", run.model)  # the base model of a LoRA run
    token = _megatron_by_dimensions(run) if name == "GPT (Megatron)" else _MODELS.get(name)
    token = token or catalog_model_by_name(name)
    if token is not None:
        return load_transformer(token), (), ""
    if run.layers and run.hidden and run.heads:
        template = load_transformer("llama2_70b" if "llama" in run.model.lower() else "gpt3_175b")
        shaped = shape_from_dimensions(template, run.layers, run.hidden, run.heads)
        return shaped, (), (f"model {run.model!r} is not in the catalog: {template.name}'s kind of decoder "
                            f"({template.activation}, feed-forward {template.ffn_hidden / template.hidden:g}x hidden) "
                            "with the row's layers, hidden and heads")  # fmt: skip
    if run.params_b:
        chosen, alternatives, note = shape_from_parameters(run.params_b)
        return chosen, tuple(alternatives), note
    return f"model {run.model!r} is not in the catalog and the row gives neither its shape nor its size"


def map_run(run: LlmRun) -> MappedRun | Unmapped:
    """Map one row, or say why it cannot be mapped."""
    found = _model_of(run)
    if isinstance(found, str):
        return Unmapped(run, found)
    model, alternatives, shape_note = found
    assumptions: list[str] = [shape_note] if shape_note else []
    device = _DEVICES.get(run.gpu_type)
    if device is None:
        read = device_from_text(run.gpu_type)
        if read is None:
            return Unmapped(run, f"gpu_type {run.gpu_type!r} names no device ddlsim knows (A100, H100, V100, ...)")
        device = read[0]
        assumptions += [f"gpu_type {run.gpu_type!r} read as {device}"] + [read[1]] * bool(read[1])
    if run.interconnect in _INTERCONNECTS:
        intra, network, nics, note = _INTERCONNECTS[run.interconnect]
        assumptions += [note] * bool(note)
    else:
        intra, network, nics, notes = links_from_text(run.interconnect, device)
        assumptions += [f"interconnect {run.interconnect!r} read as {intra}, {nics} x {network}", *notes]
    changes: dict[str, Any] = {}
    if run.seq_len is not None and run.seq_len != model.seq_len:
        changes["seq_len"] = run.seq_len
    vocabulary = re.search(r"vocab (\d+)", run.model)
    if vocabulary:
        changes["vocabulary"] = int(vocabulary.group(1))
    if run.source_family == "korthikanti" and model.name == "gpt3_175b":
        changes["vocabulary"] = 51200
        assumptions.append("vocabulary 51200 (Megatron's padded GPT-2 vocabulary, as in Korthikanti et al.'s MFU)")
    if "max_positions" not in changes and changes.get("seq_len", 0) > model.max_positions > 0:
        changes["max_positions"] = changes["seq_len"]
    model = dataclasses.replace(model, **changes) if changes else model
    for column in ("layers", "hidden", "heads"):
        published = getattr(run, column)
        if published is not None and published != getattr(model, column):
            return Unmapped(run, f"{column} {published} differs from catalog entry {model.name} "
                                 f"({getattr(model, column)})")  # fmt: skip
    if run.layers is None and not shape_note:
        assumptions.append(f"architecture from the catalog entry {model.name} (the row leaves it open)")
    layout, missing, settings = _layout(run, model, assumptions, device)
    script = _narayanan_script(run, model)  # the run script's settings, which _layout took
    open_layouts: tuple[ParallelLayout, ...] = ()
    if layout is not None and run.micro_batch is None and run.global_batch is not None and layout.zero_stage >= 3:
        layout, open_layouts, note = _sharded_micro_batch(model, layout, settings, device, run.gpus)
        if note:
            assumptions = [text for text in assumptions if not text.startswith("micro-batch 1")] + [note]
    alternative_layouts: tuple[ParallelLayout, ...] = ()
    if layout is not None and run.micro_batch is None and run.global_batch is None:
        layout, alternative_layouts, note = _fullest_batch(model, layout, settings, device, bool(run.recompute))
        dropped = ("micro-batch 1", "no activation recomputation") if layout.recompute == "full" else ("micro-batch 1",)
        assumptions = [text for text in assumptions if not text.startswith(dropped)] + [note]
    options: tuple[tuple[str, Any], ...] = ()
    if run.source_family == "nemo" and layout is not None and layout.zero_stage in (1, 2):
        options = NEMO_OVERLAPS
        assumptions.append("gradient reduce-scatter and weight all-gather overlapped with backward and forward in "
                           "125 MB buckets (NeMo: overlap_grad_sync, overlap_param_sync, bucket_cap_mb)")
    elif layout is not None and layout.dp > 1 and layout.pp == 1 and script is not None:
        # the script runs these with --DDP-impl torch: PyTorch's DistributedDataParallel, which all-reduces
        # 25 MB buckets as the backward fills them (bucket_cap_mb 25); the larger ones with Megatron's
        # local DDP, which reduces after the backward
        options = TORCH_DDP_OVERLAP
        assumptions.append(f"gradient all-reduce overlapped with the backward in 25 MB buckets (PyTorch DDP, "
                           f"--DDP-impl torch in {NARAYANAN_SCRIPT})")  # fmt: skip
    micro_open = run.micro_batch is None and script is None
    if layout is not None and micro_open and run.global_batch is not None and not open_layouts:
        open_layouts = _open_micro_batch(model, layout, settings, device, run.gpus)
        if open_layouts:
            assumptions.append(f"the interval spans micro-batch {open_layouts[0].micro_batch} (it fits and divides "
                               "the batch)")  # fmt: skip
    if layout is not None and layout.virtual_stages == 2 and INTERLEAVED_OPEN in assumptions:
        most = dataclasses.replace(layout, virtual_stages=model.total_layers // layout.pp)
        open_layouts += (most,) if most.virtual_stages > 2 and _valid(most, model, run.gpus) else ()
    alternatives = tuple(dataclasses.replace(alternative, **changes) for alternative in alternatives)
    return MappedRun(run, model, device, intra, network, nics, layout, settings, tuple(assumptions), missing, options,
                     alternatives, alternative_layouts, open_layouts)  # fmt: skip


def _valid(layout: ParallelLayout, model: TransformerConfig, gpus: int | None) -> bool:
    """Whether ``layout`` keeps every rule ``check_layout`` holds a layout of ``model`` to on ``gpus``."""
    try:
        check_layout(layout, model, gpus)
    except LayoutError:
        return False
    return True


def _runs(layout: ParallelLayout, model: TransformerConfig, settings: MemorySettings, device: str,
          gpus: int | None) -> bool:  # fmt: skip
    """A reading a row could have run: a valid layout whose fullest rank fits ``device``'s memory."""
    return _valid(layout, model, gpus) and peak_memory(model, layout, settings).fits(
        load_device(device).memory_capacity_bytes)  # fmt: skip


def _sharded_micro_batch(model: TransformerConfig, layout: ParallelLayout, settings: MemorySettings, device: str,
                         gpus: int | None) -> tuple[ParallelLayout, tuple[ParallelLayout, ...], str]:  # fmt: skip
    """A fully sharded row (ZeRO-3, FSDP) that gives its global batch but not its micro-batch: the largest
    micro-batch that divides each replica's sequences and fits, for ZeRO-3 gathers every weight again for
    each micro-batch, and DeepSpeed's and FSDP's default is no gradient accumulation; the next smaller
    divisor that fits is the interval's other reading. Unchanged, with no note, where only 1 fits."""
    assert layout.global_batch is not None
    per_replica = layout.global_batch // layout.dp
    fitting = []
    for micro in (size for size in range(per_replica, 0, -1) if per_replica % size == 0):
        candidate = dataclasses.replace(layout, micro_batch=micro)
        if _runs(candidate, model, settings, device, gpus):
            fitting.append(candidate)
            if len(fitting) == 2:
                break
    if not fitting or fitting[0].micro_batch == 1:
        return layout, (), ""
    chosen = fitting[0]
    note = (f"micro-batch {chosen.micro_batch} of the replica's {per_replica} sequences (the source gives none): "
            "the largest that divides them and fits, as ZeRO-3 gathers the weights again for every micro-batch "
            "and DeepSpeed's and FSDP's default is no gradient accumulation"
            + (f"; the interval spans micro-batch {fitting[1].micro_batch}" if len(fitting) > 1 else ""))  # fmt: skip
    return chosen, tuple(fitting[1:]), note


def _open_micro_batch(model: TransformerConfig, layout: ParallelLayout, settings: MemorySettings, device: str,
                      gpus: int | None) -> tuple[ParallelLayout, ...]:  # fmt: skip
    """A row that gives its global batch but not its micro-batch runs at micro-batch 1; the other reading
    its interval spans is twice that, where it divides the batch over the replicas, fits the device and
    keeps the layout valid (a larger micro-batch: fewer, larger steps, a longer pipeline bubble)."""
    other = dataclasses.replace(layout, micro_batch=2 * layout.micro_batch)
    if layout.global_batch is None or layout.global_batch % (other.micro_batch * other.dp):
        return ()
    return (other,) if _runs(other, model, settings, device, gpus) else ()


BATCHES = (64, 32, 16, 8, 4, 2, 1)  # micro-batches tried when a row states no batch
INTERLEAVED_OPEN = ("2 interleaved chunks per stage: the source names the interleaved schedule, not its chunks "
                    "(the fewest; the interval spans the most the stages' layers allow)")  # fmt: skip


def _fullest_batch(model: TransformerConfig, layout: ParallelLayout, settings: MemorySettings, device: str,
                   recompute_stated: bool) -> tuple[ParallelLayout, tuple[ParallelLayout, ...], str]:  # fmt: skip
    """A row that states no batch at all: the largest micro-batch whose fullest rank fits the device
    (one micro-batch an iteration; full recomputation when the row leaves it open and nothing fits
    without), and half of it as the alternative the interval spans."""
    capacity = load_device(device).memory_capacity_bytes
    tried = (layout.recompute,) if recompute_stated or layout.recompute == "full" else (layout.recompute, "full")
    for recompute in tried:
        trial = dataclasses.replace(layout, recompute=recompute)
        fitting = [micro for micro in BATCHES
                   if peak_memory(model, dataclasses.replace(trial, micro_batch=micro), settings).fits(capacity)]
        if fitting:
            break
    micro = fitting[0] if fitting else 1
    chosen = dataclasses.replace(trial, micro_batch=micro)
    alternatives = (dataclasses.replace(chosen, micro_batch=micro // 2),) if micro > 1 else ()
    note = (f"batch not stated: micro-batch {micro} per replica, the largest that fits {device}'s memory (a run "
            "that gives no batch is taken to fill its devices, as ZeRO's speed-up came from larger batches per GPU)"
            + (", with full recomputation (nothing fits without it)" if trial.recompute != layout.recompute else "")
            + (f"; the interval spans micro-batch {micro // 2}" if alternatives else ""))  # fmt: skip
    return chosen, alternatives, note


def _layout(run: LlmRun, model: TransformerConfig, assumptions: list[str], device: str):
    """The row's ParallelLayout (or None and why), and the memory settings of its software stack."""
    family = run.source_family
    precision = row_precision(run, assumptions)
    if family == "nemo":
        # NeMo-Framework-Launcher performance configs: distributed_fused_adam with bf16 gradient sync
        # keeps bf16 gradients and bf16 master remainders (plus fp32 moments) sharded over dp x cp; the
        # gradients are reduced in bf16 too (NeMo 2.0's performance scripts: grad_reduce_in_fp32 = False).
        settings = settings_for(precision, gradient_bytes=2.0, master_weight_bytes=2.0)
        assumptions.append("optimizer: NeMo distributed_fused_adam, bf16 gradients (reduced in bf16) and master "
                           "remainders (NeMo-Framework-Launcher configs)")
    else:
        settings = settings_for(precision)
    if run.tp is None or run.pp is None or run.dp is None:
        return None, LAYOUT_NOT_STATED, settings
    cp, sequence_parallel = 1, False
    if run.cp_or_sp.startswith("cp="):
        cp = int(run.cp_or_sp[3:])
    elif run.cp_or_sp.startswith("sp="):
        sequence_parallel = True
    if family == "nemo" and run.tp > 1 and not sequence_parallel:
        sequence_parallel = True
        assumptions.append("sequence parallelism on with TP > 1 (NeMo performance configs)")
    tp_overlap = family == "nemo" and run.tp > 1
    if tp_overlap:
        assumptions.append("tensor-parallel communication overlapped with its matrix products (NeMo performance "
                           "recipes: MegatronCommOverlapCallback tp_comm_overlap with userbuffers)")
    zero = zero_stage_of(run.zero_stage, assumptions)
    if family == "nemo" and run.zero_stage == "":
        zero = 1
        assumptions.append("distributed optimizer (ZeRO-1), NeMo's default (the fine-tuning table leaves it open)")
    recompute = recompute_of(run.recompute, assumptions)
    micro = run.micro_batch
    script = _narayanan_script(run, model)
    if micro is None and script is not None:
        micro = script[2]
        assumptions.append(f"micro-batch {micro} ({NARAYANAN_SCRIPT})")
    elif micro is None:
        micro = 1
        assumptions.append("micro-batch 1 (not in the source's table)")
    virtual = 1
    match = re.search(r"VP=(\d+)", run.notes)
    if match:
        virtual = int(match.group(1))
    elif script is not None and run.pp > 1:
        virtual = model.total_layers // (run.pp * script[3]) if script[3] else 1
        assumptions.append(f"{virtual} interleaved chunks per stage ({NARAYANAN_SCRIPT})" if virtual > 1
                           else f"plain 1F1B ({NARAYANAN_SCRIPT})")  # fmt: skip
    elif family == "korthikanti" and run.pp > 1 and model.name in KORTHIKANTI_CHUNKS:
        virtual = KORTHIKANTI_CHUNKS[model.name]
        if virtual > 1:
            assumptions.append(f"{virtual} interleaved chunks per stage (Calculon's configuration of this run)")
    elif run.pp > 1 and "interleaved" in run.notes.lower():
        # the source names the interleaved schedule but not its chunks (Megatron has no default count):
        # the fewest, 2, where the stages' layers split in two; the interval spans the most (open_layouts)
        if model.total_layers % (2 * run.pp) == 0:
            virtual = 2
            assumptions.append(INTERLEAVED_OPEN)
        else:
            assumptions.append("plain 1F1B: the source names the interleaved schedule, but the stages' layers do "
                               "not split into chunks")  # fmt: skip
    flash = _flash_attention(run, family, device, assumptions)
    frozen = is_lora(run.model)
    if frozen:
        assumptions.append(LORA_NOTE)
    reduce_in_fp32 = family != "nemo" and default_grad_reduce_in_fp32(precision)  # NeMo's recipes: bf16
    layout = ParallelLayout(
        frozen_weights=frozen,
        tp=run.tp, pp=run.pp, dp=run.dp, cp=cp, ep=run.ep or 1, micro_batch=micro, global_batch=run.global_batch,
        virtual_stages=virtual, sequence_parallel=sequence_parallel, zero_stage=zero, recompute=recompute,
        flash_attention=flash, precision=precision, grad_reduce_in_fp32=reduce_in_fp32, tp_comm_overlap=tp_overlap,
    )  # fmt: skip
    layout = _uneven_ends(layout, model, assumptions)
    per_step = layout.micro_batch * layout.dp
    if layout.global_batch is not None and layout.global_batch % per_step:
        rounded = nearest_multiple(layout.global_batch, per_step)
        assumptions.append(f"global batch {layout.global_batch} taken as {rounded}, the nearest multiple of "
                           f"micro-batch x dp = {per_step} (whole micro-batches on every replica)")  # fmt: skip
        layout = dataclasses.replace(layout, global_batch=rounded)
    try:
        check_layout(layout, model, run.gpus)
    except LayoutError as error:
        return None, f"the published layout breaks a rule: {error}", settings
    return layout, "", settings


def _uneven_ends(layout: ParallelLayout, model: TransformerConfig, assumptions: list[str]) -> ParallelLayout:
    """A pipeline whose stages do not divide the layers: the middle stages take the rounded-up share and
    the first and last stages split the rest equally, as Llama 3 405B's 126 layers ran on 16 stages (8 on
    each middle stage, 7 on the ends); the layout unchanged where that does not come out whole."""
    layers, stages = model.total_layers, layout.pp * layout.virtual_stages
    if layout.pp <= 2 or not layers % stages or layout.first_stage_layers or layout.last_stage_layers:
        return layout
    per = -(-layers // layout.pp)
    rest = layers - per * (layout.pp - 2)
    if rest % 2 or not layout.virtual_stages <= rest // 2 <= per or per % layout.virtual_stages:
        return layout
    assumptions.append(f"{layers} layers on {layout.pp} stages: {per} on each middle stage, {rest // 2} on the first "
                       "and the last (the ends lighter, as Llama 3 405B's pipeline)")  # fmt: skip
    return dataclasses.replace(layout, first_stage_layers=rest // 2, last_stage_layers=rest // 2)


def mapped_runs(path: Path | str = DATA_FILE) -> tuple[list[MappedRun], list[Unmapped]]:
    """All rows of ``path``: those mapped, and those that cannot be, each with its reason."""
    mapped: list[MappedRun] = []
    unmapped: list[Unmapped] = []
    for run in load_llm_runs(path):
        result = map_run(run)
        (mapped if isinstance(result, MappedRun) else unmapped).append(result)  # type: ignore[arg-type]
    return mapped, unmapped
