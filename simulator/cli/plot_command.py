"""``ddlsim plot``: PNGs from result directories (never re-simulating).

    ddlsim plot scaling    runs/a runs/b [--out PNG]   efficiency and throughput vs devices
    ddlsim plot breakdown  runs/a        [--out PNG]   compute / exposed communication / idle per scale
    ddlsim plot validate   reports/validation          predicted vs measured with +-10 % / +-25 % bands
    ddlsim plot collective runs/c ...                  time and bus bandwidth vs message size

The PNG goes to ``--out``, or by default into the (first) result directory as ``<kind>.png``.
A missing directory or the wrong kind of result directory is a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlsim.simulator.cli.common import InputError, check_output

KINDS = {
    # plot name: (result kind it needs, how many directories, default file name)
    "scaling": ("scaling", "+", "scaling.png"),
    "breakdown": ("scaling", 1, "breakdown.png"),
    "validate": ("validation", 1, "validation.png"),
    "collective": ("collective", "+", "collective.png"),
}


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="plot result directories: scaling, breakdown, validate, collective")
    kinds = p.add_subparsers(dest="plot_kind", metavar="KIND", required=True)
    helps = {
        "scaling": "scaling efficiency and throughput vs devices, one line per simulate run",
        "breakdown": "stacked compute / exposed communication / idle per node count of one simulate run",
        "validate": "predicted vs measured scatter from a validation directory (validation.csv)",
        "collective": "collective time and bus bandwidth vs message size, per algorithm and rank count",
    }
    for name, (_, count, default) in KINDS.items():
        sub = kinds.add_parser(name, help=helps[name], description=helps[name])
        sub.add_argument("dirs", nargs=count, type=Path, metavar="DIR", help="result directory")
        sub.add_argument("--out", type=Path, default=None, help=f"PNG to write (default DIR/{default})")
        sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddlsim.reports import plots

    needed, _, default = KINDS[args.plot_kind]
    dirs = args.dirs if isinstance(args.dirs, list) else [args.dirs]
    try:
        dirs = plots.require_kind(dirs, needed, f"plot {args.plot_kind}")
        out = args.out if args.out is not None else dirs[0] / default
        check_output(out, "file")
        render = {
            "scaling": lambda: plots.scaling_png(dirs),
            "breakdown": lambda: plots.breakdown_png(dirs[0]),
            "validate": lambda: plots.validate_png(dirs[0]),
            "collective": lambda: plots.collective_png(dirs),
        }[args.plot_kind]
        data = render()
    except plots.ResultDirError as error:
        raise InputError(str(error)) from None
    plots.save_png(data, out)
    width, height = plots.png_size(data)
    print(f"# wrote {out} ({width} x {height} px)")
    return 0
