"""``ddlsim report``: one self-contained HTML page from result directories, or the gallery.

    ddlsim report runs/a runs/c reports/validation --out report.html
    ddlsim report gallery [--out reports/gallery]    # re-run and re-write the published-results gallery

A missing directory or a directory that holds no results is a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlsim.simulator.cli.common import InputError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="self-contained HTML report of result directories; 'report gallery' rebuilds reports/gallery",
        description="Write one self-contained HTML page (plots inlined, tables) from simulate, collective "
        "and validation result directories. 'ddlsim report gallery' re-runs the gallery of published "
        "results and rewrites reports/gallery.",
    )
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="result directories, or the word gallery")
    p.add_argument("--out", type=Path, default=None, help="HTML file (default report.html; gallery: reports/gallery)")
    p.add_argument("--title", default="ddlsim report", help="page title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ddlsim.reports import plots

    if [str(d) for d in args.dirs] == ["gallery"]:
        from ddlsim.reports.gallery import DEFAULT_OUT, build_gallery

        out = args.out or DEFAULT_OUT
        written = build_gallery(out)
        print(f"# wrote {out}: {', '.join(written)}")
        return 0
    from ddlsim.reports.html_report import write_report

    out = args.out or Path("report.html")
    try:
        write_report(args.dirs, out, args.title)
    except plots.ResultDirError as error:
        raise InputError(str(error)) from None
    print(f"# wrote {out}")
    return 0
