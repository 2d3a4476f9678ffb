"""A parallel layout of transformer training (TP x PP x DP x CP, EP inside DP x CP), and its validity checks.

It is the ``layout`` option of the ``megatron`` training algorithm (``algorithms/megatron_training.py``)
and what the memory model and the planner read.

The sizes follow Megatron-LM's names: tensor (``tp``), pipeline (``pp``, with ``virtual_stages``
model chunks per rank for the interleaved 1F1B schedule), data (``dp``), context (``cp``) and
expert (``ep``) parallelism. GPUs = tp x pp x dp x cp; expert parallelism is carved out of the
dp x cp ranks (Megatron-Core), so it does not multiply the GPU count.

``zero_stage``: 0 plain data parallelism; 1 optimizer states sharded over dp x cp (Megatron's
distributed optimizer, ZeRO-1); 2 gradients too (ZeRO-2, FSDP SHARD_GRAD_OP); 3 weights too
(ZeRO-3, FSDP FULL_SHARD). ``recompute``: ``none``, ``selective`` (attention core, Korthikanti
et al. 2022), ``full`` (every layer keeps only its input). ``precision``: the matrix products'
(``fp8`` keeps bf16 weights and activations with fp8 products, Transformer Engine style: the
linear layers of the transformer layers run in fp8, the attention core's two products and the output
layer's logits in bf16, as Megatron-Core runs them by default: its ``fp8_dot_product_attention`` is
off and its output layer is a plain ``ColumnParallelLinear``, not a Transformer Engine module;
``fp8_attention_and_logits`` runs those in fp8 too).
``grad_reduce_in_fp32`` (Megatron's name): the data-parallel gradient reductions carry fp32 main
gradients (Megatron-LM's default in bf16 and fp8, ``default_grad_reduce_in_fp32``); off, they carry
the weights' 16-bit type (fp16 runs by default; NeMo's performance recipes and the
NeMo-Framework-Launcher's ``grad_sync_dtype: bf16``). ``tp_comm_overlap``
(Megatron's ``--tp-comm-overlap``, Transformer Engine's userbuffers): each tensor-parallel
collective runs in chunks under the matrix product it feeds or follows, so only what exceeds that
product's compute shows. ``zero3_prefetch`` (ZeRO-3): each block's weights are gathered while the
block before computes (DeepSpeed's prefetch, FSDP's forward/backward prefetch), so only what
exceeds its compute shows; off, every gather and reduce-scatter adds to the block's time.
``frozen_weights``: fine-tuning with the base weights frozen (LoRA and other adapters, whose own
small products and states are left out): the backward pass computes input gradients only, and
there are no weight gradients to reduce, no optimizer states and no update.

``check_layout`` names the first violated rule in one line; the planner and the commands show it
and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class ModelShape(Protocol):
    """What the layout rules read of a model (``simulator.workloads.transformer.TransformerConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def moe(self) -> Any: ...  # None, or the mixture of experts (experts, expert_ffn_hidden)
    @property
    def total_layers(self) -> int: ...

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")  # virtual_stages > 1 turns 1f1b into interleaved 1F1B
LAYOUT_PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
BOOLEAN_FIELDS = ("sequence_parallel", "flash_attention", "grad_reduce_in_fp32", "tp_comm_overlap", "zero3_prefetch",
                  "fp8_attention_and_logits", "frozen_weights")  # fmt: skip


class LayoutError(ValueError):
    """A layout that cannot run this model; the message names the rule in one line."""


def default_grad_reduce_in_fp32(precision: str) -> bool:
    """Whether the stacks reduce gradients in fp32 by default at ``precision``: Megatron-LM does in
    bf16 (forced: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32",
    megatron/arguments.py) and so with fp8 on bf16 weights; in fp16 its
    ``--accumulate-allreduce-grads-in-fp32`` is off by default and the gradients go in fp16, as
    DeepSpeed's do (``fp32_allreduce`` false, deepspeed/runtime/constants.py)."""
    return precision != "fp16"


@dataclass(frozen=True)
class ParallelLayout:
    """How one training iteration is split over GPUs; sizes are counts, batches in sequences."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    global_batch: int | None = None  # sequences per iteration; None: at least pp micro-batches per rank
    virtual_stages: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    recompute: str = "none"
    flash_attention: bool = True
    precision: str = "bf16"
    schedule: str = "1f1b"
    first_stage_layers: int | None = None  # Megatron --decoder-first-pipeline-num-layers (uneven stages)
    last_stage_layers: int | None = None  # Megatron --decoder-last-pipeline-num-layers
    grad_reduce_in_fp32: bool = True
    tp_comm_overlap: bool = False
    zero3_prefetch: bool = True
    fp8_attention_and_logits: bool = False
    frozen_weights: bool = False  # base weights frozen (LoRA-style fine-tuning)

    @property
    def gradient_bytes(self) -> float:
        """Bytes per gradient element in the data-parallel reductions (and ZeRO-3's reduce-scatters)."""
        return 4.0 if self.grad_reduce_in_fp32 or self.precision == "fp32" else 2.0

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def micro_batches(self) -> int | None:
        """Micro-batches per data-parallel rank per iteration (None when the global batch is not given)."""
        if self.global_batch is None:
            return None
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def interleaved(self) -> bool:
        return self.virtual_stages > 1

    def layers_per_stage(self, layers: int) -> list[int]:
        """Transformer layers on each pipeline rank (all its model chunks), first rank first.

        Even split, unless ``first_stage_layers``/``last_stage_layers`` take some off the ends (Llama 3
        405B: 126 layers on 16 stages, 7 on the first and the last, 8 on the others).
        """
        first = self.first_stage_layers
        last = self.last_stage_layers
        if self.pp == 1:
            return [layers]
        middle_stages = self.pp - (first is not None) - (last is not None)
        rest = layers - (first or 0) - (last or 0)
        middle = [rest // middle_stages] * middle_stages if middle_stages else []
        return ([first] if first is not None else []) + middle + ([last] if last is not None else [])

    def layers_per_virtual_stage(self, layers: int) -> list[int]:
        """Transformer layers on each virtual stage, in order (chunk c of pipeline rank r is virtual
        stage c x pp + r): each rank's layers (``layers_per_stage``) over its ``virtual_stages``
        chunks as evenly as they go, the earlier chunks taking one more where they do not divide
        (Llama 3 405B interleaved: 7 layers on the end ranks, chunks of 4 and 3)."""
        per_rank, chunks = self.layers_per_stage(layers), self.virtual_stages
        return [count // chunks + (chunk < count % chunks) for chunk in range(chunks) for count in per_rank]


def check_layout(layout: ParallelLayout, config: ModelShape, gpus: int | None = None) -> None:
    """Raise LayoutError naming the first rule ``layout`` breaks for ``config`` (and ``gpus``, if given)."""
    for name in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LayoutError(f"{name} must be a whole number >= 1, got {value!r}")
    choices = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "precision": LAYOUT_PRECISIONS}
    for name, allowed in choices.items():
        if getattr(layout, name) not in allowed:
            raise LayoutError(f"{name} must be one of {', '.join(allowed)}, got {getattr(layout, name)!r}")
    for name in BOOLEAN_FIELDS:
        if not isinstance(getattr(layout, name), bool):
            raise LayoutError(f"{name} must be true or false, got {getattr(layout, name)!r}")
    if layout.zero_stage not in (0, 1, 2, 3):
        raise LayoutError(f"zero_stage must be 0, 1, 2 or 3, got {layout.zero_stage!r}")
    tp, pp, dp, cp, ep = layout.tp, layout.pp, layout.dp, layout.cp, layout.ep
    if gpus is not None and layout.gpus != gpus:
        raise LayoutError(f"tp x pp x dp x cp = {tp} x {pp} x {dp} x {cp} = {layout.gpus} does not match {gpus} GPUs")
    if config.heads % tp:
        raise LayoutError(f"attention heads ({config.heads}) of {config.name} are not divisible by tp ({tp})")
    if config.kv_heads % tp:
        raise LayoutError(
            f"key/value heads ({config.kv_heads}) of {config.name} are not divisible by tp ({tp}); "
            "Megatron splits whole query groups"
        )
    widths = [("ffn_hidden", config.ffn_hidden)]
    if config.moe is not None:
        widths.append(("moe.expert_ffn_hidden", config.moe.expert_ffn_hidden))
    for name, width in widths:
        if width % tp:
            raise LayoutError(f"{name} ({width}) of {config.name} is not divisible by tp ({tp})")
    stages = pp * layout.virtual_stages
    uneven = layout.first_stage_layers is not None or layout.last_stage_layers is not None
    if uneven:
        _check_uneven(layout, config)
    elif config.total_layers % stages:
        raise LayoutError(
            f"layers ({config.total_layers}) of {config.name} are not divisible by pp x virtual_stages "
            f"= {pp} x {layout.virtual_stages} = {stages} (first_stage_layers/last_stage_layers make the ends uneven)"
        )
    if layout.virtual_stages > 1 and pp == 1:
        raise LayoutError("virtual_stages > 1 (interleaved 1F1B) needs pp > 1")
    if layout.virtual_stages > 1 and layout.schedule == "gpipe":
        raise LayoutError("virtual_stages > 1 is the interleaved 1F1B schedule, not gpipe")
    if cp > 1 and config.seq_len % (2 * cp):
        raise LayoutError(
            f"seq_len ({config.seq_len}) is not divisible by 2 x cp = {2 * cp} "
            "(context parallelism splits the sequence into 2 x cp load-balanced chunks)"
        )
    if layout.sequence_parallel and tp == 1:
        raise LayoutError("sequence_parallel needs tp > 1 (it splits the tensor-parallel group's replicated work)")
    if layout.tp_comm_overlap and tp == 1:
        raise LayoutError("tp_comm_overlap needs tp > 1 (it overlaps the tensor-parallel collectives)")
    if layout.fp8_attention_and_logits and layout.precision != "fp8":
        raise LayoutError(f"fp8_attention_and_logits needs precision fp8, got {layout.precision!r}")
    if ep > 1:
        if config.moe is None:
            raise LayoutError(f"ep ({ep}) > 1 needs a mixture-of-experts model; {config.name} has no experts")
        if config.moe.experts % ep:
            raise LayoutError(f"experts ({config.moe.experts}) of {config.name} are not divisible by ep ({ep})")
        if (dp * cp) % ep:
            raise LayoutError(f"ep ({ep}) must divide dp x cp = {dp * cp} (expert ranks are data-parallel ranks)")
    if layout.global_batch is not None:
        per_step = layout.micro_batch * dp
        if isinstance(layout.global_batch, bool) or layout.global_batch < 1 or layout.global_batch % per_step:
            raise LayoutError(
                f"global_batch ({layout.global_batch}) must be a positive multiple of micro_batch x dp = {per_step}"
            )


def _check_uneven(layout: ParallelLayout, config: ModelShape) -> None:
    ends = [value for value in (layout.first_stage_layers, layout.last_stage_layers) if value is not None]
    if any(isinstance(value, bool) or not isinstance(value, int) or value < 1 for value in ends):
        raise LayoutError(f"first_stage_layers and last_stage_layers must be whole numbers >= 1, got {ends}")
    if min(ends) < layout.virtual_stages:
        raise LayoutError(
            f"first_stage_layers/last_stage_layers ({min(ends)}) must hold at least one layer per model chunk "
            f"(virtual_stages = {layout.virtual_stages})"
        )
    middle_stages = layout.pp - len(ends)
    rest = config.total_layers - sum(ends)
    if middle_stages < 1 or rest < middle_stages or rest % middle_stages:
        raise LayoutError(
            f"after {sum(ends)} layers on the end stages, the other {rest} layers of {config.name} do not split "
            f"evenly over the remaining {middle_stages} of pp = {layout.pp} stages"
        )
