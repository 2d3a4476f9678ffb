"""Generate the workload tables from the torch models, on the ``meta`` device (no weights, no data).

Usage::

    python -m ddlsim.simulator.workloads.generate [names...] [--out DIR]

Each model is built on ``torch.device("meta")`` and run forward once on a batch-1 input; forward hooks
on the leaf modules record input and output shapes, and the counts below are computed from those
shapes. The output is deterministic: running it again with the same torch gives the same bytes.

Counting rules, per sample (N: output elements, MAC: multiply-adds, k: pooling window elements):

=================== ======================================= ============================================
layer type          forward FLOP                            backward FLOP
=================== ======================================= ============================================
conv, linear        2 MAC (+ N for the bias)                4 MAC (+ N): input grad 2 MAC, weight grad
                                                            2 MAC, bias grad N; also for the first
                                                            layer, whose input grad is not needed
attention (scores)  2 MAC + N (the 1/sqrt(d_k) scaling)     4 MAC + N: grads of both operands
attention (context) 2 MAC                                   4 MAC
batchnorm,          5 N: mean 1, variance 2, normalise and  10 N (2x forward): the scale and shift grads
layernorm           affine 2                                and the input grad through the statistics
relu, dropout       N                                       N (mask multiply)
tanh                N                                       3 N: dy (1 - y^2)
softmax             5 N: max, subtract, exp, sum, divide    4 N: y (dy - sum(dy y))
pool (max, avg)     k N (compare or add per window element) k N (route or spread each output gradient)
add (residual)      (operands - 1) N                        (operands - 1) N: the gradient sum at the
                                                            matching fork of the graph
add (positional)    2 N: scale by sqrt(d_model), add        N: scale the gradient
embedding           0 (a gather)                            N: scatter-add into the weight gradient
concat, flatten     0 (data movement only)                  0
=================== ======================================= ============================================

Bytes count every element as 4 bytes (fp32), token ids included: ``input_bytes`` sums all inputs,
``output_bytes`` is the output. Masking in causal attention is not counted (frameworks compute the
full score matrix). Parameters are the trainable scalars a layer owns; a weight shared between layers
(the Transformer's tied embeddings) is counted at its first use only.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ddlsim.simulator.workloads import COLUMNS, DATA_DIR, FP32_BYTES, Layer
from ddlsim.simulator.workloads.models import (
    MODELS,
    Add,
    AttentionContext,
    AttentionScores,
    Concat,
    ModelSpec,
    PositionalEncoding,
)

BATCH = 1


@dataclass(frozen=True)
class Call:
    """One leaf-module call as the hook saw it: per-sample element counts of inputs and output."""

    name: str
    module: nn.Module
    input_shapes: tuple[tuple[int, ...], ...]  # with the batch dimension
    output_shape: tuple[int, ...]

    @property
    def output_elements(self) -> int:
        return math.prod(self.output_shape) // BATCH

    @property
    def input_elements(self) -> int:
        return sum(math.prod(shape) for shape in self.input_shapes) // BATCH


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return value[0], value[1]


def _pool_window(call: Call) -> int:
    """Elements per pooling window; adaptive pools here always divide their input evenly."""
    module = call.module
    if isinstance(module, nn.AdaptiveAvgPool2d):
        (_, _, height, width), (_, _, out_height, out_width) = call.input_shapes[0], call.output_shape
        if height % out_height or width % out_width:
            raise ValueError(
                f"{call.name}: adaptive pooling {height}x{width} -> {out_height}x{out_width} is uneven"
            )
        return (height // out_height) * (width // out_width)
    assert isinstance(module, nn.MaxPool2d | nn.AvgPool2d)
    kernel_height, kernel_width = _pair(module.kernel_size)
    return kernel_height * kernel_width


def count(call: Call) -> tuple[str, int, int]:
    """(layer_type, forward FLOP, backward FLOP) per sample for one call, by the rules above."""
    module, n = call.module, call.output_elements
    if isinstance(module, nn.Conv2d):
        kernel_height, kernel_width = _pair(module.kernel_size)
        macs = n * (module.in_channels // module.groups) * kernel_height * kernel_width
        bias = n if module.bias is not None else 0
        return "conv", 2 * macs + bias, 4 * macs + bias
    if isinstance(module, nn.Linear):
        macs = n * module.in_features
        bias = n if module.bias is not None else 0
        return "linear", 2 * macs + bias, 4 * macs + bias
    if isinstance(module, AttentionScores):
        macs = n * call.input_shapes[0][-1]  # (batch, heads, query, key) x d_k
        return "attention", 2 * macs + n, 4 * macs + n
    if isinstance(module, AttentionContext):
        macs = n * call.input_shapes[0][-1]  # (batch, heads, query, d_v) x key length
        return "attention", 2 * macs, 4 * macs
    if isinstance(module, nn.BatchNorm2d | nn.LayerNorm):
        layer_type = "batchnorm" if isinstance(module, nn.BatchNorm2d) else "layernorm"
        return layer_type, 5 * n, 10 * n
    if isinstance(module, nn.ReLU):
        return "relu", n, n
    if isinstance(module, nn.Dropout):
        return "dropout", n, n
    if isinstance(module, nn.Tanh):
        return "tanh", n, 3 * n
    if isinstance(module, nn.Softmax):
        return "softmax", 5 * n, 4 * n
    if isinstance(module, nn.MaxPool2d | nn.AvgPool2d | nn.AdaptiveAvgPool2d):
        window = _pool_window(call)
        return "pool", window * n, window * n
    if isinstance(module, Add):
        operands = len(call.input_shapes)
        return "add", (operands - 1) * n, (operands - 1) * n
    if isinstance(module, PositionalEncoding):
        return "add", 2 * n, n
    if isinstance(module, nn.Embedding):
        return "embedding", 0, n
    if isinstance(module, Concat):
        return "concat", 0, 0
    if isinstance(module, nn.Flatten):
        return "flatten", 0, 0
    raise TypeError(f"{call.name}: no counting rule for {type(module).__name__}; add one to count()")


def trace(spec: ModelSpec) -> tuple[list[Call], nn.Module]:
    """Run the model once on the meta device and return the leaf calls in execution order."""
    with torch.device("meta"):
        model = spec.build()
        inputs = spec.example_inputs(BATCH)
    model.eval()  # shapes are those of training; eval only avoids batch-norm's batch-size check
    calls: list[Call] = []

    def record(name: str):
        def hook(module: nn.Module, args: tuple[object, ...], output: Tensor) -> None:
            shapes = tuple(tuple(arg.shape) for arg in args if isinstance(arg, Tensor))
            calls.append(Call(name, module, shapes, tuple(output.shape)))

        return hook

    leaves = [(name, module) for name, module in model.named_modules() if not list(module.children())]
    handles = [module.register_forward_hook(record(name)) for name, module in leaves]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    called = [call.name for call in calls]
    twice = sorted({name for name in called if called.count(name) > 1})
    never = [name for name, module in leaves if name not in called and list(module.parameters())]
    if twice or never:
        raise RuntimeError(f"each leaf must run once: called twice {twice}, never called {never}")
    return calls, model


def profile(spec: ModelSpec) -> list[Layer]:
    """The table rows of one model, per sample; checks that every parameter lands in one row."""
    calls, model = trace(spec)
    seen: set[int] = set()
    layers = []
    for call in calls:
        parameters = 0
        for parameter in call.module.parameters(recurse=False):
            if parameter.requires_grad and id(parameter) not in seen:
                seen.add(id(parameter))
                parameters += parameter.numel()
        layer_type, forward_flops, backward_flops = count(call)
        layers.append(
            Layer(
                name=call.name,
                layer_type=layer_type,
                parameters=parameters,
                forward_flops=forward_flops,
                backward_flops=backward_flops,
                input_bytes=call.input_elements * FP32_BYTES,
                output_bytes=call.output_elements * FP32_BYTES,
            )
        )
    total = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    if sum(layer.parameters for layer in layers) != total:
        raise RuntimeError(f"rows hold {sum(layer.parameters for layer in layers)} parameters, model {total}")
    return layers


def _number(value: float) -> str:
    """Whole numbers without a decimal point, so the files read like the counts they are."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def table_text(name: str) -> str:
    """The CSV text of workload ``name``, metadata lines first."""
    spec = MODELS[name]
    layers = profile(spec)
    buffer = io.StringIO()
    metadata = {
        "description": spec.description,
        "sample_shape": "x".join(str(size) for size in spec.sample_shape),
        "source": spec.source,
        "units": "per sample; FLOP (2 per multiply-add); bytes at 4 per element (fp32)",
        "generator": f"python -m ddlsim.simulator.workloads.generate {name}",
        "torch_version": torch.__version__,
    }
    for key, value in metadata.items():
        buffer.write(f"# {key}: {value}\n")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for layer in layers:
        writer.writerow(
            (
                layer.name,
                layer.layer_type,
                layer.parameters,
                _number(layer.forward_flops),
                _number(layer.backward_flops),
                _number(layer.input_bytes),
                _number(layer.output_bytes),
            )
        )
    return buffer.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ddlsim.simulator.workloads.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "names", nargs="*", metavar="name", help=f"workloads (default all): {', '.join(MODELS)}"
    )
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output folder (default: %(default)s)")
    arguments = parser.parse_args(argv)
    unknown = [name for name in arguments.names if name not in MODELS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; valid: {', '.join(MODELS)}")
    arguments.out.mkdir(parents=True, exist_ok=True)
    for name in arguments.names or list(MODELS):
        path = arguments.out / f"{name}.csv"
        path.write_text(table_text(name), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
