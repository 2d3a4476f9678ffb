"""Every training algorithm run for real: the same role programs as the simulator, on MPI ranks.

``run_algorithm(settings, transport)`` (call it on every rank, e.g. under ``mpiexec -n 2..4``)
builds the algorithm's ``Plan`` for the world size, a ``TorchTrainer`` (or ``StageTrainer`` for
``hybrid_parallel``) for this rank, and drives the rank's role program with
``real_runs.comm_executor.MpiComm``: compute is real torch work on real data (scikit-learn digits
by default), messages are real MPI messages of float32 weight vectors, collectives run the
registered schedules. With ``trace_dir`` every op is written in the shared trace schema.

Weights live in one flat float32 tensor per rank; the model's parameters are views into it, so
elastic moves, shard assignment and Hogwild updates are in-place vector operations on the very
memory the model computes with. Hogwild threads (``TorchTrainer.hogwild``) share that memory
without locks: each thread computes its gradient with ``torch.func.functional_call`` on detached
views of the shared parameters and writes ``p -= lr g`` in place while the others read and write
(Niu et al. 2011).

Servers (and the EASGD master) hold their shard of the flat vector only; with one server and
``evaluate_every`` set, the server also measures the full-data loss of its weights after every
``evaluate_every`` updates (the real-run check of the statistical-efficiency model).

Gradient buckets (``sync_sgd``): the model's layers with parameters, in backward order, are grouped
as ``algorithms.gradient_buckets.fill_buckets`` groups the simulator's layers. ``forward(None)`` runs
the forward pass; ``backward_bucket(0)`` starts ``loss.backward()`` on a thread of its own and
returns bucket 0's gradient once a per-parameter hook (``register_post_accumulate_grad_hook``) has
seen every gradient of the bucket; later buckets return as they complete. So the role program
starts each bucket's all-reduce on the communication stream while backward goes on, as PyTorch DDP
does. ``step`` takes the reduced buckets back into the flat gradient. Gradients travel in
``gradient_precision`` (fp16: half the bytes, mixed precision's wire format).

Per step the trainer stamps the time its forward (or gradient) began, so a run reports the seconds
of each step of each worker.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ddlsim.algorithms.comm import drive
from ddlsim.algorithms.gradient_buckets import fill_buckets
from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, AlgorithmOptions, Plan
from ddlsim.real_runs.data import Dataset, load_dataset, shard_batches
from ddlsim.real_runs.models import MODELS, build_model


def _torch():
    import torch

    return torch


@dataclass(frozen=True)
class RunSettings:
    """One real run. ``steps``: gradient steps per worker; ``learning_rate``: the SGD step (momentum
    algorithms use ``learning_rate x (1 - momentum)`` with heavy-ball ``momentum``)."""

    algorithm: str = "async_sgd"
    options: AlgorithmOptions = field(default_factory=AlgorithmOptions)
    steps: int = 30
    model: str = "digits_mlp"
    dataset: str = "digits"
    batch: int = 32
    learning_rate: float = 0.5
    momentum: float = 0.9
    seed: int = 0
    evaluate_every: int = 0  # servers: full-data loss every this many updates (0: never)
    trace_dir: Path | None = None
    gradient_precision: str = "fp32"  # wire format of gradient buckets: fp32 or fp16
    samples: int = 0  # dataset samples (0: the dataset's default)
    image_size: int = 0  # synthetic images' side (0: the default)
    torch_threads: int = 1
    # megatron: the GPT trained (real_runs.megatron_trainer.GptShape's fields); the command line fills it
    transformer: dict[str, int] | None = None
    # debugging the harness itself: this rank kills itself (SIGKILL) when it reaches that step
    fail_rank: int = -1
    fail_at_step: int = -1

    @staticmethod
    def from_dict(data: dict[str, Any]) -> RunSettings:
        """The settings ``to_dict`` wrote (JSON-friendly: options a dict, the trace directory a string)."""
        from ddlsim.algorithms.training_algorithm import parse_split

        values = dict(data)
        options = dict(values.pop("options", {}) or {})
        if "split" in options:
            options["split"] = parse_split(options["split"])
        trace_dir = values.pop("trace_dir", None)
        return RunSettings(
            **values, options=AlgorithmOptions.from_dict(options), trace_dir=Path(trace_dir) if trace_dir else None
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["trace_dir"] = str(self.trace_dir) if self.trace_dir else None
        data["options"] = self.options.to_dict()
        return data


@dataclass
class RunResult:
    rank: int
    role: str
    returned: Any
    initial_loss: float  # full-data loss of the initial weights (workers; nan elsewhere)
    final_loss: float  # full-data loss of this rank's final weights (workers; nan elsewhere)
    losses: list[float]  # minibatch losses in order (workers; the last stage for hybrid)
    evaluations: list[tuple[int, float]]  # (updates applied, full-data loss) on a single server
    weights_digest: float  # sum of the final weights (equal on ranks holding equal weights)
    step_s: list[float] = field(default_factory=list)  # seconds of each step (workers)
    buckets: int = 0  # gradient buckets of a bucketed algorithm

class TorchWork:
    """A compute item of a real run: ``run()`` does it; the real executor never reads ``duration_s``."""

    duration_s = 0.0

    def __init__(self, name: str, function, iteration: int) -> None:
        self.name = name
        self._function = function
        self.iteration = iteration

    def run(self) -> Any:
        return self._function()


def _build(name: str, dataset: Dataset):
    if name == "digits_mlp":  # its first layer's size depends on the images
        return MODELS.get(name)(dataset.in_channels, dataset.classes, int(dataset.images.shape[-1]))
    return build_model(name, dataset.in_channels, dataset.classes)


def _step_seconds(starts: list[float], end: float) -> list[float]:
    """Seconds of each step from the times the steps began and the time the last one ended."""
    return [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]


def _check_failure(settings: RunSettings, rank: int, step: int) -> None:
    if rank == settings.fail_rank and step == settings.fail_at_step:
        os.kill(os.getpid(), signal.SIGKILL)  # a hard crash, as the launcher must survive it


def _flatten_into(module) -> Any:
    """One flat float32 tensor holding every parameter of ``module``; the parameters become views of it."""
    torch = _torch()
    parameters = list(module.parameters())
    if not parameters:
        return torch.zeros(0)
    flat = torch.cat([p.detach().reshape(-1) for p in parameters]).clone()
    offset = 0
    for p in parameters:
        count = p.numel()
        p.data = flat[offset : offset + count].view_as(p)
        offset += count
    return flat


def _full_loss(model, dataset: Dataset) -> float:
    torch = _torch()
    with torch.no_grad():
        logits = model(torch.from_numpy(dataset.images))
        return float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(dataset.labels)))


def _bounds(length: int, index: int, count: int) -> tuple[int, int]:
    edges = np.linspace(0, length, count + 1).astype(int)
    return int(edges[index]), int(edges[index + 1])


class TorchTrainer:
    """The ``Trainer`` of a worker (whole model) or a server (shard ``shard`` of ``shards``)."""

    def __init__(self, settings: RunSettings, dataset: Dataset, momentum: bool, *, data_shard: int = 0,
                 data_shards: int = 1, server_shard: tuple[int, int] | None = None, rank: int = 0) -> None:  # fmt: skip
        torch = _torch()
        torch.manual_seed(settings.seed)  # identical initial weights on every rank
        self.model = _build(settings.model, dataset)
        self.rank = rank
        self.step_starts: list[float] = []
        self._buckets = _GradientBuckets(self.model, settings.options.bucket_bytes, settings.gradient_precision)
        self.flat = _flatten_into(self.model)
        self.length = int(self.flat.numel())
        self.dataset = dataset
        self.settings = settings
        self.mu = settings.momentum if momentum else 0.0
        # heavy-ball momentum multiplies the steady-state step by 1 / (1 - mu): scale it back so
        # that momentum and plain algorithms take steps of the same size
        self.lr = settings.learning_rate * (1.0 - self.mu)
        self.iteration = 0
        self.losses: list[float] = []
        self.evaluations: list[tuple[int, float]] = []
        self.updates = 0
        if server_shard is not None:
            low, high = _bounds(self.length, *server_shard)
            self.flat = self.flat[low:high].clone()  # a server keeps its shard only
            self.whole = server_shard == (0, 1)
        else:
            self.whole = False
        self.buffer = torch.zeros_like(self.flat)
        self.sum = torch.zeros_like(self.flat)
        self.anchor = self.flat.clone()
        self.center = self.flat.clone()
        self.batches = shard_batches(dataset, data_shard, data_shards, settings.batch, settings.seed)
        self._loss = torch.nn.functional.cross_entropy
        self._replicas: list[Any] = []

    def _work(self, name: str, function) -> TorchWork:
        return TorchWork(name, function, self.iteration)

    # --- worker compute ----------------------------------------------------------------------
    def _gradient(self) -> np.ndarray:
        torch = _torch()
        _check_failure(self.settings, self.rank, self.iteration - 1)
        images, labels = next(self.batches)
        self.model.zero_grad(set_to_none=True)
        loss = self._loss(self.model(torch.from_numpy(images)), torch.from_numpy(labels))
        loss.backward()
        self.losses.append(float(loss.detach()))
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).numpy()

    def gradient(self) -> TorchWork:
        self._begin_step()
        return self._work("gradient", self._gradient)

    def _begin_step(self) -> None:
        self.iteration += 1
        self.step_starts.append(time.perf_counter())

    # --- the same step in gradient buckets -------------------------------------------------------------
    def forward(self, activation: Any) -> TorchWork:
        """The whole model's forward pass on the next minibatch (``activation`` is None)."""
        self._begin_step()

        def run() -> None:
            torch = _torch()
            _check_failure(self.settings, self.rank, self.iteration - 1)  # after the last step was flushed
            images, labels = next(self.batches)
            self.model.zero_grad(set_to_none=True)
            self._step_loss = self._loss(self.model(torch.from_numpy(images)), torch.from_numpy(labels))
            self.losses.append(float(self._step_loss.detach()))

        return self._work("forward", run)

    def buckets(self) -> int:
        return len(self._buckets.params)

    def backward_bucket(self, bucket: int) -> TorchWork:
        def run() -> np.ndarray:
            if bucket == 0:
                self._buckets.start_backward(self._step_loss)
            return self._buckets.wait(bucket)

        return self._work("backward", run)

    def empty_bucket(self, bucket: int) -> np.ndarray:
        return self._buckets.empty(bucket)

    def hogwild(self, threads: int) -> TorchWork:
        self.iteration += 1
        return self._work("hogwild", lambda: self._hogwild(threads))

    def _replica(self, index: int):
        """Thread ``index``'s own module whose parameters alias the shared weights (no copy)."""
        while len(self._replicas) <= index:
            replica = copy.deepcopy(self.model)
            for mine, shared in zip(replica.parameters(), self.model.parameters(), strict=True):
                mine.data = shared.data
            self._replicas.append(replica)
        return self._replicas[index]

    def _hogwild(self, threads: int) -> None:
        torch = _torch()
        replicas = [self._replica(i) for i in range(threads)]
        batches = [next(self.batches) for _ in range(threads)]
        losses: list[float] = [0.0] * threads

        def one(index: int) -> None:
            images, labels = batches[index]
            replica = replicas[index]
            replica.zero_grad(set_to_none=True)
            loss = self._loss(replica(torch.from_numpy(images)), torch.from_numpy(labels))
            loss.backward()
            with torch.no_grad():
                for p in replica.parameters():
                    p.add_(p.grad, alpha=-self.lr)  # lock-free: the other threads read and write p meanwhile
            losses[index] = float(loss.detach())

        workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        self.losses.extend(losses)

    def _step(self, gradient: Any, scale: float) -> None:
        torch = _torch()
        if isinstance(gradient, list):  # reduced buckets from backward_with_allreduce
            gradient = self._buckets.gather(gradient, self.length)
        g = torch.as_tensor(np.asarray(gradient, dtype=np.float32)) * scale
        if self.mu:
            self.buffer.mul_(self.mu).add_(g)
            g = self.buffer
        self.flat.add_(g, alpha=-self.lr)
        self.updates += 1
        self._maybe_evaluate()

    def step(self, gradient: Any, scale: float = 1.0) -> TorchWork:
        return self._work("update", lambda: self._step(gradient, scale))

    def weights(self) -> np.ndarray:
        return self.flat.numpy().copy()

    def _assign(self, weights: Any) -> None:
        torch = _torch()
        self.flat.copy_(torch.as_tensor(np.asarray(weights)))
        self.anchor.copy_(self.flat)

    def assign(self, weights: Any) -> TorchWork:
        return self._work("assign", lambda: self._assign(weights))

    def delta(self) -> TorchWork:
        return self._work("delta", lambda: (self.flat - self.anchor).numpy())

    def _add(self, delta: Any) -> None:
        self.flat.add_(_torch().as_tensor(np.asarray(delta)))
        self.updates += 1
        self._maybe_evaluate()

    def add(self, delta: Any) -> TorchWork:
        return self._work("update", lambda: self._add(delta))

    def accumulate(self, gradient: Any) -> TorchWork:
        def add() -> None:
            self.sum.add_(_torch().as_tensor(np.asarray(gradient)))

        return self._work("accumulate", add)

    def _apply_accumulated(self, count: int) -> None:
        self._step(self.sum.numpy(), 1.0 / count)
        self.sum.zero_()

    def apply_accumulated(self, count: int) -> TorchWork:
        return self._work("update", lambda: self._apply_accumulated(count))

    def _elastic_center(self, worker_weights: Any, alpha: float) -> np.ndarray:
        old = self.flat.numpy().copy()
        self.flat.add_(_torch().as_tensor(np.asarray(worker_weights)) - self.flat, alpha=alpha)
        self.updates += 1
        self._maybe_evaluate()
        return old

    def elastic_center(self, worker_weights: Any, alpha: float) -> TorchWork:
        return self._work("elastic_center", lambda: self._elastic_center(worker_weights, alpha))

    def elastic_worker(self, center: Any, alpha: float) -> TorchWork:
        def move() -> None:
            self.flat.add_(self.flat - _torch().as_tensor(np.asarray(center)), alpha=-alpha)

        return self._work("elastic", move)

    def elastic_sync(self, total: Any, workers: int, alpha: float) -> TorchWork:
        def move() -> None:
            torch = _torch()
            center = self.center.clone()
            self.flat.add_(self.flat - center, alpha=-alpha)
            self.center.add_(torch.as_tensor(np.asarray(total)) - workers * center, alpha=alpha)

        return self._work("elastic", move)

    def part(self, payload: Any, index: int, count: int) -> np.ndarray:
        low, high = _bounds(len(payload), index, count)
        return np.ascontiguousarray(payload[low:high])

    def assign_part(self, payload: Any, index: int, count: int) -> TorchWork:
        def assign() -> None:
            low, high = _bounds(self.length, index, count)
            self.flat[low:high] = _torch().as_tensor(np.asarray(payload))
            self.anchor[low:high] = self.flat[low:high]

        return self._work("assign", assign)

    def like(self, index: int = 0, count: int = 1) -> np.ndarray:
        low, high = _bounds(self.length, index, count)
        return np.empty(high - low, dtype=np.float32)

    # --- evaluation ------------------------------------------------------------------------------
    def _maybe_evaluate(self) -> None:
        every = self.settings.evaluate_every
        if every and self.whole and self.updates % every == 0:
            self.evaluations.append((self.updates, self.full_loss()))

    def full_loss(self) -> float:
        if self.flat.numel() != self.length:
            return float("nan")
        # point the model's parameters at this rank's flat weights (already so on a worker; a
        # server's whole-model shard is a separate tensor)
        _torch().nn.utils.vector_to_parameters(self.flat, self.model.parameters())
        return _full_loss(self.model, self.dataset)


