"""Asynchronous SGD with parameter servers (Downpour-style; Dean et al. 2012, Recht's baseline in
You, Buluç, Demmel SC17).

Each worker, each step: gradient at its (possibly stale) weights, push it to the servers, pull the
weights; the servers apply every gradient as it arrives, first come first served, without waiting
for the other workers. Per step and worker: one push and one pull of model bytes in total (split
over ``servers`` shards). Option ``staleness`` delays the pulled weights artificially (pulls).
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm
from ddlsim.algorithms.training_roles import push_pull_exchanges, push_pull_worker, server_loop


class AsyncSgdTraining(TrainingAlgorithm):
    name = "async_sgd"
    family = "asynchronous"
    options: tuple[str, ...] = ("servers", "staleness")
    uses_servers = True
    summary = "asynchronous parameter server, plain SGD on the server"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if plan.is_server(comm.rank):
            return server_loop(comm, trainer, plan, push_pull_exchanges(plan), "gradient")
        return push_pull_worker(comm, trainer, plan)


TRAINING_ALGORITHMS.register("async_sgd")(AsyncSgdTraining())
