"""``ddlsim``: the command line. Each subcommand is a small module with ``register(subparsers)``.

Bad input (unknown names, impossible values) prints one line ``ddlsim: error: ...`` and exits
with status 2, having written nothing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ddlsim.algorithms.schedule import ScheduleError
from ddlsim.hardware_models.catalog import CatalogError
from ddlsim.hardware_models.units import UnitError
from ddlsim.registry import UnknownNameError
from ddlsim.simulator.cli.common import InputError
from ddlsim.simulator.engine.fabric import FabricError
from ddlsim.simulator.scenario import ScenarioError

# one line per command module; each defines register(subparsers)
COMMAND_MODULES = (
    "ddlsim.simulator.cli.simulate_command",
    "ddlsim.simulator.cli.list_command",
    "ddlsim.simulator.cli.collective_command",
    "ddlsim.simulator.cli.measurements_command",
    "ddlsim.simulator.cli.calibrate_command",
    "ddlsim.simulator.cli.validate_command",
    "ddlsim.simulator.cli.run_command",
    "ddlsim.simulator.cli.bench_command",
    "ddlsim.simulator.cli.plot_command",
    "ddlsim.simulator.cli.report_command",
)

USER_ERRORS = (ScenarioError, UnknownNameError, UnitError, ScheduleError, FabricError, CatalogError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddlsim",
        description="Predict how fast distributed deep-learning training runs, and where the time goes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = list(sys.argv[1:] if argv is None else argv)  # what the user typed, for given_flags
    try:
        return int(args.func(args) or 0)
    except (*USER_ERRORS, InputError) as error:
        print(f"ddlsim: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddlsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (ddlsim simulate | head): not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
