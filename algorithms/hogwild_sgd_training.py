"""Hogwild SGD (Niu, Recht, Ré, Wright 2011): lock-free updates of shared weights by the threads of
one node; on a cluster, per-node Hogwild with a parameter server (You, Buluç, Demmel SC17).

Each worker rank is a node running ``threads`` Hogwild threads on its shared weights; after every
iteration (one minibatch per thread) it pushes the weight delta accumulated since its last pull to
the servers, which add it first come first served, and pulls the weights. Per iteration: one push
and one pull of model bytes for ``threads`` steps.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm
from ddlsim.algorithms.training_roles import push_pull_exchanges, push_pull_worker, server_loop


class HogwildSgdTraining(TrainingAlgorithm):
    name = "hogwild_sgd"
    family = "asynchronous"
    options = ("servers", "threads")
    uses_servers = True
    hogwild = True
    summary = "per-node Hogwild threads, delta push / weight pull every iteration"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if plan.is_server(comm.rank):
            return server_loop(comm, trainer, plan, push_pull_exchanges(plan, hogwild=True), "delta")
        return push_pull_worker(comm, trainer, plan, hogwild=True)


TRAINING_ALGORITHMS.register("hogwild_sgd")(HogwildSgdTraining())
