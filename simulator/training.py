"""Synchronous data-parallel SGD: the per-device compute profile and the closed-form iteration.

An iteration on every device: forward over all layers; backward in reverse order, where each
layer's gradient becomes ready as soon as its backward is done; gradients are fused into buckets
(filled in backward order until ``bucket_bytes``) and each bucket's all-reduce starts when the
bucket is complete and the previous bucket's all-reduce is done (one communication stream, as
Horovod and PyTorch DDP); the optimizer update follows the last all-reduce. With ``overlap``
off, every bucket waits for the end of backward.

Closed form (the analytic executor), buckets b = 0..B-1 in readiness order:

    ready_b = forward + backward time up to the last layer of bucket b
    end_b   = max(ready_b, end_{b-1}) + collective_time(bytes_b)
    iteration = max(forward + backward, end_{B-1}) + update
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.compute import (
    ComputeModel,
    kernels_per_pass,
    layer_time_s,
    optimizer_update_time_s,
    parameter_tensors,
)
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.scenario import Scenario


@dataclass(frozen=True)
class LayerTime:
    name: str
    forward_s: float
    backward_s: float
    gradient_bytes: float


@dataclass(frozen=True)
class ComputeProfile:
    """Per-device times (seconds) and gradient buckets (wire bytes) of one iteration."""

    layers: tuple[LayerTime, ...]
    forward_s: float
    backward_segments_s: tuple[float, ...]  # backward time before each bucket is ready, in order
    bucket_bytes: tuple[float, ...]
    update_s: float

    @property
    def backward_s(self) -> float:
        return sum(self.backward_segments_s)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s


def compute_model(scenario: Scenario) -> ComputeModel | None:
    """The calibrated compute model of the scenario's device and precision (None: the datasheet's)."""
    if scenario.profile is None:
        return None
    return scenario.profile.compute_model(scenario.device_spec, scenario.precision, scenario.workload)


def layer_times(scenario: Scenario) -> tuple[LayerTime, ...]:
    """Time of each layer's forward and backward at the scenario's batch and precision
    (``hardware_models.compute.layer_time_s``: roofline, batch dependence, fixed cost per kernel).

    Memory traffic: forward reads inputs and weights and writes outputs; backward reads inputs,
    output gradients and weights and writes input and weight gradients (about twice forward).
    A calibration profile may pin the run shape's measured compute time: every time is then
    multiplied by its ``compute_scale`` (1 without a profile).
    """
    device = scenario.device_spec
    model = compute_model(scenario)
    scale = scenario.compute_scale
    element = scenario.bytes_per_element / 4.0  # tables hold fp32 bytes
    batch = scenario.per_device_batch
    out = []
    for layer in scenario.workload_spec.layers:
        weights = layer.parameters * scenario.bytes_per_element
        activations = batch * (layer.input_bytes + layer.output_bytes) * element
        forward = layer_time_s(
            layer.layer_type,
            batch * layer.forward_flops,
            activations + weights,
            batch,
            device,
            scenario.precision,
            model,
            kernels_per_pass(layer.layer_type, layer.parameters, backward=False),
        )
        backward = layer_time_s(
            layer.layer_type,
            batch * layer.backward_flops,
            2 * (activations + weights),
            batch,
            device,
            scenario.precision,
            model,
            kernels_per_pass(layer.layer_type, layer.parameters, backward=True),
        )
        out.append(
            LayerTime(layer.name, forward * scale, backward * scale, layer.parameters * scenario.bytes_per_element)
        )
    return tuple(out)


def bucket_segments(
    layers: Sequence[LayerTime], bucket_bytes: float, overlap: bool = True
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(backward time before each bucket is ready, bucket bytes), filling buckets in backward order.

    A bucket closes at the first layer that takes it to ``bucket_bytes``; trailing layers without
    parameters add their time as a last, empty bucket. Without overlap every bucket waits for
    the end of backward.
    """
    segments: list[float] = []
    buckets: list[float] = []
    pending_s = 0.0
    pending_bytes = 0.0
    for layer in reversed(layers):
        pending_s += layer.backward_s
        pending_bytes += layer.gradient_bytes
        if pending_bytes >= bucket_bytes:
            segments.append(pending_s)
            buckets.append(pending_bytes)
            pending_s = pending_bytes = 0.0
    if pending_bytes > 0 or not buckets:
        segments.append(pending_s)
        buckets.append(pending_bytes)
    elif pending_s > 0:  # layers without parameters at the front of the network
        segments.append(pending_s)
        buckets.append(0.0)
    if not overlap:
        total = sum(segments)
        segments = [total] + [0.0] * (len(segments) - 1)
    return tuple(segments), tuple(buckets)


def compute_profile(scenario: Scenario) -> ComputeProfile:
    layers = layer_times(scenario)
    segments, buckets = bucket_segments(layers, scenario.bucket_bytes, scenario.overlap)
    workload = scenario.workload_spec
    tensors = sum(parameter_tensors(layer.layer_type, layer.parameters) for layer in workload.layers)
    model = compute_model(scenario)
    device = scenario.device_spec
    update = optimizer_update_time_s(workload.parameter_count, device, scenario.precision, model=model, tensors=tensors)
    return ComputeProfile(layers, sum(layer.forward_s for layer in layers), segments, buckets, update)


def analytic_iteration(profile: ComputeProfile, collective_s) -> tuple[float, float]:
    """(iteration_s, summed collective time) from the closed form; ``collective_s(bytes)`` gives seconds."""
    ready = profile.forward_s
    end = -float("inf")
    comm = 0.0
    for segment, nbytes in zip(profile.backward_segments_s, profile.bucket_bytes, strict=True):
        ready += segment
        if nbytes > 0:
            duration = collective_s(nbytes)
            end = max(ready, end) + duration
            comm += duration
    return max(ready, end) + profile.update_s, comm


def with_interference(iteration_s: float, compute_s: float, comm_s: float, factor: float) -> float:
    """Iteration time when overlapped communication slows compute down by ``factor``.

    The communication hidden under compute (comm_s minus the exposed part iteration_s - compute_s)
    costs ``factor`` x its duration in extra compute time: memory and PCIe contention between
    kernels and transfers, a first-order form of the slowdowns reported by Rashidi et al. (ISCA
    2022). factor = 0 (no profile) leaves the iteration unchanged.
    """
    if factor <= 0:
        return iteration_s
    hidden = max(comm_s - max(iteration_s - compute_s, 0.0), 0.0)
    return iteration_s + factor * hidden


def analytic_point(scenario: Scenario, nodes: int, profile: ComputeProfile | None = None) -> dict[str, float]:
    profile = profile or compute_profile(scenario)
    ranks = nodes * scenario.devices_per_node
    algorithm = COLLECTIVE_ALGORITHMS.get(scenario.algorithm)
    if ranks == 1:
        return {"iteration_s": profile.compute_s, "comm_s": 0.0}
    options = dict(scenario.algorithm_options)
    schedule_ranks = algorithm.schedule("allreduce", ranks, devices_per_node=scenario.devices_per_node, **options).ranks
    costs = Fabric(scenario.fabric_spec(scenario.nodes_for(schedule_ranks))).fabric_costs()

    def collective_s(nbytes: float) -> float:
        return algorithm.closed_form_s("allreduce", ranks, nbytes, costs, **options)

    iteration, comm = analytic_iteration(profile, collective_s)
    return {"iteration_s": iteration, "comm_s": comm}
