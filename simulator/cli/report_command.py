"""``ddlsim report``: one self-contained HTML page from result directories, or the gallery.

    ddlsim report runs/a runs/c reports/validation --out report.html
    ddlsim report gallery [--out gallery]     # run the published-results gallery and write its page

The gallery goes to the directory ``--out`` names (default ``gallery`` under the working
directory); the repository's copy is made with ``--out reports/gallery``. A missing directory, a
directory that holds no results, or an ``--out`` that cannot be written is a one-line error (exit
status 2), found before any work starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlsim.simulator.cli.common import InputError, check_output


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="self-contained HTML report of result directories; 'report gallery' runs the published-results gallery",
        description="Write one self-contained HTML page (plots inlined, tables) from simulate, collective "
        "and validation result directories. 'ddlsim report gallery' runs the commands of the gallery of "
        "published results and writes its page, PNGs and run directories into --out.",
    )
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="result directories, or the word gallery")
    p.add_argument(
        "--out", type=Path, default=None,
        help="HTML file to write (default report.html); for gallery: the directory (default ./gallery)",
    )  # fmt: skip
    p.add_argument("--title", default="ddlsim report", help="page title")
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="gallery progress on stderr (default: a bar on a terminal, a line per entry otherwise after 1 s)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if [str(d) for d in args.dirs] == ["gallery"]:
        from ddlsim.simulator.cli.gallery_runs import DEFAULT_OUT, run_gallery

        out = args.out or DEFAULT_OUT
        check_output(out, "directory", files=("README.md", "index.html"))
        written = run_gallery(out, progress=args.progress)
        print(f"# wrote {out}: {', '.join(written)}")
        return 0
    from ddlsim.reports import plots
    from ddlsim.reports.html_report import write_report

    out = args.out or Path("report.html")
    check_output(out, "file")
    try:
        write_report(args.dirs, out, args.title)
    except plots.ResultDirError as error:
        raise InputError(str(error)) from None
    print(f"# wrote {out}")
    return 0
