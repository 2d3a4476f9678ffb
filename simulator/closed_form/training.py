"""The closed-form executor: a training algorithm's own closed form on the scenario's costs.

``closed_form_result(scenario, nodes)`` plans the roles as the event simulation does
(``simulator.training.setup``) and asks the algorithm's ``closed_form`` (in its file in
``algorithms/``) for the seconds of its steps, with the simulation's cost model and the fabric's
hop costs (``simulator.closed_form.costs``). Microseconds per point at any scale: nothing grows with
the node count. Algorithms without a closed form (the asynchronous ones) are refused with a message.
"""

from __future__ import annotations

import math
from typing import Any

from ddlsim.simulator.closed_form.costs import ClosedFormCosts
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.training.result import TrainingResult
from ddlsim.simulator.training.setup import setup_of
from ddlsim.simulator.training.trainers import transformer_result

# closed forms whose step waits for every worker's compute: stragglers cost the expected slowest
STRAGGLER_CLOSED_FORMS = ("sync_sgd", "megatron")


def closed_form_result(scenario: Scenario, nodes: int) -> TrainingResult:
    setup = setup_of(scenario, nodes)
    algorithm, plan = setup.algorithm, setup.plan
    if scenario.stragglers not in ("", "none") and algorithm.name not in STRAGGLER_CLOSED_FORMS:
        raise ScenarioError(
            f"--stragglers: the closed form of {algorithm.name!r} has no straggler term (it holds for "
            f"{', '.join(STRAGGLER_CLOSED_FORMS)}, whose steps wait for every worker); use --executor des"
        )
    costs = ClosedFormCosts(setup)
    estimate = algorithm.closed_form(costs, plan)
    if estimate is None:
        raise ScenarioError(
            f"algorithm {algorithm.name!r} has no closed form (its time depends on the order of events); "
            "use --executor des"
        )
    time_s, comm_s = estimate
    bucketed = "bucket_bytes" in algorithm.options and not scenario.is_transformer  # sync SGD's buckets
    result = TrainingResult(
        algorithm=algorithm.name,
        collective=plan.options.collective if "collective" in algorithm.options else "",
        nodes=nodes,
        devices=nodes * scenario.devices_per_node,
        workers=len(plan.workers),
        servers=len(plan.servers),
        steps=plan.steps,
        samples_per_step=algorithm.samples_per_step(plan, scenario.per_device_batch),
        time_s=time_s,
        # one device's step with no communication: the worker the costs already built (single_device_step_s)
        compute_s=costs.worker.profile.compute_s if not scenario.is_transformer else math.nan,
        comm_s=comm_s / plan.steps,
        comm_share=0.0 if scenario.is_transformer else max(time_s - plan.steps * costs.step.compute_s, 0.0) / time_s,
        buckets=0 if not bucketed else len(costs.step.bucket_bytes),
        executor="analytic",
        path="closed_form",
    )
    if scenario.is_transformer:
        result = transformer_result(result, scenario, plan, stage_zero_breakdown(costs, plan))
    return result


def stage_zero_breakdown(costs: ClosedFormCosts, plan: Any) -> dict[str, float]:
    """Per iteration, the seconds by cause of pipeline rank 0's work items (its forwards, backwards
    and step); the waits are what the closed form does not split out."""
    from ddlsim.algorithms.megatron_training import stage_tasks

    trainer = costs.trainer(0)
    totals: dict[str, float] = {}
    works = [
        trainer.stage_forward(task.micro_batch, task.chunk, None) if task.phase == "F"
        else trainer.stage_backward(task.micro_batch, task.chunk, None)
        for task in stage_tasks(plan.options.layout, 0)
    ] + [trainer.step([])]  # fmt: skip
    for work in works:
        for name, seconds in work.parts.items():
            totals[f"{name}_s"] = totals.get(f"{name}_s", 0.0) + seconds
    return totals
