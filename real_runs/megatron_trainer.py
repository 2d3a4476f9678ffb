"""The real ``Trainer`` of the ``megatron`` algorithm: a small GPT split over CPU ranks, for real.

The role program is ``algorithms/megatron_training.py``'s, unchanged: this rank's pipeline schedule,
activations and their gradients between pipeline neighbours, the data-parallel reductions on the
communication stream, the optimizer step, the weight gathers. What happens inside a chunk's compute
belongs to the layer, as in Megatron-LM, and runs here on sub-communicators of the same transport:

* tensor parallelism (Shoeybi et al. 2019): the query/key/value and first feed-forward products are
  split by output (column-parallel: each rank its heads, its share of the feed-forward width), the
  attention output and second feed-forward products by input (row-parallel); the identity whose
  backward all-reduces the input gradient ("f") before each column-parallel product, and the
  all-reduce of the partial outputs ("g") after each row-parallel one, are the autograd functions
  below, each an ``allreduce`` over the rank's tensor-parallel group;
* ZeRO-3: a chunk's weights live as this rank's shard; they are gathered over the data-parallel
  group before each forward and backward, and the chunk's gradients are reduce-scattered after each
  backward, inside the work item (the simulated trainer's ``zero3`` part with the layout's
  ``zero3_prefetch`` off: a prefetch on the communication stream's thread made ZeRO-3 slower on a
  2-core machine, whose cores the ranks already use).

Weights are drawn for the whole model from one seed and sliced per tensor-parallel rank, so any
layout trains the same network as one rank would: with the same global batch, a layout's losses
equal a single rank's (the tests hold them to that). Data: sequences of a fixed random permutation
of the vocabulary (learnable: the next token is a function of the current), the same on every rank
for the same (iteration, global micro-batch). The optimizer is Adam on the rank's flat shard (the
whole chunk at ZeRO 0), gradients averaged over the data-parallel group.

Not run for real (refused at start, one line): sequence and context parallelism, experts,
activation recomputation, the overlapped reductions and gathers, TP overlap; compute is fp32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlsim.algorithms.comm import Collective
from ddlsim.algorithms.megatron_training import coordinates, data_parallel_group, micro_batches
from ddlsim.algorithms.parallel_layout import ParallelLayout
from ddlsim.algorithms.training_algorithm import TrainingAlgorithmError

ADAM = (0.9, 0.95, 1e-8)  # beta1, beta2, epsilon (Megatron's GPT defaults)


@dataclass(frozen=True)
class GptShape:
    """The model the harness trains (a decoder-only GPT: learned positions, LayerNorm, GeLU)."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocabulary: int
    seq_len: int


def _torch():
    import torch

    return torch


class TimedTorchWork:
    """A compute item of the real trainer: ``run()`` does it (the real executor times it)."""

    duration_s = 0.0

    def __init__(self, name: str, function, iteration: int) -> None:
        self.name, self._function, self.iteration = name, function, iteration

    def run(self) -> Any:
        return self._function()


class _Group:
    """Collectives over a group of ranks, called inside compute on the rank's own transport."""

    def __init__(self, comm: Any, ranks: tuple[int, ...], algorithm: str) -> None:
        self.comm, self.ranks, self.algorithm = comm, ranks, algorithm

    def __call__(self, collective: str, array: np.ndarray) -> np.ndarray:
        if len(self.ranks) == 1:
            return array
        return np.asarray(self.comm.perform(Collective(collective, array, self.algorithm, group=self.ranks)))


