"""Memory per GPU of transformer training under a parallel layout (pure functions, bytes).

For every pipeline rank: weights, gradients, optimizer states (sharded by ZeRO stage), the
activations kept for backward (per micro-batch, times the micro-batches the schedule keeps in
flight), communication buffers, and two allowances: ``fragmentation`` (a fraction of the rest,
the caching allocator's unusable blocks) and ``runtime_reserve_bytes`` (CUDA context, library
workspaces, NCCL's own buffers). ``stage_memory`` returns one ``MemoryBreakdown`` per pipeline
rank; ``peak_memory`` the largest.

Sources of the rules:

- States: mixed precision with Adam keeps 16-bit weights (2 B), gradients (Megatron's fp32
  ``main_grad``: 4 B), an fp32 master copy (4 B) and two fp32 moments (8 B): 18 bytes per
  parameter; ZeRO (Rajbhandari et al. SC20, section 5) divides the optimizer part (stage 1),
  the gradients (2) and the weights (3) over the data-parallel ranks (dp x cp in Megatron).
- Activations: Korthikanti et al. 2022, section 4 (per layer, by TP/SP/recompute; see
  ``transformer_costs.SavedActivations``); context parallelism divides every token.
- In flight: 1F1B rank r keeps min(pp - r, m) micro-batches (Narayanan et al. SC21 section
  2.2.1); interleaved 1F1B rank r keeps 2 (pp - r - 1) + (v - 1) pp + 1 model chunks
  (Megatron-LM's warm-up count; rank 0: L (1 + (pp - 1)/(pp v)) layers' worth, Korthikanti et al.
  section 4.2.3); GPipe keeps all m.
- Full recomputation keeps each layer's input and rebuilds one layer's activations at a time
  during its backward.

The allowances are calibrated on the published runs of ``llm_dev.csv`` so that none that ran is
refused (``benchmarks/llm_runs_check.py``, docs/transformers.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ddlsim.algorithms.parallel_layout import ParallelLayout, check_layout, default_grad_reduce_in_fp32
from ddlsim.simulator.workloads.transformer import TransformerConfig
from ddlsim.simulator.workloads.transformer_costs import Block, Part, transformer_blocks
from ddlsim.simulator.workloads.transformer_traffic import expert_all_to_all_elements, padded_vocabulary

# CUDA context (about 0.5 GB on Ampere/Hopper), cuBLAS workspaces and NCCL's per-channel buffers
# (NCCL_BUFFSIZE 4 MiB per channel and peer): about 1 GB, held outside PyTorch's allocator.
RUNTIME_RESERVE_BYTES = 1.0e9
# The largest fraction, to 0.01, that refuses no run of llm_dev.csv given the reserve above
# (llm_checks.largest_fragmentation; benchmarks/llm_runs_check.py prints it, a test holds it).
FRAGMENTATION = 0.06

_TP_SPLIT = ("column", "row", "heads", "vocab_embedding", "vocab_logits")


@dataclass(frozen=True)
class MemorySettings:
    """Bytes per parameter and per activation element, and the allowances.

    The defaults are Megatron-LM mixed precision with Adam (16-bit weights, fp32 gradients,
    fp32 master weights and moments). Under fp8, ``fp8_weight_copy_bytes`` are added per
    parameter (Transformer Engine caches the fp8 weight and its transpose across micro-batches,
    Megatron-Core's default) and linear layers keep their inputs at ``fp8_gemm_input_bytes``.
    """

    weight_bytes: float = 2.0
    gradient_bytes: float = 4.0
    master_weight_bytes: float = 4.0
    optimizer_state_bytes: float = 8.0
    fp8_weight_copy_bytes: float = 2.0
    activation_bytes: float = 2.0
    fp8_gemm_input_bytes: float = 1.0  # linear layers' saved inputs under fp8 (their fp8 casts)
    fragmentation: float = FRAGMENTATION
    runtime_reserve_bytes: float = RUNTIME_RESERVE_BYTES
    pad_vocabulary: bool = True  # Megatron pads the vocabulary to a multiple of 128 x tp


def settings_for(precision: str, **changes: float | bool) -> MemorySettings:
    """Defaults for ``precision``: fp32 keeps 4-byte weights and activations and no separate master copy;
    the gradient buffer is fp32 where the stacks accumulate and reduce in fp32, else the weights' 16
    bits (``default_grad_reduce_in_fp32``: fp16 keeps 2-byte gradients, the ZeRO paper's 16 bytes per
    parameter)."""
    if precision == "fp32":
        base = MemorySettings(weight_bytes=4.0, master_weight_bytes=0.0, activation_bytes=4.0)
    else:
        base = MemorySettings(gradient_bytes=4.0 if default_grad_reduce_in_fp32(precision) else 2.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one GPU of pipeline rank ``stage``."""

    stage: int
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    communication_buffers: float
    fragmentation: float
    reserved: float
    in_flight_micro_batches: float  # layers' worth of micro-batches kept, per layer of this rank

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer_states + self.activations
                + self.communication_buffers + self.fragmentation + self.reserved)  # fmt: skip

    def fits(self, capacity_bytes: float) -> bool:
        return self.total <= capacity_bytes

    def describe(self, capacity_bytes: float | None = None) -> str:
        """One line per component in GB (1e9 B), and the verdict against ``capacity_bytes``."""
        rows = [
            ("weights", self.weights), ("gradients", self.gradients), ("optimizer states", self.optimizer_states),
            ("activations", self.activations), ("communication buffers", self.communication_buffers),
            ("fragmentation allowance", self.fragmentation), ("runtime reserve", self.reserved),
            ("total", self.total),
        ]  # fmt: skip
        lines = [f"pipeline rank {self.stage}:"] + [f"  {name:24s} {value / 1e9:9.2f} GB" for name, value in rows]
        if capacity_bytes is not None:
            verdict = "fits" if self.fits(capacity_bytes) else "does NOT fit"
            lines.append(f"  {verdict} in {capacity_bytes / 1e9:.1f} GB")
        return "\n".join(lines)


