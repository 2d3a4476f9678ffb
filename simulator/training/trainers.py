"""Simulated trainers: what a rank's work costs on the modeled device, and the size of what it sends.

A role program talks to its model only through a ``Trainer`` (``algorithms.training_algorithm``).
The simulated one, ``SimTrainer``, hands out ``SimWork`` items whose ``duration_s`` comes from the
roofline compute model of ``hardware_models.compute`` and whose results are size-only payloads
(``Sized``). The same trainer, without noise, gives the closed forms their numbers
(``simulator.closed_form``), so both executors price a step identically.

* Layers: each layer's forward and backward roofline time at the scenario's batch and precision
  (``layer_times``). Memory traffic: forward reads inputs and weights and writes outputs; backward
  reads inputs, output gradients and weights and writes input and weight gradients (about twice
  forward). A calibration profile may pin the run shape's measured compute: every time is then
  multiplied by its ``compute_scale``.
* Gradient buckets: the layers' gradients fused in backward order (``algorithms.gradient_buckets``).
* Memory-bound bookkeeping (elastic moves, accumulation, assignment) costs arrays x parameters x 4
  bytes at the device's STREAM bandwidth, like the optimizer update.
* Stragglers (``Stragglers``): a multiplier on a worker's compute, drawn per step (or once per
  device) from a seeded ``numpy.random.Generator``, one child stream per rank, so the draws do not
  depend on the order in which events happen (the event simulation's ``build_trainers`` draws them:
  this module imports no numpy, nor a transformer's costs unless the workload is one, so that the
  closed form starts at once).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ddlsim.algorithms.comm import Sized
from ddlsim.algorithms.gradient_buckets import StepProfile
from ddlsim.algorithms.training_algorithm import TrainingAlgorithm, TrainingAlgorithmError
from ddlsim.hardware_models.compute import (
    ComputeModel,
    kernels_per_pass,
    layer_time_s,
    optimizer_update_time_s,
    parameter_tensors,
)
from ddlsim.simulator.scenario import Scenario
from ddlsim.simulator.training.costs import GroupCosts
from ddlsim.simulator.training.result import TrainingResult
from ddlsim.simulator.training.setup import TrainingSetup

if TYPE_CHECKING:
    from ddlsim.simulator.training.transformer_trainer import TransformerCosts


@dataclass(frozen=True)
class LayerTime:
    name: str
    forward_s: float
    backward_s: float
    gradient_bytes: float
    tensors: int = 0  # parameter tensors the optimizer updates (one kernel each unless fused)


def compute_model(scenario: Scenario) -> ComputeModel | None:
    """The calibrated compute model of the scenario's device and precision (None: the datasheet's)."""
    if scenario.profile is None:
        return None
    return scenario.profile.compute_model(scenario.device_spec, scenario.precision, scenario.workload)


def layer_times(scenario: Scenario) -> tuple[LayerTime, ...]:
    """Seconds of each layer's forward and backward, and its gradient's wire bytes
    (``hardware_models.compute.layer_time_s``: roofline, batch dependence, fixed cost per kernel;
    the datasheet roofline without a calibrated compute model).

    Memory traffic: forward reads inputs and weights and writes outputs; backward reads inputs,
    output gradients and weights and writes input and weight gradients (about twice forward).
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
        forward, backward = (
            layer_time_s(
                layer.layer_type,
                batch * flops,
                traffic * (activations + weights),
                batch,
                device,
                scenario.precision,
                model,
                kernels_per_pass(layer.layer_type, layer.parameters, backward=is_backward),
            )
            for flops, traffic, is_backward in (
                (layer.forward_flops, 1, False),
                (layer.backward_flops, 2, True),
            )
        )
        out.append(
            LayerTime(
                layer.name,
                forward * scale,
                backward * scale,
                layer.parameters * scenario.bytes_per_element,
                parameter_tensors(layer.layer_type, layer.parameters),
            )
        )
    return tuple(out)


