"""``ddlsim list devices|networks|links|workloads|algorithms``: what the catalog and registries hold."""

from __future__ import annotations

import argparse
import sys

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.hardware_models.catalog import device_names, link_names, load_device, load_link
from ddlsim.simulator.workloads import load_workload, workload_names

KINDS = ("devices", "networks", "links", "workloads", "algorithms", "training-algorithms")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "list", help="list devices, networks, links, workloads, algorithms (collectives) or training-algorithms"
    )
    parser.add_argument("kind", choices=KINDS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kind == "devices":
        for name in device_names():
            device = load_device(name)
            print(
                f"{name:14s} {device.peak_flops['fp32'] / 1e12:7.2f} TFLOP/s fp32  "
                f"{device.memory_capacity_bytes / 1e9:6.1f} GB  {device.description}"
            )
    elif args.kind in ("networks", "links"):
        kind = "network" if args.kind == "networks" else None
        for name in link_names(kind):
            link = load_link(name)
            print(
                f"{name:12s} {link.kind:10s} {link.port_bandwidth_Bps / 1e9:7.2f} GB/s per port  "
                f"{link.latency_s * 1e6:6.2f} us  {link.description}"
            )
    elif args.kind == "workloads":
        for name in workload_names():
            workload = load_workload(name)
            print(
                f"{name:16s} {workload.parameter_count / 1e6:8.2f} M params  "
                f"{workload.forward_flops / 1e9:8.2f} GFLOP fwd/sample  {len(workload.layers):4d} layers"
            )
    elif args.kind == "training-algorithms":
        from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS

        for name in TRAINING_ALGORITHMS.names():
            trainer = TRAINING_ALGORITHMS.get(name)
            module = sys.modules[type(trainer).__module__]
            doc = (type(trainer).__doc__ or module.__doc__ or "").strip().splitlines()
            print(f"{name:16s} {trainer.family:13s} {doc[0] if doc else ''}")
    else:
        for name in COLLECTIVE_ALGORITHMS.names():
            algorithm = COLLECTIVE_ALGORITHMS.get(name)
            print(f"{name:20s} {', '.join(algorithm.collectives)}")
    return 0
