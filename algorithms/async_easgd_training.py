"""Async EASGD (You, Buluç, Demmel SC17): EASGD whose master serves whichever worker arrives first
instead of a fixed round-robin order (Zhang et al. 2015's asynchronous EASGD, Algorithm 1).

Per ``tau`` local steps and worker: one push of the worker weights and one pull of the center, model
bytes each; nobody waits for a turn.
"""

from __future__ import annotations

from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, Plan, Trainer, TrainingAlgorithm
from ddlsim.algorithms.training_roles import elastic_exchanges, elastic_worker, server_loop


class AsyncEasgdTraining(TrainingAlgorithm):
    name = "async_easgd"
    family = "elastic"
    options: tuple[str, ...] = ("tau", "alpha")
    uses_servers = True
    momentum = False
    summary = "elastic averaging, master serves the first worker to arrive"

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        if plan.is_server(comm.rank):
            return server_loop(comm, trainer, plan, elastic_exchanges(plan), "elastic")
        return elastic_worker(comm, trainer, plan)


TRAINING_ALGORITHMS.register("async_easgd")(AsyncEasgdTraining())