def step_profile(scenario: Scenario, layers: tuple[LayerTime, ...], momentum: bool) -> StepProfile:
    """A worker's step over ``layers``: forward, backward in the scenario's buckets, optimizer update."""
    parameters = math.fsum(layer.gradient_bytes for layer in layers) / scenario.bytes_per_element
    update = optimizer_update_time_s(
        parameters,
        scenario.device_spec,
        scenario.precision,
        momentum,
        model=compute_model(scenario),
        tensors=sum(layer.tensors for layer in layers),
    )
    return StepProfile.of_layers(
        [layer.forward_s for layer in layers],
        [layer.backward_s for layer in layers],
        [layer.gradient_bytes for layer in layers],
        scenario.options.bucket_bytes,
        update,
    )


@dataclass
class SimWork:
    """A compute item of the simulated run: ``duration_s`` seconds, then ``run()`` gives ``result``."""

    name: str
    duration_s: float
    result: Any = None
    iteration: int = 0

    def run(self) -> Any:
        return self.result


class SimTrainer:
    """The ``Trainer`` of one simulated rank: durations from the compute model, payloads ``Sized``.

    ``layers`` are the layers this rank computes (all of them, or a pipeline stage's); a server holds
    shard ``shard`` of ``shards`` of the model.
    """

    def __init__(
        self,
        scenario: Scenario,
        layers: tuple[LayerTime, ...],
        momentum: bool,
        sample=None,
        *,
        shards: int = 1,
        activation_in_bytes: float = 0.0,
        activation_out_bytes: float = 0.0,
    ) -> None:
        device = scenario.device_spec
        self.profile = step_profile(scenario, layers, momentum)
        self.forward_s = self.profile.forward_s
        self.backward_s = math.fsum(layer.backward_s for layer in layers)
        self.model_bytes = math.fsum(layer.gradient_bytes for layer in layers)
        self.update_s = self.profile.update_s
        parameters = self.model_bytes / scenario.bytes_per_element
        self.array_s = parameters * 4.0 / (device.memory_bandwidth_Bps * device.memory_efficiency)
        self.fraction = 1.0 / shards
        self.shard_bytes = self.model_bytes * self.fraction
        self.activation_in_bytes = activation_in_bytes
        self.activation_out_bytes = activation_out_bytes
        self.sample = sample or (lambda: 1.0)
        self.iteration = 0
        self._factor = 1.0  # this step's straggler multiplier, shared by its forward and backward

    def _work(self, name: str, duration_s: float, result: Any = None) -> SimWork:
        return SimWork(name, duration_s, result, max(self.iteration - 1, 0))  # steps count from 0

    # worker compute
    def gradient(self) -> SimWork:
        self.iteration += 1
        return self._work(
            "gradient", (self.forward_s + self.backward_s) * self.sample(), Sized(self.model_bytes, "gradient")
        )

    def buckets(self) -> int:
        return len(self.profile.bucket_bytes)

    def backward_bucket(self, bucket: int) -> SimWork:
        return self._work(
            "backward",
            self.profile.backward_segments_s[bucket] * self._factor,
            Sized(self.profile.bucket_bytes[bucket], "gradient"),
        )

    def empty_bucket(self, bucket: int) -> Sized:
        return Sized(self.profile.bucket_bytes[bucket], "gradient")

    def hogwild(self, threads: int) -> SimWork:
        """``threads`` minibatches in parallel threads on one device: the device's throughput, each
        thread's step (gradient and lock-free update) taking ``threads`` times as long."""
        self.iteration += 1
        per_step = self.forward_s + self.backward_s + self.update_s
        return self._work("hogwild", threads * per_step * self.sample())

    def step(self, gradient: Any, scale: float = 1.0) -> SimWork:
        return self._work("update", self.update_s * self.fraction)

    def weights(self) -> Sized:
        return Sized(self.shard_bytes, "weights")

    def assign(self, weights: Any) -> SimWork:
        return self._work("assign", 2 * self.array_s)

    def delta(self) -> SimWork:
        return self._work("delta", 3 * self.array_s, Sized(self.model_bytes, "delta"))

    def add(self, delta: Any) -> SimWork:
        return self._work("update", 3 * self.array_s * self.fraction)

    def accumulate(self, gradient: Any) -> SimWork:
        return self._work("accumulate", 3 * self.array_s * self.fraction)

    def apply_accumulated(self, count: int) -> SimWork:
        return self._work("update", self.update_s * self.fraction)

    def elastic_center(self, worker_weights: Any, alpha: float) -> SimWork:
        # read x and c, write c, and copy the old c for the reply
        return self._work("elastic_center", 4 * self.array_s, Sized(self.model_bytes, "center"))

    def elastic_worker(self, center: Any, alpha: float) -> SimWork:
        return self._work("elastic", 3 * self.array_s)

    def elastic_sync(self, total: Any, workers: int, alpha: float) -> SimWork:
        return self._work("elastic", 6 * self.array_s)

    def part(self, payload: Any, index: int, count: int) -> Sized:
        return Sized(payload.nbytes / count, payload.what)

    def assign_part(self, payload: Any, index: int, count: int) -> SimWork:
        return self._work("assign", 2 * self.array_s / count)

    def like(self, index: int = 0, count: int = 1) -> None:
        return None

    # a whole model (activation None, no output) or one pipeline stage
    def forward(self, activation: Any) -> SimWork:
        self.iteration += 1
        self._factor = self.sample()
        output = Sized(self.activation_out_bytes, "activation") if self.activation_out_bytes else None
        return self._work("forward", self.forward_s * self._factor, output)

    def backward(self, output_gradient: Any) -> SimWork:
        """A pipeline stage's backward: a draw of its own, as the stage's forward has."""
        return self._work(
            "backward", self.backward_s * self.sample(), Sized(self.activation_in_bytes, "activation_gradient")
        )

    def activation_like(self, incoming: bool) -> None:
        return None

    def stage_gradient(self) -> Sized:
        return Sized(self.model_bytes, "gradient")


