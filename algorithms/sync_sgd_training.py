"""Synchronous SGD with an all-reduce (the data-parallel baseline; Goyal et al. 2017, Horovod).

Every worker, every step: gradient of its minibatch; all-reduce of the gradient (model bytes, any
registered collective algorithm: option ``collective``); step with the mean gradient. Per step and
worker: one all-reduce of the gradient, no point-to-point message.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm


class SyncSgdTraining(TrainingAlgorithm):
    name = "sync_sgd"
    family = "synchronous"
    options = ("collective",)
    summary = "all-reduce of the gradient every step"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        group = plan.workers
        for _ in range(plan.steps):
            gradient = yield comm.compute(trainer.gradient())
            total = yield comm.allreduce(gradient, algorithm=plan.options.collective, group=group)
            yield comm.compute(trainer.step(total, 1.0 / len(group)))
        return {"role": "worker"}


TRAINING_ALGORITHMS.register("sync_sgd")(SyncSgdTraining())
