"""Hogwild EASGD (You, Buluç, Demmel SC17): per-node Hogwild threads doing lock-free local steps on
the node's weights, and every ``tau`` iterations an elastic exchange with the master, which serves
workers as they arrive (no round-robin order, no lock across workers).

Per ``tau`` iterations (each ``threads`` steps) and worker: one push and one pull of model bytes.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm
from ddlsim.algorithms.training_roles import elastic_exchanges, elastic_worker, server_loop


class HogwildEasgdTraining(TrainingAlgorithm):
    name = "hogwild_easgd"
    family = "elastic"
    options = ("tau", "alpha", "threads")
    uses_servers = True
    hogwild = True
    summary = "per-node Hogwild threads with elastic exchanges every tau iterations"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if plan.is_server(comm.rank):
            return server_loop(comm, trainer, plan, elastic_exchanges(plan, hogwild=True), "elastic")
        return elastic_worker(comm, trainer, plan, hogwild=True)


TRAINING_ALGORITHMS.register("hogwild_easgd")(HogwildEasgdTraining())
