"""Helpers shared by the command modules: output checks, tables, progress, key=value options.

Light to import (the fabric and the scenario load inside the functions that need them), so that a
command's module costs nothing until it runs.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlsim.simulator.parsing import MAX_COUNT, InputError, parse_counts
from ddlsim.simulator.progress import Progress

if TYPE_CHECKING:  # the profile module loads only when a command reads one
    from ddlsim.hardware_models.profile import Profile

__all__ = [
    "InputError", "Progress", "add_topology_arguments", "check_output", "parse_counts", "parse_options",
    "print_table", "read_profile", "topology_options",
]  # fmt: skip

PUBLISHED_PROFILE = "published"  # --profile published: fitted now to the packaged published_dev.csv
PROFILE_HELP = (
    "a profile from 'ddlsim calibrate', or 'published': one fitted now to the published runs ddlsim ships "
    "(published_dev.csv, about 7 s)"
)


def is_published(path: Path | str) -> bool:
    """Whether a ``--profile`` argument asks for the fit to the packaged runs: ``published``, where no
    file of that name is in the working directory."""
    return str(path) == PUBLISHED_PROFILE and not Path(path).exists()


def read_profile(path: Path) -> Profile:
    """The ``Profile`` a ``--profile`` argument names: a TOML file, or ``published`` (no such file
    here): ``ddlsim calibrate`` on the packaged ``published_dev.csv``, run now (seeded, so every call
    fits the same profile), with a line on stderr saying so."""
    from ddlsim.hardware_models.profile import load_profile

    if not is_published(path):
        return load_profile(path)
    from ddlsim.simulator.calibration.fit import calibrate
    from ddlsim.simulator.calibration.measurements import packaged_published_dev, read_measurements

    rows = read_measurements([packaged_published_dev()]).rows
    print(f"ddlsim: --profile published: calibrating on the {len(rows)} rows of the packaged published_dev.csv "
          "(ddlsim calibrate --measurements ... --out FILE saves one to reuse)", file=sys.stderr)  # fmt: skip
    return calibrate(rows, description="ddlsim's published_dev.csv (--profile published)").profile


def check_output(path: Path | None, kind: str = "directory", what: str = "--out", files: Iterable[str] = ()) -> None:
    """Refuse, before any work starts, an output the command could not write (InputError, exit 2).

    ``kind="file"``: ``path`` is the file to write (an existing file is replaced); ``"directory"``:
    ``path`` is a directory the command writes ``files`` into (created if missing). The message names
    the user's path. Refused: a directory where a file is wanted and the reverse, a file in the way
    of a directory to create, and a place this process cannot write (tried by creating and removing
    a probe file in the nearest existing directory, which holds for read-only mounts and for root).
    ``None`` (no output asked for) passes.
    """
    if path is None:
        return
    path = Path(path)
    if kind not in ("file", "directory"):
        raise ValueError(f"check_output: kind must be 'file' or 'directory', got {kind!r}")
    if kind == "file" and path.is_dir():
        raise InputError(f"{what} {path}: is a directory; give the name of the file to write")
    if kind == "directory":
        if path.exists() and not path.is_dir():
            raise InputError(f"{what} {path}: is a file; give a directory to write {', '.join(files) or 'into'}")
        for name in files:
            if (path / name).is_dir():
                raise InputError(f"{what} {path}: {path / name} is a directory, where the file {name} goes")
    target = path if kind == "directory" else path.parent
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{what} {path}: {existing} is a file, not a directory")
    if path.is_file() and not os.access(path, os.W_OK):
        raise InputError(f"{what} {path}: the file is not writable")
    try:
        descriptor, probe = tempfile.mkstemp(dir=existing, prefix=".ddlsim-probe-")
    except OSError as error:
        raise InputError(f"{what} {path}: cannot write in {existing}: {error.strerror}") from None
    os.close(descriptor)
    os.unlink(probe)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out=None) -> None:
    """Print ``columns`` of ``rows`` aligned, one format per column, the unit in each header
    (``iteration_s``, ``busbw_GBps``, ``scaling_efficiency_pct``), ``-`` where a figure does not apply; the same
    formats as the plots and the HTML report (``ddlsim.reports.formatting``)."""
    from ddlsim.reports.formatting import MISSING, format_table, header

    out = out or sys.stdout
    units, cells = format_table([dict(row) for row in rows], columns)
    heads = [header(column, unit) for column, unit in zip(columns, units, strict=True)]
    text = [
        all(line[i] == MISSING or not _numeric(line[i]) for line in cells) and any(line[i] != MISSING for line in cells)
        for i in range(len(columns))
    ]
    widths = [max([len(heads[i]), *(len(line[i]) for line in cells)]) for i in range(len(columns))]

    def align(value: str, i: int) -> str:
        return value.ljust(widths[i]) if text[i] else value.rjust(widths[i])

    print("  ".join(align(head, i) for i, head in enumerate(heads)).rstrip(), file=out)
    for line in cells:
        print("  ".join(align(cell, i) for i, cell in enumerate(line)).rstrip(), file=out)


def _numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return cell in ("inf", "-inf")
    return True


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
    from ddlsim.simulator.input_errors import ScenarioError

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
    from ddlsim.simulator.input_errors import ScenarioError

    if text is None:
        return None
    try:
        dims = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ScenarioError(f"--torus-dims: cannot parse {text!r}; write e.g. 8x8 or 4x4x4") from None
    if any(extent < 1 for extent in dims):
        raise ScenarioError(f"--torus-dims: extents must be positive, got {text!r}")
    if math.prod(dims) > MAX_COUNT:
        raise ScenarioError(f"--torus-dims: {text!r} holds more than {MAX_COUNT:,} nodes")
    return dims


def add_topology_arguments(parser) -> None:
    """The fabric-shape options shared by ``simulate`` and ``collective``; read back with ``topology_options``."""
    from ddlsim.simulator.engine.fabric_spec import PLACEMENTS, TOPOLOGIES
    from ddlsim.simulator.parsing import bounded

    parser.add_argument(
        "--nics-per-node", type=bounded(int, 1, 64, "--nics-per-node"), default=1, help="network adapters per node"
    )
    parser.add_argument(
        "--sockets", type=bounded(int, 1, 8, "--sockets"), default=1,
        help="CPU sockets a node's devices are split over (PCIe peer and NIC traffic between sockets "
        "crosses --socket-link)",
    )  # fmt: skip
    parser.add_argument("--socket-link", default=None, help="the link between two sockets (e.g. qpi)")
    parser.add_argument("--topology", default="switch", help=", ".join(TOPOLOGIES))
    parser.add_argument(
        "--oversubscription", type=bounded(float, 1, 1024, "--oversubscription"), default=1.0,
        help="fat tree leaf uplink oversubscription (1 to 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes-per-leaf", type=bounded(int, 1, 2**16, "--nodes-per-leaf"), default=16,
        help="fat tree nodes under one leaf switch",
    )  # fmt: skip
    parser.add_argument("--torus-dims", default=None, help="torus extents in nodes, e.g. 8x8 or 4x4x4")
    parser.add_argument(
        "--nodes-per-router", type=bounded(int, 1, 1024, "--nodes-per-router"), default=4,
        help="dragonfly: nodes on one router (Cray Aries: 4)",
    )  # fmt: skip
    parser.add_argument(
        "--routers-per-group", type=bounded(int, 1, 4096, "--routers-per-group"), default=16,
        help="dragonfly: routers joined all to all in one group (Cray XC: 96)",
    )  # fmt: skip
    parser.add_argument(
        "--dragonfly-global-links", type=bounded(int, 1, 4096, "--dragonfly-global-links"), default=1,
        help="dragonfly: links between each pair of groups (each at the network's port bandwidth)",
    )  # fmt: skip
    parser.add_argument(
        "--placement", default="block", help=f"rank placement: {', '.join(PLACEMENTS)} (scatter ignores leaves)"
    )
    parser.add_argument("--loggp", action="store_true", help="LogGP-style CPU overhead per message at both ends")


def topology_options(args) -> dict[str, Any]:
    """The ``add_topology_arguments`` options as Scenario / CollectiveSetup fields."""
    from ddlsim.simulator.engine.fabric_spec import topology_of

    return {**topology_of(args), "torus_dims": parse_torus_dims(args.torus_dims), "socket_link": args.socket_link}
