"""The SimPy training engine: devices as processes, gradient buckets as collectives on the fabric.

Each device is a process: forward, then backward one bucket segment at a time (a segment is
the run of layers whose gradients complete a bucket; its time is the sum of those layers'
roofline times, so a layer costs no event of its own), posting each bucket as it becomes ready,
then it waits for its last all-reduce and runs the optimizer update; the next iteration's
forward follows.

Each bucket's all-reduce is the collective algorithm's schedule run on the fabric. A rank enters
bucket b's collective when the bucket is ready on it and it has finished bucket b-1's collective
(one communication stream per device). Two ways to execute it, with the same result:

* vectorised (default): once every rank has posted the bucket, the round executor computes each
  rank's finish time in one go and the engine schedules it. Every rank's all-reduce result
  depends on every rank's input, so no rank can finish before the last one posted: the engine
  never schedules into the past. If the executor finds that flows may contend, the point is
  re-run message by message.
* message: every transfer of every collective is a SimPy process on the flow network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.simulator.engine.collective_engine import (
    ContentionDetected,
    MessageExecutor,
    TransferLog,
    VectorisedExecutor,
)
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.scenario import Scenario
from ddlsim.simulator.training import ComputeProfile, compute_profile

_CAUSALITY_SLACK_S = 1e-12


@dataclass
class PointTrace:
    """Per-rank timeline of the simulated iterations in the shared trace schema."""

    rows: list[dict] = field(default_factory=list)

    def add(self, rank: int, iteration: int, op: str, start: float, end: float, nbytes: float = 0.0) -> None:
        self.rows.append(
            {
                "rank": rank,
                "iteration": iteration,
                "op": op,
                "peer": -1,
                "bytes": nbytes,
                "start_s": start,
                "end_s": end,
            }
        )


@dataclass
class DesResult:
    iteration_s: float
    comm_s: float  # mean over ranks of summed collective durations per iteration
    path: str  # vectorised or message
    transfers: int
    trace: PointTrace | None


def _succeed_later(event: simpy.Event, with_time: bool = False):
    """A callback that triggers ``event`` (with the current time as value when asked)."""

    def callback(trigger: simpy.Event) -> None:
        event.succeed(trigger.env.now if with_time else None)

    return callback


class TrainingSimulation:
    def __init__(
        self,
        scenario: Scenario,
        nodes: int,
        profile: ComputeProfile | None = None,
        mode: str = "vectorised",
        trace: bool = False,
        compute_scale: np.ndarray | None = None,
        transfer_log: TransferLog | None = None,
    ) -> None:
        self.scenario = scenario
        self.nodes = nodes
        self.ranks = nodes * scenario.devices_per_node
        self.profile = profile or compute_profile(scenario)
        self.mode = mode
        self.algorithm = COLLECTIVE_ALGORITHMS.get(scenario.algorithm)
        self.env = simpy.Environment()
        self.trace = PointTrace() if trace else None
        self.transfer_log = transfer_log  # every transfer of every collective, for timelines
        # per-rank multiplier on compute times (stragglers); ones for a homogeneous cluster
        self.compute_scale = np.ones(self.ranks) if compute_scale is None else np.asarray(compute_scale, dtype=float)
        self.comm_total = np.zeros(self.ranks)
        self._schedule = None
        collective_ranks = self.ranks
        if self.ranks > 1:
            self._schedule = self.algorithm.schedule(
                "allreduce", self.ranks, devices_per_node=scenario.devices_per_node, **scenario.algorithm_options
            )
            # helper ranks (dedicated parameter servers) get devices of their own, on extra nodes
            collective_ranks = self._schedule.ranks
        self.collective_ranks = collective_ranks
        self.fabric = Fabric(scenario.fabric_spec(scenario.nodes_for(collective_ranks)))
        self.vectorised = VectorisedExecutor(self.fabric, self.collective_ranks)
        self.message = MessageExecutor(self.fabric, self.env)
        # per (iteration, bucket): each rank's "ready" event and "done" event
        buckets = len(self.profile.bucket_bytes)
        iterations = scenario.iterations
        self.ready = [
            [[self.env.event() for _ in range(self.ranks)] for _ in range(buckets)] for _ in range(iterations)
        ]
        self.done: list[list[list[simpy.Event]]] = [[[] for _ in range(buckets)] for _ in range(iterations)]
        self.finish_time = np.zeros(self.ranks)

    # --- processes -----------------------------------------------------------------------------
    def device(self, rank: int):
        env, profile, scale = self.env, self.profile, self.compute_scale[rank]
        for iteration in range(self.scenario.iterations):
            start = env.now
            yield env.timeout(profile.forward_s * scale)
            self._record(rank, iteration, "forward", start, env.now)
            backward_start = env.now
            for bucket, segment in enumerate(profile.backward_segments_s):
                if segment:
                    yield env.timeout(segment * scale)
                self.ready[iteration][bucket][rank].succeed(env.now)
            self._record(rank, iteration, "backward", backward_start, env.now)
            if self.ranks > 1:
                for bucket in range(len(profile.bucket_bytes)):
                    yield self.done[iteration][bucket][rank]
            update_start = env.now
            yield env.timeout(profile.update_s * scale)
            self._record(rank, iteration, "update", update_start, env.now)
        self.finish_time[rank] = env.now

    def _previous_done(self, iteration: int, bucket: int) -> list[simpy.Event] | None:
        if bucket > 0:
            return self.done[iteration][bucket - 1]
        if iteration > 0:
            return self.done[iteration - 1][-1]
        return None

    def coordinator(self):
        """Vectorised path: execute each bucket's collective once all ranks have posted it."""
        env = self.env
        # helper ranks (servers) are always ready: their start is their previous finish
        previous = np.zeros(self.collective_ranks)
        workers = self.ranks
        assert self._schedule is not None
        for iteration in range(self.scenario.iterations):
            for bucket, nbytes in enumerate(self.profile.bucket_bytes):
                ready_events = self.ready[iteration][bucket]
                done = [env.event() for _ in range(self.ranks)]
                self.done[iteration][bucket] = done
                yield env.all_of(ready_events)
                ready = np.fromiter((event.value for event in ready_events), dtype=np.float64, count=workers)
                start = previous.copy()
                start[:workers] = np.maximum(ready, previous[:workers])
                finish = self.vectorised.run(self._schedule, nbytes, start, self.transfer_log) if nbytes > 0 else start
                if finish[:workers].min() < env.now - _CAUSALITY_SLACK_S:
                    raise RuntimeError("a rank would finish its all-reduce before the last rank posted it")
                self.comm_total += finish[:workers] - start[:workers]
                for rank in range(self.ranks):
                    delay = max(float(finish[rank]) - env.now, 0.0)
                    env.timeout(delay).callbacks.append(_succeed_later(done[rank]))
                    self._record(rank, iteration, "allreduce", float(start[rank]), float(finish[rank]), nbytes)
                previous = finish

    def _message_collectives(self) -> None:
        """Message path: each bucket's collective as SimPy processes, chained per rank."""
        env = self.env
        assert self._schedule is not None
        for iteration in range(self.scenario.iterations):
            for bucket, nbytes in enumerate(self.profile.bucket_bytes):
                ready = list(self.ready[iteration][bucket])
                for _ in range(self.collective_ranks - self.ranks):  # helper ranks: always ready
                    ready.append(env.event().succeed(0.0))
                previous = self._previous_done(iteration, bucket)
                gates = [
                    env.all_of([ready[r], previous[r]]) if previous else ready[r] for r in range(self.collective_ranks)
                ]
                entered = [env.event() for _ in range(self.ranks)]
                for r in range(self.ranks):
                    gates[r].callbacks.append(_succeed_later(entered[r], with_time=True))
                done = self.message.process(self._schedule, nbytes, gates, self.transfer_log) if nbytes > 0 else gates
                self.done[iteration][bucket] = done
                for r in range(self.ranks):
                    env.process(self._account(r, iteration, nbytes, entered[r], done[r]))

    def _account(self, rank: int, iteration: int, nbytes: float, entered: simpy.Event, done: simpy.Event):
        yield entered
        start = self.env.now
        yield done
        self.comm_total[rank] += self.env.now - start
        self._record(rank, iteration, "allreduce", start, self.env.now, nbytes)

    def _record(self, rank: int, iteration: int, op: str, start: float, end: float, nbytes: float = 0.0) -> None:
        if self.trace is not None:
            self.trace.add(rank, iteration, op, start, end, nbytes)

    # --- driver ----------------------------------------------------------------------------------
    def run(self) -> DesResult:
        env = self.env
        if self.ranks > 1:
            if self.mode == "vectorised":
                env.process(self.coordinator())
            else:
                self._message_collectives()
        for rank in range(self.ranks):
            env.process(self.device(rank))
        env.run()
        iterations = self.scenario.iterations
        transfers = self.vectorised.transfers + self.message.transfers
        return DesResult(
            iteration_s=float(self.finish_time.max()) / iterations,
            comm_s=float(self.comm_total.mean()) / iterations,
            path=self.mode,
            transfers=transfers,
            trace=self.trace,
        )


def simulate_training(
    scenario: Scenario,
    nodes: int,
    profile: ComputeProfile | None = None,
    mode: str = "auto",
    trace: bool = False,
    compute_scale: np.ndarray | None = None,
) -> DesResult:
    """Run the DES for one point; ``auto`` uses the vectorised path and falls back on contention."""
    if mode not in ("auto", "vectorised", "message"):
        raise ValueError(f"unknown DES mode {mode!r}; valid: auto, vectorised, message")
    if mode in ("auto", "vectorised"):
        try:
            return TrainingSimulation(scenario, nodes, profile, "vectorised", trace, compute_scale).run()
        except ContentionDetected:
            if mode == "vectorised":
                raise
    return TrainingSimulation(scenario, nodes, profile, "message", trace, compute_scale).run()
