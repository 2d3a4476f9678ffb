"""Pipeline schedules: each stage runs every (micro-batch, chunk) once each way, and the makespans that
the dependencies give are the published ones (Narayanan et al. SC21: bubble (P - 1)(tf + tb), and
(P - 1)(tf + tb) / V interleaved)."""

from __future__ import annotations

from collections import Counter

import pytest

from ddlsim.algorithms.pipeline_schedules import (
    BACKWARD,
    FORWARD,
    in_flight_peak,
    pipeline_schedule,
)
from ddlsim.algorithms.schedule import ScheduleError


def makespan(schedule, forward_s: float, backward_s: float, chunks: int = 1) -> float:
    """A tiny dependency simulation: free messages, each task waiting for its input on the
    neighbouring virtual stage; a chunk costs 1/chunks of the stage's time."""
    stages = len(schedule)
    last = stages * chunks - 1
    done: dict[tuple[str, int, int], float] = {}
    position = [0] * stages
    clock = [0.0] * stages
    remaining = sum(len(tasks) for tasks in schedule)
    while remaining:
        progressed = False
        for stage, tasks in enumerate(schedule):
            while position[stage] < len(tasks):
                task = tasks[position[stage]]
                virtual = task.chunk * stages + stage
                if task.phase == FORWARD:
                    needs = None if virtual == 0 else (FORWARD, task.micro_batch, virtual - 1)
                    cost = forward_s / chunks
                else:
                    upstream = (BACKWARD, task.micro_batch, virtual + 1)
                    needs = (FORWARD, task.micro_batch, last) if virtual == last else upstream
                    cost = backward_s / chunks
                if needs is not None and needs not in done:
                    break
                start = max(clock[stage], done[needs] if needs else 0.0)
                clock[stage] = start + cost
                done[(task.phase, task.micro_batch, virtual)] = clock[stage]
                position[stage] += 1
                remaining -= 1
                progressed = True
        assert progressed, "the schedule deadlocks"
    return max(clock)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 4), (2, 2), (4, 8), (8, 3)])
def test_flush_schedules_take_m_plus_p_minus_1_steps(name, stages, micro_batches):
    schedule = pipeline_schedule(name, stages, micro_batches)
    assert makespan(schedule, 1.0, 2.0) == pytest.approx((micro_batches + stages - 1) * 3.0)


@pytest.mark.parametrize(("stages", "micro_batches", "chunks"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (4, 4, 3)])
def test_interleaving_divides_the_bubble_by_the_chunks(stages, micro_batches, chunks):
    schedule = pipeline_schedule("interleaved", stages, micro_batches, chunks)
    expected = micro_batches * 3.0 + (stages - 1) * 3.0 / chunks
    assert makespan(schedule, 1.0, 2.0, chunks) == pytest.approx(expected)


@pytest.mark.parametrize(("name", "chunks"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_every_stage_runs_each_chunk_of_each_micro_batch_once_each_way(name, chunks):
    stages, micro_batches = 4, 8
    for tasks in pipeline_schedule(name, stages, micro_batches, chunks):
        counts = Counter((t.phase, t.micro_batch, t.chunk) for t in tasks)
        assert set(counts.values()) == {1} and len(counts) == 2 * micro_batches * chunks
        seen = set()
        for task in tasks:  # a backward comes after its own forward
            if task.phase == FORWARD:
                seen.add((task.micro_batch, task.chunk))
            else:
                assert (task.micro_batch, task.chunk) in seen


def test_activations_in_flight():
    """1F1B keeps P - s micro-batches on stage s; GPipe keeps all M."""
    assert [in_flight_peak(tasks) for tasks in pipeline_schedule("1f1b", 4, 8)] == [4, 3, 2, 1]
    assert [in_flight_peak(tasks) for tasks in pipeline_schedule("gpipe", 4, 8)] == [8] * 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("interleaved", 4, 6, 2), "multiple of the pipeline stages"),
        (("1f1b", 4, 8, 2), "virtual stages need 'interleaved'"),
        (("zigzag", 4, 8, 1), "unknown pipeline schedule 'zigzag'"),
        (("1f1b", 0, 8, 1), "stages must be a positive integer"),
    ],
)
def test_impossible_schedules_are_refused(args, message):
    with pytest.raises(ScheduleError, match=message):
        pipeline_schedule(*args)
