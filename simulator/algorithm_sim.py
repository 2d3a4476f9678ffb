"""Simulating a training algorithm: simulated trainers, placement, and what the run reports.

``simulate_algorithm(AlgorithmSetup(...))`` builds one ``SimTrainer`` per rank (work durations
from the roofline compute profile of ``simulator.training``; payloads size-only), places the ranks
on the scenario's fabric, runs the algorithm's role programs in ``RoleExecutor`` and reports:

* ``time_s``: when the last worker finished its ``updates`` steps; throughput in samples/s;
* per-rank op records (the shared trace schema via ``trace_rows``) and each rank's role;
* server/master utilisation (share of the run not spent waiting in ``recv``), queueing (how long
  pushes waited in the server's mailbox; the most ever waiting) for parameter-server algorithms;
* staleness of every push the servers applied (asynchronous and elastic algorithms);
* the communication share: per worker, time in send, recv and collectives over its run time (mean).

Placement: server (or master) j sits on the first device of node j, replacing a worker there;
workers take every other device in order. ``hybrid_parallel`` puts one pipeline stage per device
of each node. Stragglers (``--stragglers``): a multiplier on every worker compute item, drawn from a
seeded ``numpy.random.Generator`` (one child stream per rank, so the draw does not depend on the
order in which events happen).

Memory-bound bookkeeping (elastic moves, accumulation, assignment) costs arrays x parameters x 4
bytes at the device's STREAM bandwidth, like the optimizer update of ``hardware_models.compute``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddlsim.algorithms.comm import Sized
from ddlsim.algorithms.training_algorithm import (
    TRAINING_ALGORITHMS,
    AlgorithmOptions,
    Plan,
    TrainingAlgorithm,
    TrainingAlgorithmError,
    check_server_placement,
)
from ddlsim.hardware_models.compute import optimizer_update_time_s
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.executor.role_executor import OpRecord, RoleExecutor
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.training import LayerTime, layer_times

STRAGGLER_FORMS = "none, lognormal:SIGMA (per step) or lognormal:SIGMA:device (per device, fixed)"


@dataclass(frozen=True)
class Stragglers:
    """Compute-time noise: multiplier exp(sigma z - sigma^2 / 2), z ~ N(0, 1), mean 1."""

    sigma: float = 0.0
    per_device: bool = False

    @staticmethod
    def parse(text: str | None) -> Stragglers:
        if text in (None, "", "none"):
            return Stragglers()
        match = re.fullmatch(r"lognormal:([0-9.eE+-]+)(:device|:step)?", str(text))
        if not match:
            raise ScenarioError(f"--stragglers: cannot parse {text!r}; allowed: {STRAGGLER_FORMS}")
        sigma = float(match.group(1))
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ScenarioError(f"--stragglers: sigma must be >= 0, got {sigma!r}")
        return Stragglers(sigma, match.group(2) == ":device")

    def sampler(self, rng: np.random.Generator):
        """A function () -> next multiplier for one rank."""
        if self.sigma == 0:
            return lambda: 1.0
        sigma = self.sigma
        if self.per_device:
            fixed = float(np.exp(sigma * rng.standard_normal() - sigma * sigma / 2))
            return lambda: fixed
        return lambda: float(np.exp(sigma * rng.standard_normal() - sigma * sigma / 2))


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
    """The ``Trainer`` of one simulated rank: durations from the compute profile, payloads ``Sized``.

    ``layers`` are the layers this rank computes (all of them, or a pipeline stage's); a server holds
    shard ``shard`` of ``shards`` of the model.
    """

    def __init__(
        self,
        scenario: Scenario,
        layers: tuple[LayerTime, ...],
        momentum: bool,
        sample,
        *,
        shard: int = 0,
        shards: int = 1,
        activation_in_bytes: float = 0.0,
        activation_out_bytes: float = 0.0,
        threads: int = 1,
    ) -> None:
        device = scenario.device_spec
        self.forward_s = math.fsum(layer.forward_s for layer in layers)
        self.backward_s = math.fsum(layer.backward_s for layer in layers)
        self.model_bytes = math.fsum(layer.gradient_bytes for layer in layers)
        parameters = self.model_bytes / scenario.bytes_per_element
        self.update_s = optimizer_update_time_s(parameters, device, scenario.precision, momentum)
        self.array_s = parameters * 4.0 / (device.memory_bandwidth_Bps * device.memory_efficiency)
        self.fraction = 1.0 / shards
        self.shard_bytes = self.model_bytes * self.fraction
        self.activation_in_bytes = activation_in_bytes
        self.activation_out_bytes = activation_out_bytes
        self.sample = sample
        self.iteration = 0
        self.threads = threads

    def _work(self, name: str, duration_s: float, result: Any = None) -> SimWork:
        return SimWork(name, duration_s, result, self.iteration)

    # worker compute
    def gradient(self) -> SimWork:
        self.iteration += 1
        return self._work(
            "gradient", (self.forward_s + self.backward_s) * self.sample(), Sized(self.model_bytes, "gradient")
        )

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

    # pipeline stage
    def forward(self, activation: Any) -> SimWork:
        self.iteration += 1
        return self._work("forward", self.forward_s * self.sample(), Sized(self.activation_out_bytes, "activation"))

    def backward(self, output_gradient: Any) -> SimWork:
        return self._work(
            "backward", self.backward_s * self.sample(), Sized(self.activation_in_bytes, "activation_gradient")
        )

    def activation_like(self, incoming: bool) -> None:
        return None

    def stage_gradient(self) -> Sized:
        return Sized(self.model_bytes, "gradient")


@dataclass(frozen=True)
class AlgorithmSetup:
    """One simulated run: the algorithm and its options on ``scenario``'s hardware with ``nodes`` nodes."""

    algorithm: str
    scenario: Scenario
    nodes: int
    updates: int = 100  # gradient steps per worker (per pipeline for hybrid_parallel)
    options: AlgorithmOptions = field(default_factory=AlgorithmOptions)
    stragglers: str = "none"
    seed: int = 0


@dataclass
class AlgorithmResult:
    algorithm: str
    nodes: int
    workers: int
    servers: int
    updates_per_worker: int
    samples: int  # minibatch samples processed by all workers
    time_s: float
    comm_share: float
    server_utilisation: float  # nan without servers
    server_queue_s: float  # mean wait of a push in a server mailbox (nan without servers)
    server_queue_peak: int
    staleness: np.ndarray
    records: list[OpRecord]
    roles: list[str]
    placement: np.ndarray
    plan: Plan

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples / self.time_s

    @property
    def mean_staleness(self) -> float:
        return float(self.staleness.mean()) if self.staleness.size else 0.0

    def summary(self) -> dict[str, Any]:
        """One tidy row (SI units, suffixed names)."""
        staleness = self.staleness
        return {
            "algorithm": self.algorithm,
            "nodes": self.nodes,
            "workers": self.workers,
            "servers": self.servers,
            "updates_per_worker": self.updates_per_worker,
            "time_s": self.time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "comm_share": self.comm_share,
            "server_utilisation": self.server_utilisation,
            "server_queue_s": self.server_queue_s,
            "server_queue_peak": self.server_queue_peak,
            "staleness_mean": self.mean_staleness,
            "staleness_p50": float(np.percentile(staleness, 50)) if staleness.size else 0.0,
            "staleness_p99": float(np.percentile(staleness, 99)) if staleness.size else 0.0,
            "staleness_max": int(staleness.max()) if staleness.size else 0,
        }

    def trace_rows(self) -> list[dict[str, Any]]:
        """Op records in the shared trace schema (``simulator.records.TRACE_COLUMNS``)."""
        return [
            {
                "rank": r.rank,
                "iteration": r.iteration,
                "op": r.op,
                "peer": r.peer,
                "bytes": r.nbytes,
                "start_s": r.start_s,
                "end_s": r.end_s,
            }
            for r in self.records
        ]

    def staleness_histogram(self) -> list[dict[str, int]]:
        values, counts = np.unique(self.staleness, return_counts=True)
        return [{"staleness": int(v), "count": int(c)} for v, c in zip(values, counts, strict=True)]


def placement_of(algorithm: TrainingAlgorithm, plan: Plan, nodes: int, devices_per_node: int) -> np.ndarray:
    """Device of each rank: server j on the first device of node j, workers on the rest in order."""
    servers = [j * devices_per_node for j in range(len(plan.servers))]
    taken = set(servers)
    workers = [d for d in range(nodes * devices_per_node) if d not in taken]
    return np.asarray(servers + workers, dtype=np.int64)


def _stage_layers(layers: tuple[LayerTime, ...], split: tuple[int, ...]) -> list[tuple[LayerTime, ...]]:
    if sum(split) != len(layers):
        raise TrainingAlgorithmError(
            f"hybrid split {','.join(map(str, split))} covers {sum(split)} layers; the workload has {len(layers)}"
        )
    bounds = np.cumsum((0, *split))
    return [layers[bounds[i] : bounds[i + 1]] for i in range(len(split))]


def balanced_split(layers: tuple[LayerTime, ...], stages: int) -> tuple[int, ...]:
    """Contiguous split with near-equal forward + backward time per stage (each stage >= 1 layer)."""
    if stages > len(layers):
        raise TrainingAlgorithmError(f"hybrid_parallel: {stages} stages but only {len(layers)} layers")
    cost = np.cumsum([layer.forward_s + layer.backward_s for layer in layers])
    cuts = []
    previous = 0
    for stage in range(1, stages):
        cut = int(np.searchsorted(cost, cost[-1] * stage / stages)) + 1
        cut = min(max(cut, previous + 1), len(layers) - (stages - stage))
        cuts.append(cut)
        previous = cut
    bounds = [0, *cuts, len(layers)]
    return tuple(bounds[i + 1] - bounds[i] for i in range(stages))


def _activation_bytes(scenario: Scenario, stage_layers: tuple[LayerTime, ...]) -> float:
    """Bytes of the minibatch's output activation of a stage's last layer."""
    by_name = {layer.name: layer for layer in scenario.workload_spec.layers}
    last = by_name[stage_layers[-1].name]
    return scenario.per_device_batch * last.output_bytes * scenario.bytes_per_element / 4.0


def build_trainers(setup: AlgorithmSetup, algorithm: TrainingAlgorithm, plan: Plan) -> list[SimTrainer]:
    scenario = setup.scenario
    layers = layer_times(scenario)
    rng = np.random.default_rng(setup.seed)
    streams = rng.spawn(plan.ranks)
    stragglers = Stragglers.parse(setup.stragglers)
    trainers = []
    if algorithm.name == "hybrid_parallel":
        split = plan.options.split or balanced_split(layers, plan.options.stages)
        stages = _stage_layers(layers, split)
        for rank in range(plan.ranks):
            stage = rank % plan.options.stages
            incoming = _activation_bytes(scenario, stages[stage - 1]) if stage > 0 else 0.0
            outgoing = _activation_bytes(scenario, stages[stage]) if stage < len(stages) - 1 else 0.0
            trainers.append(
                SimTrainer(
                    scenario,
                    stages[stage],
                    algorithm.momentum,
                    stragglers.sampler(streams[rank]),
                    activation_in_bytes=incoming,
                    activation_out_bytes=outgoing,
                )
            )
        return trainers
    for rank in range(plan.ranks):
        server = plan.is_server(rank)
        sample = (lambda: 1.0) if server else stragglers.sampler(streams[rank])
        shards = len(plan.servers) if server and algorithm.name != "easgd" else 1
        trainers.append(
            SimTrainer(scenario, layers, algorithm.momentum, sample, shard=rank if server else 0, shards=max(shards, 1))
        )
    return trainers


def make_plan(setup: AlgorithmSetup) -> tuple[TrainingAlgorithm, Plan]:
    algorithm = TRAINING_ALGORITHMS.get(setup.algorithm)
    options = setup.options
    dpn = setup.scenario.devices_per_node
    if algorithm.name == "hybrid_parallel":
        options = dataclasses.replace(options, stages=dpn)
    options.validate()
    check_server_placement(algorithm, options, setup.nodes)
    return algorithm, algorithm.plan(setup.nodes * dpn, setup.updates, options)


def simulate_algorithm(setup: AlgorithmSetup) -> AlgorithmResult:
    algorithm, plan = make_plan(setup)
    scenario = setup.scenario
    fabric = Fabric(scenario.fabric_spec(setup.nodes))
    placement = placement_of(algorithm, plan, setup.nodes, scenario.devices_per_node)
    trainers = build_trainers(setup, algorithm, plan)
    executor = RoleExecutor(fabric, placement)
    returns = executor.run(lambda comm: algorithm.program(comm, trainers[comm.rank], plan))

    workers = list(plan.workers)
    servers = list(plan.servers)
    finish = executor.finish_s
    time_s = float(finish[workers].max())
    comm_time = np.zeros(plan.ranks)
    recv_wait = np.zeros(plan.ranks)
    queued: list[float] = []
    for record in executor.records:
        duration = record.end_s - record.start_s
        if record.kind != "compute":
            comm_time[record.rank] += duration
        if record.kind == "recv":
            recv_wait[record.rank] += duration
            if record.rank in servers:
                queued.append(record.queued_s)
    comm_share = float(np.mean(comm_time[workers] / np.maximum(finish[workers], 1e-300)))
    staleness = np.asarray(
        [s for rank in servers for s in (returns.get(rank) or {}).get("staleness", [])], dtype=np.int64
    )
    if servers:
        span = max(time_s, float(finish[servers].max()))
        utilisation = float(np.mean([(finish[s] - recv_wait[s]) / span for s in servers]))
        queue_s = float(np.mean(queued)) if queued else 0.0
        peak = max(executor.mailboxes[s].peak for s in servers)
    else:
        utilisation, queue_s, peak = math.nan, math.nan, 0
    if algorithm.name == "hybrid_parallel":
        pipelines = plan.ranks // plan.options.stages
        samples = pipelines * plan.steps * scenario.per_device_batch
    else:
        samples = len(workers) * plan.steps * scenario.per_device_batch
    roles = ["server" if plan.is_server(r) else "worker" for r in range(plan.ranks)]
    if algorithm.family == "elastic" and servers:
        roles = ["master" if role == "server" else role for role in roles]
    return AlgorithmResult(
        algorithm.name,
        setup.nodes,
        len(workers),
        len(servers),
        plan.steps,
        samples,
        time_s,
        comm_share,
        utilisation,
        queue_s,
        peak,
        staleness,
        executor.records,
        roles,
        placement,
        plan,
    )


def best_hybrid_split(setup: AlgorithmSetup, updates: int = 2) -> tuple[tuple[int, ...], float]:
    """The layer split with the shortest simulated step: coordinate descent from the balanced split,
    moving one boundary by 8, 4, 2, 1 layers while it helps. Returns (split, seconds per step)."""
    layers = layer_times(setup.scenario)
    stages = setup.scenario.devices_per_node

    def cost(split: tuple[int, ...]) -> float:
        options = dataclasses.replace(setup.options, split=split)
        trial = dataclasses.replace(setup, options=options, updates=updates, algorithm="hybrid_parallel")
        return simulate_algorithm(trial).time_s / updates

    best = balanced_split(layers, stages)
    best_s = cost(best)
    if stages == 1:
        return best, best_s
    seen = {best}
    for move in (8, 4, 2, 1):
        improved = True
        while improved:
            improved = False
            for boundary in range(stages - 1):
                for sign in (-1, 1):
                    split = list(best)
                    split[boundary] += sign * move
                    split[boundary + 1] -= sign * move
                    candidate = tuple(split)
                    if min(candidate) < 1 or candidate in seen:
                        continue
                    seen.add(candidate)
                    seconds = cost(candidate)
                    if seconds < best_s:
                        best, best_s, improved = candidate, seconds, True
    return best, best_s