class _GradientBuckets:
    """A model's parameters grouped into gradient buckets, and the backward pass that fills them.

    Parameters of each bucket (layers with parameters in backward order, ``fill_buckets``), the
    positions of their elements in the model's flat parameter vector, and per backward pass a thread
    running ``loss.backward()`` with per-parameter hooks that mark a bucket ready once all its
    gradients have been accumulated.
    """

    def __init__(self, model: Any, bucket_bytes: float, precision: str) -> None:
        self.dtype = np.dtype(np.float16 if precision == "fp16" else np.float32)
        layers = [module for module in model.modules() if any(True for _ in module.parameters(recurse=False))]
        layer_params = [[p for p in layer.parameters(recurse=False) if p.requires_grad] for layer in reversed(layers)]
        sizes = [sum(p.numel() for p in params) * self.dtype.itemsize for params in layer_params]
        buckets = fill_buckets(sizes, bucket_bytes)
        self.params = [[p for index in bucket for p in layer_params[index]] for bucket in buckets]
        self.params = [params for params in self.params if params]
        offsets, offset = {}, 0
        for param in model.parameters():
            offsets[id(param)] = offset
            offset += param.numel()
        self.positions = [
            np.concatenate([np.arange(offsets[id(p)], offsets[id(p)] + p.numel()) for p in params])
            for params in self.params
        ]
        self._ready: list[threading.Event] = []
        self._remaining: list[int] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        for index, params in enumerate(self.params):
            for param in params:
                param.register_post_accumulate_grad_hook(self._hook(index))

    def _hook(self, index: int):
        def ready(_param: Any) -> None:
            if not self._remaining:  # a backward not started by start_backward (a whole-model gradient)
                return
            with self._lock:
                self._remaining[index] -= 1
                done = self._remaining[index] == 0
            if done:
                self._ready[index].set()

        return ready

    def start_backward(self, loss: Any) -> None:
        self._remaining = [len(params) for params in self.params]
        self._ready = [threading.Event() for _ in self.params]
        self._error = None

        def backward() -> None:
            try:
                loss.backward()
            except BaseException as error:  # handed to the waiting thread
                self._error = error
            finally:
                for event in self._ready:  # parameters that got no gradient count as ready
                    event.set()

        self._thread = threading.Thread(target=backward, name="backward", daemon=True)
        self._thread.start()

    def wait(self, index: int) -> np.ndarray:
        self._ready[index].wait()
        if index == len(self.params) - 1 and self._thread is not None:
            self._thread.join()
            self._remaining = []
        if self._error is not None:
            raise self._error
        parts = [
            p.grad.detach().reshape(-1).numpy() if p.grad is not None else np.zeros(p.numel(), np.float32)
            for p in self.params[index]
        ]
        return np.concatenate(parts).astype(self.dtype, copy=False)

    def empty(self, index: int) -> np.ndarray:
        return np.zeros(sum(p.numel() for p in self.params[index]), dtype=self.dtype)

    def gather(self, buckets: list[np.ndarray], length: int) -> np.ndarray:
        """The flat gradient (parameter order) from the reduced buckets."""
        flat = np.zeros(length, dtype=np.float32)
        for positions, values in zip(self.positions, buckets, strict=True):
            flat[positions] = values
        return flat


