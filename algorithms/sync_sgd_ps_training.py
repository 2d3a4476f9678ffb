"""Synchronous SGD through parameter servers, the model sharded over ``servers`` servers
(Li et al., "Scaling distributed machine learning with the parameter server", OSDI 2014).

Every step each worker pushes shard j of its gradient to server j and pulls shard j of the new
weights; server j waits for all P workers, applies the mean gradient, then answers each worker.
Per step and worker: ``servers`` pushes and ``servers`` pulls of model_bytes / servers each.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import ANY_SOURCE, RoleProgram
from ddlsim.algorithms.training_algorithm import (
    TAG_PULL,
    TAG_PUSH,
    TRAINING_ALGORITHMS,
    Plan,
    Trainer,
    TrainingAlgorithm,
)
from ddlsim.algorithms.training_roles import push_pull_worker


class SyncSgdPsTraining(TrainingAlgorithm):
    name = "sync_sgd_ps"
    family = "synchronous"
    options = ("servers",)
    uses_servers = True
    summary = "synchronous parameter servers (sharded), every step"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if not plan.is_server(comm.rank):
            return push_pull_worker(comm, trainer, plan)
        return self._server(comm, trainer, plan)

    def _server(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        shard, count = comm.rank, len(plan.servers)
        workers = len(plan.workers)
        for _ in range(plan.steps):
            for _ in range(workers):
                _source, gradient = yield comm.recv(ANY_SOURCE, TAG_PUSH, like=trainer.like(shard, count))
                yield comm.compute(trainer.accumulate(gradient))
            yield comm.compute(trainer.apply_accumulated(workers))
            for worker in plan.workers:
                yield comm.send(worker, trainer.weights(), TAG_PULL)
        return {"role": "server", "staleness": [], "updates": plan.steps}


TRAINING_ALGORITHMS.register("sync_sgd_ps")(SyncSgdPsTraining())
