"""``ddlsim``: the command line. Each subcommand is a small module with ``register(subparsers)``.

Bad input (unknown names, impossible values) prints one line ``ddlsim: error: ...`` and exits
with status 2, having written nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ddlsim.algorithms.registry import UnknownNameError
from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.hardware_models.catalog import CatalogError
from ddlsim.hardware_models.units import UnitError
from ddlsim.simulator.fabric import FabricError
from ddlsim.simulator.scenario import ScenarioError

# one line per command module; each defines register(subparsers)
COMMAND_MODULES = (
    "ddlsim.simulator.commands.simulate_command",
    "ddlsim.simulator.commands.list_command",
    "ddlsim.simulator.commands.collective_command",
    "ddlsim.simulator.commands.measurements_command",
    "ddlsim.simulator.commands.calibrate_command",
    "ddlsim.simulator.commands.validate_command",
    "ddlsim.simulator.commands.algorithm_command",
    "real_runs.run_command",
    "real_runs.bench_command",
    "ddlsim.simulator.commands.plot_command",
    "ddlsim.simulator.commands.report_command",
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
