"""Large-model training as Megatron-LM lays it out: tensor (TP), pipeline (PP), data (DP), context (CP)
and expert (EP) parallelism, with sharded data parallelism (ZeRO 1-3) and recomputation
(Shoeybi et al. 2019; Narayanan et al. SC21; Korthikanti et al. 2022; Megatron-Core).

Ranks (Megatron-Core's order "tp-cp-ep-dp-pp", tensor parallelism fastest)::

    rank = tp_rank + tp x (cp_rank + cp x (dp_rank + dp x pp_rank))

so a tensor-parallel group is ``tp`` consecutive ranks (inside a node's NVLink domain when tp <= the
devices per node), and pipeline and data parallelism cross nodes.

Each rank runs one pipeline stage's program (``algorithms.pipeline_schedules``): for every task of
its schedule, a forward receives its input activation from the previous virtual stage, computes its
model chunk and starts the send of its output to the next; a backward receives the output gradient
from the next virtual stage, computes, and starts the send of its input gradient back. What happens
inside a chunk's compute belongs to the layer, as in Megatron: tensor-parallel all-reduces (or
all-gathers and reduce-scatters with sequence parallelism), ring attention's key/value exchange,
experts' all-to-all and ZeRO-3's per-layer parameter gathers run within the work item the trainer
hands out (the simulated trainer times them with the collectives' closed forms on the group's
links; the real trainer calls them on sub-communicators). The bubble comes out of the schedule.

After the pipeline flush each chunk's gradient is reduced over the data-parallel group (the ranks of
the same tensor and pipeline rank: dp x cp of them): an all-reduce (ZeRO 0), or a reduce-scatter
into the shard this rank updates (ZeRO >= 1, Megatron's distributed optimizer); then the optimizer
step, then (ZeRO 1 and 2) an all-gather of the updated weights. Option ``overlap_grad_reduce``
(Megatron's ``--overlap-grad-reduce``) runs each chunk's last backward in gradient buckets of about
``bucket_bytes`` and starts a bucket's reduction as soon as it is complete, overlapping the rest of
that backward and of the pipeline's cool-down. Option ``overlap_param_gather`` (ZeRO 1-2,
``--overlap-param-gather``) moves the gathers to the start of the next iteration: they run bucket by
bucket while each chunk's first forward runs, each bucket's layers waiting for their weights. An
iteration then starts with the gathers of the previous step's update, so every iteration, the first
included, costs what an iteration costs in the steady state.

Closed form: the pipeline's dependency recurrence over the tasks with the trainer's times and the
hop cost of each activation message, then the reductions, the step and the gathers; exact where
nothing contends (the tests hold the DES to it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from ddlsim.algorithms.comm import RoleProgram
from ddlsim.algorithms.parallel_layout import ParallelLayout
from ddlsim.algorithms.pipeline_schedules import BACKWARD, FORWARD, Task, pipeline_schedule
from ddlsim.algorithms.training_algorithm import (
    TRAINING_ALGORITHMS,
    AlgorithmOptions,
    Plan,
    Trainer,
    TrainingAlgorithm,
    TrainingAlgorithmError,
    TrainingCosts,
)

# pipeline messages: TAG_BASE + 2 x the virtual stage they go to + (0 forward, 1 backward). Messages of
# one such edge arrive in micro-batch order on both sides in every schedule, so the order messages
# between two ranks keep (MPI's, the simulator's) matches them; the tags stay small at any scale.
TAG_BASE = 1000


@dataclass(frozen=True)
class Coordinates:
    tp: int
    cp: int
    dp: int
    pp: int


def resolved_layout(layout: ParallelLayout, ranks: int) -> ParallelLayout:
    """``layout`` with its data-parallel size filled in (dp 0: the ranks that tp x pp x cp leave)."""
    model = layout.tp * layout.pp * layout.cp
    if layout.dp == 0:
        if ranks % model:
            raise TrainingAlgorithmError(
                f"megatron: {ranks} GPUs do not divide into tp x pp x cp = {layout.tp} x {layout.pp} x {layout.cp}"
                f" = {model}"
            )
        layout = replace(layout, dp=ranks // model)
    if layout.gpus != ranks:
        raise TrainingAlgorithmError(
            f"megatron: tp x pp x dp x cp = {layout.tp} x {layout.pp} x {layout.dp} x {layout.cp} = {layout.gpus} "
            f"does not match {ranks} GPUs"
        )
    return layout


def coordinates(rank: int, layout: ParallelLayout) -> Coordinates:
    tp, rest = rank % layout.tp, rank // layout.tp
    cp, rest = rest % layout.cp, rest // layout.cp
    return Coordinates(tp, cp, rest % layout.dp, rest // layout.dp)


def rank_of(c: Coordinates, layout: ParallelLayout) -> int:
    return c.tp + layout.tp * (c.cp + layout.cp * (c.dp + layout.dp * c.pp))


def data_parallel_group(rank: int, layout: ParallelLayout, kind: str = "dense") -> tuple[int, ...]:
    """The ranks that reduce gradients with ``rank``: same tensor and pipeline rank, every (dp, cp);
    for expert parameters (``kind`` "expert") the dp x cp / ep of them that hold the same experts
    (expert parallelism is carved out of data parallelism, Megatron-Core). One group per (tp, pp)
    and expert index, built once: a DES of 16,384 ranks asks for it from every rank."""
    here = coordinates(rank, layout)
    mine = (here.cp + layout.cp * here.dp) % layout.ep if kind == "expert" else -1
    return _data_parallel_group(here.tp, here.pp, mine, layout)


@lru_cache(maxsize=4096)
def _data_parallel_group(tp: int, pp: int, expert: int, layout: ParallelLayout) -> tuple[int, ...]:
    # (dp, cp) in rank order are consecutive multiples of tp from the group's first rank
    first = rank_of(Coordinates(tp, 0, 0, pp), layout)
    members = range(first, first + layout.tp * layout.cp * layout.dp, layout.tp)
    return tuple(members if expert < 0 else members[expert :: layout.ep])


def gathers_updated_weights(layout: ParallelLayout, group_size: int) -> bool:
    """Whether a rank all-gathers its updated weights after the step: the distributed optimizer (ZeRO
    1-2) over more than one replica, and weights that are trained (not frozen)."""
    return 1 <= layout.zero_stage <= 2 and group_size > 1 and not layout.frozen_weights


def micro_batches(layout: ParallelLayout) -> int:
    """Micro-batches each pipeline runs per iteration (a global batch not given: one per stage)."""
    count = layout.micro_batches
    return layout.pp if count is None else count


def schedule_name(layout: ParallelLayout) -> str:
    return "interleaved" if layout.virtual_stages > 1 else layout.schedule


def stage_tasks(layout: ParallelLayout, stage: int) -> tuple[Task, ...]:
    return _schedule(schedule_name(layout), layout.pp, micro_batches(layout), layout.virtual_stages)[stage]


@lru_cache(maxsize=64)
def _schedule(name: str, stages: int, micro: int, chunks: int) -> tuple[tuple[Task, ...], ...]:
    """Every stage's tasks, built once per layout shape (every rank of a stage runs the same ones)."""
    return tuple(tuple(tasks) for tasks in pipeline_schedule(name, stages, micro, chunks))


