"""Sync EASGD (You, Buluç, Demmel SC17): elastic averaging with no master; every worker keeps a
copy of the center and every ``tau`` local steps the workers all-reduce their weights.

With S = sum of the worker weights: x_i -= alpha (x_i - c); c += alpha (S - P c), identical on every
worker (Zhang et al. 2015, eq. 5-6, synchronous form). Per ``tau`` steps and worker: one all-reduce
of model bytes. You et al. report it 5.3x faster than original EASGD on a KNL cluster, the
communication share falling from 87% to 14%.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm


class SyncEasgdTraining(TrainingAlgorithm):
    name = "sync_easgd"
    family = "elastic"
    options = ("tau", "alpha", "collective")
    summary = "elastic averaging through an all-reduce every tau steps"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        tau, alpha = plan.options.tau, plan.options.alpha
        group = plan.workers
        for step in range(1, plan.steps + 1):
            gradient = yield comm.compute(trainer.gradient())
            yield comm.compute(trainer.step(gradient))
            if step % tau == 0:
                total = yield comm.allreduce(trainer.weights(), algorithm=plan.options.collective, group=group)
                yield comm.compute(trainer.elastic_sync(total, len(group), alpha))
        return {"role": "worker"}


TRAINING_ALGORITHMS.register("sync_easgd")(SyncEasgdTraining())
