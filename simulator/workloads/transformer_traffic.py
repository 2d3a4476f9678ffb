"""What a transformer layout sends: tensor-parallel collectives per part, pipeline, expert and context traffic.

Sizes are elements **per sample**; multiply by the micro-batch and the bytes per element
(2 for bf16/fp16 activations). A collective's size is that of the whole tensor, as nccl-tests
states it: an all-reduce's buffer, an all-gather's gathered output, a reduce-scatter's input;
each of the t ranks of an all-gather or reduce-scatter holds 1/t of it.

Megatron's rules (Shoeybi et al. 2019 section 3; Korthikanti et al. 2022 section 4.2.2 for
sequence parallelism, "SP"):

============ ===================================== ========================================
part         forward                               backward
============ ===================================== ========================================
column       SP: all-gather of the input           all-reduce of the input gradient;
                                                   SP: all-gather of the input again (for
                                                   the weight gradient) + reduce-scatter of
                                                   the input gradient
row          all-reduce of the output;             SP: all-gather of the output gradient
             SP: reduce-scatter
vocab embed  all-reduce of the output; SP: r-s     SP: all-gather of the output gradient
vocab logits as column (plus three all-reduces of one fp32 per token in the cross entropy, not listed)
heads, replicated: nothing
============ ===================================== ========================================
"""

from __future__ import annotations

from ddlsim.simulator.workloads.transformer import TransformerConfig
from ddlsim.simulator.workloads.transformer_costs import Block, Part


def tensor_parallel_collectives(part: Part, sequence_parallel: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(forward, backward) collectives over the TP group around ``part``, each of ``part.boundary_elements``."""
    if part.boundary_elements == 0:
        return (), ()
    kind = part.tensor_parallel
    if kind in ("column", "vocab_logits"):
        if sequence_parallel:
            return ("all_gather",), ("all_gather", "reduce_scatter")
        return (), ("all_reduce",)
    if kind in ("row", "vocab_embedding"):
        if sequence_parallel:
            return ("reduce_scatter",), ("all_gather",)
        return ("all_reduce",), ()
    return (), ()


def pipeline_message_elements(block: Block, hidden: int) -> float:
    """Elements per sample a pipeline stage ending after ``block`` sends on (the hidden states).

    With sequence parallelism (or Megatron's scatter-gather optimisation, Narayanan et al. SC21
    section 4.1) each TP rank sends 1/t of it. An encoder-decoder stage in the decoder also
    forwards the encoder output (``block.tokens`` of the encoder); not included here.
    """
    return float(block.tokens) * hidden


def expert_all_to_all_elements(block: Block) -> float:
    """Token elements per sample one MoE layer dispatches to its experts; the combine returns as many.

    Forward: dispatch then combine; backward: the combine's gradient then the dispatch's. Of
    each, a rank sends (ep - 1)/ep to the other expert-parallel ranks when tokens spread evenly.
    """
    return sum(part.all_to_all_elements for part in block.parts)


def context_parallel_kv_elements(config: TransformerConfig, block: Block) -> float:
    """Key and value elements per sample of one layer's whole sequence (ring attention's payload).

    With CP c each rank holds 1/c and receives the other (c - 1)/c in c - 1 ring steps forward;
    backward passes the keys and values again and their gradients the other way (Liu et al. 2023,
    ring attention; Megatron-Core context parallelism).
    """
    latent = config.latent_attention
    if latent is not None:
        per_token = config.heads * (latent.qk_nope_head_dim + latent.qk_rope_head_dim + latent.v_head_dim)
    else:
        per_token = 2 * config.kv_heads * config.head_dim
    return float(block.tokens) * per_token


def padded_vocabulary(vocabulary: int, tensor_parallel: int = 1, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of ``divisible_by x tensor_parallel``.

    Example: 50257 -> 50304 at TP 1, 51200 at TP 8.
    """
    multiple = divisible_by * tensor_parallel
    return -(-vocabulary // multiple) * multiple