def neighbour(rank: int, layout: ParallelLayout, virtual: int) -> int:
    """The rank holding virtual stage ``virtual`` in ``rank``'s pipeline."""
    here = coordinates(rank, layout)
    return rank_of(Coordinates(here.tp, here.cp, here.dp, virtual % layout.pp), layout)


def stage_neighbours(rank: int, layout: ParallelLayout) -> dict[int, int]:
    """Virtual stage -> the rank holding it, for the virtual stages next to each of ``rank``'s own."""
    stage, last = coordinates(rank, layout).pp, layout.pp * layout.virtual_stages - 1
    return {virtual: neighbour(rank, layout, virtual) for chunk in range(layout.virtual_stages)
            for virtual in (chunk * layout.pp + stage - 1, chunk * layout.pp + stage + 1)
            if 0 <= virtual <= last}  # fmt: skip


def tag(target: int, phase: str) -> int:
    """The tag of a pipeline message to virtual stage ``target``."""
    return TAG_BASE + 2 * target + (0 if phase == FORWARD else 1)


class MegatronTraining(TrainingAlgorithm):
    name = "megatron"
    family = "synchronous"
    options = ("layout", "collective", "collective_options", "overlap_grad_reduce", "overlap_param_gather",
               "bucket_bytes")
    momentum = True  # Adam's moments (the optimizer step's memory traffic)
    summary = "tensor, pipeline, data, context and expert parallelism with ZeRO, as Megatron-LM"
    default_updates = 1

    def plan(
        self, ranks: int, steps: int, options: AlgorithmOptions | None = None, devices_per_node: int = 1
    ) -> Plan:
        options = options or AlgorithmOptions()
        options.validate()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise TrainingAlgorithmError(f"steps (iterations) must be an integer >= 1, got {steps!r}")
        layout = resolved_layout(options.layout, ranks)
        return Plan(self.name, ranks, range(0), range(ranks), steps, replace(options, layout=layout))

    def samples_per_step(self, plan: Plan, per_device_batch: int) -> int:
        """Sequences per iteration: micro-batches x micro-batch x data-parallel replicas."""
        layout = plan.options.layout
        return micro_batches(layout) * layout.micro_batch * layout.dp

    def program(self, comm: Any, trainer: Trainer, plan: Plan) -> RoleProgram:
        layout, options = plan.options.layout, plan.options
        rank = comm.rank
        here = coordinates(rank, layout)
        chunks, last = layout.virtual_stages, layout.pp * layout.virtual_stages - 1
        tasks = stage_tasks(layout, here.pp)
        group = data_parallel_group(rank, layout)  # dense parameters' group: the optimizer's shards
        # the ranks holding the virtual stages next to this rank's (looked up once, not per message)
        near = stage_neighbours(rank, layout)
        backwards = Counter(task.chunk for task in tasks if task.phase == BACKWARD)
        gathered = gathers_updated_weights(layout, len(group))
        early_gathers = gathered and options.overlap_param_gather
        bucketed = options.overlap_grad_reduce or early_gathers
        buckets = {chunk: trainer.chunk_buckets(chunk, options.bucket_bytes) for chunk in range(chunks) if bucketed}
        for _ in range(plan.steps):
            sends, reductions, gathers = [], [], {}
            if early_gathers:  # the previous step's update, gathered while the first forwards run
                for chunk in range(chunks):
                    for bucket in range(buckets[chunk]):
                        shard = trainer.parameter_bucket(chunk, bucket, buckets[chunk])
                        message = comm.collective("allgather", shard, options.collective, group)
                        gathers[(chunk, bucket)] = yield comm.start(message)
            left = Counter(backwards)
            for task in tasks:
                virtual = task.chunk * layout.pp + here.pp
                if task.phase == FORWARD:
                    activation = None
                    if virtual > 0:
                        source = near[virtual - 1]
                        activation = yield comm.recv(source, tag(virtual, FORWARD))
                    if early_gathers and task.micro_batch == 0:
                        count = buckets[task.chunk]
                        for bucket in range(count):
                            yield comm.wait(gathers[(task.chunk, bucket)])
                            output = yield comm.compute(
                                trainer.stage_forward_bucket(task.micro_batch, task.chunk, activation, bucket, count)
                            )
                    else:
                        output = yield comm.compute(trainer.stage_forward(task.micro_batch, task.chunk, activation))
                    if virtual < last:
                        target = near[virtual + 1]
                        message = comm.send(target, output, tag(virtual + 1, FORWARD))
                        sends.append((yield comm.start(message)))
                    continue
                gradient = None
                if virtual < last:
                    source = near[virtual + 1]
                    gradient = yield comm.recv(source, tag(virtual, BACKWARD))
                left[task.chunk] -= 1
                if options.overlap_grad_reduce and left[task.chunk] == 0:  # the last backward: bucket by bucket
                    count = buckets[task.chunk]
                    for bucket in range(count):
                        work = trainer.stage_backward_bucket(task.micro_batch, task.chunk, gradient, bucket, count)
                        input_gradient = yield comm.compute(work)
                        gradients = trainer.bucket_gradients(task.chunk, bucket, count)
                        reductions += yield from _reduce(comm, options, gradients)
                else:
                    input_gradient = yield comm.compute(trainer.stage_backward(task.micro_batch, task.chunk, gradient))
                if virtual > 0:
                    target = near[virtual - 1]
                    message = comm.send(target, input_gradient, tag(virtual - 1, BACKWARD))
                    sends.append((yield comm.start(message)))
            yield comm.wait(*sends)
            if not options.overlap_grad_reduce:
                for chunk in range(chunks):
                    reductions += yield from _reduce(comm, options, trainer.chunk_gradients(chunk))
            reduced = yield comm.wait(*reductions)
            yield comm.compute(trainer.step(reduced))
            if gathered and not early_gathers:
                handles = []
                for chunk in range(chunks):
                    shard = trainer.parameter_shard(chunk)
                    handles.append((yield comm.start(comm.collective("allgather", shard, options.collective, group))))
                weights = yield comm.wait(*handles)
                yield comm.compute(trainer.assign_gathered(weights))
        return {"role": "worker", "stage": here.pp}

    def peers(self, plan: Plan) -> list[tuple[int, int]]:
        """Each rank and the ranks of the virtual stages next to its own: its pipeline messages."""
        layout = plan.options.layout
        return [(rank, near) for rank in range(layout.gpus) for near in stage_neighbours(rank, layout).values()]

    def closed_form(self, costs: TrainingCosts, plan: Plan) -> tuple[float, float]:
        """Every pipeline (every tp, cp and dp rank) runs the same timeline: the early gathers on the
        communication stream, the recurrence over one pipeline's tasks, then the reductions on the
        stream in the order they start, the step and the gathers; the iteration ends with the slowest
        stage. Collective seconds are stage 0's."""
        layout, options = plan.options.layout, plan.options
        pipeline = [rank_of(Coordinates(0, 0, 0, stage), layout) for stage in range(layout.pp)]
        trainers = [costs.trainer(rank) for rank in pipeline]
        chunks = range(layout.virtual_stages)
        bucketed = options.overlap_grad_reduce or options.overlap_param_gather
        buckets = [{chunk: trainer.chunk_buckets(chunk, options.bucket_bytes) for chunk in chunks if bucketed}
                   for trainer in trainers]  # fmt: skip
        gathered = [gathers_updated_weights(layout, len(data_parallel_group(rank, layout))) for rank in pipeline]
        gather_ready: dict[tuple[int, int], list[float]] = {}  # (stage, chunk) -> each bucket's gather end
        stream_start, spent_on = [-float("inf")] * layout.pp, [0.0] * layout.pp
        for stage, rank in enumerate(pipeline):
            if gathered[stage] and options.overlap_param_gather:
                group, clock = data_parallel_group(rank, layout), 0.0
                for chunk in chunks:
                    count = buckets[stage][chunk]
                    shard = trainers[stage].parameter_bucket(chunk, 0, count).nbytes
                    seconds = _collective_s(costs, "allgather", shard, group, options, layout)
                    gather_ready[(stage, chunk)] = [clock + seconds * (bucket + 1) for bucket in range(count)]
                    clock += seconds * count
                stream_start[stage], spent_on[stage] = clock, clock
        done, last_backward = _pipeline_recurrence(layout, trainers, pipeline, costs, gather_ready)
        finish, comm_total = 0.0, 0.0
        for stage, rank in enumerate(pipeline):
            trainer, spent = trainers[stage], spent_on[stage]
            reductions: list[tuple[float, float]] = []  # (ready, seconds), in the order the program starts them
            for chunk in chunks:
                if options.overlap_grad_reduce:
                    count = buckets[stage][chunk]
                    start, duration = last_backward[(stage, chunk)]
                    pieces = [(start + duration * (bucket + 1) / count, trainer.bucket_gradients(chunk, bucket, count))
                              for bucket in range(count)]  # fmt: skip
                else:
                    pieces = [(done[stage], trainer.chunk_gradients(chunk))]
                for ready, gradients in pieces:
                    for payload, collective, kind in gradients:
                        group = data_parallel_group(rank, layout, kind)
                        seconds = _collective_s(costs, collective, payload.nbytes, group, options, layout)
                        reductions.append((ready, seconds))
            stream = stream_start[stage]
            for ready, seconds in sorted(reductions, key=lambda item: item[0]):
                if seconds:
                    stream = max(stream, ready) + seconds
                    spent += seconds
            clock = max(done[stage], stream) + trainer.step([]).duration_s
            if gathered[stage] and not options.overlap_param_gather:
                group = data_parallel_group(rank, layout)
                for chunk in chunks:
                    shard = trainer.parameter_shard(chunk).nbytes
                    seconds = _collective_s(costs, "allgather", shard, group, options, layout)
                    clock += seconds
                    spent += seconds
            finish = max(finish, clock)
            comm_total = spent if stage == 0 else comm_total
        return plan.steps * finish, plan.steps * comm_total