# --- hybrid parallelism: contiguous layer ranges per pipeline stage ------------------------------


L = TypeVar("L")  # a layer as the caller holds it (``LayerTime``, a workload's ``Layer``)


def stage_layers(layers: tuple[L, ...], split: tuple[int, ...]) -> list[tuple[L, ...]]:
    """``layers`` cut into consecutive stages of ``split[i]`` layers each."""
    if sum(split) != len(layers):
        raise TrainingAlgorithmError(
            f"hybrid split {','.join(map(str, split))} covers {sum(split)} layers; the workload has {len(layers)}"
        )
    bounds = list(itertools.accumulate((0, *split)))
    return [layers[bounds[i] : bounds[i + 1]] for i in range(len(split))]


def balanced_split(layers: tuple[LayerTime, ...], stages: int) -> tuple[int, ...]:
    """Contiguous split with near-equal forward + backward time per stage (each stage >= 1 layer)."""
    if stages > len(layers):
        raise TrainingAlgorithmError(f"hybrid_parallel: {stages} stages but only {len(layers)} layers")
    cost = list(itertools.accumulate(layer.forward_s + layer.backward_s for layer in layers))
    cuts = []
    previous = 0
    for stage in range(1, stages):
        cut = bisect.bisect_left(cost, cost[-1] * stage / stages) + 1
        cut = min(max(cut, previous + 1), len(layers) - (stages - stage))
        cuts.append(cut)
        previous = cut
    bounds = [0, *cuts, len(layers)]
    return tuple(bounds[i + 1] - bounds[i] for i in range(stages))


def _activation_bytes(scenario: Scenario, layers: tuple[LayerTime, ...]) -> float:
    """Bytes of the minibatch's output activation of the last of ``layers``."""
    by_name = {layer.name: layer for layer in scenario.workload_spec.layers}
    last = by_name[layers[-1].name]
    return scenario.per_device_batch * last.output_bytes * scenario.bytes_per_element / 4.0


