"""Synchronous data-parallel SGD, for real: torch forward/backward, gradients all-reduced by a schedule.

What the simulator models (``simulator/training.py``), done with real tensors:

* gradients are grouped into buckets layer by layer in backward order (reverse registration order
  of the model's layers), a bucket closing once it holds ``bucket_bytes`` (default 25 MB, as
  PyTorch DDP and the simulator);
* a per-parameter hook (``register_post_accumulate_grad_hook``) marks a gradient ready; when its
  bucket is complete, a communication thread all-reduces it with ``run_schedule`` on a duplicated
  communicator, bucket after bucket in a fixed order (one communication stream, as Horovod and
  DDP), overlapping the rest of backward; with ``overlap`` off every bucket waits for backward;
* the update (SGD with momentum) follows the last bucket.

The trace rows are the simulator's: ``forward``, ``backward``, ``allreduce`` (one per bucket, with
its wire bytes) and ``update``, per rank and iteration. Dedicated helper ranks of a schedule (a
parameter server's servers) train nothing: they take part in every bucket's schedule with an
empty buffer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ddlsim.algorithms.schedule import Schedule
from ddlsim.real_runs.data import load_dataset, shard_batches
from ddlsim.real_runs.models import build_model
from ddlsim.real_runs.schedule_executor import SCHEDULE_TAG, Workspace, build_schedule, run_schedule
from ddlsim.real_runs.transport import Transport

GRADIENT_TAG = SCHEDULE_TAG + 2
PRECISIONS = {"fp32": np.float32, "fp16": np.float16}


@dataclass(frozen=True)
class TrainSettings:
    """One training run. ``gradient_precision`` fp16 sends gradients as float16 (mixed precision)."""

    model: str = "small_cnn"
    dataset: str = "digits"
    algorithm: str = "ring"
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    per_device_batch: int = 32
    iterations: int = 30
    learning_rate: float = 0.1
    momentum: float = 0.9
    bucket_bytes: float = 25e6
    overlap: bool = True
    gradient_precision: str = "fp32"
    seed: int = 0
    samples: int = 0  # 0: the dataset's default
    image_size: int = 0  # 0: the dataset's default
    torch_threads: int = 1
    # debugging the harness itself: this rank kills itself (SIGKILL) when it reaches that iteration
    fail_rank: int = -1
    fail_at_iteration: int = -1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class MomentumSgd:
    """SGD with momentum, torch.optim.SGD's update (dampening 0, no Nesterov): v = m v + g; p -= lr v.

    Written out because ``torch.optim`` imports ``torch._dynamo`` on the first step (seconds per rank).
    """

    def __init__(self, params: list[Any], learning_rate: float, momentum: float) -> None:
        self.params = params
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.velocity: list[Any] = [None] * len(params)

    def zero_grad(self) -> None:
        for param in self.params:
            if param.grad is not None:
                param.grad.zero_()

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for index, param in enumerate(self.params):
                if param.grad is None:
                    continue
                if self.velocity[index] is None:
                    self.velocity[index] = param.grad.clone()
                else:
                    self.velocity[index].mul_(self.momentum).add_(param.grad)
                param.add_(self.velocity[index], alpha=-self.learning_rate)


def plan_buckets(model: Any, bucket_bytes: float, element_bytes: int) -> list[list[Any]]:
    """Parameters grouped into buckets, layer by layer in backward order, as the simulator fills them."""
    layers = [module for module in model.modules() if any(True for _ in module.parameters(recurse=False))]
    buckets: list[list[Any]] = []
    pending: list[Any] = []
    pending_bytes = 0
    for layer in reversed(layers):
        params = [p for p in layer.parameters(recurse=False) if p.requires_grad]
        pending += params
        pending_bytes += sum(p.numel() for p in params) * element_bytes
        if pending_bytes >= bucket_bytes:
            buckets.append(pending)
            pending, pending_bytes = [], 0
    if pending:
        buckets.append(pending)
    return buckets


class GradientReducer:
    """All-reduces a model's gradients bucket by bucket, from a communication thread during backward."""

    def __init__(self, buckets: list[list[Any]], schedule: Schedule, transport: Transport, dtype: Any,
                 tracer: Any = None, overlap: bool = True) -> None:  # fmt: skip
        self.buckets = buckets
        self.schedule = schedule
        self.transport = transport
        self.dtype = np.dtype(dtype)
        self.tracer = tracer
        self.overlap = overlap
        self.workspace = Workspace()
        self._lock = threading.Lock()
        self._remaining: list[int] = []
        self._ready: list[threading.Event] = []
        self._results: list[np.ndarray | None] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._iteration = 0
        for index, bucket in enumerate(buckets):
            for param in bucket:
                param.register_post_accumulate_grad_hook(self._hook(index))

    def _hook(self, index: int):
        def ready(param: Any) -> None:
            with self._lock:
                self._remaining[index] -= 1
                done = self._remaining[index] == 0
            if done:
                self._ready[index].set()

        return ready

    def begin(self, iteration: int) -> None:
        """Arm the hooks for one backward pass; with overlap, start the communication thread."""
        self._iteration = iteration
        self._remaining = [len(bucket) for bucket in self.buckets]
        self._ready = [threading.Event() for _ in self.buckets]
        self._results = [None] * len(self.buckets)
        self._error = None
        if self.overlap:
            self._thread = threading.Thread(target=self._communicate, name="gradient-allreduce", daemon=True)
            self._thread.start()

    def _flatten(self, bucket: list[Any]) -> np.ndarray:
        parts = [
            (param.grad.detach().reshape(-1).numpy() if param.grad is not None else np.zeros(param.numel()))
            for param in bucket
        ]
        return np.concatenate(parts).astype(self.dtype, copy=False)

    def _communicate(self) -> None:
        try:
            for index, bucket in enumerate(self.buckets):
                self._ready[index].wait()
                flat = np.ascontiguousarray(self._flatten(bucket))
                start = time.perf_counter_ns()
                run_schedule(self.schedule, flat, self.transport, tag=GRADIENT_TAG, workspace=self.workspace)
                if self.tracer is not None:
                    self.tracer.record("allreduce", start, time.perf_counter_ns(), nbytes=flat.nbytes,
                                       iteration=self._iteration)  # fmt: skip
                self._results[index] = flat
        except BaseException as error:  # handed to the main thread in finish()
            self._error = error

    def finish(self, workers: int) -> None:
        """After backward: wait for every bucket, then write the averaged gradients back."""
        import torch

        for event in self._ready:  # parameters that got no gradient this step count as ready
            event.set()
        if self.overlap:
            assert self._thread is not None
            self._thread.join()
            if self._error is not None:
                raise self._error
        else:
            self._communicate()
            if self._error is not None:
                raise self._error
        for bucket, flat in zip(self.buckets, self._results, strict=True):
            assert flat is not None
            offset = 0
            for param in bucket:
                count = param.numel()
                values = torch.from_numpy(flat[offset : offset + count].astype(np.float32)).view_as(param)
                if param.grad is None:
                    param.grad = values / workers
                else:
                    param.grad.copy_(values).div_(workers)
                offset += count


