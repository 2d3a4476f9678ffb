"""Run one scenario point in the event simulation: the algorithm's role programs on the modeled fabric.

``run_des(scenario, nodes)`` plans the roles and places the ranks (``simulator.training.setup``),
gives each rank its simulated trainer (``simulator.training.trainers``), runs every rank's role
program in the ``RoleExecutor`` and summarises the run (``TrainingResult``). ``mode="auto"`` runs the
collectives a round at a time and re-runs the point message by message when the fast path cannot
prove its times exact (``ContentionDetected``); where a collective met another still in flight
(``ConcurrentCollectives``), it first runs the round path again timing such pairs together, and
where it could not prove a collective otherwise (``FluidMayApply``: its own flows contend, or may
meet earlier ones), again timing such collectives by the fluid path (each on its own, where none
of its flows meets one from before). ``vectorised`` or ``message`` force one path. The result's
``path`` says which ran: ``vectorised``, ``vectorised+fluid`` (some collectives went the fluid
path) or ``message``.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ddlsim.simulator.engine.collective_engine import ContentionDetected, TransferLog
from ddlsim.simulator.engine.fabric import Fabric
from ddlsim.simulator.executor.role_executor import (
    MODES,
    ConcurrentCollectives,
    FluidMayApply,
    OpRecord,
    RoleExecutor,
)
from ddlsim.simulator.scenario import Scenario, ScenarioError, Stragglers
from ddlsim.simulator.training.costs import GroupCosts
from ddlsim.simulator.training.result import TrainingResult
from ddlsim.simulator.training.setup import TrainingSetup, setup_of
from ddlsim.simulator.training.trainers import (
    SimTrainer,
    hybrid_stage_trainers,
    layer_times,
    single_device_step_s,
    transformer_costs,
    transformer_result,
)
from ddlsim.simulator.training.transformer_trainer import TransformerTrainer


def build_trainers(setup: TrainingSetup) -> list[Any]:
    """One trainer per rank of the setup's plan: workers and helpers hold the whole model (a hybrid
    stage its layers), servers their shard (the EASGD master the whole center); a transformer
    layout's ranks their pipeline stage's chunks."""
    scenario, algorithm, plan = setup.scenario, setup.algorithm, setup.plan
    streams = np.random.default_rng(scenario.seed).spawn(plan.ranks)
    stragglers = Stragglers.parse(scenario.stragglers)
    workers = len(plan.workers)  # a synchronous step waits for the slowest of them
    if scenario.is_transformer:
        costs = transformer_costs(setup, GroupCosts(scenario.fabric_spec(setup.fabric_nodes)))
        return [
            TransformerTrainer(costs, rank, stragglers.sampler(streams[rank], workers)) for rank in range(plan.ranks)
        ]
    if algorithm.name == "hybrid_parallel":
        stage_trainer = hybrid_stage_trainers(setup)
        return [
            stage_trainer(rank % plan.options.stages, stragglers.sampler(streams[rank], workers))
            for rank in range(plan.ranks)
        ]
    layers = layer_times(scenario)
    shards = max(len(plan.servers), 1)
    return [
        SimTrainer(scenario, layers, algorithm.momentum, shards=shards)
        if plan.is_server(rank)
        else SimTrainer(scenario, layers, algorithm.momentum, stragglers.sampler(streams[rank], workers))
        for rank in range(plan.ranks)
    ]


@dataclass
class DesRun:
    setup: TrainingSetup
    result: TrainingResult
    records: list[OpRecord] | None  # every operation of every rank, when asked for
    transfer_log: TransferLog | None  # the traced ranks' transfers (and counts of all), when asked for
    finish_s: np.ndarray  # when each rank finished its role program


# The event simulation keeps millions of live objects (events, processes, per-rank state) and makes
# many more short-lived ones; at CPython's default thresholds (700, 10, 10) the collector's full
# passes over the live ones took 45 % of hybrid_parallel's 4096-node run (38 s -> 20 s) and 44 % of
# sync_sgd's (29 s -> 17 s; peak memory 104 -> 139 MB and unchanged). Cycles are still collected.
DES_GC_THRESHOLD = (100_000, 50, 100)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect garbage less often while an event simulation runs (``DES_GC_THRESHOLD``); the
    caller's thresholds come back afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(*DES_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)


TRACED_SENDERS = 64  # ranks whose transfers a transfer log keeps (a trace draws a few ranks' sends)
NOTE_RANKS = 64  # from this many ranks on, re-running a point message by message takes long enough to say so


def fallback_note(ranks: int, reason: str, closed_form: bool = True) -> str:
    """What a user is told when a point is re-run message by message, and why (``closed_form``: the
    algorithm has one, which ``--executor analytic`` gives at once)."""
    instead = "--executor analytic gives the closed form at once" if closed_form else "fewer nodes run faster"
    return (
        f"ddlsim: note: {ranks:,} ranks: the round-at-a-time path cannot prove this point's times exact "
        f"({reason}); re-running it message by message, which takes longer: its events grow with ranks x "
        f"messages ({instead})"
    )


def note_on_stderr(ranks: int, reason: str, closed_form: bool = True) -> None:
    """The default ``run_des`` notice: on stderr, from ``NOTE_RANKS`` ranks on (smaller points re-run fast)."""
    if ranks >= NOTE_RANKS:
        print(fallback_note(ranks, reason, closed_form), file=sys.stderr, flush=True)


@fewer_collections()  # the set-up (routes, trainers) and every attempt
def run_des(
    scenario: Scenario,
    nodes: int,
    mode: str = "auto",
    *,
    record: bool = False,
    log_transfers: bool = False,
    traced_senders: int = TRACED_SENDERS,
    note: Callable[[int, str, bool], None] = note_on_stderr,
) -> DesRun:
    """Simulate one point. ``record``: every operation of every rank; ``log_transfers``: the
    transfers sent by fabric ranks below ``traced_senders`` (and counts of all of them); ``note``
    is told (ranks, reason, whether the algorithm has a closed form) before the point is re-run
    message by message."""
    if mode not in ("auto", *MODES):
        raise ScenarioError(f"unknown DES mode {mode!r}; valid: auto, {', '.join(MODES)}")
    setup = setup_of(scenario, nodes)
    fabric = Fabric(scenario.fabric_spec(setup.fabric_nodes))
    attempts = [(current, False, False) for current in (MODES if mode == "auto" else (mode,))]
    placement = setup.placement()
    while attempts:
        current, concurrent, fluid = attempts.pop(0)
        log = TransferLog(max_sender=traced_senders) if log_transfers else None
        executor = RoleExecutor(
            fabric, placement, current, record=record, transfer_log=log, concurrent=concurrent, fluid=fluid
        )
        trainers = build_trainers(setup)
        executor.route_peers(setup.algorithm.peers(setup.plan))
        try:
            returns = executor.run(partial(_program, setup, trainers))
        except ConcurrentCollectives:
            attempts.insert(0, (current, True, fluid))  # the round path again, timing such collectives together
            continue
        except FluidMayApply:
            attempts.insert(0, (current, concurrent, True))  # again, timing such collectives by the fluid path
            continue
        except ContentionDetected as detected:
            if not attempts:
                raise
            note(executor.ranks, str(detected), setup.algorithm.has_closed_form)
            continue
        bucketed = "bucket_bytes" in setup.algorithm.options and not scenario.is_transformer  # sync SGD's
        buckets = trainers[setup.plan.workers[0]].buckets() if bucketed else 0
        path = f"{current}+fluid" if executor.fluid_collectives else current
        result = summarise(setup, executor, returns, buckets, path)
        return DesRun(setup, result, executor.records, log, executor.finish_s)
    raise AssertionError("unreachable")


def _program(setup: TrainingSetup, trainers: list, comm: Any) -> Any:
    return setup.algorithm.program(comm, trainers[comm.rank], setup.plan)


def summarise(setup: TrainingSetup, executor: RoleExecutor, returns: dict, buckets: int, path: str) -> TrainingResult:
    """The run's figures from the executor's per-rank accumulators."""
    scenario, plan, algorithm = setup.scenario, setup.plan, setup.algorithm
    workers, servers = list(plan.workers), list(plan.servers)
    finish, stats = executor.finish_s, executor.stats
    time_s = float(finish[workers].max())
    comm_share = float(np.mean(stats.blocked_s[workers] / np.maximum(finish[workers], 1e-300)))
    result = TrainingResult(
        algorithm=algorithm.name,
        collective=plan.options.collective if "collective" in algorithm.options else "",
        nodes=setup.nodes,
        devices=setup.nodes * scenario.devices_per_node,
        workers=len(workers),
        servers=len(servers),
        steps=plan.steps,
        samples_per_step=algorithm.samples_per_step(plan, scenario.per_device_batch),
        time_s=time_s,
        compute_s=single_device_step_s(scenario, algorithm) if not scenario.is_transformer else math.nan,
        comm_s=float(stats.comm_s[workers].mean()) / plan.steps,
        comm_share=comm_share,
        buckets=buckets,
        executor="des",
        path=path,
        staleness=np.zeros(0, dtype=np.int64),  # the servers' pushes below, where there are servers
        transfers=executor.transfers,
    )
    if scenario.is_transformer:
        last = int(np.argmax(finish))
        steps = plan.steps
        breakdown = {f"{name}_s": float(seconds[last]) / steps for name, seconds in stats.parts.items()}
        breakdown["pipeline_wait_s"] = float(stats.recv_wait_s[last]) / steps
        breakdown["dp_wait_s"] = float(stats.wait_s[last]) / steps
        result = transformer_result(result, scenario, plan, breakdown)
    if servers:
        span = max(time_s, float(finish[servers].max()))
        received = int(stats.received[servers].sum())
        result = dataclasses.replace(
            result,
            server_utilisation=float(np.mean([(finish[s] - stats.recv_wait_s[s]) / span for s in servers])),
            server_queue_s=float(stats.queued_s[servers].sum()) / received if received else math.nan,
            server_queue_peak=max(executor.mailboxes[s].peak for s in servers),
            staleness=np.asarray(
                [value for s in servers for value in (returns.get(s) or {}).get("staleness", [])], dtype=np.int64
            ),
        )
    return result


def best_hybrid_split(scenario: Scenario, nodes: int, updates: int = 2) -> tuple[tuple[int, ...], float]:
    """The hybrid_parallel layer split with the shortest simulated step: coordinate descent from the
    balanced split, moving one boundary by 8, 4, 2, 1 layers while it helps. (split, seconds per step).
    A split whose largest stage does not fit the device's memory is skipped (unless the scenario
    does not enforce memory)."""
    from ddlsim.simulator.training.trainers import balanced_split, layer_times

    stages = scenario.devices_per_node

    def cost(split: tuple[int, ...]) -> float:
        options = dataclasses.replace(scenario.options, split=split)
        try:  # the trial scenario checks its stages' memory when it is built
            trial = dataclasses.replace(scenario, options=options, updates=updates, algorithm="hybrid_parallel")
        except ScenarioError:
            if split == start:
                raise
            return math.inf
        return run_des(trial, nodes).result.iteration_s

    best = start = balanced_split(layer_times(scenario), stages)
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
