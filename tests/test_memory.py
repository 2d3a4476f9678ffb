"""Memory per GPU: states by ZeRO stage, activations by schedule and recomputation, with numbers a calculator
can check; the layout rules each fail in one line naming the rule."""

from __future__ import annotations

import dataclasses

import pytest

from ddlsim.algorithms.parallel_layout import LayoutError, ParallelLayout, check_layout
from ddlsim.hardware_models.catalog import load_device
from ddlsim.simulator.workloads.transformer import TransformerConfig, load_transformer
from ddlsim.simulator.workloads.transformer_costs import parameter_count, transformer_blocks
from ddlsim.simulator.workloads.transformer_memory import MemorySettings, peak_memory, settings_for, stage_memory

BARE = MemorySettings(fragmentation=0.0, runtime_reserve_bytes=0.0)


def small_gpt() -> TransformerConfig:
    """8 GPT layers, h=1024, 16 heads, V=51200 (a multiple of 128: no padding), s=2048, tied.
    P = V h + s h + 8 (12 h^2 + 13 h) + 2 h = 54,525,952 + 100,769,792 + 2,048 = 155,297,792."""
    return dataclasses.replace(load_transformer("megatron_1_7b"), layers=8, hidden=1024, heads=16, kv_heads=16,
                               head_dim=64, ffn_hidden=4096)


def test_small_gpt_parameters_by_hand() -> None:
    assert parameter_count(transformer_blocks(small_gpt())) == 155_297_792


def test_states_without_sharding_are_18_bytes_per_parameter() -> None:
    """2 + 4 + (4 + 8) bytes per parameter (Rajbhandari et al. SC20 3.1: 16, plus 2 for fp32 gradients)."""
    memory = stage_memory(small_gpt(), ParallelLayout(), BARE)[0]
    p = 155_297_792
    assert (memory.weights, memory.gradients, memory.optimizer_states) == (2 * p, 4 * p, 12 * p)


@pytest.mark.parametrize(
    ("stage", "weights", "gradients", "optimizer"),
    [
        (1, 2.0, 4.0, 12.0 / 8),
        (2, 2.0, 4.0 / 8, 12.0 / 8),
        (3, 2.0 / 8, 4.0 / 8, 12.0 / 8),
    ],
)
def test_zero_stages_shard_over_data_parallel_ranks(
    stage: int, weights: float, gradients: float, optimizer: float
) -> None:
    """dp=8. ZeRO-3 also holds two gathered blocks at a time: the largest is the embedding, 54,525,952 parameters."""
    p = 155_297_792
    memory = stage_memory(small_gpt(), ParallelLayout(dp=8, zero_stage=stage), BARE)[0]
    gathered = 2 * 54_525_952 * 2.0 if stage == 3 else 0.0
    assert memory.weights == pytest.approx(weights * p + gathered)
    assert memory.gradients == pytest.approx(gradients * p)
    assert memory.optimizer_states == pytest.approx(optimizer * p)


def megatron_22b(**layout) -> tuple[TransformerConfig, ParallelLayout]:
    return load_transformer("megatron_22b"), ParallelLayout(tp=8, pp=4, flash_attention=False, **layout)


# One 22B layer at TP 8, no SP, s=2048, b=1 (Korthikanti eq. 2): s h (10 + 24/8) + 5 a s^2/8 = 331,350,016 bytes;
# the embedding's dropout mask: s h = 12,582,912 bytes; 48 layers on 4 stages: 12 per stage.
LAYER = 331_350_016
EMBEDDING_MASK = 12_582_912


def test_1f1b_first_stage_keeps_pp_micro_batches() -> None:
    """Narayanan et al. SC21 2.2.1: rank 0 keeps 4 micro-batches of its 12 layers:
    4 x (12 x 331,350,016 + 12,582,912)."""
    config, layout = megatron_22b()
    stages = stage_memory(config, layout, BARE)
    assert [stage.in_flight_micro_batches for stage in stages] == [4, 3, 2, 1]
    assert stages[0].activations == pytest.approx(4 * (12 * LAYER + EMBEDDING_MASK))
    assert stages[1].activations == pytest.approx(3 * 12 * LAYER)


def test_interleaved_first_stage_keeps_korthikanti_share() -> None:
    """Korthikanti et al. 4.2.3: rank 0 keeps L (1 + (p - 1)/(p v)) = 48 x (1 + 3/8) = 66 layers' worth = 12 x 5.5."""
    config, layout = megatron_22b(virtual_stages=2)
    assert stage_memory(config, layout, BARE)[0].activations == pytest.approx(5.5 * (12 * LAYER + EMBEDDING_MASK))


