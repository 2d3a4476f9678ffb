"""Transformer costs: held to torch on small instances of every family, to the papers' closed forms,
and to Korthikanti et al.'s activation formulas with numbers a calculator can check."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ddlsim.simulator.workloads.flops_formulas import (
    iteration_s_from_throughput,
    korthikanti_selective_hardware_flops,
    model_flops_utilization,
    narayanan_flops_per_iteration,
)
from ddlsim.simulator.workloads.transformer import LatentAttention, TransformerConfig, load_transformer
from ddlsim.simulator.workloads.transformer_costs import (
    Block,
    hardware_flops_per_sample,
    model_flops_per_sample,
    model_flops_per_token,
    parameter_count,
    transformer_blocks,
)
from ddlsim.simulator.workloads.transformer_traffic import (
    context_parallel_kv_elements,
    expert_all_to_all_elements,
    padded_vocabulary,
    tensor_parallel_collectives,
)

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from ddlsim.simulator.workloads.transformer_torch import TorchTransformer  # noqa: E402

FAMILIES = ["gpt2", "bert_base", "t5_base", "llama2_70b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3",
            "nemotron_8b"]  # fmt: skip


def tiny(name: str) -> TransformerConfig:
    """The catalog entry's architecture at toy size: 2 layers, hidden 64, 4 heads (GQA kept as 2 kv heads)."""
    config = load_transformer(name)
    changes: dict = dict(layers=2, hidden=64, heads=4, head_dim=16, ffn_hidden=96, vocabulary=101, seq_len=16,
                         kv_heads=4 if config.kv_heads == config.heads else 2)
    if config.architecture == "encoder_decoder":
        changes.update(encoder_layers=2, decoder_seq_len=8)
    if config.position_embedding == "learned":
        changes["max_positions"] = 32
    if config.moe is not None:
        shared = 48 if config.moe.shared_experts else 0
        changes["moe"] = dataclasses.replace(config.moe, experts=4, top_k=2, expert_ffn_hidden=48,
                                             shared_ffn_hidden=shared, dense_layers=min(config.moe.dense_layers, 1))
    if config.latent_attention is not None:
        q_rank = 24 if config.latent_attention.q_lora_rank else 0
        changes["latent_attention"] = LatentAttention(q_rank, 32, 16, 8, 16)
    return dataclasses.replace(config, **changes)


def part_flops(counts: dict, key: str) -> int:
    """A module's forward FLOPs; containers that are never called are the sum of their children."""
    if key in counts:
        return sum(counts[key].values())
    children = [name for name in counts if name.startswith(key + ".") and "." not in name[len(key) + 1 :]]
    return sum(sum(counts[name].values()) for name in children)


@pytest.mark.torch
@pytest.mark.parametrize("name", FAMILIES)
def test_counts_equal_torch_on_a_small_instance(name: str) -> None:
    """Parameters exactly; forward FLOPs per part and backward FLOPs in total, as FlopCounterMode counts."""
    config = tiny(name)
    torch.manual_seed(0)
    model = TorchTransformer(config)
    blocks = transformer_blocks(config)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(blocks)
    for block in blocks:
        for part in block.parts:
            if part.name == "loss":
                continue
            module = model.blocks[block.name][part.name]
            assert sum(p.numel() for p in module.parameters()) == part.parameters, (block.name, part.name)
    batch = 3
    tokens = torch.randint(0, config.vocabulary, (batch, config.seq_len))
    extra = (torch.randint(0, config.vocabulary, (batch, config.decoder_seq_len)),) if config.decoder_seq_len else ()
    forward = FlopCounterMode(display=False)
    with forward:
        loss = model(tokens, *extra)
    backward = FlopCounterMode(display=False)
    with backward:
        loss.backward()
    counts = forward.get_flop_counts()
    for block in blocks:
        for part in block.parts:
            got = part_flops(counts, f"TorchTransformer.blocks.{block.name}.{part.name}")
            assert got == part.forward_flops * batch, (block.name, part.name)
    assert forward.get_total_flops() == sum(block.forward_flops for block in blocks) * batch
    assert backward.get_total_flops() == sum(block.backward_flops for block in blocks) * batch