def _rank_of_chunks(blocks: tuple[Block, ...], layout: ParallelLayout) -> list[int]:
    """Pipeline rank of each block: layers in pp x v chunks in order, chunk c on rank c % pp.

    The embedding goes with the first layer after it, an output head with the layer before it.
    """
    layers = [i for i, block in enumerate(blocks) if block.kind == "layer"]
    ranks = [0] * len(blocks)
    position = 0
    for virtual, count in enumerate(layout.layers_per_virtual_stage(len(layers))):
        for index in layers[position : position + count]:
            ranks[index] = virtual % layout.pp
        position += count
    for index, block in enumerate(blocks):
        if block.kind != "layer":
            following = [i for i in layers if i > index]
            preceding = [i for i in layers if i < index]
            ranks[index] = ranks[following[0]] if block.kind == "embedding" and following else ranks[preceding[-1]]
    return ranks


def _parameters_on_rank(part: Part, layout: ParallelLayout) -> float:
    if part.expert:
        return part.parameters / (layout.tp * layout.ep)
    return part.parameters / (layout.tp if part.tensor_parallel in _TP_SPLIT else 1)


def _in_flight(layout: ParallelLayout, rank: int) -> float:
    """Micro-batches' worth of this rank's layer activations kept at the peak of the schedule."""
    micro = layout.micro_batches
    if layout.schedule == "gpipe":
        return float(micro if micro is not None else layout.pp)
    if layout.interleaved:
        v = layout.virtual_stages
        chunks = 2 * (layout.pp - rank - 1) + (v - 1) * layout.pp + 1
        if micro is not None:
            chunks = min(chunks, micro * v)
        return chunks / v  # each chunk is 1/v of the rank's layers
    kept = layout.pp - rank
    return float(min(kept, micro) if micro is not None else kept)


@dataclass
class _RankContents:
    """What one pipeline rank holds, before bytes per parameter and schedules apply."""

    dense_parameters: float = 0.0
    expert_parameters: float = 0.0
    largest_block_parameters: float = 0.0
    activations_per_micro_batch: float = 0.0  # bytes kept per micro-batch over all its blocks
    recompute_working: float = 0.0  # bytes of the one layer rebuilt at a time under full recompute
    logits_bytes: float = 0.0  # 16-bit logits alive while the loss builds its fp32 softmax
    all_to_all_bytes: float = 0.0  # one MoE layer's dispatch plus combine buffers


