"""The costs a training algorithm's closed form asks for (``TrainingCosts``): its trainers (the event
simulation's own cost model, without noise) and the uncontended times of collectives and messages
(``simulator.training.costs.GroupCosts``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ddlsim.algorithms.gradient_buckets import StepProfile
from ddlsim.simulator.scenario import Stragglers
from ddlsim.simulator.training.costs import GroupCosts
from ddlsim.simulator.training.setup import TrainingSetup
from ddlsim.simulator.training.trainers import SimTrainer, hybrid_stage_trainers, layer_times, transformer_costs


class ClosedFormCosts(GroupCosts):
    """The ``TrainingCosts`` of one scenario point (``algorithms.training_algorithm``)."""

    def __init__(self, setup: TrainingSetup) -> None:
        scenario = setup.scenario
        super().__init__(scenario.fabric_spec(setup.fabric_nodes))
        self.setup = setup
        # stragglers: a step that waits for every worker's compute takes the expected slowest of them
        # (the event simulation draws each worker's multiplier; this is its mean maximum)
        self.straggler_factor = Stragglers.parse(scenario.stragglers).expected_slowest(len(setup.plan.workers))
        if scenario.is_transformer:
            # every iteration ends in the data-parallel reductions, which wait for every rank: each rank
            # computes at that pace (exact for data parallelism alone; tensor and pipeline ranks also
            # wait for each other within the step)
            self._transformer = transformer_costs(setup, self, compute_factor=self.straggler_factor)
        else:
            self.worker = SimTrainer(scenario, layer_times(scenario), setup.algorithm.momentum)
            self._stage_trainer = (
                hybrid_stage_trainers(setup) if setup.algorithm.name == "hybrid_parallel" else None
            )  # the split worked out once for every stage asked
            self.step: StepProfile = self.worker.profile
            if self.straggler_factor != 1.0:
                factor = self.straggler_factor
                self.step = dataclasses.replace(
                    self.step,
                    forward_s=self.step.forward_s * factor,
                    backward_segments_s=tuple(seconds * factor for seconds in self.step.backward_segments_s),
                )

    @property
    def transformer(self) -> Any:
        """The per-chunk costs of a transformer layout (``TransformerCosts``; None for other workloads)."""
        return getattr(self, "_transformer", None)

    def trainer(self, rank: int) -> Any:
        """Rank ``rank``'s trainer, without noise (layouts' ranks differ; the others' workers are alike)."""
        if self.setup.scenario.is_transformer:
            from ddlsim.simulator.training.transformer_trainer import TransformerTrainer  # transformers only

            return TransformerTrainer(self._transformer, rank)
        if self._stage_trainer is not None:  # hybrid_parallel: a pipeline stage's layers
            return self._stage_trainer(rank % self.setup.plan.options.stages, None)
        return self.worker