@pytest.mark.torch
def test_counts_equal_torch_on_the_meta_device_at_a_longer_sequence() -> None:
    """No weights, no data: GPT-2 small's layers at 1024 tokens, counted on torch's meta device."""
    config = dataclasses.replace(load_transformer("gpt2"), layers=2)
    with torch.device("meta"):
        model = TorchTransformer(config)
        tokens = torch.zeros(2, config.seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        loss = model(tokens)
        loss.backward()
    blocks = transformer_blocks(config)
    assert counter.get_total_flops() == model_flops_per_sample(blocks) * 2


@pytest.mark.parametrize("name", ["megatron_1_7b", "megatron_76b", "megatron_1t", "megatron_22b", "gpt3_175b"])
def test_gpt_counts_equal_the_narayanan_formula(name: str) -> None:
    """Exact counts = 72 B s l h^2 (1 + s/6h + V/12lh) (model) and 96 B s l h^2 (1 + s/6h + V/16lh) (full recompute)."""
    config = load_transformer(name)
    blocks = transformer_blocks(config)
    batch = 512
    args = (batch, config.seq_len, config.layers, config.hidden, config.vocabulary)
    model = narayanan_flops_per_iteration(*args, recompute=False)
    assert model_flops_per_sample(blocks) * batch == pytest.approx(model, rel=1e-12)
    full = narayanan_flops_per_iteration(*args, recompute=True)
    assert hardware_flops_per_sample(blocks, "full") * batch == pytest.approx(full, rel=1e-12)


def test_narayanan_formula_by_hand() -> None:
    """1T model, B=512: 72 x 512 x 2048 x 128 x 25600^2 x (1 + 2048/153600 + 51200/39321600) = 6.4257e18;
    at 71.49 s on 512 A100 (312 TFLOP/s) that is MFU 0.5627, the 56.3% Korthikanti et al. report."""
    flops = narayanan_flops_per_iteration(512, 2048, 128, 25600, 51200, recompute=False)
    assert flops == pytest.approx(6.4257e18, rel=1e-4)
    assert model_flops_utilization(flops, 71.49, 512, 312e12) == pytest.approx(0.5627, abs=5e-4)
    hardware = korthikanti_selective_hardware_flops(512, 2048, 128, 25600, 51200)
    assert model_flops_utilization(hardware, 71.49, 512, 312e12) == pytest.approx(0.570, abs=5e-4)
    assert iteration_s_from_throughput(flops, flops / 10.0, 1) == pytest.approx(10.0)


def test_selective_recompute_adds_the_attention_core_forward() -> None:
    """Megatron 22B at s=2048, per sample: core forward 4 s^2 h l = 4 x 2048^2 x 6144 x 48 = 4.9478e15 FLOPs."""
    blocks = transformer_blocks(load_transformer("megatron_22b"))
    extra = hardware_flops_per_sample(blocks, "selective") - hardware_flops_per_sample(blocks, "none")
    assert extra == pytest.approx(4 * 2048**2 * 6144 * 48, rel=1e-12)
    assert hardware_flops_per_sample(blocks, "none") == model_flops_per_sample(blocks)
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        hardware_flops_per_sample(blocks, "some")


def gpt_layer(name: str = "megatron_22b") -> tuple[TransformerConfig, Block]:
    config = load_transformer(name)
    return config, transformer_blocks(config)[1]


def test_korthikanti_activations_per_gpt_layer() -> None:
    """Korthikanti et al. 2022 eq. 1-4 for the 22B layer, s=2048, h=6144, a=64, b=1 (bytes):
    s h = 12,582,912; 34 s h = 427,819,008; 5 a s^2 = 1,342,177,280.
    - no parallelism: 34 s h + 5 a s^2 = 1,769,996,288
    - TP 8: s h (10 + 24/8) + 5 a s^2 / 8 = 163,577,856 + 167,772,160 = 331,350,016
    - TP 8 + SP: (34 s h + 5 a s^2) / 8 = 221,249,536
    - TP 8 + SP + selective recompute: 34 s h / 8 = 53,477,376
    """
    _, layer = gpt_layer()
    saved = layer.saved
    assert saved.bytes() == 1_769_996_288
    assert saved.bytes(tensor_parallel=8) == 331_350_016
    assert saved.bytes(tensor_parallel=8, sequence_parallel=True) == 221_249_536
    assert saved.bytes(tensor_parallel=8, sequence_parallel=True, keep_scores=False) == 53_477_376


def test_flash_attention_keeps_no_score_matrix() -> None:
    """FlashAttention: 34 s h plus the fp32 log-sum-exp, 4 a s = 524,288 bytes, instead of 5 a s^2."""
    _, layer = gpt_layer()
    assert layer.saved.bytes(flash_attention=True) == 427_819_008 + 4 * 64 * 2048


def test_the_attention_scores_move_more_bytes_than_the_core_keeps() -> None:
    """Megatron's unfused core attention per score element, in 16 bits: forward the scores written,
    read and the probabilities written by the softmax, read and written again with a 1-byte mask by
    the dropout, read by the product with V: 6 x 2 + 1 = 13 bytes; backward 9 x 2 + 1 = 19. Without
    dropout (Llama) 4 x 2 = 8 and 7 x 2 = 14. The core keeps 5 (Korthikanti et al. eq. 1)."""
    from ddlsim.simulator.workloads.transformer_costs import score_traffic_bytes

    for name, heads, forward, backward in (("megatron_22b", 64, 13, 19), ("llama2_7b", 32, 8, 14)):
        config = load_transformer(name)
        core = next(part for part in transformer_blocks(config)[1].parts if part.name.endswith("_core"))
        elements = heads * config.seq_len**2
        assert score_traffic_bytes(core.saved, backward=False) == forward * elements
        assert score_traffic_bytes(core.saved, backward=True) == backward * elements
    gpt = transformer_blocks(load_transformer("megatron_22b"))[1]
    kept = next(part for part in gpt.parts if part.name.endswith("_core")).saved
    assert kept.bytes(flash_attention=False) - kept.bytes(flash_attention=False, keep_scores=False) == 5 * 64 * 2048**2
    qkv = next(part for part in gpt.parts if part.name.endswith("_qkv"))
    assert score_traffic_bytes(qkv.saved, backward=False) == 0.0  # only the core has score matrices


def test_llama_layer_activations_gqa_swiglu_no_dropout() -> None:
    """Llama 3 8B layer at s=8192 (h=4096, 8 kv heads of 128, f=14336), flash, bf16, bytes per sample:
    replicated 4 s h (two norm inputs, QKV and MLP inputs); split: Q s h, K and V 2 s x 1024,
    output-projection input s h, gate and up 2 s f, down input s f; plus 4 a s fp32 log-sum-exp.
    = 2 x 8192 x (4 x 4096 + 4096 + 2048 + 4096 + 3 x 14336) + 4 x 32 x 8192 = 1,078,984,704.
    """
    config = load_transformer("llama3_8b")
    layer = transformer_blocks(config)[1]
    assert layer.saved.masks == layer.saved.score_masks == 0
    expected = 2 * 8192 * (4 * 4096 + 4096 + 2048 + 4096 + 3 * 14336) + 4 * 32 * 8192
    assert layer.saved.bytes(flash_attention=True) == expected
    # without flash, the bf16 softmax output of every head: 2 a s^2 bytes
    without = layer.saved.bytes(flash_attention=False) - layer.saved.bytes(flash_attention=True)
    assert without == 2 * 32 * 8192**2 - 4 * 32 * 8192


def test_tensor_parallel_collectives_of_a_gpt_layer() -> None:
    """Megatron's four all-reduces per layer (Shoeybi et al. 2019, figure 4): two forward, two backward.
    With SP, forward 2 all-gathers + 2 reduce-scatters; backward 4 all-gathers (2 re-gathers) + 2 reduce-scatters."""
    _, layer = gpt_layer()

    def collect(sp: bool) -> tuple[list[str], list[str]]:
        forward: list[str] = []
        backward: list[str] = []
        for part in layer.parts:
            f, b = tensor_parallel_collectives(part, sp)
            forward += f
            backward += b
        return sorted(forward), sorted(backward)

    assert collect(False) == (["all_reduce"] * 2, ["all_reduce"] * 2)
    assert collect(True) == (["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"],
                             ["all_gather"] * 4 + ["reduce_scatter"] * 2)
    boundaries = {part.boundary_elements for part in layer.parts if part.boundary_elements}
    assert boundaries == {2048 * 6144}


def test_moe_traffic_and_capacity_factor() -> None:
    """Mixtral, s=4096: dispatch 2 x 4096 x 4096 elements per MoE layer; a capacity factor of 1.25 pads the
    executed expert work and the all-to-all, not the model FLOPs."""
    config = dataclasses.replace(load_transformer("mixtral_8x7b"), seq_len=4096)
    layer = transformer_blocks(config)[1]
    assert expert_all_to_all_elements(layer) == 2 * 4096 * 4096
    padded = dataclasses.replace(config, moe=dataclasses.replace(config.moe, capacity_factor=1.25))
    padded_blocks = transformer_blocks(padded)
    assert expert_all_to_all_elements(padded_blocks[1]) == 1.25 * 2 * 4096 * 4096
    assert model_flops_per_sample(padded_blocks) == model_flops_per_sample(transformer_blocks(config))
    expert_flops = sum(p.forward_flops + p.backward_flops for p in layer.parts if p.expert) * config.layers
    padding = hardware_flops_per_sample(padded_blocks) - model_flops_per_sample(padded_blocks)
    assert padding == pytest.approx(0.25 * expert_flops)


def test_context_parallel_and_vocabulary_padding() -> None:
    """Llama 3 70B layer, s=8192: K and V of 8 heads x 128 = 8192 x 2048 elements. Megatron pads 50257 to 50304
    (multiple of 128) and to 51200 at TP 8 (multiple of 1024)."""
    config = load_transformer("llama3_70b")
    assert context_parallel_kv_elements(config, transformer_blocks(config)[1]) == 8192 * 2048
    assert padded_vocabulary(50257) == 50304
    assert padded_vocabulary(50257, tensor_parallel=8) == 51200


def test_model_flops_per_token_of_llama2_7b_by_hand() -> None:
    """6 N (non-embedding N = 32 x 202,383,360 minus norms) + 12 s h l attention + 6 h V logits, s=4096:
    6 x 32 x (4 x 4096^2 + 3 x 4096 x 11008) + 12 x 4096 x 4096 x 32 + 6 x 4096 x 32000 = 46.08e9."""
    blocks = transformer_blocks(load_transformer("llama2_7b"))
    expected = 6 * 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 12 * 4096 * 4096 * 32 + 6 * 4096 * 32000
    assert model_flops_per_token(blocks) == pytest.approx(expected, rel=1e-12)
    assert math.isclose(expected, 46.08e9, rel_tol=1e-3)
