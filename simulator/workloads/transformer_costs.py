"""Per-layer costs of a transformer: FLOPs, parameters, saved activations, split and traffic sizes.

``transformer_blocks(config)`` lists the model as blocks in forward order (the embedding, each
transformer layer, the output head), each block as parts (attention QKV projection, attention
core, output projection, norms, MLP or experts, logits, loss). Every number is **per sample**
(one sequence of ``seq_len`` tokens); a micro-batch of b sequences costs b times as much.

Conventions (the ones the torch check in ``tests/test_transformer_costs.py`` holds them to):

- FLOPs count matrix products only, two per multiply-add, as ``torch.utils.flop_counter`` and
  the papers do (Narayanan et al. SC21 section 5.1; Korthikanti et al. 2022 appendix); norms,
  softmax, activations and residual adds are memory-bound work, not counted here.
- The backward pass is twice the forward for every product (input and weight gradients; every
  product's input needs a gradient because the embedding is trained).
- Attention scores are counted over the full s x s matrix, causal or not, with or without
  FlashAttention: FlashAttention changes bytes, not FLOPs (Dao et al. 2022); Megatron and the
  papers count the same way.
- A mixture of experts counts ``top_k`` routed experts per token (model FLOPs, dropless); a
  capacity factor pads the executed work (``Part.executed_factor``), not the model FLOPs.

Saved activations follow Korthikanti et al. 2022 ("Reducing activation recomputation in large
transformer models", section 4.1): per GPT layer 34 s b h + 5 a s^2 b bytes with 16-bit
activations and 1-byte dropout masks; each term is filed below under how tensor and sequence
parallelism divide it (``SavedActivations``). Generalised to GQA (smaller K and V), gated MLPs
(gate and up outputs saved: 6 s f instead of 4 s f bytes), no dropout (no masks; the softmax
output alone is kept), FlashAttention (no score-sized tensors; the fp32 log-sum-exp per query
and head instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

from ddlsim.simulator.workloads.transformer import TransformerConfig

TENSOR_PARALLEL_KINDS = ("column", "row", "heads", "vocab_embedding", "vocab_logits", "replicated")


@dataclass(frozen=True)
class SavedActivations:
    """Elements kept from forward to backward, per sample, filed by how parallelism divides them.

    - ``replicated``: 16-bit elements every tensor-parallel rank keeps whole (norm inputs, the
      inputs of column-parallel products); sequence parallelism divides them by the TP size.
    - ``split``: 16-bit elements divided over the TP ranks (per-head Q, K, V, MLP intermediates).
    - ``masks``: 1-byte dropout masks, replicated like ``replicated``.
    - ``scores``: 16-bit score-sized elements (softmax output, its dropout output), split by TP,
      kept only without FlashAttention and without selective recomputation.
    - ``score_masks``: 1-byte score dropout masks, kept like ``scores``.
    - ``flash_fp32``: 4-byte elements kept only with FlashAttention (log-sum-exp per query and head).
    - ``fp32``: 4-byte elements split by TP (the loss's softmax over the vocabulary, router probabilities).
    - ``gemm_replicated``, ``gemm_split``: the part of ``replicated`` and ``split`` that are inputs of
      linear layers, kept for the weight gradient; under fp8 Transformer Engine keeps them as their
      fp8 casts (1 byte), the other activations stay 16-bit.
    """

    replicated: float = 0.0
    split: float = 0.0
    masks: float = 0.0
    scores: float = 0.0
    score_masks: float = 0.0
    flash_fp32: float = 0.0
    fp32: float = 0.0
    gemm_replicated: float = 0.0
    gemm_split: float = 0.0

    def __add__(self, other: SavedActivations) -> SavedActivations:
        return SavedActivations(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def scaled(self, factor: float) -> SavedActivations:
        return SavedActivations(**{f.name: getattr(self, f.name) * factor for f in fields(self)})

    def bytes(
        self,
        tensor_parallel: int = 1,
        sequence_parallel: bool = False,
        flash_attention: bool = False,
        keep_scores: bool = True,
        activation_bytes: float = 2.0,
        gemm_input_bytes: float | None = None,
    ) -> float:
        """Bytes per sample on one tensor-parallel rank.

        ``keep_scores`` is False under selective recomputation (the attention core is recomputed).
        ``gemm_input_bytes`` (1 under fp8) replaces ``activation_bytes`` for the linear layers' inputs.
        Example (Korthikanti eq. 2): a GPT layer with TP t and no SP keeps s h (10 + 24/t + 5 a s/(h t)) bytes.
        """
        t = float(tensor_parallel)
        replicated_divisor = t if sequence_parallel else 1.0
        total = activation_bytes * (self.replicated / replicated_divisor + self.split / t)
        if gemm_input_bytes is not None:
            gemm_elements = self.gemm_replicated / replicated_divisor + self.gemm_split / t
            total += (gemm_input_bytes - activation_bytes) * gemm_elements
        total += self.masks / replicated_divisor + 4.0 * self.fp32 / t
        if flash_attention:
            total += 4.0 * self.flash_fp32 / t
        elif keep_scores:
            total += (activation_bytes * self.scores + self.score_masks) / t
        return total


NOTHING_SAVED = SavedActivations()


def score_traffic_bytes(saved: SavedActivations, backward: bool, activation_bytes: float = 2.0) -> float:
    """Bytes the attention core without FlashAttention moves through memory per sample for its score
    matrices (a elements of s x s per head), in one pass: Megatron-LM's core attention runs
    ``torch.baddbmm`` (writes the scores), ``FusedScaleMaskSoftmax`` (reads them, writes the
    probabilities), ``attention_dropout`` (reads those, writes its output and a 1-byte mask) and
    ``torch.bmm`` with V (reads the dropped probabilities): 6 activations and a mask per element
    forward, 13 bytes in 16 bits. The backward writes the gradient of the dropped probabilities, the
    dropout's backward reads it and the mask and writes its own, the softmax's backward reads that and
    the probabilities and writes the scores' gradient, which the two products for dQ and dK read, and
    dV reads the dropped probabilities: 9 activations and the mask, 19 bytes. Without dropout: 4 and 7
    activations. (What the core keeps for backward, ``scores`` and ``score_masks``, is 5 bytes an
    element, Korthikanti et al. eq. 1: fewer than its passes move.)"""
    elements = saved.scores - saved.score_masks  # scores holds 2 tensors per element under dropout
    if not elements:
        return 0.0
    dropout = saved.score_masks > 0
    activations = (9.0 if dropout else 7.0) if backward else (6.0 if dropout else 4.0)
    return elements * (activations * activation_bytes + (1.0 if dropout else 0.0))


@dataclass(frozen=True)
class Part:
    """One part of a block, per sample.

    ``tensor_parallel`` says how Megatron splits it over TP ranks: ``column`` (output features
    split; input gathered), ``row`` (input features split; output summed), ``heads`` (the
    attention core, per head), ``vocab_embedding``/``vocab_logits`` (vocabulary split),
    ``replicated`` (norms: every rank computes its whole tokens). ``boundary_elements`` is the
    size of the tensor that crosses the TP boundary (a column part's input, a row part's
    output), per sample. ``shared_parameters`` are parameters this part uses but another part
    owns (a tied output layer), which a pipeline stage holding only this part must still keep.
    ``expert`` parts are split over expert-parallel ranks; ``all_to_all_elements`` are the token
    elements dispatched to the experts (and combined back) per sample. ``executed_factor``
    scales the FLOPs actually executed (a capacity factor's padding).
    """

    name: str
    tensor_parallel: str
    parameters: int
    forward_flops: float
    backward_flops: float
    saved: SavedActivations = NOTHING_SAVED
    boundary_elements: float = 0.0
    shared_parameters: int = 0
    expert: bool = False
    all_to_all_elements: float = 0.0
    executed_factor: float = 1.0

    def pass_flops(self, backward: bool, frozen_weights: bool = False) -> float:
        """Matrix FLOPs of one pass per sample. With ``frozen_weights`` (LoRA-style fine-tuning) a
        product with weights computes only its input gradient, half its backward; the attention core
        keeps its whole backward."""
        if not backward:
            return self.forward_flops
        return self.backward_flops * (0.5 if frozen_weights and self.parameters > 0 else 1.0)


@dataclass(frozen=True)
class Block:
    """A pipeline-placeable unit: ``embedding``, one transformer ``layer``, or the ``output`` head."""

    name: str
    kind: str  # embedding | layer | output
    stack: str  # decoder | encoder
    tokens: int  # tokens per sample in this block's stack
    parts: tuple[Part, ...]

    @property
    def parameters(self) -> int:
        return sum(part.parameters for part in self.parts)

    @property
    def forward_flops(self) -> float:
        return math.fsum(part.forward_flops for part in self.parts)

    @property
    def backward_flops(self) -> float:
        return math.fsum(part.backward_flops for part in self.parts)

    @property
    def saved(self) -> SavedActivations:
        return _sum_saved(self.parts)

    def part(self, name: str) -> Part:
        for part in self.parts:
            if part.name == name:
                return part
        raise KeyError(f"block {self.name!r} has no part {name!r}; parts: {', '.join(p.name for p in self.parts)}")


@lru_cache(maxsize=4096)
def _sum_saved(parts: tuple[Part, ...]) -> SavedActivations:
    total = NOTHING_SAVED
    for part in parts:
        total = total + part.saved
    return total


def _linear(name: str, kind: str, tokens: float, inputs: int, outputs: int, bias: bool, **extra) -> Part:
    """A dense product of ``tokens`` rows: 2 tokens inputs outputs FLOPs forward, twice that backward."""
    flops = 2.0 * tokens * inputs * outputs
    boundary = tokens * (inputs if kind == "column" else outputs if kind == "row" else 0)
    return Part(
        name=name,
        tensor_parallel=kind,
        parameters=inputs * outputs + (outputs if bias else 0),
        forward_flops=flops,
        backward_flops=2.0 * flops,
        boundary_elements=boundary,
        **extra,
    )


def _norm(config: TransformerConfig, name: str, tokens: float, width: int | None = None) -> Part:
    width = config.hidden if width is None else width
    per_feature = 2 if config.norm == "layernorm" else 1
    return Part(name, "replicated", per_feature * width, 0.0, 0.0, SavedActivations(replicated=tokens * width))


def _activation_saved(config: TransformerConfig, tokens: float, width: int) -> float:
    """Elements the activation function keeps besides the next product's input: gated 2 (gate, up), GeLU 1, ReLU 0."""
    if config.gated:
        return 2.0 * tokens * width
    return 0.0 if config.activation == "relu" else tokens * width


def _mlp_parts(config: TransformerConfig, prefix: str, tokens: float, width: int, expert: bool = False,
               copies: int = 1, routed: float = 1.0, executed: float = 1.0,
               keep_input: bool = True) -> tuple[Part, Part]:
    """Feed-forward in/out products: ``copies`` experts of ``width``, each token through ``routed`` of them.

    ``keep_input`` False when another part (the router) already keeps the same normed input.
    """
    h = config.hidden
    gate = 2 if config.gated else 1
    routed_tokens = tokens * routed
    mask = tokens * h if config.dropout else 0.0
    common = {"expert": expert, "executed_factor": executed}
    first = _linear(f"{prefix}_in", "column", routed_tokens, h, gate * width, config.linear_bias, **common)
    second = _linear(f"{prefix}_out", "row", routed_tokens, width, h, config.linear_bias, **common)
    first_saved = SavedActivations(split=_activation_saved(config, routed_tokens, width) * executed)
    if expert:  # the experts keep the tokens dispatched to them (and gathered over TP ranks)
        first_saved = first_saved + _gemm_input(replicated=routed_tokens * h * executed)
    elif keep_input:
        first_saved = first_saved + _gemm_input(replicated=tokens * h)
    a2a = routed_tokens * h * executed if expert else 0.0
    first = _replace(first, copies, first_saved, a2a)
    second = _replace(second, copies, _gemm_input(split=routed_tokens * width * executed, masks=mask), 0.0)
    return first, second


def _gemm_input(replicated: float = 0.0, split: float = 0.0, masks: float = 0.0) -> SavedActivations:
    """Saved elements that are a linear layer's input (see ``SavedActivations.gemm_replicated``)."""
    return SavedActivations(replicated=replicated, split=split, masks=masks, gemm_replicated=replicated,
                            gemm_split=split)


def _replace(part: Part, copies: int, saved: SavedActivations, a2a: float) -> Part:
    return Part(
        name=part.name,
        tensor_parallel=part.tensor_parallel,
        parameters=part.parameters * copies,
        forward_flops=part.forward_flops,
        backward_flops=part.backward_flops,
        saved=saved,
        boundary_elements=part.boundary_elements,
        expert=part.expert,
        all_to_all_elements=a2a,
        executed_factor=part.executed_factor,
    )


def _attention_parts(config: TransformerConfig, prefix: str, query_tokens: int, key_tokens: int,
                     cross: bool, relative_bias: bool) -> list[Part]:
    """QKV projection(s), core and output projection of one (self or cross) attention."""
    h, a, k = config.hidden, config.heads, config.kv_heads
    bias = config.linear_bias
    parts: list[Part] = []
    latent = config.latent_attention
    if latent is not None and not cross:
        qk_dim = latent.qk_nope_head_dim + latent.qk_rope_head_dim
        v_dim = latent.v_head_dim
        q_rank, kv_rank, rope = latent.q_lora_rank, latent.kv_lora_rank, latent.qk_rope_head_dim
        # The down-projections (to the query latent, the key/value latent and the shared rotary key)
        # are replicated over TP ranks (Megatron-Core MLA); the up-projections are column-split.
        down = _linear(f"{prefix}_latent", "replicated", query_tokens, h, q_rank + kv_rank + rope, bias)
        # kept: the normed input, each latent before and after its RMS norm, the rotary key part
        latent_saved = query_tokens * (h + 2 * q_rank + 2 * kv_rank + rope)
        gemm_inputs = query_tokens * (h + q_rank + kv_rank)  # the normed input, each normed latent
        saved = SavedActivations(replicated=latent_saved, gemm_replicated=gemm_inputs)
        parts.append(Part(down.name, "replicated", down.parameters + q_rank + kv_rank, down.forward_flops,
                          down.backward_flops, saved))
        q_in = q_rank or h
        q_up = _linear("q", "column", query_tokens, q_in, a * qk_dim, bias)
        kv_up = _linear("kv", "column", query_tokens, kv_rank, a * (latent.qk_nope_head_dim + v_dim), bias)
        parts.append(Part(f"{prefix}_qkv", "column", q_up.parameters + kv_up.parameters,
                          q_up.forward_flops + kv_up.forward_flops, q_up.backward_flops + kv_up.backward_flops,
                          boundary_elements=query_tokens * (q_in + kv_rank)))
        key_heads = a
    else:
        qk_dim = v_dim = config.head_dim
        key_heads = k
        if cross:
            parts.append(_linear(f"{prefix}_q", "column", query_tokens, h, a * qk_dim, bias,
                                 saved=_gemm_input(replicated=query_tokens * h)))
            # The encoder output feeding every decoder layer's K/V is saved once, by the encoder's output block.
            parts.append(_linear(f"{prefix}_kv", "column", key_tokens, h, 2 * k * qk_dim, bias))
        else:
            parts.append(_linear(f"{prefix}_qkv", "column", query_tokens, h, (a + 2 * k) * qk_dim, bias,
                                 saved=_gemm_input(replicated=query_tokens * h)))
    score_elements = float(a) * query_tokens * key_tokens
    core_saved = SavedActivations(
        split=query_tokens * a * qk_dim + key_tokens * key_heads * (qk_dim + v_dim),
        scores=score_elements * (2 if config.dropout else 1),
        score_masks=score_elements if config.dropout else 0.0,
        flash_fp32=float(query_tokens) * a,
    )
    core_flops = 2.0 * query_tokens * key_tokens * a * (qk_dim + v_dim)
    bias_parameters = config.relative_attention_buckets * a if relative_bias else 0
    parts.append(Part(f"{prefix}_core", "heads", bias_parameters, core_flops, 2.0 * core_flops, core_saved))
    output = _linear(f"{prefix}_output", "row", query_tokens, a * v_dim, h, bias)
    masks = query_tokens * h if config.dropout else 0.0
    parts.append(_replace(output, 1, _gemm_input(split=query_tokens * a * v_dim, masks=masks), 0.0))
    return parts


def _layer(config: TransformerConfig, index: int, stack: str, tokens: int, encoder_tokens: int) -> Block:
    first_of_stack = index == 0
    relative = config.position_embedding == "relative_bias" and first_of_stack
    parts = [_norm(config, "norm_attention", tokens)]
    parts += _attention_parts(config, "attention", tokens, tokens, cross=False, relative_bias=relative)
    if stack == "decoder" and config.architecture == "encoder_decoder":
        parts.append(_norm(config, "norm_cross_attention", tokens))
        parts += _attention_parts(config, "cross_attention", tokens, encoder_tokens, cross=True, relative_bias=False)
    parts.append(_norm(config, "norm_mlp", tokens))
    moe = config.moe
    if moe is not None and stack == "decoder" and moe.is_moe_layer(index):
        executed = moe.capacity_factor or 1.0
        router = _linear("router", "replicated", tokens, config.hidden, moe.experts, False)
        router_saved = SavedActivations(replicated=tokens * config.hidden, fp32=float(tokens) * moe.experts)
        parts.append(_replace(router, 1, router_saved, 0.0))
        parts += _mlp_parts(config, "experts", tokens, moe.expert_ffn_hidden, expert=True, copies=moe.experts,
                            routed=moe.top_k, executed=executed)
        if moe.shared_experts:
            parts += _mlp_parts(config, "shared_experts", tokens, moe.shared_experts * moe.shared_ffn_hidden,
                                keep_input=False)
    else:
        parts += _mlp_parts(config, "mlp", tokens, config.ffn_hidden)
    prefix = "encoder_" if stack == "encoder" and config.architecture == "encoder_decoder" else ""
    return Block(f"{prefix}layer_{index}", "layer", stack, tokens, tuple(parts))


def _embedding(config: TransformerConfig, name: str, stack: str, tokens: int, owns_table: bool) -> Block:
    h = config.hidden
    parameters = config.vocabulary * h if owns_table else 0
    if config.position_embedding == "learned":
        parameters += config.max_positions * h
    parameters += config.token_types * h
    saved = SavedActivations(masks=tokens * h if config.dropout else 0.0)
    parts = [Part("embedding", "vocab_embedding", parameters, 0.0, 0.0, saved, boundary_elements=float(tokens) * h,
                  shared_parameters=0 if owns_table else config.vocabulary * h)]
    if config.embedding_norm:
        parts.append(_norm(config, "embedding_norm", tokens))
    return Block(name, "embedding", stack, tokens, tuple(parts))


def _output(config: TransformerConfig, tokens: int) -> Block:
    h, vocabulary = config.hidden, config.vocabulary
    parts: list[Part] = []
    if config.norm_position == "pre":
        parts.append(_norm(config, "final_norm", tokens))
    if config.pooler:  # BERT: tanh(dense) on the first token, then the two-way next-sentence classifier
        pooler = _linear("pooler", "replicated", 1, h, h, True)
        classifier = _linear("classifier", "replicated", 1, h, 2, True)
        parts.append(Part("pooler", "replicated", pooler.parameters + classifier.parameters,
                          pooler.forward_flops + classifier.forward_flops,
                          pooler.backward_flops + classifier.backward_flops, SavedActivations(replicated=2.0 * h)))
    if config.lm_head_transform:  # BERT: dense, GeLU, layer norm before the tied decoder
        dense = _linear("lm_head_transform", "replicated", tokens, h, h, True)
        norm = _norm(config, "lm_head_norm", tokens)
        parts.append(Part(dense.name, "replicated", dense.parameters + norm.parameters, dense.forward_flops,
                          dense.backward_flops, SavedActivations(replicated=3.0 * tokens * h)))
    logits = _linear("logits", "vocab_logits", tokens, h, vocabulary, config.output_bias,
                     saved=SavedActivations(replicated=float(tokens) * h))
    tied = vocabulary * h if config.tied_embeddings else 0
    parts.append(Part(logits.name, logits.tensor_parallel, logits.parameters - tied, logits.forward_flops,
                      logits.backward_flops, logits.saved, boundary_elements=logits.boundary_elements,
                      shared_parameters=tied))
    # Megatron's vocab-parallel cross entropy keeps the fp32 softmax of the logits for backward.
    parts.append(Part("loss", "vocab_logits", 0, 0.0, 0.0, SavedActivations(fp32=float(tokens) * vocabulary)))
    return Block("output", "output", "decoder" if config.architecture != "encoder" else "encoder", tokens,
                 tuple(parts))


@lru_cache(maxsize=64)
def transformer_blocks(config: TransformerConfig) -> tuple[Block, ...]:
    """The model as blocks in forward order, each block's parts per sample at the config's sequence lengths.

    Decoder-only and encoder-only: ``embedding``, ``layer_0`` .. ``layer_{L-1}``, ``output``.
    Encoder-decoder (T5): ``encoder_embedding``, ``encoder_layer_*``, ``encoder_output`` (final
    norm; keeps the encoder output that every cross-attention reads), ``embedding`` (the
    decoder's, sharing the table), ``layer_*``, ``output``. Change the sequence length with
    ``dataclasses.replace(config, seq_len=...)``. Cached per config (configs and blocks are
    immutable): a planner asks for the same model many times.
    """
    blocks: list[Block] = []
    tokens = config.seq_len
    if config.architecture == "encoder_decoder":
        decoder_tokens = config.decoder_seq_len or config.seq_len
        blocks.append(_embedding(config, "encoder_embedding", "encoder", tokens, owns_table=True))
        blocks += [_layer(config, i, "encoder", tokens, tokens) for i in range(config.encoder_layers)]
        encoder_norm = _norm(config, "final_norm", tokens)
        # the normed encoder output is read by every decoder layer's cross-attention: kept once, here
        encoder_norm = Part(encoder_norm.name, "replicated", encoder_norm.parameters, 0.0, 0.0,
                            SavedActivations(replicated=2.0 * tokens * config.hidden))
        blocks.append(Block("encoder_output", "output", "encoder", tokens, (encoder_norm,)))
        blocks.append(_embedding(config, "embedding", "decoder", decoder_tokens, owns_table=False))
        blocks += [_layer(config, i, "decoder", decoder_tokens, tokens) for i in range(config.layers)]
        blocks.append(_output(config, decoder_tokens))
        return tuple(blocks)
    stack = "encoder" if config.architecture == "encoder" else "decoder"
    blocks.append(_embedding(config, "embedding", stack, tokens, owns_table=True))
    blocks += [_layer(config, i, stack, tokens, tokens) for i in range(config.layers)]
    blocks.append(_output(config, tokens))
    return tuple(blocks)


# --- totals ---------------------------------------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")


def recomputed(block: Block, part: Part, recompute: str) -> bool:
    """Whether ``part`` of ``block`` runs its forward again before its backward: every transformer
    layer's part under ``full``, the attention cores under ``selective`` (Korthikanti et al. 2022,
    section 5); never the embedding or the output head."""
    return block.kind == "layer" and (recompute == "full" or (recompute == "selective" and part.name.endswith("_core")))


def parameter_count(blocks: tuple[Block, ...]) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(block.parameters for block in blocks)


def active_parameter_count(config: TransformerConfig, blocks: tuple[Block, ...]) -> float:
    """Parameters one token passes through: routed experts count top_k / experts of theirs."""
    total = 0.0
    for block in blocks:
        for part in block.parts:
            share = config.moe.top_k / config.moe.experts if part.expert and config.moe else 1.0
            total += part.parameters * share
    return total


def model_flops_per_sample(blocks: tuple[Block, ...], frozen_weights: bool = False) -> float:
    """Forward plus backward matrix-product FLOPs of one sample: the 'model FLOPs' of MFU. With
    ``frozen_weights`` (LoRA-style fine-tuning) a product with weights computes only its input
    gradient, half its backward; the attention core keeps its whole backward."""
    if not frozen_weights:
        return math.fsum(block.forward_flops + block.backward_flops for block in blocks)
    return math.fsum(part.pass_flops(False) + part.pass_flops(True, frozen_weights=True)
                     for block in blocks for part in block.parts)  # fmt: skip


def hardware_flops_per_sample(blocks: tuple[Block, ...], recompute: str = "none") -> float:
    """FLOPs executed for one sample: model FLOPs, capacity padding, plus the recomputed forward.

    ``full`` recomputes every transformer layer's forward; ``selective`` the attention cores
    (Korthikanti et al. 2022, section 5). The embedding and the output head are not recomputed.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    total = 0.0
    for block in blocks:
        for part in block.parts:
            forward = part.forward_flops * part.executed_factor
            total += forward + part.backward_flops * part.executed_factor
            if recomputed(block, part, recompute):
                total += forward
    return total


def model_flops_per_token(blocks: tuple[Block, ...]) -> float:
    """Model FLOPs per trained token: per sample divided by the tokens the loss sees (the output stack's)."""
    return model_flops_per_sample(blocks) / blocks[-1].tokens