def test_few_micro_batches_cap_what_is_in_flight() -> None:
    """Global batch 2 at dp 1 and micro-batch 1: only 2 micro-batches exist; GPipe keeps them all."""
    config, layout = megatron_22b(global_batch=2)
    assert stage_memory(config, layout, BARE)[0].in_flight_micro_batches == 2
    gpipe = dataclasses.replace(layout, global_batch=16, schedule="gpipe")
    assert stage_memory(config, gpipe, BARE)[3].in_flight_micro_batches == 16


def test_full_recompute_keeps_layer_inputs_and_one_layer() -> None:
    """Each layer keeps its 2 s h input (25,165,824 B); backward rebuilds one whole layer (331,350,016 B):
    4 x (12 x 25,165,824 + 12,582,912) + 331,350,016 = 1,589,641,216."""
    config, layout = megatron_22b(recompute="full")
    assert stage_memory(config, layout, BARE)[0].activations == pytest.approx(1_589_641_216)


def test_fp8_adds_weight_copies_and_halves_gemm_inputs() -> None:
    """Transformer Engine under fp8: 2 more bytes per parameter (fp8 weight and transpose); linear inputs at 1 byte."""
    config = small_gpt()
    bf16 = stage_memory(config, ParallelLayout(), BARE)[0]
    fp8 = stage_memory(config, ParallelLayout(precision="fp8"), BARE)[0]
    assert fp8.weights == pytest.approx(bf16.weights * 2)
    # per layer the linear inputs are QKV in (s h), output-projection in (s h), MLP in (s h), MLP out (4 s h):
    # 7 s h elements, 1 byte less each: 8 layers x 7 x 2048 x 1024
    assert bf16.activations - fp8.activations == pytest.approx(8 * 7 * 2048 * 1024)


def test_fp32_settings() -> None:
    """fp32 training: 4-byte weights and activations, no separate master copy: 4 + 4 + 8 = 16 bytes per parameter."""
    settings = settings_for("fp32")
    assert (settings.weight_bytes, settings.master_weight_bytes, settings.activation_bytes) == (4.0, 0.0, 4.0)


def test_llama3_405b_published_layout_fits_only_with_flash_attention() -> None:
    """Llama 3 405B as Meta trained it (Llama Team 2024, table 4 and section 3.3.2): TP 8, PP 16 (7 layers on the first
    and last stage), DP 128, 8K tokens, gradients and optimizer states sharded (FSDP without resharding = ZeRO-2).
    Fits an H100 with FlashAttention; without it the score matrices alone need hundreds of GB (Calculon: 775 GiB)."""
    config = load_transformer("llama3_405b")
    layout = ParallelLayout(tp=8, pp=16, dp=128, micro_batch=1, global_batch=2048, sequence_parallel=True,
                            zero_stage=2, first_stage_layers=7, last_stage_layers=7)
    capacity = load_device("h100_sxm5").memory_capacity_bytes
    assert peak_memory(config, layout).fits(capacity)
    without = peak_memory(config, dataclasses.replace(layout, flash_attention=False))
    assert without.total > 3 * capacity


def test_uneven_stages_follow_the_given_ends() -> None:
    layout = ParallelLayout(pp=16, first_stage_layers=7, last_stage_layers=7)
    assert layout.layers_per_stage(126) == [7] + [8] * 14 + [7]


def test_uneven_ends_with_interleaving_split_each_rank_over_its_chunks() -> None:
    """Virtual stage c x pp + r is chunk c of rank r: the end ranks' 7 layers go 4 then 3, the others' 8 go 4 and 4."""
    layout = ParallelLayout(pp=16, virtual_stages=2, first_stage_layers=7, last_stage_layers=7)
    assert layout.layers_per_virtual_stage(126) == [4] * 16 + [3] + [4] * 14 + [3]
    check_layout(layout, load_transformer("llama3_405b"))  # allowed: every chunk holds a layer
    even = ParallelLayout(pp=4, virtual_stages=3)
    assert even.layers_per_virtual_stage(60) == [5] * 12


def test_describe_names_every_component_and_the_verdict() -> None:
    text = peak_memory(small_gpt(), ParallelLayout()).describe(1e9)
    for name in ("weights", "gradients", "optimizer states", "activations", "communication buffers",
                 "fragmentation allowance", "runtime reserve", "total"):
        assert name in text
    assert text.endswith("does NOT fit in 1.0 GB")