def _rank_contents(config: TransformerConfig, blocks: tuple[Block, ...], ranks: list[int],
                   layout: ParallelLayout, settings: MemorySettings) -> list[_RankContents]:
    """What each pipeline rank holds, in one pass over the blocks."""
    contents = [_RankContents() for _ in range(layout.pp)]
    owner_of_table = ranks[0]  # the (first) embedding block owns the token table
    act = settings.activation_bytes
    gemm_bytes = settings.fp8_gemm_input_bytes if layout.precision == "fp8" else None
    per_micro = layout.micro_batch / layout.cp
    for block, rank in zip(blocks, ranks, strict=True):
        held = contents[rank]
        block_parameters = 0.0
        for part in block.parts:
            on_rank = _parameters_on_rank(part, layout)
            if part.expert:
                held.expert_parameters += on_rank
            else:
                held.dense_parameters += on_rank
            if part.shared_parameters and owner_of_table != rank:
                held.dense_parameters += part.shared_parameters / layout.tp  # a tied table kept twice
            block_parameters += on_rank
        held.largest_block_parameters = max(held.largest_block_parameters, block_parameters)
        saved = per_micro * block.saved.bytes(layout.tp, layout.sequence_parallel, layout.flash_attention,
                                              layout.recompute != "selective", act, gemm_bytes)
        if block.kind == "layer" and layout.recompute == "full":
            layer_input = act * block.tokens * config.hidden * per_micro
            held.activations_per_micro_batch += layer_input / (layout.tp if layout.sequence_parallel else 1)
            held.recompute_working = max(held.recompute_working, saved)
        else:
            held.activations_per_micro_batch += saved
        if block.name == "output":
            held.logits_bytes = act * block.tokens * config.vocabulary * per_micro / layout.tp
        if block.kind == "layer":
            held.all_to_all_bytes = max(held.all_to_all_bytes,
                                        2.0 * expert_all_to_all_elements(block) * act * per_micro)
    return contents


def _buffers(config: TransformerConfig, layout: ParallelLayout, settings: MemorySettings,
             contents: _RankContents) -> float:
    """Communication and transient buffers: SP all-gather, pipeline send/receive, MoE all-to-all, logits."""
    hidden_bytes = settings.activation_bytes * config.seq_len * config.hidden * layout.micro_batch / layout.cp
    buffers = contents.logits_bytes + contents.all_to_all_bytes
    if layout.sequence_parallel:
        buffers += hidden_bytes  # the all-gathered input of a column-parallel product
    if layout.pp > 1:
        buffers += 2.0 * hidden_bytes / (layout.tp if layout.sequence_parallel else 1)  # send and receive
    return buffers


def stage_memory(
    config: TransformerConfig, layout: ParallelLayout, settings: MemorySettings | None = None
) -> list[MemoryBreakdown]:
    """Memory of one GPU of each pipeline rank, bytes. Raises LayoutError for an invalid layout."""
    check_layout(layout, config)
    settings = settings or settings_for(layout.precision, gradient_bytes=layout.gradient_bytes)
    if settings.pad_vocabulary:
        config = dataclasses.replace(config, vocabulary=padded_vocabulary(config.vocabulary, layout.tp))
    blocks = transformer_blocks(config)
    ranks = _rank_of_chunks(blocks, layout)
    dense_shards = layout.dp * layout.cp  # Megatron shards over the data- and context-parallel ranks
    expert_shards = max(1, dense_shards // layout.ep)
    weight_bytes = settings.weight_bytes + (settings.fp8_weight_copy_bytes if layout.precision == "fp8" else 0.0)
    optimizer_bytes = settings.master_weight_bytes + settings.optimizer_state_bytes
    results = []
    for rank, contents in enumerate(_rank_contents(config, blocks, ranks, layout, settings)):
        dense, expert = contents.dense_parameters, contents.expert_parameters
        sharded_count = dense / dense_shards + expert / expert_shards

        def states(per_parameter: float, from_stage: int, whole: float = dense + expert,
                   shard: float = sharded_count) -> float:
            return per_parameter * (shard if layout.zero_stage >= from_stage else whole)

        weights = states(weight_bytes, 3)
        if layout.zero_stage == 3:  # the gathered block being computed and the prefetched next one
            weights += 2.0 * contents.largest_block_parameters * weight_bytes
        in_flight = _in_flight(layout, rank)
        activations = contents.activations_per_micro_batch * in_flight + contents.recompute_working
        frozen = 0.0 if layout.frozen_weights else 1.0  # frozen base weights: no gradients, no optimizer states
        gradients = frozen * states(settings.gradient_bytes, 2)
        optimizer = frozen * states(optimizer_bytes, 1)
        buffers = _buffers(config, layout, settings, contents)
        subtotal = weights + gradients + optimizer + activations + buffers
        results.append(
            MemoryBreakdown(
                stage=rank,
                weights=weights,
                gradients=gradients,
                optimizer_states=optimizer,
                activations=activations,
                communication_buffers=buffers,
                fragmentation=settings.fragmentation * subtotal,
                reserved=settings.runtime_reserve_bytes,
                in_flight_micro_batches=in_flight,
            )
        )
    return results


def peak_memory(
    config: TransformerConfig, layout: ParallelLayout, settings: MemorySettings | None = None
) -> MemoryBreakdown:
    """The pipeline rank that needs the most memory."""
    return max(stage_memory(config, layout, settings), key=lambda breakdown: breakdown.total)
