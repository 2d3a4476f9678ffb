"""``ddlsim``: the command line. Each subcommand is a small module with ``register(subparsers)``.

Bad input (unknown names, impossible values) prints one line ``ddlsim: error: ...`` and exits
with status 2, having written nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from algorithms.registry import UnknownNameError
from algorithms.schedule import ScheduleError
from hardware_models.catalog import CatalogError
from hardware_models.units import UnitError
from simulator.fabric import FabricError
from simulator.scenario import ScenarioError

# one line per command module; each defines register(subparsers)
COMMAND_MODULES = (
    "simulator.commands.simulate_command",
    "simulator.commands.list_command",
    "simulator.commands.collective_command",
    "simulator.commands.measurements_command",
    "simulator.commands.calibrate_command",
    "simulator.commands.validate_command",
    "simulator.commands.algorithm_command",
    "real_runs.run_command",
    "real_runs.bench_command",
    "simulator.commands.plot_command",
    "simulator.commands.report_command",
)

USER_ERRORS = (ScenarioError, UnknownNameError, UnitError, ScheduleError, FabricError, CatalogError)


class InputError(ValueError):
    """Bad command-line input detected by a command itself."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddlsim",
        description="Predict how fast distributed deep-learning training runs, and where the time goes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name and name.startswith(error.name):
                continue  # an optional command whose module is absent
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (*USER_ERRORS, InputError) as error:
        print(f"ddlsim: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddlsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
