"""The papers' closed forms for GPT training FLOPs, and utilisation, to compare with the exact counts.

The exact per-part counts are in ``transformer_costs``; these are the formulas the published
throughputs were computed with, so that a published TFLOP/s can be turned back into time (and
the other way) the way its authors counted. For the GPT layers of those papers (a 4h MLP, biases
and norms not counted) the exact counts equal these formulas; ``tests/test_transformer_costs.py``
checks that.
"""

from __future__ import annotations


def narayanan_flops_per_iteration(
    batch: int, seq_len: int, layers: int, hidden: int, vocabulary: int, recompute: bool = True
) -> float:
    """FLOPs of one iteration of a GPT model, Narayanan et al. SC21 section 5.1 (eq. 3).

    With full activation recomputation (4 passes over every layer: forward, recomputed forward,
    backward at twice the forward), the paper's count, under which its table 1 throughputs are
    reported: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``. Without recomputation (the 'model
    FLOPs' of MFU, Korthikanti et al. 2022 appendix): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``.
    Example: B=512, s=2048, l=128, h=25600, V=51200 without recompute: 6.4257e18 FLOPs.
    """
    passes = 96.0 if recompute else 72.0
    logits = vocabulary / ((16.0 if recompute else 12.0) * layers * hidden)
    return passes * batch * seq_len * layers * hidden**2 * (1.0 + seq_len / (6.0 * hidden) + logits)


def korthikanti_selective_hardware_flops(batch: int, seq_len: int, layers: int, hidden: int, vocabulary: int) -> float:
    """Hardware FLOPs with selective recomputation as Korthikanti et al. 2022 count them (for HFU).

    ``72 B s l h^2 (1 + s/(3h) + V/(12 l h))``: the attention term counted twice. (Recomputing the
    attention core's forward adds 4 B s^2 h l, a third of that term; the paper's HFU of 57.0%
    against MFU 56.3% for the 1T model matches its formula, not the smaller exact count.)
    """
    return 72.0 * batch * seq_len * layers * hidden**2 * (
        1.0 + seq_len / (3.0 * hidden) + vocabulary / (12.0 * layers * hidden)
    )


def model_flops_utilization(flops_per_iteration: float, iteration_s: float, gpus: int, peak_flops: float) -> float:
    """Fraction of the GPUs' peak (FLOP/s per GPU) that ``flops_per_iteration`` in ``iteration_s`` uses."""
    if not iteration_s > 0 or gpus < 1 or not peak_flops > 0:
        raise ValueError(f"need iteration_s > 0, gpus >= 1, peak_flops > 0; got {iteration_s}, {gpus}, {peak_flops}")
    return flops_per_iteration / (iteration_s * gpus * peak_flops)


def iteration_s_from_throughput(flops_per_iteration: float, flops_per_s_per_gpu: float, gpus: int) -> float:
    """Seconds per iteration implied by a published per-GPU throughput (FLOP/s) counted the same way."""
    if not flops_per_s_per_gpu > 0 or gpus < 1:
        raise ValueError(f"need flops_per_s_per_gpu > 0 and gpus >= 1; got {flops_per_s_per_gpu}, {gpus}")
    return flops_per_iteration / (flops_per_s_per_gpu * gpus)
