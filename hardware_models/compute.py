"""Compute cost: the time of one layer pass on a device (pure functions, seconds).

The entry point for the training model is ``layer_time_s`` (one layer's forward or backward pass
over a whole per-device batch) with ``optimizer_update_time_s`` for the update::

    time = max(FLOP / (peak(precision) x efficiency(layer type) x batch / (batch + half_batch)),
               bytes / (memory bandwidth x memory efficiency),
               kernels x launch_s)

* the roofline (compute or memory bound) with the device's efficiencies;
* a batch-size dependence: small per-device batches do not fill the device (efficiency halves at
  ``half_batch`` samples);
* the fixed cost of the framework per kernel (``launch_s``: kernel launch plus the framework's
  per-operation dispatch, e.g. Python or the TensorFlow executor), which makes small batches slow.
  It is a floor, not an addition: a device runs kernels asynchronously, so the host's issue time
  hides behind any kernel that runs longer than it (the launch-bound regime of small batches).

Without a calibration the ``ComputeModel`` is the datasheet's (``ComputeModel.from_datasheet``:
its efficiencies, no batch dependence, no fixed cost), which is the plain roofline. A calibration
profile supplies a fitted model per device and precision (``Profile.compute_model``), also for
devices without any measurement of their own (efficiencies fitted across devices, per
architecture generation, layer kind and precision: ``simulator/calibration/compute_fit.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddlsim.hardware_models.catalog import Device

BYTES_PER_ELEMENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}

# Architecture generations, found by the name the datasheet's description gives the part (the
# vendor's family name, NVIDIA's chip prefix: GK Kepler, GM Maxwell, GP Pascal, GV Volta, GA
# Ampere, GH Hopper, or the product's generation letter: K80, M40, P100, V100, A100, H100).
ARCHITECTURES = (
    ("kepler", ("kepler", "gk1", "gk2", "k20", "k40", "k80")),
    ("maxwell", ("maxwell", "gm2", "m40")),
    ("pascal", ("pascal", "gp1", "p100", "p40")),
    ("volta", ("volta", "gv1", "v100")),
    ("ampere", ("ampere", "ga1", "a100")),
    ("hopper", ("hopper", "gh1", "h100")),
    ("knights_landing", ("knights landing",)),
    ("skylake", ("skylake", "cascade lake")),
    ("cooper_lake", ("cooper lake",)),
)

# The layer types of the workload tables (simulator/workloads), and the kinds that share an
# efficiency: convolutions, matrix products, and everything else (the FLOP of normalisations,
# activations and pooling, which are usually memory bound anyway).
LAYER_TYPES = (
    "conv", "linear", "embedding", "attention", "batchnorm", "layernorm", "relu", "gelu", "tanh", "pool", "add",
    "concat", "dropout", "softmax", "flatten",
)  # fmt: skip
LAYER_KINDS = ("conv", "matmul", "other")
_MATMUL = ("linear", "embedding", "attention")


def architecture(device: Device) -> str:
    """The device's architecture generation (``ARCHITECTURES``), or its kind when none is named."""
    text = device.description.lower()
    for name, words in ARCHITECTURES:
        if any(word in text for word in words):
            return name
    return device.kind


def layer_kind(layer_type: str) -> str:
    """``conv``, ``matmul`` (linear, embedding, attention) or ``other``."""
    if layer_type == "conv":
        return "conv"
    return "matmul" if layer_type in _MATMUL else "other"


def precision_class(device: Device, precision: str) -> str:
    """The device kind and ``reduced`` when ``precision`` runs at a faster reduced-precision peak
    of ``device`` (Tensor Cores, AVX-512 BF16), else ``fp32`` (parts without a fast path compute in
    fp32): ``gpu_fp32``, ``gpu_reduced``, ``cpu_reduced``, ..."""
    fast = precision != "fp32" and device.peak_flops.get(precision, 0.0) > device.peak_flops["fp32"]
    return f"{device.kind}_{'reduced' if fast else 'fp32'}"


def kernels_per_pass(layer_type: str, parameters: float, backward: bool) -> int:
    """Kernels a framework launches for one layer pass: one forward; backward two for a layer with
    weights (gradient of the input and of the weights), one otherwise."""
    return 2 if backward and parameters > 0 else 1


