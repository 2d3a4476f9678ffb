"""Hybrid parallelism: model parallelism inside a node, data parallelism across nodes
(You, Buluç, Demmel SC17 §5; the layer split over the devices or NUMA domains of one node).

Ranks: ``stages`` consecutive ranks form one node's pipeline (rank r is stage r % stages of node
r // stages); stage s holds ``split[s]`` consecutive layers. One step on every pipeline::

    stage 0            stage 1              ...   stage S-1
    forward --act--->  forward --act--->          forward, loss
    backward <-grad--  backward <-grad---         backward
    all-reduce of the stage's weight gradients with the same stage of every other node, step

Per step: one activation and one activation-gradient message across each stage boundary (bytes:
the boundary layer's output for the minibatch) and, with more than one node, one all-reduce per
stage of that stage's gradient bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.training_algorithm import (
    TAG_ACTIVATION,
    TAG_ACTIVATION_GRADIENT,
    TRAINING_ALGORITHMS,
    AlgorithmOptions,
    Plan,
    Trainer,
    TrainingAlgorithm,
    TrainingAlgorithmError,
    TrainingCosts,
)


class HybridParallelTraining(TrainingAlgorithm):
    name = "hybrid_parallel"
    family = "synchronous"
    options = ("stages", "split", "collective", "collective_options")
    summary = "layers split over a node's devices, data parallel across nodes"

    default_updates = 1

    def plan(
        self, ranks: int, steps: int, options: AlgorithmOptions | None = None, devices_per_node: int = 1
    ) -> Plan:
        options = options or AlgorithmOptions()
        plan = super().plan(ranks, steps, options, devices_per_node)
        if ranks % options.stages:
            raise TrainingAlgorithmError(
                f"hybrid_parallel: {ranks} ranks do not form whole pipelines of {options.stages} stages"
            )
        if options.split is not None and len(options.split) != options.stages:
            raise TrainingAlgorithmError(
                f"hybrid split {','.join(map(str, options.split))} names {len(options.split)} stages, "
                f"the node has {options.stages} devices"
            )
        return plan

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        stages = plan.options.stages
        stage, rank = comm.rank % stages, comm.rank
        nodes = plan.ranks // stages
        group = _stage_group(stage, stages, nodes)
        for _ in range(plan.steps):
            activation = None
            if stage > 0:
                activation = yield comm.recv(rank - 1, TAG_ACTIVATION, like=trainer.activation_like(True))
            output = yield comm.compute(trainer.forward(activation))
            output_gradient = None
            if stage < stages - 1:
                yield comm.send(rank + 1, output, TAG_ACTIVATION)
                output_gradient = yield comm.recv(
                    rank + 1, TAG_ACTIVATION_GRADIENT, like=trainer.activation_like(False)
                )
            input_gradient = yield comm.compute(trainer.backward(output_gradient))
            if stage > 0:
                yield comm.send(rank - 1, input_gradient, TAG_ACTIVATION_GRADIENT)
            gradient = trainer.stage_gradient()
            if nodes > 1:
                gradient = yield comm.allreduce(
                    gradient, plan.options.collective, group, **plan.options.collective_options
                )
            yield comm.compute(trainer.step(gradient, 1.0 / nodes))
        return {"role": "worker", "stage": stage}

    def peers(self, plan: Plan) -> list[tuple[int, int]]:
        """Each stage and the next of its node, both ways: the activations and their gradients."""
        stages = plan.options.stages
        return [pair for rank in range(plan.ranks) if rank % stages < stages - 1
                for pair in ((rank, rank + 1), (rank + 1, rank))]  # fmt: skip

    def closed_form(self, costs: TrainingCosts, plan: Plan) -> tuple[float, float]:
        """Node 0's pipeline, step by step, as its program runs it (every node runs the same one): a
        stage starts its forward when it is free and the activation has arrived, a send holds its
        sender until the message arrives, the last stage turns round at once, and each stage's
        all-reduce starts when its backward (and the gradient it sends back) is done, uncontended:
        the two stages' all-reduces sharing a node's port are not modelled here (the event
        simulation has them). Collective seconds are stage 0's."""
        stages, collective = plan.options.stages, plan.options.collective
        nodes = plan.ranks // stages
        trainers = [costs.trainer(stage) for stage in range(stages)]
        forward = [trainer.forward(None) for trainer in trainers]
        backward = [trainer.backward(None) for trainer in trainers]
        to_next = [costs.message_s(s, s + 1, forward[s].run().nbytes) for s in range(stages - 1)]
        to_previous = [0.0] + [costs.message_s(s, s - 1, backward[s].run().nbytes) for s in range(1, stages)]
        reduce_s = [0.0] * stages
        update_s = [0.0] * stages
        for stage, trainer in enumerate(trainers):
            gradient = trainer.stage_gradient()
            if nodes > 1:
                group = tuple(node * stages + stage for node in range(nodes))
                reduce_s[stage] = costs.collective_s(
                    "allreduce", collective, nodes, gradient.nbytes, plan.options.collective_options, group=group
                )
            update_s[stage] = trainer.step(gradient, 1.0 / nodes).duration_s
        free = [0.0] * stages
        for _ in range(plan.steps):
            released = [0.0] * stages  # when a stage's forward (and its send) let it go
            arrival = 0.0
            for stage in range(stages):
                end = max(free[stage], arrival) + forward[stage].duration_s
                arrival = end + to_next[stage] if stage < stages - 1 else end
                released[stage] = arrival
            for stage in reversed(range(stages)):
                start = released[stage] if stage == stages - 1 else max(released[stage], arrival)
                arrival = start + backward[stage].duration_s + to_previous[stage]
                free[stage] = arrival + reduce_s[stage] + update_s[stage]
        return max(free), plan.steps * reduce_s[0]

    def samples_per_step(self, plan: Plan, per_device_batch: int) -> int:
        """One minibatch per pipeline (node) and step."""
        return plan.ranks // plan.options.stages * per_device_batch


@lru_cache(maxsize=64)
def _stage_group(stage: int, stages: int, nodes: int) -> tuple[int, ...]:
    """The ranks of one stage on every node, built once: every rank of the stage (4096 at 4096
    nodes) passes the same tuple, which a DES would otherwise hold 4096 copies of."""
    return tuple(range(stage, nodes * stages, stages))


TRAINING_ALGORITHMS.register("hybrid_parallel")(HybridParallelTraining())
