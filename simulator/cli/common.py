"""Helpers shared by the command modules: table printing, progress, key=value options."""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ddlsim.simulator.cli.parsing import InputError, parse_counts
from ddlsim.simulator.engine.fabric import topology_of
from ddlsim.simulator.progress import Progress
from ddlsim.simulator.scenario import ScenarioError

__all__ = [
    "InputError", "Progress", "add_topology_arguments", "parse_counts", "parse_options", "print_table",
    "topology_options",
]  # fmt: skip


def format_cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.4g}"
        return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out=None) -> None:
    out = out or sys.stdout
    cells = [[format_cell(row.get(column, "")) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) if cells else len(column)
        for i, column in enumerate(columns)
    ]
    print("  ".join(column.rjust(width) for column, width in zip(columns, widths, strict=True)), file=out)
    for line in cells:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)), file=out)


def given_flags(args: argparse.Namespace) -> set[str]:
    """The destinations of the options the user typed (not those left at their defaults), found by
    parsing the command line again with every default suppressed."""
    parser = getattr(args, "command_parser", None)
    line = getattr(args, "command_line", None)
    if parser is None or line is None:
        return set()
    quiet = copy.deepcopy(parser)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    position = line.index(args.command) if args.command in line else -1
    namespace, _ = quiet.parse_known_args(line[position + 1 :])
    return set(vars(namespace))


def parse_options(items: Sequence[str] | None, what: str = "--algorithm-option") -> dict[str, Any]:
    """Parse KEY=VALUE items; values become int, float, bool or stay strings."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"{what}: expected KEY=VALUE, got {item!r}")
        value: Any = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        if raw in ("true", "false"):
            value = raw == "true"
        options[key.replace("-", "_")] = value
    return options


def parse_torus_dims(text: str | None) -> tuple[int, ...] | None:
    """Parse torus extents "8x8" or "4x4x4"; None stays None."""
    if text is None:
        return None
    try:
        dims = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ScenarioError(f"--torus-dims: cannot parse {text!r}; write e.g. 8x8 or 4x4x4") from None
    if any(extent < 1 for extent in dims):
        raise ScenarioError(f"--torus-dims: extents must be positive, got {text!r}")
    return dims


def add_topology_arguments(parser) -> None:
    """The fabric-shape options shared by ``simulate`` and ``collective``; read back with ``topology_options``."""
    from ddlsim.simulator.engine.fabric import PLACEMENTS, TOPOLOGIES

    parser.add_argument("--nics-per-node", type=int, default=1, help="network adapters per node")
    parser.add_argument("--topology", default="switch", help=", ".join(TOPOLOGIES))
    parser.add_argument(
        "--oversubscription", type=float, default=1.0, help="fat tree leaf uplink oversubscription (>= 1)"
    )
    parser.add_argument("--nodes-per-leaf", type=int, default=16, help="fat tree nodes under one leaf switch")
    parser.add_argument("--torus-dims", default=None, help="torus extents in nodes, e.g. 8x8 or 4x4x4")
    parser.add_argument(
        "--placement", default="block", help=f"rank placement: {', '.join(PLACEMENTS)} (scatter ignores leaves)"
    )
    parser.add_argument("--loggp", action="store_true", help="LogGP-style CPU overhead per message at both ends")


def topology_options(args) -> dict[str, Any]:
    """The ``add_topology_arguments`` options as Scenario / CollectiveSetup fields."""
    return {**topology_of(args), "torus_dims": parse_torus_dims(args.torus_dims)}
