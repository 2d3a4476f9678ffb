"""Role programs shared by several training algorithms (parameter-server loops, elastic workers).

Each algorithm file picks and parametrises these; they are plain generators over the ``Comm`` seam
and a ``Trainer`` (``algorithms.training_algorithm``), so both executors run them unchanged.

Message pattern of one parameter-server exchange (shard j of k on server rank j)::

    worker                           server j
      compute: gradient / delta
      send(j, part j) ----TAG_PUSH---> recv(ANY_SOURCE)       staleness = version - version pulled
                                       compute: apply / add / elastic center
      recv(j) <---------TAG_PULL------ send(worker, weights or center)
      compute: assign part j / elastic

Staleness (recorded by the server, which alone knows it): how many updates the server applied
between a worker's last pull and the arrival of its next push.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ddlsim.algorithms.comm import ANY_SOURCE, RoleProgram
from ddlsim.algorithms.training_algorithm import TAG_PULL, TAG_PUSH, Plan, Trainer


def hogwild_batches(steps: int, threads: int) -> list[int]:
    """Steps per Hogwild iteration: ``threads`` at a time, the last iteration possibly fewer."""
    return [min(threads, steps - done) for done in range(0, steps, threads)]


def server_loop(comm: Any, trainer: Trainer, plan: Plan, pushes_per_worker: int, update: str) -> RoleProgram:
    """Serve pushes first come, first served; ``update``: ``gradient``, ``delta`` or ``elastic``."""
    shard, count = comm.rank, len(plan.servers)
    version = 0
    pulled = dict.fromkeys(plan.workers, 0)
    staleness: list[int] = []
    for _ in range(pushes_per_worker * len(plan.workers)):
        source, payload = yield comm.recv(ANY_SOURCE, TAG_PUSH, like=trainer.like(shard, count))
        staleness.append(version - pulled[source])
        if update == "gradient":
            yield comm.compute(trainer.step(payload))
            reply = trainer.weights()
        elif update == "delta":
            yield comm.compute(trainer.add(payload))
            reply = trainer.weights()
        else:
            reply = yield comm.compute(trainer.elastic_center(payload, plan.options.alpha))
        version += 1
        yield comm.send(source, reply, TAG_PULL)
        pulled[source] = version
    return {"role": "server", "staleness": staleness, "updates": version}


def round_robin_master(comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
    """Original EASGD master: exchanges with worker 1, 2, ..., P, 1, ... in a fixed order."""
    version = 0
    pulled = dict.fromkeys(plan.workers, 0)
    staleness: list[int] = []
    for _ in range(plan.exchanges):
        for worker in plan.workers:
            weights = yield comm.recv(worker, TAG_PUSH, like=trainer.like())
            staleness.append(version - pulled[worker])
            center = yield comm.compute(trainer.elastic_center(weights, plan.options.alpha))
            version += 1
            yield comm.send(worker, center, TAG_PULL)
            pulled[worker] = version
    return {"role": "master", "staleness": staleness, "updates": version}


def push_pull_worker(comm: Any, trainer: Trainer, plan: Plan, hogwild: bool = False) -> RoleProgram:
    """Asynchronous PS worker: every step (Hogwild: every iteration of ``threads`` steps) push the
    gradient (Hogwild: the weight delta) to the servers, pull fresh weights.

    ``plan.options.staleness`` = d > 0 delays the pulled weights by d pulls before they are used: the
    gradient of step t is computed on weights d pulls older than the newest (real-run check of the
    statistical-efficiency model).
    """
    servers = plan.servers
    count = len(servers)
    delay = plan.options.staleness
    pending: deque[list[Any]] = deque()
    batches = hogwild_batches(plan.steps, plan.options.threads) if hogwild else [1] * plan.steps
    for threads in batches:
        if hogwild:
            yield comm.compute(trainer.hogwild(threads))
            payload = yield comm.compute(trainer.delta())
        else:
            payload = yield comm.compute(trainer.gradient())
        for index, server in enumerate(servers):
            yield comm.send(server, trainer.part(payload, index, count), TAG_PUSH)
        parts = []
        for index, server in enumerate(servers):
            parts.append((yield comm.recv(server, TAG_PULL, like=trainer.like(index, count))))
        pending.append(parts)
        if len(pending) > delay:
            for index, part in enumerate(pending.popleft()):
                yield comm.compute(trainer.assign_part(part, index, count))
    return {"role": "worker", "iterations": len(batches)}


def elastic_worker(comm: Any, trainer: Trainer, plan: Plan, hogwild: bool = False) -> RoleProgram:
    """EASGD worker (Zhang, Choromanska, LeCun 2015, Algorithm 1/2): local steps, and after every
    ``tau`` of them (Hogwild: every ``tau`` iterations) send the weights to the master, receive the
    center and move elastically towards it."""
    master = plan.servers[0]
    tau, alpha = plan.options.tau, plan.options.alpha
    batches = hogwild_batches(plan.steps, plan.options.threads) if hogwild else [1] * plan.steps
    for iteration, threads in enumerate(batches, start=1):
        if hogwild:
            yield comm.compute(trainer.hogwild(threads))
        else:
            gradient = yield comm.compute(trainer.gradient())
            yield comm.compute(trainer.step(gradient))
        if iteration % tau == 0:
            yield comm.send(master, trainer.weights(), TAG_PUSH)
            center = yield comm.recv(master, TAG_PULL, like=trainer.like())
            yield comm.compute(trainer.elastic_worker(center, alpha))
    return {"role": "worker", "iterations": len(batches)}


def elastic_exchanges(plan: Plan, hogwild: bool = False) -> int:
    """Exchanges each elastic worker makes with the master."""
    iterations = len(hogwild_batches(plan.steps, plan.options.threads)) if hogwild else plan.steps
    return iterations // plan.options.tau


def push_pull_exchanges(plan: Plan, hogwild: bool = False) -> int:
    """Pushes each parameter-server worker makes to every server."""
    return len(hogwild_batches(plan.steps, plan.options.threads)) if hogwild else plan.steps
