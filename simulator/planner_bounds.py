"""A lower bound on each layout's iteration time, so ``ddlsim plan`` evaluates only layouts that can win.

The ``megatron`` closed form runs each pipeline rank's tasks one after another (a task starts at
``max(previous end, input arrival)``), then the reductions and the optimizer step; so an iteration
is never shorter than, on any pipeline rank s,

    m x (sum over the chunks on s of one micro-batch's forward + backward) + step_s

where m is the number of micro-batches; and rank s cannot start before the first micro-batch's
forward has passed the chunk-0 layers of ranks 0..s-1, nor can rank 0 end before the last
micro-batch's backward, which every rank ends with (checked on the schedule), has come back
through them. So the bound on rank s is

    fill_s + m x T_s + max(step_s, drain_s + reduce_0 + step_0 + gather_0)

with fill_s and drain_s the chunk-0 forward and backward seconds of the ranks before s, and
reduce_0 and gather_0 rank 0's gradient reductions and (ZeRO 1-2) weight gathers over its
data-parallel group, which the closed form runs after the rank's last task (reductions not
overlapped with backward, the ``megatron`` default; with the cluster's stack overlapping the
reductions or the gathers, the bound counts none of them). T_s
holds compute, the tensor-parallel collectives and ring attention's exchange, and, where every
pipeline rank's data-parallel groups are placed alike (rank 0's seconds are then every rank's),
ZeRO-3's gathers beyond compute and the expert all-to-alls; elsewhere those two are left out, which
only lowers the bound. What the bound does not see: the messages between stages and the waits
inside the steady state.

Costs per transformer block are computed once per *shape* (tp, cp, ep, micro-batch, recompute,
sequence parallelism, flash attention) by the simulation's own cost model
(``TransformerCosts``) on a representative layout (the rank-0 groups are the same at every pp and
dp); the blocks-to-ranks map once per (pp, virtual stages, end-stage layers). A million layouts then
cost a few dictionary lookups each.

``branch_and_bound`` (in ``planner``) walks the layouts by increasing bound and stops once the bound
reaches the K-th best exact time found: every layout it skips is provably slower than the K best, so
the top K are exactly those of the exhaustive search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ddlsim.algorithms.parallel_layout import ParallelLayout
from ddlsim.simulator.training.transformer_trainer import adam_update_s
from ddlsim.simulator.workloads.transformer import TransformerConfig

if TYPE_CHECKING:
    from ddlsim.simulator.planner import Cluster

ShapeKey = tuple[int, int, int, int, str, bool, bool, bool, bool, bool, bool]
# pipeline schedules whose every rank ends with the backward of the same micro-batch on chunk 0
ENDS_TOGETHER = ("gpipe", "1f1b", "interleaved")
MapKey = tuple[int, int, int | None, int | None]


def shape_key(layout: ParallelLayout) -> ShapeKey:
    return (layout.tp, layout.cp, layout.ep, layout.micro_batch, layout.recompute, layout.sequence_parallel,
            layout.flash_attention, layout.tp_comm_overlap, layout.zero3_prefetch,
            layout.fp8_attention_and_logits, layout.frozen_weights)  # fmt: skip


def map_key(layout: ParallelLayout) -> MapKey:
    return (layout.pp, layout.virtual_stages, layout.first_stage_layers, layout.last_stage_layers)


class LowerBounds:
    """Iteration-time lower bounds of layouts of one model on one cluster (see the module docstring)."""

    def __init__(
        self, model: str, config: TransformerConfig, cluster: Cluster, changes: tuple[tuple[str, int], ...] = ()
    ) -> None:
        from ddlsim.simulator.workloads.transformer_costs import transformer_blocks

        self.model, self.config, self.cluster = model, config, cluster
        self.changes = changes  # how ``config`` differs from the catalog's ``model`` (the probes apply them)
        self.blocks = transformer_blocks(config)
        self._block_costs: dict[ShapeKey, tuple[np.ndarray, ...]] = {}
        self._zero3: dict[tuple[ShapeKey, int], tuple[np.ndarray, np.ndarray]] = {}
        self._stage_of_block: dict[MapKey, tuple[np.ndarray, np.ndarray]] = {}
        self._stage_sums: dict[tuple[ShapeKey, MapKey, tuple[int, bool, bool]], tuple[np.ndarray, ...]] = {}
        self._ep: dict[tuple[ShapeKey, int], np.ndarray] = {}
        self._groups: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self._data_parallel: dict[tuple[ShapeKey, MapKey, int, int, float], float] = {}
        self._costs: Any = None  # the first probe's: one fabric for every layout's data-parallel collectives
        self._models: dict[ShapeKey, Any] = {}  # each shape's probe TransformerCosts (its layout's shape)

    def block_costs(self, layout: ParallelLayout) -> tuple[np.ndarray, ...]:
        """Per block, for one micro-batch: (forward seconds, backward seconds, dense parameters on the
        rank, forward compute seconds, backward compute seconds)."""
        key = shape_key(layout)
        if key not in self._block_costs:
            self._block_costs[key] = self._measure(layout)
        return self._block_costs[key]

    def _measure(self, layout: ParallelLayout) -> tuple[np.ndarray, ...]:
        from ddlsim.simulator.closed_form.costs import ClosedFormCosts
        from ddlsim.simulator.planner import scenario_of
        from ddlsim.simulator.training.setup import setup_of

        cluster = self.cluster
        # the rank-0 tensor and context groups of any pp and dp: one pipeline stage over the rest
        probe = dataclasses.replace(
            layout, pp=1, virtual_stages=1, first_stage_layers=None, last_stage_layers=None, zero_stage=0,
            dp=cluster.gpus // (layout.tp * layout.cp),
            global_batch=layout.micro_batch * (cluster.gpus // (layout.tp * layout.cp)),
        )  # fmt: skip
        costs = ClosedFormCosts(setup_of(scenario_of(self.model, cluster, probe, self.changes), cluster.nodes))
        self._costs = self._costs or costs
        model = self._models[shape_key(layout)] = costs.transformer
        forwards, backwards, dense, compute_forward, compute_backward = (np.zeros(len(self.blocks)) for _ in range(5))
        for index, block in enumerate(model.blocks):
            cost = model.block_cost(block, 0)
            compute_forward[index], compute_backward[index] = cost.forward_compute, cost.backward_compute
            forwards[index] = cost.forward_compute + cost.forward_tp + cost.forward_cp
            backwards[index] = cost.backward_compute + cost.backward_tp + cost.backward_cp
            dense[index] = cost.dense_parameters
        return forwards, backwards, dense, compute_forward, compute_backward

    def zero3_s(self, layout: ParallelLayout) -> tuple[np.ndarray, np.ndarray]:
        """Per block, ZeRO-3's gathers (and backward reduce-scatters) over rank 0's data-parallel group
        beyond what the block's compute hides (``TransformerCosts.zero3_exposed_s``): (forward, backward)."""
        key = (shape_key(layout), layout.dp)
        seconds = self._zero3.get(key)
        if seconds is None:
            _, _, dense, compute_forward, compute_backward = self.block_costs(layout)
            group, model = self.group(layout), self._models[shape_key(layout)]
            forward, backward = np.zeros(len(self.blocks)), np.zeros(len(self.blocks))
            for index, parameters in enumerate(dense):
                forward[index] = model.zero3_exposed_s(parameters, group, compute_forward[index], backward=False)
                backward[index] = model.zero3_exposed_s(parameters, group, compute_backward[index], backward=True)
            seconds = self._zero3[key] = (forward, backward)
        return seconds

    def zero3_applies(self, layout: ParallelLayout) -> bool:
        """ZeRO-3 with a group to shard over, and every pipeline rank's data-parallel group placed alike
        (a stage's ranks fill whole nodes or a node holds whole stages), so that rank 0's collective
        seconds are every rank's; otherwise the bound leaves ZeRO-3's costs out."""
        if layout.zero_stage < 3 or layout.dp * layout.cp == 1:
            return False
        per_stage, per_node = layout.tp * layout.cp * layout.dp, self.cluster.devices_per_node
        return per_stage % per_node == 0 or per_node % per_stage == 0

    def ep_applies(self, layout: ParallelLayout) -> bool:
        """Expert parallelism over an EP group placed alike on every pipeline rank (as ``zero3_applies``)."""
        if layout.ep == 1 or self.config.moe is None:
            return False
        per_stage, per_node = layout.tp * layout.cp * layout.dp, self.cluster.devices_per_node
        return per_stage % per_node == 0 or per_node % per_stage == 0

    def ep_s(self, layout: ParallelLayout) -> np.ndarray:
        """Per block, an MoE layer's dispatch and combine all-to-alls over rank 0's EP group (the first
        ep ranks of its data-parallel group, ``TransformerCosts.expert_exchange_s``): the same in the
        forward and in the backward."""
        key = (shape_key(layout), layout.dp)
        seconds = self._ep.get(key)
        if seconds is None:
            self.block_costs(layout)  # measures the shape: its probe model
            model, group = self._models[shape_key(layout)], self.group(layout)[: layout.ep]
            seconds = np.array([model.expert_exchange_s(block, 0, group) for block in model.blocks])
            self._ep[key] = seconds
        return seconds

    def placement_key(self, layout: ParallelLayout) -> tuple[int, bool, bool]:
        """What of the data-parallel placement a layout's per-micro-batch costs depend on."""
        zero3, ep = self.zero3_applies(layout), self.ep_applies(layout)
        return (layout.dp if zero3 or ep else 0, zero3, ep)

    def group(self, layout: ParallelLayout) -> tuple[int, ...]:
        """Rank 0's data-parallel group (``data_parallel_group``), once per (tp, cp, dp)."""
        from ddlsim.algorithms.megatron_training import data_parallel_group

        key = (layout.tp, layout.cp, layout.dp)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = data_parallel_group(0, layout)
        return group

    def stage_of_block(self, layout: ParallelLayout) -> tuple[np.ndarray, np.ndarray]:
        """(the pipeline rank holding each block, its virtual stage): ``virtual_stage_of_blocks``."""
        key = map_key(layout)
        if key not in self._stage_of_block:
            from ddlsim.simulator.training.transformer_trainer import virtual_stage_of_blocks

            virtual = np.asarray(virtual_stage_of_blocks(self.blocks, layout), dtype=np.int64)
            self._stage_of_block[key] = (virtual % layout.pp, virtual)
        return self._stage_of_block[key]

    @staticmethod
    def ends_together(layout: ParallelLayout) -> bool:
        """Whether every pipeline rank's last task is the backward of one micro-batch on chunk 0, so
        rank 0 ends after that backward has passed every rank: true of every schedule there is
        (``ENDS_TOGETHER``; tests/test_plan.py checks each over pp, chunks and micro-batches)."""
        from ddlsim.algorithms.megatron_training import schedule_name

        return schedule_name(layout) in ENDS_TOGETHER

    def _sums(self, layout: ParallelLayout) -> tuple[np.ndarray, ...]:
        """Per pipeline rank: one micro-batch's forward + backward, dense parameters, fill and drain."""
        placement = self.placement_key(layout)
        key = (shape_key(layout), map_key(layout), placement)
        sums = self._stage_sums.get(key)
        if sums is None:
            forwards, backwards, dense, _, _ = self.block_costs(layout)
            _, zero3, ep = placement
            if zero3:  # ZeRO-3's exposed gathers and reduce-scatters, in each block's forward and backward
                extra_forward, extra_backward = self.zero3_s(layout)
                forwards, backwards = forwards + extra_forward, backwards + extra_backward
            if ep:  # the expert all-to-alls, in each MoE block's forward and backward
                exchange = self.ep_s(layout)
                forwards, backwards = forwards + exchange, backwards + exchange
            stages, virtual = self.stage_of_block(layout)
            pp = layout.pp
            first = virtual < pp  # chunk 0 of each rank
            fill = np.concatenate(([0.0], np.cumsum(np.bincount(virtual[first], forwards[first], pp))[:-1]))
            drain = np.concatenate(([0.0], np.cumsum(np.bincount(virtual[first], backwards[first], pp))[:-1]))
            sums = (np.bincount(stages, forwards + backwards, pp), np.bincount(stages, dense, pp), fill, drain)
            self._stage_sums[key] = sums
        return sums

    def bound(self, layout: ParallelLayout) -> float:
        """Seconds an iteration of ``layout`` takes at least, by the closed form's own costs."""
        return self.bounds([layout])[0]

    def bounds(self, layouts: Sequence[ParallelLayout]) -> list[float]:
        """``bound`` of each layout, computed for all layouts of one shape and stage map at once."""
        from ddlsim.algorithms.megatron_training import micro_batches

        groups: dict[tuple[ShapeKey, MapKey, tuple[int, bool, bool]], list[int]] = {}
        for index, layout in enumerate(layouts):
            groups.setdefault((shape_key(layout), map_key(layout), self.placement_key(layout)), []).append(index)
        out = np.empty(len(layouts))
        for indices in groups.values():
            members = [layouts[index] for index in indices]
            per_micro_batch, dense, fill, drain = self._sums(members[0])
            counts = np.array([micro_batches(layout) for layout in members], dtype=float)
            shards = np.array([layout.dp * layout.cp if layout.zero_stage >= 1 else 1 for layout in members], float)
            reductions = np.array([self.data_parallel_s(layout) for layout in members])
            together = np.array([self.ends_together(layout) for layout in members])
            busy = fill[None, :] + counts[:, None] * per_micro_batch[None, :]
            ends = busy.copy()
            if not members[0].frozen_weights:  # frozen weights take no optimizer step
                ends += adam_update_s(dense[None, :] / shards[:, None], self._costs.transformer.device)
            ends[:, 0] += reductions
            after_drain = busy + drain[None, :] + (ends[:, 0] - busy[:, 0])[:, None]
            ends = np.where(together[:, None], np.maximum(ends, after_drain), ends)
            out[indices] = ends.max(axis=1)
        return out.tolist()

    def data_parallel_s(self, layout: ParallelLayout) -> float:
        """Rank 0's reductions of its dense gradients and (ZeRO 1-2) gathers of its updated weights,
        chunk by chunk at their closed forms over its data-parallel group (none under ZeRO-3: those
        run inside backward, and the bound leaves them out)."""
        key = (shape_key(layout), map_key(layout), layout.dp, layout.zero_stage, layout.gradient_bytes)
        seconds = self._data_parallel.get(key)
        # overlapped with compute (``Cluster.stack``): what shows is at least nothing
        hidden_reductions = bool(self.cluster.stack_value("overlap_grad_reduce", False))
        hidden_gathers = bool(self.cluster.stack_value("overlap_param_gather", False))
        if seconds is None:
            seconds = 0.0
            if layout.zero_stage < 3 and layout.dp * layout.cp > 1 and not layout.frozen_weights:
                group = self.group(layout)
                _, _, dense, _, _ = self.block_costs(layout)
                _, virtual = self.stage_of_block(layout)
                chunks = np.bincount(virtual, dense, layout.pp * layout.virtual_stages)[:: layout.pp]
                costs = self._costs
                assert costs is not None
                options = costs.setup.plan.options
                reduce = "allreduce" if layout.zero_stage == 0 else "reduce_scatter"
                weight_bytes = costs.transformer.weight_bytes
                for parameters in chunks:
                    for collective, nbytes in (
                        (reduce, 0 if hidden_reductions else parameters * layout.gradient_bytes),
                        ("allgather", parameters * weight_bytes if layout.zero_stage and not hidden_gathers else 0),
                    ):
                        if nbytes > 0:
                            seconds += costs.collective_s(collective, options.collective, len(group), nbytes,
                                                          options.collective_options, group=group)  # fmt: skip
            self._data_parallel[key] = seconds
        return seconds