def _collective_s(costs: TrainingCosts, collective: str, nbytes: float, group: tuple[int, ...],
                  options: AlgorithmOptions, layout: ParallelLayout) -> float:  # fmt: skip
    """A data-parallel group's collective, which the stage's other tensor ranks run at the same time
    over their own groups, on the same nodes."""
    if len(group) == 1 or nbytes <= 0:
        return 0.0
    return costs.collective_s(collective, options.collective, len(group), nbytes, options.collective_options,
                              group=group, beside=layout.tp)  # fmt: skip


def _reduce(comm: Any, options: AlgorithmOptions, gradients: list[tuple[Any, str, str]]):
    """Start the reductions of ``gradients`` ((payload, collective, kind) of a chunk or of one of its
    buckets) over their data-parallel groups; the handles."""
    handles = []
    layout = options.layout
    for payload, collective, kind in gradients:
        group = data_parallel_group(comm.rank, layout, kind)
        if payload.nbytes and len(group) > 1:
            handles.append((yield comm.start(comm.collective(collective, payload, options.collective, group))))
    return handles


def _pipeline_recurrence(
    layout: ParallelLayout,
    trainers: list[Trainer],
    pipeline: list[int],
    costs: TrainingCosts,
    gather_ready: dict[tuple[int, int], list[float]] | None = None,
) -> tuple[list[float], dict[tuple[int, int], tuple[float, float]]]:
    """(each stage's time when its last task and its sends are done, each (stage, chunk)'s last
    backward (start, seconds)), running the schedule's tasks with their dependencies: a forward waits
    for its input to arrive (the previous virtual stage's compute end plus the message's hop), a
    backward for its output gradient; a stage runs its tasks in order, its sends leaving without
    blocking it. With ``gather_ready`` a chunk's first forward runs bucket by bucket, each bucket after
    its weights' gather ends."""
    stages, chunks = layout.pp, layout.virtual_stages
    last = stages * chunks - 1
    schedule = [stage_tasks(layout, stage) for stage in range(stages)]
    arrival: dict[tuple[str, int, int], float] = {}  # (phase, micro-batch, virtual stage) -> input ready
    position = [0] * stages
    clock = [0.0] * stages
    sends_done = [0.0] * stages
    last_backward: dict[tuple[int, int], tuple[float, float]] = {}
    works: dict[tuple[int, str, int], tuple[float, float | None]] = {}  # every micro-batch's task costs the same
    hops: dict[tuple[int, int, float], float] = {}
    remaining = sum(len(tasks) for tasks in schedule)
    while remaining:
        progressed = False
        for stage, tasks in enumerate(schedule):
            trainer = trainers[stage]
            while position[stage] < len(tasks):
                task = tasks[position[stage]]
                virtual = task.chunk * stages + stage
                forward = task.phase == FORWARD
                needs_input = virtual > 0 if forward else virtual < last
                key = (task.phase, task.micro_batch, virtual)
                if needs_input and key not in arrival:
                    break
                start = max(clock[stage], arrival.get(key, 0.0))
                cost = works.get((stage, task.phase, task.chunk))
                if cost is None:
                    if forward:
                        work = trainer.stage_forward(task.micro_batch, task.chunk, None)
                    else:
                        work = trainer.stage_backward(task.micro_batch, task.chunk, None)
                    output = work.run()
                    cost = (work.duration_s, None if output is None else float(output.nbytes))
                    works[(stage, task.phase, task.chunk)] = cost
                duration_s, nbytes = cost
                end = start + duration_s
                if forward and task.micro_batch == 0 and gather_ready and (stage, task.chunk) in gather_ready:
                    ready = gather_ready[(stage, task.chunk)]
                    end = start
                    for gather_end in ready:
                        end = max(end, gather_end) + duration_s / len(ready)
                clock[stage] = end
                target = virtual + 1 if forward else virtual - 1
                if 0 <= target <= last and nbytes is not None:
                    hop_key = (stage, target, nbytes)
                    hop = hops.get(hop_key)
                    if hop is None:
                        # every (tp, cp, dp) rank of the stage sends its piece at once
                        block = layout.tp * layout.cp * layout.dp
                        hop = hops[hop_key] = costs.message_s(pipeline[stage], pipeline[target % stages], nbytes, block)
                    arrival[(task.phase, task.micro_batch, target)] = end + hop
                    sends_done[stage] = max(sends_done[stage], end + hop)
                if not forward:
                    last_backward[(stage, task.chunk)] = (start, duration_s)
                position[stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise TrainingAlgorithmError("megatron: the pipeline schedule deadlocks")
    return [max(clock[stage], sends_done[stage]) for stage in range(stages)], last_backward


TRAINING_ALGORITHMS.register("megatron")(MegatronTraining())