def _parallel_functions(tp_group: _Group):
    """Megatron's "f" (identity forward, all-reduce backward) and "g" (all-reduce forward,
    identity backward) over ``tp_group``."""
    torch = _torch()

    def allreduce(tensor: Any) -> Any:
        reduced = tp_group("allreduce", np.ascontiguousarray(tensor.detach().numpy()))
        return torch.from_numpy(reduced.reshape(tensor.shape))

    function: Any = torch.autograd.Function

    class CopyToTensorParallel(function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return allreduce(grad)

    class ReduceFromTensorParallel(function):
        @staticmethod
        def forward(ctx, x):
            return allreduce(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    return CopyToTensorParallel.apply, ReduceFromTensorParallel.apply


def _full_weights(shape: GptShape, seed: int, layer: int) -> dict[str, np.ndarray]:
    """Every weight of decoder layer ``layer`` (-1: embeddings, -2: final norm and head), whole."""
    rng = np.random.default_rng([seed, layer + 2])
    h, f, v = shape.hidden, shape.ffn_hidden, shape.vocabulary

    def normal(*size: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(size) * scale).astype(np.float32)

    if layer == -1:
        return {"tokens": normal(v, h), "positions": normal(shape.seq_len, h)}
    if layer == -2:
        return {"norm_w": np.ones(h, np.float32), "norm_b": np.zeros(h, np.float32), "head": normal(v, h)}
    out_scale = 0.02 / math.sqrt(2 * shape.layers)  # Megatron's scaled init of the output products
    return {
        "ln1_w": np.ones(h, np.float32), "ln1_b": np.zeros(h, np.float32),
        "q": normal(h, h), "k": normal(h, h), "v": normal(h, h),
        "q_b": np.zeros(h, np.float32), "k_b": np.zeros(h, np.float32), "v_b": np.zeros(h, np.float32),
        "proj": normal(h, h, scale=out_scale), "proj_b": np.zeros(h, np.float32),
        "ln2_w": np.ones(h, np.float32), "ln2_b": np.zeros(h, np.float32),
        "fc1": normal(f, h), "fc1_b": np.zeros(f, np.float32),
        "fc2": normal(h, f, scale=out_scale), "fc2_b": np.zeros(h, np.float32),
    }  # fmt: skip


def _tp_slice(name: str, weight: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This tensor-parallel rank's part: rows of column-parallel products, columns of row-parallel ones."""
    if name in ("q", "k", "v", "q_b", "k_b", "v_b", "fc1", "fc1_b"):
        return np.array_split(weight, size, axis=0)[rank].copy()
    if name in ("proj", "fc2"):
        return np.array_split(weight, size, axis=1)[rank].copy()
    return weight


class MegatronTorchTrainer:
    """The ``Trainer`` of one rank of a megatron layout, running for real (see the module docstring)."""

    def __init__(self, shape: GptShape, layout: ParallelLayout, comm: Any, rank: int, *, collective: str = "ring",
                 batch: int = 1, learning_rate: float = 1e-3, seed: int = 0) -> None:  # fmt: skip
        torch = _torch()
        self.torch = torch
        self.shape, self.layout, self.rank, self.seed = shape, layout, rank, seed
        self.lr = learning_rate
        here = coordinates(rank, layout)
        self.here = here
        self.micro_batch = layout.micro_batch
        self.micro_batches = micro_batches(layout)
        tp_first = rank - here.tp
        self.tp_group = _Group(comm, tuple(range(tp_first, tp_first + layout.tp)), collective)
        self.dp_ranks = data_parallel_group(rank, layout)
        self.dp_group = _Group(comm, self.dp_ranks, collective)
        self.collective = collective
        self.copy_to, self.reduce_from = _parallel_functions(self.tp_group)
        self.chunks = layout.virtual_stages
        per_virtual = layout.layers_per_virtual_stage(shape.layers)
        starts = np.cumsum([0, *per_virtual])
        last_virtual = layout.pp * layout.virtual_stages - 1
        self.params: list[dict[str, Any]] = []
        self.virtuals = [chunk * layout.pp + here.pp for chunk in range(self.chunks)]
        for virtual in self.virtuals:
            layers = range(int(starts[virtual]), int(starts[virtual + 1]))
            self.params.append(self._chunk_parameters(layers, virtual == 0, virtual == last_virtual))
        self.last_virtual = last_virtual
        self.flats = [self._flatten(chunk) for chunk in range(self.chunks)]
        size = len(self.dp_ranks)
        self.padded = [int(math.ceil(flat.numel() / size) * size) for flat in self.flats]
        zero = layout.zero_stage
        self.owned = [self._block("reduce_scatter", chunk) for chunk in range(self.chunks)] if zero else None
        self.adam = [self._adam_state(chunk) for chunk in range(self.chunks)]
        self.shard_grads = [np.zeros(self._state_size(chunk), np.float32) for chunk in range(self.chunks)]
        self._stale = [False] * self.chunks  # ZeRO-3: updated since the last gather
        self.iteration = 0
        self.step_count = 0
        self.losses: list[float] = []
        self.evaluations: list[tuple[int, float]] = []
        self.step_starts: list[float] = []
        self._saved: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._loss_sum = 0.0
        self.permutation = np.random.default_rng([seed, 1]).permutation(shape.vocabulary)

    # --- model -----------------------------------------------------------------------------------
    def _chunk_parameters(self, layers: range, first: bool, last: bool) -> dict[str, Any]:
        torch, tp = self.torch, self.layout
        out: dict[str, Any] = {}
        pieces = [(-1, "emb.")] if first else []
        pieces += [(layer, f"l{layer}.") for layer in layers]
        pieces += [(-2, "out.")] if last else []
        for layer, prefix in pieces:
            for name, weight in _full_weights(self.shape, self.seed, layer).items():
                part = _tp_slice(name, weight, self.here.tp, tp.tp) if layer >= 0 else weight
                out[prefix + name] = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(part)))
        out["_layers"] = list(layers)
        out["_first"], out["_last"] = first, last
        return out

    def _tensors(self, chunk: int) -> list[Any]:
        return [value for key, value in self.params[chunk].items() if not key.startswith("_")]

    def _flatten(self, chunk: int) -> Any:
        torch = self.torch
        tensors = self._tensors(chunk)
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).clone()
        offset = 0
        for t in tensors:
            t.data = flat[offset : offset + t.numel()].view_as(t)
            offset += t.numel()
        return flat

    def _layer(self, x: Any, p: dict[str, Any], prefix: str) -> Any:
        torch = self.torch
        functional = torch.nn.functional
        b, s, h = x.shape
        local_heads = self.shape.heads // self.layout.tp
        y = self.copy_to(functional.layer_norm(x, (h,), p[prefix + "ln1_w"], p[prefix + "ln1_b"]))

        def heads(t: Any) -> Any:
            return t.view(b, s, local_heads, -1).transpose(1, 2)

        q = heads(functional.linear(y, p[prefix + "q"], p[prefix + "q_b"]))
        k = heads(functional.linear(y, p[prefix + "k"], p[prefix + "k_b"]))
        v = heads(functional.linear(y, p[prefix + "v"], p[prefix + "v_b"]))
        attention = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        attention = attention.transpose(1, 2).reshape(b, s, -1)
        x = x + self.reduce_from(functional.linear(attention, p[prefix + "proj"])) + p[prefix + "proj_b"]
        y = self.copy_to(functional.layer_norm(x, (h,), p[prefix + "ln2_w"], p[prefix + "ln2_b"]))
        y = functional.gelu(functional.linear(y, p[prefix + "fc1"], p[prefix + "fc1_b"]))
        return x + self.reduce_from(functional.linear(y, p[prefix + "fc2"])) + p[prefix + "fc2_b"]

    def _tokens(self, micro_batch: int) -> tuple[Any, Any]:
        """(inputs, labels) of this data-parallel rank's ``micro_batch`` of the current iteration."""
        index = self.here.dp * self.micro_batches + micro_batch  # the global micro-batch
        rng = np.random.default_rng([self.seed, 2, self.iteration, index])
        starts = rng.integers(0, self.shape.vocabulary, size=self.micro_batch)
        sequences = np.empty((self.micro_batch, self.shape.seq_len + 1), dtype=np.int64)
        sequences[:, 0] = starts
        for position in range(1, self.shape.seq_len + 1):
            sequences[:, position] = self.permutation[sequences[:, position - 1]]
        torch = self.torch
        return torch.from_numpy(sequences[:, :-1]), torch.from_numpy(sequences[:, 1:])

    def _chunk_forward(self, chunk: int, micro_batch: int, activation: Any) -> tuple[Any, Any]:
        torch, p = self.torch, self.params[chunk]
        functional = torch.nn.functional
        if p["_first"]:
            tokens, _ = self._tokens(micro_batch)
            x_in = None
            x = functional.embedding(tokens, p["emb.tokens"]) + p["emb.positions"][: tokens.shape[1]]
        else:
            x_in = torch.from_numpy(np.array(activation, dtype=np.float32)).requires_grad_()
            x = x_in
        for layer in p["_layers"]:
            x = self._layer(x, p, f"l{layer}.")
        if not p["_last"]:
            return x_in, x
        _, labels = self._tokens(micro_batch)
        x = functional.layer_norm(x, (self.shape.hidden,), p["out.norm_w"], p["out.norm_b"])
        logits = functional.linear(x, p["out.head"])
        loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        self._loss_sum += float(loss.detach())
        return x_in, loss / self.micro_batches

    # --- ZeRO: shard blocks, gathers and reduce-scatters ------------------------------------------
    def _block(self, collective: str, chunk: int) -> list[tuple[int, int]]:
        from ddlsim.algorithms.collective import resolve
        from ddlsim.real_runs.schedule_executor import build_schedule, contract_blocks

        size = len(self.dp_ranks)
        if size == 1:
            return [(0, self.padded[chunk])]
        token, chosen = resolve(self.collective, collective, 4.0 * self.padded[chunk], size)
        return contract_blocks(build_schedule(token, collective, size, **chosen), self.padded[chunk])

    def _mine(self) -> int:
        return self.dp_ranks.index(self.rank)

    def _state_size(self, chunk: int) -> int:
        if self.owned is None:
            return int(self.flats[chunk].numel())
        low, high = self.owned[chunk][self._mine()]
        return high - low

    def _adam_state(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        size = self._state_size(chunk)
        return np.zeros(size, np.float32), np.zeros(size, np.float32)

    def _padded(self, chunk: int, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.padded[chunk], np.float32)
        out[: values.size] = values
        return out

    def _gather_payload(self, chunk: int) -> np.ndarray:
        """The all-gather's buffer: this rank's updated shard where the gather's schedule starts it."""
        assert self.owned is not None
        gather = self._block("allgather", chunk)
        payload = np.zeros(self.padded[chunk], np.float32)
        flat = self._padded(chunk, self.flats[chunk].numpy())
        low, high = self.owned[chunk][self._mine()]
        start, end = gather[self._mine()]
        payload[start:end] = flat[low:high]
        return payload

    def _assign_gathered(self, chunk: int, gathered: np.ndarray) -> None:
        assert self.owned is not None
        gather = self._block("allgather", chunk)
        full = np.zeros(self.padded[chunk], np.float32)
        for (low, high), (start, end) in zip(self.owned[chunk], gather, strict=True):
            full[low:high] = gathered[start:end]
        flat = self.flats[chunk]
        flat.copy_(self.torch.from_numpy(full[: flat.numel()]))

    def _zero3_gather(self, chunk: int) -> None:
        """ZeRO-3's gather before a forward or backward. The weights change only at the step, so the
        first gather after it assigns them; the later ones of the iteration bring the same values
        (they run for their cost) and leave the weights the pending backwards saved untouched."""
        if self.layout.zero_stage >= 3 and len(self.dp_ranks) > 1:
            gathered = self.dp_group("allgather", self._gather_payload(chunk))
            if self._stale[chunk]:
                self._assign_gathered(chunk, gathered)
                self._stale[chunk] = False

    def _zero3_reduce(self, chunk: int) -> None:
        """Reduce-scatter the chunk's gradients of this backward; keep this rank's block."""
        if self.layout.zero_stage < 3:
            return
        assert self.owned is not None
        gradient = self._padded(chunk, self._flat_gradient(chunk))
        reduced = self.dp_group("reduce_scatter", gradient)
        low, high = self.owned[chunk][self._mine()]
        self.shard_grads[chunk] += reduced[low:high]
        for tensor in self._tensors(chunk):
            tensor.grad = None

    def _flat_gradient(self, chunk: int) -> np.ndarray:
        parts = [t.grad.reshape(-1).numpy() if t.grad is not None else np.zeros(t.numel(), np.float32)
                 for t in self._tensors(chunk)]  # fmt: skip
        return np.concatenate(parts).astype(np.float32, copy=False)

    # --- the Trainer interface the megatron program uses --------------------------------------------
    def stage_forward(self, micro_batch: int, chunk: int, activation: Any) -> TimedTorchWork:
        if micro_batch == 0 and chunk == 0:
            self.iteration += 1
            self.step_starts.append(time.perf_counter())
            self._loss_sum = 0.0

        def run() -> Any:
            self._zero3_gather(chunk)
            x_in, output = self._chunk_forward(chunk, micro_batch, activation)
            self._saved[(micro_batch, chunk)] = (x_in, output)
            if self.virtuals[chunk] == self.last_virtual:
                return None
            return output.detach().numpy()

        return TimedTorchWork("forward", run, self.iteration)

    def stage_backward(self, micro_batch: int, chunk: int, gradient: Any) -> TimedTorchWork:
        def run() -> Any:
            self._zero3_gather(chunk)
            x_in, output = self._saved.pop((micro_batch, chunk))
            if self.virtuals[chunk] == self.last_virtual:
                output.backward()
            else:
                output.backward(self.torch.from_numpy(np.array(gradient, dtype=np.float32)))
            self._zero3_reduce(chunk)
            if self.virtuals[chunk] == self.last_virtual and micro_batch == self.micro_batches - 1:
                self.losses.append(self._loss_sum / self.micro_batches)
            return None if x_in is None else x_in.grad.numpy()

        return TimedTorchWork("backward", run, self.iteration)

    def chunk_gradients(self, chunk: int) -> list[tuple[np.ndarray, str, str]]:
        if self.layout.zero_stage >= 3:
            return []
        collective = "allreduce" if self.layout.zero_stage == 0 else "reduce_scatter"
        return [(self._padded(chunk, self._flat_gradient(chunk)), collective, "dense")]

    def parameter_shard(self, chunk: int) -> np.ndarray:
        return self._gather_payload(chunk)

    def assign_gathered(self, gathered: list[Any]) -> TimedTorchWork:
        def run() -> None:
            for chunk, payload in enumerate(gathered):
                self._assign_gathered(chunk, np.asarray(payload))

        return TimedTorchWork("assign", run, self.iteration)

    def step(self, reduced: Any, scale: float = 1.0) -> TimedTorchWork:
        def run() -> None:
            self.step_count += 1
            for chunk in range(self.chunks):
                if self.layout.zero_stage >= 3:
                    gradient = self.shard_grads[chunk]
                elif len(self.dp_ranks) == 1:  # nothing to reduce: the program started no reduction
                    gradient = self._flat_gradient(chunk)
                elif self.owned is None:
                    gradient = np.asarray(reduced[chunk])[: self.flats[chunk].numel()]
                else:
                    low, high = self.owned[chunk][self._mine()]
                    gradient = np.asarray(reduced[chunk])[low:high]
                self._adam(chunk, gradient / len(self.dp_ranks))
                self.shard_grads[chunk][:] = 0.0
                self._stale[chunk] = True
                for tensor in self._tensors(chunk):
                    tensor.grad = None

        return TimedTorchWork("update", run, self.iteration)

    def _adam(self, chunk: int, gradient: np.ndarray) -> None:
        beta1, beta2, epsilon = ADAM
        m, v = self.adam[chunk]
        m *= beta1
        m += (1 - beta1) * gradient
        v *= beta2
        v += (1 - beta2) * gradient * gradient
        update = self.lr * (m / (1 - beta1**self.step_count)) / (np.sqrt(v / (1 - beta2**self.step_count)) + epsilon)
        flat = self.flats[chunk]
        if self.owned is None:
            flat.sub_(self.torch.from_numpy(update.astype(np.float32)))
            return
        low, high = self.owned[chunk][self._mine()]
        padded = self._padded(chunk, flat.numpy())
        padded[low:high] -= update.astype(np.float32)
        flat.copy_(self.torch.from_numpy(padded[: flat.numel()]))

    @property
    def flat(self) -> Any:
        """Every weight this rank holds (its chunks), one vector: the run's digest sums it."""
        return self.torch.cat(list(self.flats))

    def full_loss(self) -> float:
        return float("nan")


def check_runnable(options: Any) -> None:
    """Raise TrainingAlgorithmError (one line) for what the harness does not run for real."""
    layout = options.layout
    unsupported = [
        ("sequence_parallel", layout.sequence_parallel), ("cp > 1", layout.cp > 1), ("ep > 1", layout.ep > 1),
        (f"recompute {layout.recompute}", layout.recompute != "none"), ("tp_comm_overlap", layout.tp_comm_overlap),
        ("overlap_grad_reduce", options.overlap_grad_reduce), ("overlap_param_gather", options.overlap_param_gather),
        ("frozen_weights", layout.frozen_weights),
    ]  # fmt: skip
    named = [name for name, used in unsupported if used]
    if named:
        raise TrainingAlgorithmError(
            f"the harness runs megatron with tensor, pipeline (interleaved too) and data parallelism and ZeRO 0-3; "
            f"not {', '.join(named)} (those are simulated only)"
        )
