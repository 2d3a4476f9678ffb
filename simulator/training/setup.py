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

import numpy as np

from ddlsim.algorithms.training_algorithm import Plan, TrainingAlgorithm, check_server_placement
from ddlsim.simulator.scenario import Scenario


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
        """The fabric rank of each rank (built on demand: the closed form never needs it)."""
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
    """The plan and placement of ``scenario`` on ``nodes`` nodes (raises on impossible input)."""
    algorithm = scenario.training_algorithm
    options = scenario.options
    per_node = scenario.devices_per_node
    if algorithm.name == "hybrid_parallel":
        options = dataclasses.replace(options, stages=per_node)
    options.validate()
    check_server_placement(algorithm, options, nodes)
    plan = algorithm.plan(nodes * per_node, scenario.steps, options, per_node)
    return TrainingSetup(scenario, nodes, algorithm, plan)