def parameter_tensors(layer_type: str, parameters: float) -> int:
    """Parameter tensors of a layer (the optimizer updates each with its own kernel unless fused):
    weight and bias for linear layers and normalisations, the weight alone otherwise."""
    if parameters <= 0:
        return 0
    return 2 if layer_type in ("linear", "batchnorm", "layernorm") else 1


@dataclass(frozen=True)
class ComputeModel:
    """How one device runs layers at one precision (SI units).

    ``efficiency``: fraction of the precision's peak reached by compute-bound layers at large
    batch, per layer type (``default_efficiency`` for types not listed); ``memory_efficiency``:
    fraction of the memory bandwidth reached by memory-bound layers; ``half_batch``: samples per
    device at which compute efficiency is half its large-batch value (0 = no batch dependence);
    ``launch_s``: fixed seconds per kernel.
    """

    default_efficiency: float
    memory_efficiency: float
    efficiency: Mapping[str, float] = field(default_factory=dict)
    half_batch: float = 0.0
    launch_s: float = 0.0

    @classmethod
    def from_datasheet(cls, device: Device) -> ComputeModel:
        """The datasheet's efficiencies, no batch dependence and no fixed cost: the plain roofline."""
        return cls(device.compute_efficiency, device.memory_efficiency, dict(device.layer_efficiency))

    def efficiency_for(self, layer_type: str) -> float:
        return self.efficiency.get(layer_type, self.default_efficiency)


def layer_time_s(
    layer_type: str,
    flops: float,
    memory_bytes: float,
    batch: float,
    device: Device,
    precision: str,
    model: ComputeModel | None = None,
    kernels: int = 1,
) -> float:
    """Seconds for one pass of one layer over a per-device batch of ``batch`` samples.

    ``flops`` and ``memory_bytes`` are the whole batch's FLOP and memory traffic (bytes);
    ``kernels`` the kernels of this pass (``kernels_per_pass``); ``model`` the device's compute
    model at ``precision`` (None: ``ComputeModel.from_datasheet(device)``).

    Example: 1e12 FLOP at batch 64 on a 10 TFLOP/s part at efficiency 0.5, half_batch 0 and no
    launch cost -> 0.2 s, unless memory takes longer; with half_batch 64 -> 0.4 s; 1e6 FLOP with 3
    kernels of 10 us -> 30 us (launch bound).
    """
    model = model or ComputeModel.from_datasheet(device)
    efficiency = model.efficiency_for(layer_type)
    if model.half_batch > 0:
        efficiency *= batch / (batch + model.half_batch)
    compute_s = flops / (device.peak_flops_for(precision) * efficiency)
    memory_s = memory_bytes / (device.memory_bandwidth_Bps * model.memory_efficiency)
    return max(compute_s, memory_s, kernels * model.launch_s)


def roofline_time_s(flops: float, memory_bytes: float, device: Device, precision: str, layer_type: str) -> float:
    """Seconds to run ``flops`` FLOP touching ``memory_bytes`` bytes on ``device`` with the datasheet's
    efficiencies (``layer_time_s`` with the datasheet model and no fixed cost).

    Example: 1e12 FLOP on a 10 TFLOP/s part at efficiency 0.5 -> 0.2 s, unless memory takes longer.
    """
    return layer_time_s(layer_type, flops, memory_bytes, 1.0, device, precision, None, kernels=0)


def optimizer_update_time_s(
    parameters: float,
    device: Device,
    precision: str,
    momentum: bool = True,
    model: ComputeModel | None = None,
    tensors: int = 0,
) -> float:
    """Seconds for an SGD (momentum) update: memory bound, fp32 master weights.

    Reads weights and gradients (and momentum), writes weights (and momentum): 5 fp32 arrays with
    momentum, 3 without; mixed precision also writes the fp16 working copy (2 bytes per weight).
    ``tensors`` parameter tensors each need one kernel of at least ``model.launch_s``.
    """
    model = model or ComputeModel.from_datasheet(device)
    arrays = 5 if momentum else 3
    memory_bytes = parameters * (4.0 * arrays + (2.0 if precision != "fp32" else 0.0))
    return max(memory_bytes / (device.memory_bandwidth_Bps * model.memory_efficiency), tensors * model.launch_s)
