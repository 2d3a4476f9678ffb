"""Synchronous SGD with an all-reduce (the data-parallel baseline; Goyal et al. 2017, Horovod, PyTorch DDP).

Every worker, every step: forward; backward in gradient buckets, each bucket's all-reduce started as
soon as it is ready and overlapping the rest of backward (``algorithms.gradient_buckets``; option
``overlap`` off: after backward); the update with the mean gradient once every bucket is reduced.
Per step and worker: one all-reduce per bucket (model bytes in all, any registered collective
algorithm or library selector: option ``collective``), no point-to-point message.

A collective whose schedule has relay ranks of its own (``parameter_server`` with dedicated servers)
gets them as helper ranks after the workers; they join every bucket's all-reduce with an empty buffer.

Closed form: ``gradient_buckets.step_time_s`` per step (exact where nothing contends, as the tests
hold the DES to).
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.collective import helper_ranks
from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.gradient_buckets import backward_with_allreduce, serve_allreduce, step_time_s
from ddlsim.algorithms.training_algorithm import (
    TRAINING_ALGORITHMS,
    AlgorithmOptions,
    Plan,
    Trainer,
    TrainingAlgorithm,
    TrainingCosts,
)


class SyncSgdTraining(TrainingAlgorithm):
    name = "sync_sgd"
    family = "synchronous"
    options = ("collective", "collective_options", "bucket_bytes", "overlap")
    summary = "all-reduce of the gradient every step, in buckets overlapping backward"
    momentum = True  # SGD with momentum, as Goyal et al. and PyTorch DDP's examples train
    default_updates = 1

    def plan(
        self, ranks: int, steps: int, options: AlgorithmOptions | None = None, devices_per_node: int = 1
    ) -> Plan:
        plan = super().plan(ranks, steps, options, devices_per_node)
        options = plan.options
        helpers = helper_ranks(options.collective, ranks, **options.collective_options) if ranks > 1 else 0
        if not helpers:
            return plan
        return Plan(
            plan.algorithm, ranks + helpers, range(0), plan.workers, steps, plan.options, range(ranks, ranks + helpers)
        )

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        options = plan.options
        group = plan.workers
        collective = options.collective, dict(options.collective_options)
        if plan.is_helper(comm.rank):
            return serve_allreduce(comm, trainer, group, collective[0], plan.steps, plan.helpers, collective[1])
        return self._worker(comm, trainer, plan)

    def _worker(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        options = plan.options
        group = plan.workers
        for _ in range(plan.steps):
            yield comm.compute(trainer.forward(None))
            totals = yield from backward_with_allreduce(
                comm, trainer, group, options.collective, options.overlap, plan.helpers,
                dict(options.collective_options),
            )  # fmt: skip
            yield comm.compute(trainer.step(totals, 1.0 / len(group)))
        return {"role": "worker"}

    def closed_form(self, costs: TrainingCosts, plan: Plan) -> tuple[float, float]:
        options = plan.options
        workers = len(plan.workers)
        profile = costs.step if options.overlap else costs.step.without_overlap()

        def collective_s(nbytes: float) -> float:
            if workers == 1:
                return 0.0
            return costs.collective_s("allreduce", options.collective, workers, nbytes, options.collective_options)

        step_s, comm_s = step_time_s(profile, collective_s)
        return plan.steps * step_s, plan.steps * comm_s


TRAINING_ALGORITHMS.register("sync_sgd")(SyncSgdTraining())
