"""Pipeline schedules: the order in which a pipeline stage runs its micro-batches' forward and backward.

A schedule is, per stage, a list of ``Task(phase, micro_batch, chunk)``; the role program of a stage
runs its list in order, receiving each input from the neighbouring stage and sending each output on.
The pipeline bubble is what the dependencies between stages make of these orders: it comes out of
the simulation (or of a real run), not from a formula. Stages are numbered 0..P-1, micro-batches
0..M-1; with ``chunks`` = V > 1 (interleaved 1F1B) stage s holds the V model chunks s, s + P,
s + 2P, ... of the V x P virtual stages, and a micro-batch visits virtual stages in order.

* ``gpipe`` (Huang et al. 2019): every forward, then every backward in reverse order; a stage keeps
  the activations of all M micro-batches.
* ``1f1b`` (PipeDream-Flush; Narayanan et al. SC21 section 2.2): stage s first runs P - s - 1
  warm-up forwards, then alternates one forward and one backward, then drains the backwards; at most
  P - s micro-batches in flight.
* ``interleaved`` (Narayanan et al. SC21 section 2.2.2, Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): 1F1B over the V x M (micro-batch, chunk) pairs
  taken in groups of P micro-batches per chunk; warm-up 2 (P - s - 1) + (V - 1) P forwards. Needs
  M to be a multiple of P (as Megatron-LM does).

Only the order lives here; who sends what to whom is in the role program
(``algorithms/megatron_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlsim.algorithms.schedule import ScheduleError

SCHEDULES = ("gpipe", "1f1b", "interleaved")
FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class Task:
    phase: str  # FORWARD or BACKWARD
    micro_batch: int
    chunk: int = 0


def _check(stages: int, micro_batches: int, chunks: int) -> None:
    for name, value in (("stages", stages), ("micro-batches", micro_batches), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError(f"pipeline: {name} must be a positive integer, got {value!r}")


def gpipe(stages: int, micro_batches: int) -> list[list[Task]]:
    _check(stages, micro_batches, 1)
    order = [Task(FORWARD, mb) for mb in range(micro_batches)]
    order += [Task(BACKWARD, mb) for mb in reversed(range(micro_batches))]
    return [list(order) for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Task]]:
    _check(stages, micro_batches, 1)
    out = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        order = [Task(FORWARD, mb) for mb in range(warmup)]
        for index in range(micro_batches - warmup):
            order += [Task(FORWARD, warmup + index), Task(BACKWARD, index)]
        order += [Task(BACKWARD, mb) for mb in range(micro_batches - warmup, micro_batches)]
        out.append(order)
    return out


def _virtual(k: int, stages: int, chunks: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of the k-th forward (or backward) of a stage in the interleaved order."""
    group, within = divmod(k, stages * chunks)
    chunk = within // stages
    if not forward:
        chunk = chunks - chunk - 1
    return group * stages + within % stages, chunk


def interleaved(stages: int, micro_batches: int, chunks: int) -> list[list[Task]]:
    _check(stages, micro_batches, chunks)
    if micro_batches % stages:
        raise ScheduleError(
            f"pipeline: the interleaved schedule needs micro-batches ({micro_batches}) to be a multiple of the "
            f"pipeline stages ({stages})"
        )
    total = micro_batches * chunks
    out = []
    for stage in range(stages):
        warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
        if micro_batches == stages:  # Megatron-LM: all warm-up when the micro-batches fill the pipe once
            warmup = total
        order = [Task(FORWARD, *_virtual(k, stages, chunks, True)) for k in range(warmup)]
        for index in range(total - warmup):
            order.append(Task(FORWARD, *_virtual(warmup + index, stages, chunks, True)))
            order.append(Task(BACKWARD, *_virtual(index, stages, chunks, False)))
        order += [Task(BACKWARD, *_virtual(k, stages, chunks, False)) for k in range(total - warmup, total)]
        out.append(order)
    return out


def pipeline_schedule(name: str, stages: int, micro_batches: int, chunks: int = 1) -> list[list[Task]]:
    """Each stage's tasks in order for schedule ``name`` (see the module docstring)."""
    if name == "gpipe":
        schedule = gpipe(stages, micro_batches)
    elif name == "1f1b":
        schedule = one_f_one_b(stages, micro_batches)
    elif name == "interleaved":
        schedule = interleaved(stages, micro_batches, chunks)
    else:
        raise ScheduleError(f"unknown pipeline schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    if name != "interleaved" and chunks != 1:
        raise ScheduleError(f"pipeline: {name} runs one model chunk per stage; virtual stages need 'interleaved'")
    return schedule


def in_flight_peak(tasks: list[Task]) -> int:
    """Most micro-batch chunks whose forward ran and whose backward has not: activations kept at once."""
    live = peak = 0
    for task in tasks:
        live += 1 if task.phase == FORWARD else -1
        peak = max(peak, live)
    return peak
