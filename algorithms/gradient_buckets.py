"""Gradient buckets: the data-parallel gradient fused into buckets in backward order, each bucket's
all-reduce started as soon as it is ready, overlapping the rest of backward (PyTorch DDP's buckets,
Horovod's tensor fusion). One definition, used by every executor:

* ``fill_buckets``: which layers form each bucket. Layers are taken in backward order (the reverse
  of the forward order); a bucket closes at the first layer that takes it to ``bucket_bytes``;
  layers at the front of the network without parameters end in a last bucket of 0 bytes, so their
  backward time still counts. The simulated trainer groups layer times this way, the real one
  groups torch parameters this way.
* ``backward_with_allreduce``: the role-program piece. Each bucket's backward is one compute item
  whose result is the bucket's gradient; its all-reduce is started on the rank's communication
  stream right away (``overlap``) or after the whole backward; the piece waits for all of them.
* ``StepProfile`` and ``step_time_s``: the closed form of one step of that piece, the recurrence

      ready_b = forward + backward time up to the last layer of bucket b
      end_b   = max(ready_b, end_{b-1}) + collective_time(bytes_b)
      step    = max(forward + backward, end_{B-1}) + update

  (one communication stream: bucket b's all-reduce starts when the bucket is ready and bucket
  b-1's is done). Without overlap every bucket is ready at the end of backward.

Units: seconds and wire bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddlsim.algorithms.comm import RoleProgram


def fill_buckets(gradient_bytes: Sequence[float], bucket_bytes: float) -> list[list[int]]:
    """Layer indices (into ``gradient_bytes``, given in backward order) of each bucket, in order.

    Example: bytes (10, 0, 30, 5, 0) with buckets of 20 -> [[0, 1, 2], [3, 4]]: the second bucket
    never reaches 20 bytes and closes at the end; (10, 30, 0) -> [[0, 1], [2]] (a last, empty one).
    """
    buckets: list[list[int]] = []
    pending: list[int] = []
    pending_bytes = 0.0
    for index, nbytes in enumerate(gradient_bytes):
        pending.append(index)
        pending_bytes += nbytes
        if pending_bytes >= bucket_bytes:
            buckets.append(pending)
            pending, pending_bytes = [], 0.0
    if pending or not buckets:
        buckets.append(pending)
    return buckets


@dataclass(frozen=True)
class StepProfile:
    """One data-parallel worker's step: seconds of compute, and the gradient buckets (wire bytes)."""

    forward_s: float
    backward_segments_s: tuple[float, ...]  # backward time before each bucket is ready, in order
    bucket_bytes: tuple[float, ...]
    update_s: float

    @property
    def backward_s(self) -> float:
        return sum(self.backward_segments_s)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s

    @staticmethod
    def of_layers(
        forward_s: Sequence[float],
        backward_s: Sequence[float],
        gradient_bytes: Sequence[float],
        bucket_bytes: float,
        update_s: float,
    ) -> StepProfile:
        """The profile of layers given in forward order (seconds per layer, gradient wire bytes)."""
        backward_order = list(reversed(range(len(forward_s))))
        buckets = fill_buckets([gradient_bytes[i] for i in backward_order], bucket_bytes)
        segments = tuple(sum(backward_s[backward_order[i]] for i in bucket) for bucket in buckets)
        sizes = tuple(sum(gradient_bytes[backward_order[i]] for i in bucket) for bucket in buckets)
        return StepProfile(sum(forward_s), segments, sizes, update_s)

    def without_overlap(self) -> StepProfile:
        """Every bucket ready at the end of backward."""
        segments = (self.backward_s,) + (0.0,) * (len(self.backward_segments_s) - 1)
        return StepProfile(self.forward_s, segments, self.bucket_bytes, self.update_s)


def step_time_s(profile: StepProfile, collective_s: Callable[[float], float]) -> tuple[float, float]:
    """(step seconds, summed collective seconds) of the recurrence above; ``collective_s(bytes)``
    is one all-reduce's time. Example: forward 1, segments (1, 1), buckets of 10 B each taking 1.5 s,
    update 0.5: ready 2 and 3, ends 3.5 and 5, step 5.5 s with 3 s of collectives."""
    ready = profile.forward_s
    end = -float("inf")
    comm = 0.0
    for segment, nbytes in zip(profile.backward_segments_s, profile.bucket_bytes, strict=True):
        ready += segment
        if nbytes > 0:
            duration = collective_s(nbytes)
            end = max(ready, end) + duration
            comm += duration
    return max(ready, end) + profile.update_s, comm


def backward_with_allreduce(
    comm: Any,
    trainer: Any,
    group: Sequence[int],
    algorithm: str,
    overlap: bool = True,
    helpers: Sequence[int] = (),
    options: dict[str, Any] | None = None,
) -> RoleProgram:
    """Backward pass bucket by bucket, each bucket's gradient all-reduced over ``group`` with the
    collective ``algorithm``; returns the reduced buckets in order (``trainer.step`` takes them).

    The trainer gives ``buckets()`` (their count) and ``backward_bucket(b)``, the work whose result is
    bucket b's gradient; an empty bucket (no parameters) is not communicated.
    """
    options = options or {}
    handles: list[Any] = []
    ready: list[Any] = []
    for bucket in range(trainer.buckets()):
        gradient = yield comm.compute(trainer.backward_bucket(bucket))
        if gradient.nbytes == 0:
            continue
        if overlap:
            handles.append((yield comm.start(comm.allreduce(gradient, algorithm, group, helpers, **options))))
        else:
            ready.append(gradient)
    for gradient in ready:
        handles.append((yield comm.start(comm.allreduce(gradient, algorithm, group, helpers, **options))))
    totals = yield comm.wait(*handles)
    return list(totals)


def serve_allreduce(
    comm: Any,
    trainer: Any,
    group: Sequence[int],
    algorithm: str,
    steps: int,
    helpers: Sequence[int],
    options: dict[str, Any] | None = None,
) -> RoleProgram:
    """A helper rank of a collective (a dedicated parameter server): joins every bucket's all-reduce
    of ``steps`` steps with an empty buffer of the bucket's size (``trainer.empty_bucket(b)``)."""
    options = options or {}
    for _ in range(steps):
        for bucket in range(trainer.buckets()):
            buffer = trainer.empty_bucket(bucket)
            if buffer.nbytes:
                yield comm.allreduce(buffer, algorithm, group, helpers, **options)
    return {"role": "helper"}
