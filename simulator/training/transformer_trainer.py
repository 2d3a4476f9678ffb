"""What one rank of a Megatron layout costs: the simulated trainer of the ``megatron`` algorithm.

A rank holds, on pipeline rank s, the model chunks of virtual stages s, s + P, ... (the transformer
layers in order, the embedding with the first, the output head with the last). Per micro-batch of b
sequences its forward of a chunk costs, over the chunk's blocks and their parts
(``simulator.workloads.transformer_costs``):

* compute: each part's roofline, max(FLOPs / (peak x efficiency), bytes / (memory bandwidth x
  memory efficiency)), at the peak of the precision its products run in (under ``fp8`` the attention
  core and the output layer's logits run at the bf16 peak unless the layout's
  ``fp8_attention_and_logits`` says otherwise); matrix FLOPs divided over the tensor-parallel ranks
  (replicated parts too under sequence parallelism) and the context-parallel ranks (who split the
  sequence); bytes are the part's activations (what it keeps for backward), its weights, and for an
  attention core without FlashAttention what its unfused kernels move for the score matrices
  (``transformer_costs.score_traffic_bytes``: 13 bytes an element forward, 19 backward);
* ``tp``: the part's tensor-parallel collectives (Megatron's rules, ``transformer_traffic``) at the
  collectives' closed forms over the TP group's links (inside an NVLink domain when tp <= devices
  per node), not overlapped; with the layout's ``tp_comm_overlap`` only what exceeds the part's own
  compute (its forward, or its backward without the recomputed forward);
* ``cp``: ring attention's key/value passes (c - 1 hops forward, twice back), hidden under the
  attention core's compute where it is shorter;
* ``ep``: an MoE layer's dispatch and combine all-to-alls (pairwise exchange over the EP group);
* ``zero3``: ZeRO-3's gather of each block's weights before its forward and backward and the
  reduce-scatter of its gradients after, overlapped with the block's compute (prefetch): only what
  exceeds the compute shows (all of it with the layout's ``zero3_prefetch`` off).

A calibration profile's fixed cost per kernel (``launch_s`` of its compute model: the framework's
dispatch) adds to each part's pass on a CPU, once forward and twice backward for a part with
weights, and is a floor on an accelerator, whose kernels run while the host issues the next.

The backward costs twice the forward's FLOPs plus the recomputed forward (``full``: every layer's;
``selective``: the attention cores'), and the recomputed forward's tensor-parallel collectives and
expert all-to-alls (``full`` only: the attention core has none). Each work item carries its
``parts`` (seconds by cause), which the event simulation sums into where the time goes. The
gradient reductions, the optimizer step (Adam: 16 bytes of fp32 state and gradient read and 14
written per parameter of the rank's shard) and the weight gathers of the distributed optimizer are
what ``megatron``'s program communicates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddlsim.algorithms.comm import Sized
from ddlsim.algorithms.megatron_training import coordinates, data_parallel_group
from ddlsim.algorithms.parallel_layout import ParallelLayout
from ddlsim.hardware_models.catalog import Device
from ddlsim.simulator.workloads.transformer import TransformerConfig
from ddlsim.simulator.workloads.transformer_costs import (
    Block,
    Part,
    recomputed,
    score_traffic_bytes,
    transformer_blocks,
)
from ddlsim.simulator.workloads.transformer_traffic import (
    context_parallel_kv_elements,
    expert_all_to_all_elements,
    pipeline_message_elements,
    tensor_parallel_collectives,
)

TP_SPLIT = ("column", "row", "heads", "vocab_embedding", "vocab_logits")
ADAM_BYTES_PER_PARAMETER = 30.0  # read fp32 master, two moments, gradient (16); write them (12) and bf16 weights (2)
COLLECTIVE_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter"}


@dataclass
class TimedWork:
    """A compute item with the seconds of each cause (``compute``, ``tp``, ``cp``, ``ep``, ``zero3``)."""

    name: str
    duration_s: float
    result: Any = None
    iteration: int = 0
    parts: dict[str, float] = field(default_factory=dict)

    def run(self) -> Any:
        return self.result


@dataclass(frozen=True)
class ChunkCost:
    forward_parts: dict[str, float]
    backward_parts: dict[str, float]
    output_bytes: float  # the activation sent to the next virtual stage (0 after the last)
    input_gradient_bytes: float  # the gradient sent back (0 before the first)
    dense_parameters: float  # on this rank (after tensor parallelism)
    expert_parameters: float


@dataclass(frozen=True)
class BlockCost:
    """One block's per-micro-batch seconds on a rank, by cause, before the expert all-to-alls and
    ZeRO-3 (which depend on the data-parallel groups): what ``TransformerCosts.block_cost`` returns."""

    forward_compute: float
    backward_compute: float  # with the recomputed forward
    forward_tp: float
    backward_tp: float
    forward_cp: float
    backward_cp: float
    dense_parameters: float  # on this rank (after tensor parallelism)
    expert_parameters: float


def virtual_stage_of_blocks(blocks: tuple[Block, ...], layout: ParallelLayout) -> list[int]:
    """Virtual stage (chunk x pp + pipeline rank) of each block: layers in order over the P x V
    virtual stages (uneven end stages as the layout says), the embedding with the first layer after
    it, any other block with the layer before it."""
    layers = [i for i, block in enumerate(blocks) if block.kind == "layer"]
    counts = layout.layers_per_virtual_stage(len(layers))
    virtual = [0] * len(blocks)
    position = 0
    for stage, count in enumerate(counts):
        for index in layers[position : position + count]:
            virtual[index] = stage
        position += count
    for index, block in enumerate(blocks):
        if block.kind != "layer":
            following = [i for i in layers if i > index]
            preceding = [i for i in layers if i < index]
            if block.kind == "embedding" and following:
                virtual[index] = virtual[following[0]]
            else:
                virtual[index] = virtual[preceding[-1]] if preceding else 0
    return virtual


class Collectives:
    """Closed-form seconds of a collective over a group of ranks (``ClosedFormCosts`` or the like)."""

    def __init__(self, collective_s: Callable[..., float], message_s: Callable[[int, int, float], float]) -> None:
        self.collective_s = collective_s
        self.message_s = message_s


def adam_update_s(parameters: Any, device: Device) -> Any:
    """Seconds of the Adam step over ``parameters`` (a count, or an array of counts): memory-bound,
    ``ADAM_BYTES_PER_PARAMETER`` moved per parameter."""
    return parameters * ADAM_BYTES_PER_PARAMETER / (device.memory_bandwidth_Bps * device.memory_efficiency)


BF16_UNDER_FP8 = ("heads", "vocab_logits")  # Part.tensor_parallel of the attention core and the logits


def _roofline(flops: float, nbytes: float, device: Device, precision: str) -> float:
    compute = flops / (device.peak_flops_for(precision) * device.efficiency_for("transformer")) if flops else 0.0
    memory = nbytes / (device.memory_bandwidth_Bps * device.memory_efficiency)
    return max(compute, memory)


class TransformerCosts:
    """Per-chunk costs of every pipeline rank of a layout (shared by that rank's tensor, context and
    data-parallel peers: they run the same chunks)."""

    def __init__(self, config: TransformerConfig, layout: ParallelLayout, device: Device, precision: str,
                 comm: Collectives, algorithm: str = "ring", launch_s: float = 0.0,
                 compute_factor: float = 1.0) -> None:  # fmt: skip
        self.config, self.layout, self.device, self.precision = config, layout, device, precision
        self.comm, self.algorithm = comm, algorithm
        self.launch_s = launch_s
        # the closed form's stragglers: every rank computes at the expected slowest rank's pace
        self.compute_factor = compute_factor
        self.activation_bytes = 4.0 if precision == "fp32" else 2.0
        self.weight_bytes = 4.0 if precision == "fp32" else 2.0
        self.blocks = transformer_blocks(config)
        self.virtual = virtual_stage_of_blocks(self.blocks, layout)
        self._chunks: dict[tuple[int, int], ChunkCost] = {}

    def chunk(self, rank: int, chunk: int) -> ChunkCost:
        """The cost of ``chunk`` on ``rank`` (costs differ by pipeline rank only; groups are ``rank``'s)."""
        stage = coordinates(rank, self.layout).pp
        key = (stage, chunk)
        if key not in self._chunks:
            self._chunks[key] = self._chunk_cost(rank, chunk * self.layout.pp + stage)
        return self._chunks[key]

    # --- groups of a rank (the collectives' closed forms need their placement) -----------------------
    def _tp_group(self, rank: int) -> tuple[int, ...]:
        first = rank - rank % self.layout.tp
        return tuple(range(first, first + self.layout.tp))

    def group_s(self, collective: str, nbytes: float, group: tuple[int, ...], beside: int = 1) -> float:
        """Closed-form seconds of ``collective`` of ``nbytes`` over ``group`` (0 for one rank or no bytes),
        ``beside`` alike groups running it on the same nodes at the same time."""
        if len(group) < 2 or nbytes <= 0:
            return 0.0
        return self.comm.collective_s(collective, self.algorithm, len(group), nbytes, {}, group=group, beside=beside)

    def _cp_neighbour(self, rank: int) -> int:
        layout = self.layout
        here = coordinates(rank, layout)
        return rank + layout.tp * ((here.cp + 1) % layout.cp - here.cp)

    def _ep_group(self, rank: int) -> tuple[int, ...]:
        """The expert-parallel ranks of ``rank``: ep consecutive members of its data-parallel group."""
        members = data_parallel_group(rank, self.layout)
        index = members.index(rank)
        first = index - index % self.layout.ep
        return members[first : first + self.layout.ep]

    # --- one chunk ------------------------------------------------------------------------------------
    def _part_s(self, part: Part, block: Block, backward: bool) -> float:
        layout = self.layout
        b, tp, cp = layout.micro_batch, layout.tp, layout.cp
        split = part.tensor_parallel in TP_SPLIT or (layout.sequence_parallel and part.tensor_parallel == "replicated")
        divisor = cp * (tp if split else 1)
        flops = part.pass_flops(backward, layout.frozen_weights) * part.executed_factor * b / divisor
        # bytes through memory: what the part keeps (written forward, read back and its gradient written
        # backward), with the score matrices of an attention core without FlashAttention at what its
        # kernels move (``score_traffic_bytes``), kept or recomputed alike
        kept = b * part.saved.bytes(tp, layout.sequence_parallel, layout.flash_attention, keep_scores=False,
                                    activation_bytes=self.activation_bytes) / cp  # fmt: skip
        scores = 0.0
        if not layout.flash_attention:
            scores = b * score_traffic_bytes(part.saved, backward, self.activation_bytes) / (tp * cp)
        if part.expert:
            parameters = part.parameters / (tp * layout.ep)
        else:
            parameters = part.parameters / (tp if part.tensor_parallel in TP_SPLIT else 1)
        nbytes = (2.0 if backward else 1.0) * kept + scores + parameters * self.weight_bytes
        seconds = _roofline(flops, nbytes, self.device, self.part_precision(part))
        if not self.launch_s:
            return seconds
        wgrad = backward and part.parameters and not layout.frozen_weights  # a backward's dgrad and wgrad kernels
        dispatch = (2.0 if wgrad else 1.0) * self.launch_s
        # a CPU dispatches and computes on the same core: the costs add; an accelerator runs its
        # kernels while the host issues the next, so the dispatch is a floor
        return seconds + dispatch if self.device.kind == "cpu" else max(seconds, dispatch)

    def part_precision(self, part: Part) -> str:
        """The precision ``part``'s products run in: the run's, except that under fp8 Megatron-Core keeps
        the attention core (``fp8_dot_product_attention`` off) and the output layer (a plain
        ``ColumnParallelLinear``, outside Transformer Engine) in bf16."""
        if self.precision == "fp8" and part.tensor_parallel in BF16_UNDER_FP8:
            return "fp8" if self.layout.fp8_attention_and_logits else "bf16"
        return self.precision

    def _tp_s(self, part: Part, rank: int, backward: bool) -> float:
        layout = self.layout
        if layout.tp == 1 or not part.boundary_elements:
            return 0.0
        forward, backward_ones = tensor_parallel_collectives(part, layout.sequence_parallel)
        size = part.boundary_elements * layout.micro_batch * self.activation_bytes / layout.cp
        group = self._tp_group(rank)
        return sum(self.group_s(COLLECTIVE_NAMES[c], size, group) for c in (backward_ones if backward else forward))

    def _cp_s(self, block: Block, rank: int, backward: bool, core_s: float) -> float:
        layout = self.layout
        if layout.cp == 1 or block.kind != "layer":
            return 0.0
        step_bytes = context_parallel_kv_elements(self.config, block) * layout.micro_batch * self.activation_bytes
        step_bytes /= layout.cp * layout.tp  # each rank passes its heads' share of its sequence chunk
        ring = (layout.cp - 1) * self.comm.message_s(rank, self._cp_neighbour(rank), step_bytes)
        return max(0.0, (2.0 if backward else 1.0) * ring - core_s)  # the exchange hides under the core

    def _ep_s(self, block: Block, rank: int) -> float:
        if self.layout.ep == 1 or not expert_all_to_all_elements(block):
            return 0.0
        return self.expert_exchange_s(block, rank, self._ep_group(rank))

    def expert_exchange_s(self, block: Block, rank: int, group: tuple[int, ...]) -> float:
        """``block``'s dispatch and combine all-to-alls from ``rank`` over the expert-parallel ``group``
        (the same in the forward and, as their gradients, in the backward)."""
        layout = self.layout
        elements = expert_all_to_all_elements(block)
        if layout.ep == 1 or not elements:
            return 0.0
        per_peer = elements * layout.micro_batch * self.activation_bytes / (layout.cp * layout.tp * layout.ep)
        exchange = sum(self.comm.message_s(rank, peer, per_peer) for peer in group if peer != rank)
        return 2.0 * exchange  # dispatch and combine (forward), or their gradients (backward)

    def zero3_exposed_s(self, parameters: float, group: tuple[int, ...], compute_s: float, backward: bool) -> float:
        """ZeRO-3's gather of a block's ``parameters`` over ``group`` before its forward or backward (and
        the reduce-scatter of its gradients after the backward), beyond the ``compute_s`` it overlaps."""
        # the stage's other tensor ranks gather over their own data-parallel groups at the same time
        tp = self.layout.tp
        seconds = self.group_s("allgather", parameters * self.weight_bytes, group, tp)
        if backward and not self.layout.frozen_weights:
            seconds += self.group_s("reduce_scatter", parameters * self.layout.gradient_bytes, group, tp)
        return max(0.0, seconds - compute_s) if self.layout.zero3_prefetch else seconds

    def block_cost(self, block: Block, rank: int) -> BlockCost:
        """``block``'s compute, tensor-parallel and ring-attention seconds and its parameters on ``rank``."""
        layout = self.layout
        forward = backward = core = forward_tp = backward_tp = dense = expert = 0.0
        for part in block.parts:
            part_forward = self._part_s(part, block, backward=False)
            again = recomputed(block, part, layout.recompute)
            part_backward = self._part_s(part, block, backward=True)
            forward += part_forward
            backward += part_backward + (part_forward if again else 0.0)
            core += part_forward if part.name.endswith("_core") else 0.0
            part_forward_tp = self._tp_s(part, rank, backward=False)
            part_backward_tp = self._tp_s(part, rank, backward=True)
            if layout.tp_comm_overlap:  # chunked under the part's own matrix product
                part_forward_tp = max(0.0, part_forward_tp - part_forward)
                part_backward_tp = max(0.0, part_backward_tp - part_backward)
            forward_tp += part_forward_tp
            # a recomputed part runs its forward again, collectives included (Megatron's checkpointed
            # layer calls the same forward); the attention core that selective recomputation redoes has none
            backward_tp += part_backward_tp + (part_forward_tp if again else 0.0)
            if part.expert:
                expert += part.parameters / (layout.tp * layout.ep)
            else:
                dense += part.parameters / (layout.tp if part.tensor_parallel in TP_SPLIT else 1)
        return BlockCost(
            forward, backward, forward_tp, backward_tp, self._cp_s(block, rank, False, core),
            self._cp_s(block, rank, True, 2 * core), dense, expert,
        )  # fmt: skip

    def _chunk_cost(self, rank: int, virtual: int) -> ChunkCost:
        layout = self.layout
        forward = dict.fromkeys(("compute", "tp", "cp", "ep", "zero3"), 0.0)
        backward = dict(forward)
        dense = expert = 0.0
        blocks = [block for block, stage in zip(self.blocks, self.virtual, strict=True) if stage == virtual]
        zero3_group = data_parallel_group(rank, layout) if layout.zero_stage >= 3 else None
        for block in blocks:
            cost = self.block_cost(block, rank)
            forward_compute = cost.forward_compute * self.compute_factor
            backward_compute = cost.backward_compute * self.compute_factor
            forward["compute"] += forward_compute
            backward["compute"] += backward_compute
            forward["tp"] += cost.forward_tp
            backward["tp"] += cost.backward_tp
            forward["cp"] += cost.forward_cp
            backward["cp"] += cost.backward_cp
            dense += cost.dense_parameters
            expert += cost.expert_parameters
            exchange = self._ep_s(block, rank)
            forward["ep"] += exchange
            # and the dispatch and combine of the recomputed forward, where the part that carries them is
            redone = any(recomputed(block, part, layout.recompute) for part in block.parts if part.all_to_all_elements)
            backward["ep"] += exchange * (2.0 if redone else 1.0)
            if zero3_group is not None:  # gathers before the block's forward and backward, overlapped with it
                forward["zero3"] += self.zero3_exposed_s(cost.dense_parameters, zero3_group, forward_compute,
                                                         backward=False)  # fmt: skip
                backward["zero3"] += self.zero3_exposed_s(cost.dense_parameters, zero3_group, backward_compute,
                                                          backward=True)  # fmt: skip
        last = layout.pp * layout.virtual_stages - 1
        message = 0.0
        if blocks:
            # Megatron's scatter-gather: each tensor-parallel rank sends 1/tp of the hidden states
            message = pipeline_message_elements(blocks[-1], self.config.hidden) * layout.micro_batch
            message *= self.activation_bytes / (layout.tp * layout.cp)
        return ChunkCost(
            forward, backward, message if virtual < last else 0.0, message if virtual > 0 else 0.0, dense, expert
        )


class TransformerTrainer:
    """The ``Trainer`` of one simulated rank of the ``megatron`` algorithm."""

    def __init__(self, costs: TransformerCosts, rank: int, sample: Callable[[], float] | None = None) -> None:
        self.costs, self.rank = costs, rank
        self.layout = costs.layout
        self.sample = sample or (lambda: 1.0)
        self.iteration = 0
        self._step_factor = 1.0
        self._whole = TimedWork("none", 0.0)  # the pass being handed out bucket by bucket

    def _work(self, name: str, parts: dict[str, float], result: Any) -> TimedWork:
        scaled = {key: value * (self._step_factor if key == "compute" else 1.0) for key, value in parts.items()}
        return TimedWork(name, math.fsum(scaled.values()), result, max(self.iteration - 1, 0), scaled)

    def stage_forward(self, micro_batch: int, chunk: int, activation: Any) -> TimedWork:
        if micro_batch == 0 and chunk == 0:  # a new iteration: one straggler draw for its compute
            self.iteration += 1
            self._step_factor = self.sample()
        cost = self.costs.chunk(self.rank, chunk)
        output = Sized(cost.output_bytes, "activation") if cost.output_bytes else None
        return self._work("forward", cost.forward_parts, output)

    def stage_backward(self, micro_batch: int, chunk: int, gradient: Any) -> TimedWork:
        cost = self.costs.chunk(self.rank, chunk)
        result = Sized(cost.input_gradient_bytes, "activation_gradient") if cost.input_gradient_bytes else None
        return self._work("backward", cost.backward_parts, result)

    def chunk_gradients(self, chunk: int) -> list[tuple[Sized, str, str]]:
        layout = self.layout
        if layout.zero_stage >= 3 or layout.frozen_weights:  # ZeRO-3: reduce-scattered inside backward
            return []
        cost = self.costs.chunk(self.rank, chunk)
        collective = "allreduce" if layout.zero_stage == 0 else "reduce_scatter"
        out = [(Sized(cost.dense_parameters * layout.gradient_bytes, "gradient"), collective, "dense")]
        if cost.expert_parameters:
            out.append((Sized(cost.expert_parameters * layout.gradient_bytes, "gradient"), collective, "expert"))
        return out

    def parameter_shard(self, chunk: int) -> Sized:
        return Sized(self.costs.chunk(self.rank, chunk).dense_parameters * self.costs.weight_bytes, "weights")

    def assign_gathered(self, gathered: Any) -> TimedWork:
        return TimedWork("assign", 0.0, None, max(self.iteration - 1, 0), {})

    # --- overlapped reductions and gathers: a chunk's pass in equal gradient buckets -----------------
    def chunk_buckets(self, chunk: int, bucket_bytes: float) -> int:
        total = math.fsum(payload.nbytes for payload, _, _ in self.chunk_gradients(chunk))
        return max(1, math.ceil(total / bucket_bytes))

    def stage_forward_bucket(
        self, micro_batch: int, chunk: int, activation: Any, bucket: int, buckets: int
    ) -> TimedWork:
        if bucket == 0:
            self._whole = self.stage_forward(micro_batch, chunk, activation)
        return _piece(self._whole, bucket, buckets)

    def stage_backward_bucket(
        self, micro_batch: int, chunk: int, gradient: Any, bucket: int, buckets: int
    ) -> TimedWork:
        if bucket == 0:
            self._whole = self.stage_backward(micro_batch, chunk, gradient)
        return _piece(self._whole, bucket, buckets)

    def bucket_gradients(self, chunk: int, bucket: int, buckets: int) -> list[tuple[Sized, str, str]]:
        return [(Sized(payload.nbytes / buckets, "gradient"), collective, kind)
                for payload, collective, kind in self.chunk_gradients(chunk)]  # fmt: skip

    def parameter_bucket(self, chunk: int, bucket: int, buckets: int) -> Sized:
        return Sized(self.parameter_shard(chunk).nbytes / buckets, "weights")

    def step(self, reduced: Any, scale: float = 1.0) -> TimedWork:
        layout = self.layout
        dense = sum(self.costs.chunk(self.rank, c).dense_parameters for c in range(layout.virtual_stages))
        expert = sum(self.costs.chunk(self.rank, c).expert_parameters for c in range(layout.virtual_stages))
        if layout.zero_stage >= 1:
            dense /= layout.dp * layout.cp
            expert /= max(1, layout.dp * layout.cp // layout.ep)
        device = self.costs.device
        seconds = 0.0 if layout.frozen_weights else adam_update_s(dense + expert, device)
        return TimedWork("update", seconds, None, max(self.iteration - 1, 0), {"compute": seconds})


def _piece(whole: TimedWork, bucket: int, buckets: int) -> TimedWork:
    """Bucket ``bucket`` of ``buckets`` equal shares of ``whole`` (its result with the last)."""
    parts = {key: value / buckets for key, value in whole.parts.items()}
    result = whole.result if bucket == buckets - 1 else None
    return TimedWork(whole.name, whole.duration_s / buckets, result, whole.iteration, parts)