# --- layout rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "layout", "gpus", "message"),
    [
        ("megatron_76b", ParallelLayout(tp=8, pp=4, dp=16), 1024,
         "tp x pp x dp x cp = 8 x 4 x 16 x 1 = 512 does not match 1024 GPUs"),
        ("megatron_76b", ParallelLayout(tp=3), None, "heads (80) of megatron_76b are not divisible by tp (3)"),
        ("llama3_70b", ParallelLayout(tp=16), None, "key/value heads (8) of llama3_70b are not divisible by tp (16)"),
        ("megatron_76b", ParallelLayout(pp=8), None,
         "layers (60) of megatron_76b are not divisible by pp x virtual_stages = 8 x 1 = 8"),
        ("megatron_76b", ParallelLayout(pp=4, virtual_stages=2), None, "= 4 x 2 = 8"),
        ("megatron_76b", ParallelLayout(ep=2, dp=2), None, "ep (2) > 1 needs a mixture-of-experts model"),
        ("mixtral_8x7b", ParallelLayout(ep=3, dp=3), None, "experts (8) of mixtral_8x7b are not divisible by ep (3)"),
        ("mixtral_8x7b", ParallelLayout(ep=4, dp=2), None, "ep (4) must divide dp x cp = 2"),
        ("llama3_8b", ParallelLayout(cp=3), None, "seq_len (8192) is not divisible by 2 x cp = 6"),
        ("llama3_8b", ParallelLayout(sequence_parallel=True), None, "sequence_parallel needs tp > 1"),
        ("llama3_8b", ParallelLayout(virtual_stages=2), None, "virtual_stages > 1 (interleaved 1F1B) needs pp > 1"),
        ("llama3_8b", ParallelLayout(zero_stage=4), None, "zero_stage must be 0, 1, 2 or 3, got 4"),
        ("llama3_8b", ParallelLayout(recompute="some"), None, "recompute must be one of none, selective, full"),
        ("llama3_8b", ParallelLayout(dp=4, micro_batch=2, global_batch=12), None,
         "global_batch (12) must be a positive multiple of micro_batch x dp = 8"),
        ("llama3_405b", ParallelLayout(pp=16, first_stage_layers=6, last_stage_layers=7), None,
         "the other 113 layers of llama3_405b do not split evenly over the remaining 14"),
        ("llama3_8b", ParallelLayout(tp=0), None, "tp must be a whole number >= 1, got 0"),
        ("llama3_405b", ParallelLayout(pp=16, virtual_stages=8, first_stage_layers=7, last_stage_layers=7), None,
         "first_stage_layers/last_stage_layers (7) must hold at least one layer per model chunk (virtual_stages = 8)"),
    ],
)
def test_bad_layout_is_one_line_naming_the_rule(model: str, layout: ParallelLayout, gpus: int | None,
                                                message: str) -> None:
    with pytest.raises(LayoutError) as caught:
        check_layout(layout, load_transformer(model), gpus)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_published_megatron_layout_is_valid() -> None:
    """Narayanan et al. SC21 table 1, 76.1B: TP 8, PP 4, DP 32 on 1024 GPUs."""
    check_layout(ParallelLayout(tp=8, pp=4, dp=32, global_batch=1792), load_transformer("megatron_76b"), 1024)


def test_fp16_keeps_its_gradients_in_fp16_and_reduces_them_so_bf16_in_fp32():
    """Megatron-LM accumulates and reduces in fp32 only with --accumulate-allreduce-grads-in-fp32,
    which it forces for bf16 alone; DeepSpeed's fp32_allreduce is off: 16 bytes a parameter in fp16."""
    from ddlsim.algorithms.parallel_layout import default_grad_reduce_in_fp32

    fp16, bf16 = settings_for("fp16"), settings_for("bf16")
    assert fp16.gradient_bytes == 2.0 and bf16.gradient_bytes == 4.0
    assert fp16.weight_bytes + fp16.gradient_bytes + fp16.master_weight_bytes + fp16.optimizer_state_bytes == 16.0
    assert not default_grad_reduce_in_fp32("fp16")
    assert default_grad_reduce_in_fp32("bf16") and default_grad_reduce_in_fp32("fp8")
    layout = ParallelLayout(tp=1, pp=1, dp=8, precision="fp16", grad_reduce_in_fp32=False)
    assert layout.gradient_bytes == 2.0


def test_every_published_data_parallel_run_fits_in_its_devices_memory() -> None:
    """The runs of published_dev.csv ran, so the memory check must pass them. Before the model kept
    only what each layer's backward reads, it refused 11 of them: TensorFlow's ResNet-152 at 64 images
    on a 16 GB P100 (21.1 GB) and MLPerf's ResNet-50 at 208 images in fp16 on a 16 GB V100 (16.0 GB)."""
    import dataclasses

    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements
    from ddlsim.simulator.calibration.predict import training_scenario

    checked = []
    for row in read_measurements([packaged_published_dev()]).rows:
        if row.kind != "training" or not (row.per_device_batch and row.precision and row.algorithm):
            continue
        scenario = dataclasses.replace(training_scenario(row, None, "analytic"), enforce_memory=True)
        if scenario.is_transformer:
            continue
        scenario.check_memory()
        checked.append((row.id, scenario.memory_needed_bytes() / scenario.device_spec.memory_capacity_bytes))
    assert len(checked) >= 90
    fullest = max(checked, key=lambda item: item[1])
    assert fullest[1] > 0.5  # the check is not vacuous: some run fills more than half of its device