class StageTrainer:
    """The ``Trainer`` of one pipeline stage of ``hybrid_parallel``: modules [low, high) of the model."""

    def __init__(self, settings: RunSettings, dataset: Dataset, stage: int, stages: int, node: int,
                 nodes: int) -> None:  # fmt: skip
        torch = _torch()
        torch.manual_seed(settings.seed)
        model = _build(settings.model, dataset)
        modules = list(model.children())
        split = settings.options.split or _default_split(modules, stages)
        if sum(split) != len(modules):
            from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError

            raise TrainingAlgorithmError(
                f"hybrid split {','.join(map(str, split))} covers {sum(split)} layers; the model has {len(modules)}"
            )
        edges = np.cumsum((0, *split))
        self.module = torch.nn.Sequential(*modules[edges[stage] : edges[stage + 1]])
        self.flat = _flatten_into(self.module)
        self.first, self.last = stage == 0, stage == stages - 1
        self.lr = settings.learning_rate
        self.batches = shard_batches(dataset, node, nodes, settings.batch, settings.seed)
        self.iteration = 0
        self.losses: list[float] = []
        self.updates = 0
        self.evaluations: list[tuple[int, float]] = []
        self._input: Any = None
        self._output: Any = None
        self._labels: Any = None

    def forward(self, activation: Any) -> TorchWork:
        self.iteration += 1

        def run() -> Any:
            torch = _torch()
            images, labels = next(self.batches)  # every stage of a pipeline draws the same batch
            self._labels = torch.from_numpy(labels)
            if self.first:
                self._input = torch.from_numpy(images)
            else:
                self._input = torch.from_numpy(np.array(activation, dtype=np.float32)).requires_grad_()
            self.module.zero_grad(set_to_none=True)
            self._output = self.module(self._input)
            if self.last:
                self._output = torch.nn.functional.cross_entropy(self._output, self._labels)
                self.losses.append(float(self._output.detach()))
                return None
            return self._output.detach().numpy()

        return TorchWork("forward", run, self.iteration)

    def backward(self, output_gradient: Any) -> TorchWork:
        def run() -> Any:
            torch = _torch()
            if self.last:
                self._output.backward()
            else:
                self._output.backward(torch.from_numpy(np.array(output_gradient, dtype=np.float32)))
            return None if self.first else self._input.grad.numpy()

        return TorchWork("backward", run, self.iteration)

    def activation_like(self, incoming: bool) -> None:
        return None

    def stage_gradient(self) -> np.ndarray:
        torch = _torch()
        grads = [p.grad.reshape(-1) for p in self.module.parameters() if p.grad is not None]
        return torch.cat(grads).numpy() if grads else np.zeros(0, dtype=np.float32)

    def step(self, gradient: Any, scale: float = 1.0) -> TorchWork:
        def run() -> None:
            self.flat.add_(_torch().as_tensor(np.asarray(gradient)), alpha=-self.lr * scale)
            self.updates += 1

        return TorchWork("update", run, self.iteration)

    def weights(self) -> np.ndarray:
        return self.flat.numpy().copy()