def hybrid_stage_trainers(setup: TrainingSetup) -> Callable[[int, Callable[[], float] | None], SimTrainer]:
    """A maker of ``hybrid_parallel`` stage trainers, (stage, sample) -> trainer: the stage's layers of
    the split (the balanced one unless the options name one) and the activations it receives and
    sends. The split is worked out once, however many ranks ask."""
    scenario, algorithm, options = setup.scenario, setup.algorithm, setup.plan.options
    layers = layer_times(scenario)
    stages = stage_layers(layers, options.split or balanced_split(layers, options.stages))
    last = len(stages) - 1
    incoming = [_activation_bytes(scenario, stages[stage - 1]) if stage > 0 else 0.0 for stage in range(last + 1)]
    outgoing = [_activation_bytes(scenario, stages[stage]) if stage < last else 0.0 for stage in range(last + 1)]

    def make(stage: int, sample: Callable[[], float] | None = None) -> SimTrainer:
        return SimTrainer(scenario, stages[stage], algorithm.momentum, sample,
                          activation_in_bytes=incoming[stage], activation_out_bytes=outgoing[stage])  # fmt: skip

    return make


def transformer_costs(setup: TrainingSetup, group_costs: GroupCosts, compute_factor: float = 1.0) -> TransformerCosts:
    """The per-chunk costs of a ``megatron`` setup's ranks, with collectives timed by ``group_costs``;
    ``compute_factor`` scales every rank's compute (the closed form's expected slowest rank)."""
    from ddlsim.simulator.training.transformer_trainer import Collectives, TransformerCosts

    scenario = setup.scenario
    options = setup.plan.options
    comm = Collectives(group_costs.collective_s, group_costs.message_s)
    device = scenario.device_spec
    model = scenario.profile.compute_model(device, scenario.precision, scenario.workload) if scenario.profile else None
    return TransformerCosts(scenario.transformer_spec, options.layout, device, scenario.precision, comm,
                            options.collective, launch_s=model.launch_s if model else 0.0,
                            compute_factor=compute_factor)  # fmt: skip


def layout_figures(scenario: Scenario, plan: Any, breakdown: dict[str, float]) -> dict[str, float]:
    """A transformer layout's per-iteration figures for ``TrainingResult.layout``: the breakdown in
    seconds, the tokens and model FLOPs of an iteration, the device's peak at the precision."""
    from ddlsim.algorithms.megatron_training import micro_batches
    from ddlsim.simulator.workloads.transformer_costs import model_flops_per_sample, transformer_blocks

    layout = plan.options.layout
    sequences = micro_batches(layout) * layout.micro_batch * layout.dp
    blocks = transformer_blocks(scenario.transformer_spec)
    return breakdown | {
        "tokens_per_step": float(sequences * blocks[-1].tokens),
        "model_flops_per_step": sequences * model_flops_per_sample(blocks, layout.frozen_weights),
        "peak_flops": scenario.device_spec.peak_flops_for(scenario.precision),
    }


def transformer_result(
    result: TrainingResult, scenario: Scenario, plan: Any, breakdown: dict[str, float]
) -> TrainingResult:
    """``result`` of a transformer layout with its per-iteration figures (``layout_figures``) under the
    profile's ``transformer_slowdown`` (measured over closed-form iteration time, fitted by ``ddlsim
    calibrate`` on large-model rows; 1 without a profile): the iteration and every part of its
    breakdown scaled by it, so the parts still sum to the iteration."""
    slowdown = scenario.profile.transformer_slowdown if scenario.profile is not None else 1.0
    figures = layout_figures(scenario, plan, {name: seconds * slowdown for name, seconds in breakdown.items()})
    return dataclasses.replace(result, time_s=result.time_s * slowdown, comm_s=result.comm_s * slowdown, layout=figures)


def single_device_step_s(scenario: Scenario, algorithm: TrainingAlgorithm) -> float:
    """One device's step over the whole model with no communication: the base of speedup."""
    return SimTrainer(scenario, layer_times(scenario), algorithm.momentum).profile.compute_s


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
