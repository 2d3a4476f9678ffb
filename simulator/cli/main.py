"""``ddlsim``: the command line. Each subcommand is a small module with ``register(subparsers)``.

Only the module of the command being run is imported (``ddlsim --help`` imports none, and no
numpy, SimPy or matplotlib), so the command line starts at once. Bad input (unknown names,
impossible values, malformed options) prints one line ``ddlsim: error: ...`` and exits with status
2, having written nothing; an interrupt exits with 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ddlsim.simulator.cli.allocator import keep_freed_memory
from ddlsim.simulator.parsing import InputError

# command: (module defining register(subparsers), the one-line help shown by ``ddlsim --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "ddlsim.simulator.cli.simulate_command",
        "simulate a training algorithm over node counts: time per step, throughput, scaling, where time goes",
    ),
    "list": (
        "ddlsim.simulator.cli.list_command",
        "list devices, networks, links, workloads, algorithms (collectives) or training-algorithms",
    ),
    "collective": (
        "ddlsim.simulator.cli.collective_command",
        "simulate one collective: time, algbw and busbw (nccl-tests definitions) per message size",
    ),
    "measurements": (
        "ddlsim.simulator.cli.measurements_command",
        "check, split or convert measurement files (CSV schema)",
    ),
    "calibrate": (
        "ddlsim.simulator.cli.calibrate_command",
        "fit compute across devices, link alpha/beta per message size, overlap interference and noise",
    ),
    "validate": (
        "ddlsim.simulator.cli.validate_command",
        "predict measurements after calibrating on others; exit 1 past --tolerance",
    ),
    "plan": (
        "ddlsim.simulator.cli.plan_command",
        "search every TP x PP x DP x CP x EP layout of a transformer on N GPUs: fits, ranked by throughput",
    ),
    "run": ("ddlsim.simulator.cli.run_command", "train for real (torch + MPI or gloo) on N ranks and trace every op"),
    "bench": (
        "ddlsim.simulator.cli.bench_command",
        "measure point-to-point, collectives and per-layer compute for calibration",
    ),
    "plot": ("ddlsim.simulator.cli.plot_command", "plot result directories: scaling, breakdown, validate, collective"),
    "report": (
        "ddlsim.simulator.cli.report_command",
        "self-contained HTML report of result directories; 'report gallery' runs the published-results gallery",
    ),
}
ALIASES = {"simulate-algorithm": "simulate"}

# (module, class): errors that are the user's input, reported in one line with exit status 2. Looked
# up in sys.modules when an error arrives: a module never imported cannot have raised its error.
USER_ERRORS = (
    ("ddlsim.simulator.input_errors", "ScenarioError"),  # (scenario.py re-exports it)
    ("ddlsim.registry", "UnknownNameError"),
    ("ddlsim.hardware_models.units", "UnitError"),
    ("ddlsim.algorithms.schedule", "ScheduleError"),
    ("ddlsim.simulator.engine.fabric_spec", "FabricError"),
    ("ddlsim.hardware_models.catalog", "CatalogError"),
)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as the one line every other bad input gets (status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ddlsim: error: {message} (see '{self.prog} --help')\n")


class VersionAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        import ddlsim

        print(f"ddlsim {ddlsim.__version__}")
        parser.exit(0)


def catalog_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ``--catalog DIR`` values anywhere in ``argv`` (before or after the command), and the rest.

    Taken out before parsing so that every command accepts the flag in either place."""
    directories: list[str] = []
    rest: list[str] = []
    items = iter(argv)
    for arg in items:
        if arg == "--":
            rest += [arg, *items]
            break
        if arg == "--catalog":
            value = next(items, None)
            if value is None:
                raise InputError("--catalog needs a directory (of devices/, links/ or transformers/ TOML files)")
            directories.append(value)
        elif arg.startswith("--catalog="):
            directories.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return directories, rest


def use_catalogs(directories: Sequence[str]) -> None:
    """Search the user's catalog directories after the built-ins, here and in every process this
    command starts (process pools, MPI ranks: through ``DDLSIM_CATALOG``). A directory that does not
    exist or holds no catalog is one line, exit status 2."""
    import os

    from ddlsim.hardware_models.catalog import CATALOG_ENVIRONMENT_VARIABLE, register_catalog_directory

    resolved = [str(register_catalog_directory(directory)) for directory in directories]
    inherited = os.environ.get(CATALOG_ENVIRONMENT_VARIABLE, "")
    os.environ[CATALOG_ENVIRONMENT_VARIABLE] = os.pathsep.join([*resolved, *([inherited] if inherited else [])])


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (aliases resolved), or None."""
    for arg in argv:
        if not arg.startswith("-"):
            return ALIASES.get(arg, arg) if ALIASES.get(arg, arg) in COMMANDS else None
    return None


def build_parser(command: str | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The parser. Subcommands whose module is not loaded are listed by name and help only: with
    ``every`` (tests, documentation) all modules load; otherwise only ``command``'s."""
    parser = Parser(
        prog="ddlsim",
        description="Predict how fast distributed deep-learning training runs, and where the time goes.",
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "--catalog",
        metavar="DIR",
        action="append",
        help="also read devices/, links/ and transformers/ datasheets (TOML) from DIR, checked like the "
        "built-ins; repeatable, before or after the command (or DDLSIM_CATALOG=dir1:dir2)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    aliases = {name: [alias for alias, target in ALIASES.items() if target == name] for name in COMMANDS}
    for name, (module, help_text) in COMMANDS.items():
        if every or name == command:
            importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, aliases=aliases[name])
    return parser


def is_user_error(error: BaseException) -> bool:
    for module, name in USER_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(error, cls):
            return True
    return isinstance(error, InputError)


def main(argv: Sequence[str] | None = None) -> int:
    keep_freed_memory()  # the process is ours: glibc tuned for arrays made and dropped at every step
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        catalogs, argv = catalog_arguments(argv)
    except InputError as error:
        print(f"ddlsim: error: {error}", file=sys.stderr)
        return 2
    command = command_of(argv)
    args = build_parser(command, every=False).parse_args(argv)
    args.command_line = argv  # what the user typed, for given_flags
    try:
        if catalogs:
            use_catalogs(catalogs)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM where a command turns it into one
        signum = int(getattr(interrupt, "signum", 2))
        detail = f": {interrupt}" if str(interrupt) else ""
        print(f"ddlsim: interrupted{detail}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # the reader of our output went away (ddlsim simulate | head): not an error
        sys.stderr.close()
        return 0
    except Exception as error:
        if not is_user_error(error):
            raise
        print(f"ddlsim: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
