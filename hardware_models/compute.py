"""Compute cost: roofline time of a layer on a device (pure functions, seconds).

time = max(FLOP / (peak(precision) x efficiency(layer type)), bytes / (memory bandwidth x memory efficiency))

The efficiencies are the device datasheet's defaults until a calibration profile replaces them.
"""

from __future__ import annotations

from ddlsim.hardware_models.catalog import Device

BYTES_PER_ELEMENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}


def roofline_time_s(
    flops: float, memory_bytes: float, device: Device, precision: str, layer_type: str
) -> float:
    """Seconds to run ``flops`` FLOP touching ``memory_bytes`` bytes of memory on ``device``.

    Example: 1e12 FLOP on a 10 TFLOP/s part at efficiency 0.5 -> 0.2 s, unless memory takes longer.
    """
    compute_s = flops / (device.peak_flops_for(precision) * device.efficiency_for(layer_type))
    memory_s = memory_bytes / (device.memory_bandwidth_Bps * device.memory_efficiency)
    return max(compute_s, memory_s)


def optimizer_update_time_s(
    parameters: float, device: Device, precision: str, momentum: bool = True
) -> float:
    """Seconds for an SGD (momentum) update: memory bound, fp32 master weights.

    Reads weights and gradients (and momentum), writes weights (and momentum): 5 fp32 arrays with
    momentum, 3 without; mixed precision also writes the fp16 working copy (2 bytes per weight).
    """
    arrays = 5 if momentum else 3
    memory_bytes = parameters * (4.0 * arrays + (2.0 if precision != "fp32" else 0.0))
    return memory_bytes / (device.memory_bandwidth_Bps * device.memory_efficiency)
