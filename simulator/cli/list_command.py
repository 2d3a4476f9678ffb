"""``ddlsim list devices|networks|links|workloads|algorithms``: what the catalog and registries hold.

Workloads are the CNN layer tables (kind ``table``) and the transformer catalog (kind
``decoder``, ``encoder``, ``encoder_decoder``, with ``_moe`` for a mixture of experts), both with
user catalog directories' entries (``DDLSIM_CATALOG``).
"""

from __future__ import annotations

import argparse
import io
import re
import sys

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import device_names, link_names, load_device, load_link
from ddlsim.simulator.cli.common import print_table
from ddlsim.simulator.workloads import load_workload, workload_names
from ddlsim.simulator.workloads.transformer import load_transformer, transformer_names
from ddlsim.simulator.workloads.transformer_costs import (
    model_flops_per_token,
    parameter_count,
    transformer_blocks,
)

KINDS = ("devices", "networks", "links", "workloads", "algorithms", "training-algorithms")


def summary(doc: str | None) -> str:
    """A docstring's first paragraph on one line, as plain text (RST ``literals`` unquoted)."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    return re.sub(r"``([^`]+)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), " ".join(paragraph.split()))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "list", help="list devices, networks, links, workloads, algorithms (collectives) or training-algorithms"
    )
    parser.add_argument("kind", choices=KINDS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # every entry is loaded before anything is printed: a broken datasheet in a user catalog is one
    # error line (exit 2), not a list cut off where it was met
    lines = _lines(args.kind)
    print("\n".join(lines))
    return 0


def _lines(kind_asked: str) -> list[str]:
    """The lines ``ddlsim list KIND`` prints."""
    out: list[str] = []
    if kind_asked == "devices":
        for name in device_names():
            device = load_device(name)
            peaks = "  ".join(
                f"{device.peak_flops[p] / 1e12:7.1f}" if p in device.peak_flops else f"{'-':>7s}"
                for p in ("fp32", "bf16", "fp8")
            )
            out.append(
                f"{name:16s} {peaks} TFLOP/s fp32/bf16/fp8  "
                f"{device.memory_capacity_bytes / 1e9:6.1f} GB  {device.description}"
            )
    elif kind_asked in ("networks", "links"):
        kind = "network" if kind_asked == "networks" else None
        for name in link_names(kind):
            link = load_link(name)
            domain = f"domain {link.domain_size:5d}" if link.domain_size else " " * 12
            out.append(
                f"{name:22s} {link.kind:10s} {link.port_bandwidth_Bps / 1e9:7.2f} GB/s per port  "
                f"{link.latency_s * 1e6:6.2f} us  {domain}  {link.description}"
            )
    elif kind_asked == "workloads":
        rows = []
        for name in workload_names():
            workload = load_workload(name)
            detail = f"{workload.forward_flops / 1e9:.2f} GFLOP fwd/sample, {len(workload.layers)} layers"
            rows.append((name, "table", workload.parameter_count, detail))
        for name in transformer_names():
            config = load_transformer(name)
            blocks = transformer_blocks(config)
            detail = f"seq {config.seq_len}, {model_flops_per_token(blocks) / 1e9:.1f} GFLOP/token (model, fwd+bwd)"
            rows.append((name, config.kind, parameter_count(blocks), detail))
        for name, kind, parameters, detail in sorted(rows):
            out.append(f"{name:18s} {kind:16s} {_count(parameters):>9s} params  {detail}")
    elif kind_asked == "training-algorithms":
        from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS

        algorithms = []
        for name in TRAINING_ALGORITHMS.names():
            trainer = TRAINING_ALGORITHMS.get(name)
            module = sys.modules[type(trainer).__module__]
            description = summary(type(trainer).__doc__ or module.__doc__)
            algorithms.append({"name": name, "family": trainer.family, "description": description})
        table = io.StringIO()
        print_table(algorithms, ("name", "family", "description"), out=table)
        out.append(table.getvalue().rstrip("\n"))
    else:
        for name in COLLECTIVE_ALGORITHMS.names():
            algorithm = COLLECTIVE_ALGORITHMS.get(name)
            out.append(f"{name:20s} {', '.join(algorithm.collectives)}")
    return out


def _count(parameters: int) -> str:
    """124439808 -> '124.4 M', 70553706496 -> '70.55 B'."""
    if parameters >= 1e9:
        return f"{parameters / 1e9:.2f} B"
    return f"{parameters / 1e6:.1f} M"
