"""Who runs where: a scenario point's plan of roles and the placement of its ranks on the fabric.

Both executors start here, so the event simulation and the closed form see the same ranks:

* ``plan``: the algorithm's roles for ``nodes x devices_per_node`` devices (``hybrid_parallel`` gets
  one pipeline stage per device of a node);
* placement: server (or master) j on the first device of node j, replacing a worker there; workers
  on every other device in order; helper ranks of a collective (dedicated parameter servers) on
  devices of extra nodes after the workers' (as a launcher given more processes would place them).

Placement values are the fabric's ranks (``simulator.engine.fabric``), which its own rank placement
(block or scatter) maps to devices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddlsim.algorithms.parallel_layout import LayoutError, ParallelLayout, check_layout
from ddlsim.algorithms.training_algorithm import Plan, TrainingAlgorithm, check_server_placement
from ddlsim.simulator.scenario import Scenario, ScenarioError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class TrainingSetup:
    scenario: Scenario
    nodes: int  # nodes of the scenario point (helpers may need more: ``fabric_nodes``)
    algorithm: TrainingAlgorithm
    plan: Plan

    @property
    def fabric_nodes(self) -> int:
        per_node = self.scenario.devices_per_node
        return max(self.nodes, -(-(self.nodes * per_node + len(self.plan.helpers)) // per_node))

    def placement(self) -> np.ndarray:
        """The fabric rank of each rank (built on demand: the closed form never needs it, nor numpy)."""
        import numpy as np

        per_node = self.scenario.devices_per_node
        devices = self.nodes * per_node
        servers = np.arange(len(self.plan.servers), dtype=np.int64) * per_node
        free = np.ones(devices, dtype=bool)
        free[servers] = False
        helpers = devices + np.arange(len(self.plan.helpers), dtype=np.int64)
        return np.concatenate([servers, np.flatnonzero(free), helpers])

    def role(self, rank: int) -> str:
        if self.plan.is_helper(rank):
            return "helper"
        if self.plan.is_server(rank):
            return "master" if self.algorithm.family == "elastic" else "server"
        return "worker"


def setup_of(scenario: Scenario, nodes: int) -> TrainingSetup:
    """The plan and placement of ``scenario`` on ``nodes`` nodes (raises on impossible input: a layout
    that does not fit the GPUs or the model, or does not fit in the device's memory)."""
    algorithm = scenario.training_algorithm
    options = scenario.options
    per_node = scenario.devices_per_node
    if algorithm.name == "hybrid_parallel":
        options = dataclasses.replace(options, stages=per_node)
    options.validate()
    check_server_placement(algorithm, options, nodes)
    plan = algorithm.plan(nodes * per_node, scenario.steps, options, per_node)
    if scenario.is_transformer:
        check_layout_fits(scenario, plan.options.layout)
    return TrainingSetup(scenario, nodes, algorithm, plan)


def check_layout_fits(scenario: Scenario, layout: ParallelLayout) -> None:
    """The layout is valid for the model and, unless the scenario says it ran, fits the device."""
    from ddlsim.simulator.workloads.transformer_memory import peak_memory

    layout = dataclasses.replace(layout, precision=scenario.precision)
    config = scenario.transformer_spec
    try:
        check_layout(layout, config)
    except LayoutError as error:
        raise ScenarioError(str(error)) from None
    if not scenario.enforce_memory:
        return
    capacity = scenario.device_spec.memory_capacity_bytes
    peak = peak_memory(config, layout)
    if not peak.fits(capacity):
        allowances = peak.communication_buffers + peak.fragmentation + peak.reserved
        named = (("weights", peak.weights), ("gradients", peak.gradients), ("optimizer states", peak.optimizer_states),
                 ("activations", peak.activations), ("buffers and allowances", allowances))  # fmt: skip
        parts = ", ".join(f"{name} {value / 1e9:.1f}" for name, value in named)
        raise ScenarioError(
            f"does not fit: {config.name} with this layout needs {peak.total / 1e9:.1f} GB on pipeline rank "
            f"{peak.stage} ({parts} GB), {scenario.device} has {capacity / 1e9:.1f} GB; use more tensor or "
            "pipeline parallelism, a higher ZeRO stage or recomputation, or --no-memory-check if it ran"
        )
