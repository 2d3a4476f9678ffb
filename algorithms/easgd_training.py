"""Original EASGD (Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015),
as You, Buluç, Demmel (SC17) describe it: the master talks to the workers one at a time in a fixed
round-robin order.

Worker: ``tau`` local SGD steps, then send its weights x to the master, receive the center c, and
x -= alpha (x - c). Master, for worker 1, 2, ..., P, 1, ...: receive x, c += alpha (x - c), reply with
c (before the update). Per ``tau`` steps and worker: one push and one pull of model bytes; a worker
whose turn has not come waits.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm
from ddlsim.algorithms.training_roles import elastic_worker, round_robin_master


class EasgdTraining(TrainingAlgorithm):
    name = "easgd"
    family = "elastic"
    options = ("tau", "alpha")
    uses_servers = True
    summary = "elastic averaging, master serves workers in round-robin order"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if plan.is_server(comm.rank):
            return round_robin_master(comm, trainer, plan)
        return elastic_worker(comm, trainer, plan)


TRAINING_ALGORITHMS.register("easgd")(EasgdTraining())
