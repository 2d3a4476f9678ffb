"""Running the gallery's commands: ``ddlsim report gallery --out DIR``.

The entries (``reports/gallery.py``) name ddlsim command lines; this module runs each one here, on
the command-line side, into ``DIR/runs/<entry>/<run>/`` with what it printed in ``stdout.txt``, and
writes ``DIR/runs/<entry>/pending.txt`` when a command fails. ``reports.gallery.build_gallery`` then
renders the page from those files alone (reports never run ddlsim themselves).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ddlsim.simulator.progress import Progress
from ddlsim.simulator.records import atomic_open

if TYPE_CHECKING:
    from ddlsim.reports.gallery import Entry

DEFAULT_OUT = Path("gallery")  # under the working directory, never inside the installed package


def run_entry(entry: Entry, runs_dir: Path, progress: Progress | None = None) -> str:
    """Run the entry's commands (output captured) into ``runs_dir/<entry>``; '' or why it is pending."""
    from ddlsim.reports.gallery import KEEP_FILES, PENDING_FILE
    from ddlsim.simulator.calibration.measurements import packaged_published_dev
    from ddlsim.simulator.cli.main import main

    where = runs_dir / entry.key
    if where.exists():
        shutil.rmtree(where)  # no result of an earlier run may stand in for this one
    where.mkdir(parents=True)
    reason = entry.pending
    for index, run in enumerate(entry.runs if not reason else (), start=1):
        out = where / run.name
        captured_out, captured_err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(captured_out), contextlib.redirect_stderr(captured_err):
                code = main([*run.argv(where, packaged_published_dev()), "--out", str(out)])
        except SystemExit as error:  # argparse: unknown command or option (a module not there yet)
            code = int(error.code or 2) if not isinstance(error.code, str) else 2
            captured_err.write(str(error.code or ""))
        if progress is not None:
            progress(index, len(entry.runs))
        if code != 0:
            lines = captured_err.getvalue().strip().splitlines()
            reason = f"`{run.command()}` failed: {lines[-1] if lines else f'exit status {code}'}"
            break
        if not run.results:
            continue  # one file (a calibrated profile), read by the entry's other runs
        with atomic_open(out / "stdout.txt") as handle:
            handle.write(captured_out.getvalue())
        for path in out.iterdir():  # keep the results and the resolved inputs, not traces
            if path.name not in KEEP_FILES:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    if reason:
        with atomic_open(where / PENDING_FILE) as handle:
            handle.write(reason + "\n")
    return reason


def run_gallery(
    out: Path = DEFAULT_OUT, entries: Sequence[Entry] | None = None, progress: bool | None = None
) -> list[str]:
    """Run every entry into ``out/runs`` and render the gallery into ``out``; the names written."""
    from ddlsim.reports.gallery import build_gallery
    from ddlsim.reports.gallery_entries import ENTRIES

    entries = ENTRIES if entries is None else entries
    out = Path(out)
    report = Progress("gallery", progress, unit="runs")
    for number, entry in enumerate(entries, start=1):
        report.stage(f"gallery entry {number}/{len(entries)} ({entry.key})", total=max(len(entry.runs), 1))
        run_entry(entry, out / "runs", report)
    report.close()
    return build_gallery(out, entries)