def serve_buckets(schedule: Schedule, sizes: list[int], transport: Transport, dtype: Any, tracer: Any,
                  iteration: int, workspace: Workspace) -> None:  # fmt: skip
    """A helper rank's share of one iteration: every bucket's schedule, from an empty buffer."""
    for size in sizes:
        flat = np.zeros(size, dtype=dtype)
        start = time.perf_counter_ns()
        run_schedule(schedule, flat, transport, tag=GRADIENT_TAG, workspace=workspace)
        if tracer is not None:
            tracer.record("allreduce", start, time.perf_counter_ns(), nbytes=flat.nbytes, iteration=iteration)


@dataclass(frozen=True)
class TrainResult:
    """Per-iteration rows ``{"iteration", "loss", "iteration_s"}`` (loss: the mean over workers of
    their batch loss) and the digest of this rank's final parameters."""

    rows: list[dict[str, float]]
    parameter_digest: str
    buckets: int


def train(settings: TrainSettings, transport: Transport, tracer: Any = None) -> TrainResult:
    """Run ``settings.iterations`` steps of synchronous SGD on this rank."""
    import torch

    torch.set_num_threads(settings.torch_threads)
    torch.manual_seed(settings.seed)  # every worker starts from the same weights
    dataset = load_dataset(settings.dataset, settings.seed, settings.samples, settings.image_size)
    model = build_model(settings.model, dataset.in_channels, dataset.classes)
    optimizer = MomentumSgd(list(model.parameters()), settings.learning_rate, settings.momentum)
    dtype = PRECISIONS[settings.gradient_precision]
    buckets = plan_buckets(model, settings.bucket_bytes, np.dtype(dtype).itemsize)
    schedule = build_schedule(settings.algorithm, "allreduce", transport.size, **settings.algorithm_options)
    workers = schedule.workers
    rank = transport.rank
    dup = getattr(transport, "dup", None)
    comm_transport = dup() if (dup is not None and settings.overlap) else transport
    reducer = GradientReducer(buckets, schedule, comm_transport, dtype, tracer, settings.overlap)
    batches = (
        shard_batches(dataset, rank, workers, settings.per_device_batch, settings.seed) if rank < workers else None
    )
    sizes = [sum(p.numel() for p in bucket) for bucket in buckets]
    workspace = Workspace()
    rows = []
    if tracer is not None:
        tracer.start(transport.barrier)
    else:
        transport.barrier()
    for iteration in range(settings.iterations):
        if rank == settings.fail_rank and iteration == settings.fail_at_iteration:
            os.kill(os.getpid(), signal.SIGKILL)  # a hard crash, as the launcher must survive it
        if tracer is not None:
            tracer.iteration = iteration
        begin = time.perf_counter()
        loss_value = 0.0
        if batches is None:
            serve_buckets(schedule, sizes, comm_transport, dtype, tracer, iteration, workspace)
        else:
            images, labels = next(batches)
            start = time.perf_counter_ns()
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(images)), torch.from_numpy(labels))
            if tracer is not None:
                tracer.record("forward", start, time.perf_counter_ns())
            optimizer.zero_grad()
            reducer.begin(iteration)
            start = time.perf_counter_ns()
            loss.backward()
            if tracer is not None:
                tracer.record("backward", start, time.perf_counter_ns())
            reducer.finish(workers)
            start = time.perf_counter_ns()
            optimizer.step()
            if tracer is not None:
                tracer.record("update", start, time.perf_counter_ns())
            loss_value = float(loss.detach())
        iteration_s = time.perf_counter() - begin
        total = transport.reference("allreduce", np.array([loss_value], dtype=np.float64))
        rows.append({"iteration": iteration, "loss": float(total[0]) / workers, "iteration_s": iteration_s})
        if tracer is not None:
            tracer.flush()
    return TrainResult(rows, parameter_digest(model) if batches is not None else "", len(buckets))


def parameter_digest(model: Any) -> str:
    """A digest of a model's parameters (ranks compare it to prove they stayed in sync)."""
    import hashlib

    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().numpy().tobytes())
    return digest.hexdigest()[:16]
