"""Sync EASGD (You, Buluç, Demmel SC17): elastic averaging with no master; every worker keeps a
copy of the center and every ``tau`` local steps the workers all-reduce their weights.

With S = sum of the worker weights: x_i -= alpha (x_i - c); c += alpha (S - P c), identical on every
worker (Zhang et al. 2015, eq. 5-6, synchronous form). Per ``tau`` steps and worker: one all-reduce
of model bytes. You et al. report it 5.3x faster than original EASGD on a KNL cluster, the
communication share falling from 87% to 14%.

Closed form: every worker runs the same sequence, so ``steps`` local steps plus ``steps // tau``
all-reduces of the weights and elastic moves (exact where nothing contends).
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm, TrainingCosts


class SyncEasgdTraining(TrainingAlgorithm):
    name = "sync_easgd"
    family = "elastic"
    options = ("tau", "alpha", "collective", "collective_options")
    summary = "elastic averaging through an all-reduce every tau steps"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        tau, alpha = plan.options.tau, plan.options.alpha
        group = plan.workers
        for step in range(1, plan.steps + 1):
            gradient = yield comm.compute(trainer.gradient())
            yield comm.compute(trainer.step(gradient))
            if step % tau == 0:
                total = yield comm.allreduce(
                    trainer.weights(), plan.options.collective, group, **plan.options.collective_options
                )
                yield comm.compute(trainer.elastic_sync(total, len(group), alpha))
        return {"role": "worker"}

    def closed_form(self, costs: TrainingCosts, plan: Plan) -> tuple[float, float]:
        options, worker, workers = plan.options, costs.worker, len(plan.workers)
        gradient = worker.gradient()
        local_s = gradient.duration_s + worker.step(gradient.run()).duration_s
        weights = worker.weights()
        allreduce_s = (
            costs.collective_s("allreduce", options.collective, workers, weights.nbytes, options.collective_options)
            if workers > 1
            else 0.0
        )
        exchange_s = allreduce_s + worker.elastic_sync(weights, workers, options.alpha).duration_s
        exchanges = plan.steps // options.tau
        return plan.steps * local_s + exchanges * exchange_s, exchanges * allreduce_s


TRAINING_ALGORITHMS.register("sync_easgd")(SyncEasgdTraining())