def _default_split(modules: list, stages: int) -> tuple[int, ...]:
    """Parameterised modules spread evenly: each stage gets at least one module with weights."""
    weighted = [i for i, module in enumerate(modules) if any(True for _ in module.parameters())]
    if len(weighted) < stages:
        from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError

        raise TrainingAlgorithmError(f"the model has {len(weighted)} layers with weights, fewer than {stages} stages")
    cuts = [weighted[round(k * len(weighted) / stages)] for k in range(1, stages)]
    edges = [0, *cuts, len(modules)]
    return tuple(edges[i + 1] - edges[i] for i in range(stages))


def _megatron_trainer(settings: RunSettings, plan: Plan, rank: int, comm: Any):
    from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError
    from ddlsim.real_runs.megatron_trainer import GptShape, MegatronTorchTrainer, check_runnable

    options = plan.options
    check_runnable(options)
    if settings.transformer is None:
        raise TrainingAlgorithmError("megatron needs the transformer's shape (RunSettings.transformer)")
    return MegatronTorchTrainer(GptShape(**settings.transformer), options.layout, comm, rank,
                                collective=options.collective, learning_rate=settings.learning_rate,
                                seed=settings.seed)  # fmt: skip


def _trainer(settings: RunSettings, plan: Plan, rank: int, dataset: Dataset):
    algorithm = TRAINING_ALGORITHMS.get(settings.algorithm)
    if algorithm.name == "hybrid_parallel":
        stages = plan.options.stages
        nodes = plan.ranks // stages
        return StageTrainer(settings, dataset, rank % stages, stages, rank // stages, nodes)
    if plan.is_server(rank):
        shards = 1 if algorithm.family == "elastic" else len(plan.servers)
        return TorchTrainer(settings, dataset, algorithm.momentum, server_shard=(rank, shards), rank=rank)
    if plan.is_helper(rank):  # relays a collective: it needs the bucket sizes only
        return TorchTrainer(settings, dataset, algorithm.momentum, rank=rank)
    index = plan.workers.index(rank)
    return TorchTrainer(
        settings, dataset, algorithm.momentum, data_shard=index, data_shards=len(plan.workers), rank=rank
    )


def run_algorithm(settings: RunSettings, transport: Any = None, tracer: Any = None) -> RunResult:
    """Run ``settings.algorithm`` on every rank of ``transport`` (default MPI COMM_WORLD).

    ``tracer`` (a ``TraceWriter`` or anything with ``start``, ``record``, ``flush`` and an
    ``iteration`` attribute) receives every op; without one, ``settings.trace_dir`` gets a
    ``TraceWriter``. The tracer is flushed as each step of this rank begins, so a rank that dies
    keeps its finished steps on disk.
    """
    from ddlsim.real_runs.comm_executor import MpiComm
    from ddlsim.real_runs.trace import TraceWriter
    from ddlsim.real_runs.transport import make_transport

    _torch().set_num_threads(settings.torch_threads)
    transport = transport if transport is not None else make_transport("mpi")
    algorithm = TRAINING_ALGORITHMS.get(settings.algorithm)
    plan = algorithm.plan_exactly(transport.size, settings.steps, settings.options)
    owned = tracer is None and settings.trace_dir is not None
    if owned:
        metadata = {"algorithm": settings.algorithm, "settings": settings.to_dict(), "ranks": transport.size}
        assert settings.trace_dir is not None
        tracer = TraceWriter(settings.trace_dir, transport.rank, metadata)
    comm = MpiComm(transport, tracer)
    if algorithm.name == "megatron":  # its tensor-parallel collectives run inside compute, on ``comm``
        trainer = _megatron_trainer(settings, plan, transport.rank, comm)
    else:
        dataset = load_dataset(settings.dataset, settings.seed, settings.samples, settings.image_size)
        trainer = _trainer(settings, plan, transport.rank, dataset)
    if tracer is not None:
        tracer.start(transport.barrier)
    else:
        transport.barrier()
    is_worker = isinstance(trainer, TorchTrainer) and rank_role(plan, algorithm, transport.rank) == "worker"
    initial = trainer.full_loss() if is_worker else float("nan")
    step = [trainer.iteration]

    def perform(op: Any) -> Any:
        if tracer is not None and trainer.iteration != step[0]:  # a new step began: keep the last on disk
            tracer.flush()
            step[0] = trainer.iteration
        if tracer is not None:
            tracer.iteration = max(trainer.iteration - 1, 0)  # steps count from 0 in traces
        return comm.perform(op)

    try:
        returned = drive(algorithm.program(comm, trainer, plan), perform)
    finally:
        comm.close()
    end = time.perf_counter()
    if tracer is not None:
        tracer.flush()
        if owned:
            tracer.close()
    final = trainer.full_loss() if is_worker else float("nan")
    starts = getattr(trainer, "step_starts", [])
    return RunResult(
        transport.rank,
        rank_role(plan, algorithm, transport.rank),
        returned,
        initial,
        final,
        list(trainer.losses),
        list(trainer.evaluations),
        float(trainer.flat.double().sum()),
        _step_seconds(starts, end) if starts else [],
        trainer.buckets() if "bucket_bytes" in algorithm.options and isinstance(trainer, TorchTrainer) else 0,
    )


def rank_role(plan: Plan, algorithm: Any, rank: int) -> str:
    if plan.is_helper(rank):
        return "helper"
    if plan.is_server(rank):
        return "master" if algorithm.family == "elastic" else "server"
    return "worker"


def steps_to_target(evaluations: list[tuple[int, float]], target_loss: float) -> int | None:
    """Updates until the evaluated loss first reaches ``target_loss`` (None if it never does)."""
    for updates, loss in evaluations:
        if loss <= target_loss:
            return updates
    return None
