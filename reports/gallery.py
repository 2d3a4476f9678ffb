"""The gallery: ddlsim's predictions beside the headline numbers of the seed publications.

The entries (``ENTRIES``, in ``reports/gallery_entries.py``) say which ddlsim commands reproduce
which published figure. ``ddlsim report gallery --out DIR`` (``simulator/cli/gallery_runs.py``)
runs every entry's commands into ``DIR/runs/<entry>/<run>/``; ``build_gallery(DIR)`` here then
reads those result files, and only them, and writes ``DIR/README.md``, ``DIR/index.html`` and one
PNG per entry. Each entry states the exact commands, the prediction, the published figure and the
gap, and the assumptions made where a paper does not pin an input down. Nothing here is fitted to
the published figures. The copy in the repository (``reports/gallery``) is made with ``ddlsim
report gallery --out reports/gallery``.

Epoch times: time = images per epoch x epochs / predicted throughput, with the ImageNet-1k
training set of 1,281,167 images ("1.28M"); start-up, evaluation and input pipelines are not
modelled, so predicted times are lower bounds of what a real run of the same hardware would take.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlsim.reports import plots
from ddlsim.reports.html_report import esc, page, table
from ddlsim.simulator.records import atomic_open, read_csv

IMAGENET_IMAGES = 1_281_167
# Synchronous entries wait for the slowest rank every step: the rank jitter ddlsim calibrate fits on
# published_dev.csv (rank_jitter_sigma 0.0525, docs/calibration.md), every rank at the expected
# slowest pace (deterministic: the DES equals the closed form). Fitted on other data, not on these.
RANK_JITTER_SIGMA = 0.0525
# what a run directory keeps (the results, the resolved inputs and what the command printed), and the
# file that says why an entry could not be computed
KEEP_FILES = ("results.csv", "scenario.json", "setup.json", "stdout.txt")
PENDING_FILE = "pending.txt"


@dataclass(frozen=True)
class Run:
    """One ddlsim command line of an entry (without ``ddlsim``); ``--out`` is appended by the gallery."""

    name: str
    line: str
    # False for a run that writes one file, not a results directory (``calibrate`` writing the profile
    # that the entry's other runs read as ``--profile {entry}/NAME``)
    results: bool = True

    def argv(self, entry_dir: Path, published_dev: Path) -> list[str]:
        """The command's words with ``{entry}`` (the entry's run directory) and ``{published_dev}``
        (the packaged development measurements) filled in."""
        line = self.line.replace("{entry}", str(entry_dir)).replace("{published_dev}", str(published_dev))
        return shlex.split(line)

    def command(self) -> str:
        line = self.line.replace("{entry}", "runs/...").replace("{published_dev}", "published_dev.csv")
        return f"ddlsim {line} --out runs/.../{self.name}"


OFF_BY = 0.10  # a gap over 10% (10 points) must carry a stated reason


@dataclass(frozen=True)
class Comparison:
    quantity: str
    published: float | None
    predicted: float | None
    unit: str  # "%" (compared in points), "min", "s", "x", "ms", ...
    note: str = ""
    # why the prediction is off, with the evidence, for a gap over OFF_BY (shown in the summary table)
    reason: str = ""

    def off(self) -> bool:
        """More than 10% (10 points for percentages) from the published figure."""
        if self.published is None or self.predicted is None:
            return False
        if self.unit == "%":
            return abs(self.predicted - self.published) > OFF_BY * 100
        return abs(self.predicted / self.published - 1) > OFF_BY

    def gap(self) -> str:
        if self.published is None or self.predicted is None:
            return "-"
        if self.unit == "%":
            return f"{self.predicted - self.published:+.1f} points"
        ratio = self.predicted / self.published
        return f"{100 * (ratio - 1):+.0f}% ({ratio:.2f}x)"


Results = dict[str, list[dict[str, str]]]


@dataclass(frozen=True)
class Entry:
    key: str
    title: str
    source: str
    runs: tuple[Run, ...]
    compare: Callable[[Results], list[Comparison]]
    assumptions: str
    gap_note: str
    plot: str = "scaling"  # scaling, per_node, collective or none
    result_file: str = "results.csv"
    pending: str = ""  # why this entry cannot be computed yet (shown instead of numbers)
    # references (collective plot: published points), plot_runs (the run names to plot; default all)
    extra: dict = field(default_factory=dict)


# --- helpers for the comparisons ---------------------------------------------------------------------


def at(rows: list[dict[str, str]], nodes: int) -> dict[str, str]:
    for row in rows:
        if int(row["nodes"]) == nodes:
            return row
    raise KeyError(f"no row for {nodes} nodes")


def throughput(rows: list[dict[str, str]], nodes: int) -> float:
    return float(at(rows, nodes)["throughput_samples_per_s"])


def efficiency_pct(rows: list[dict[str, str]], nodes: int) -> float:
    return 100 * float(at(rows, nodes)["scaling_efficiency"])


def relative_efficiency_pct(rows: list[dict[str, str]], nodes: int, base_nodes: int = 1) -> float:
    """Efficiency against ``base_nodes`` nodes (as papers that scale from one server report it)."""
    return 100 * throughput(rows, nodes) * base_nodes / (throughput(rows, base_nodes) * nodes)


def epoch_minutes(rows: list[dict[str, str]], nodes: int, epochs: float) -> float:
    return IMAGENET_IMAGES * epochs / throughput(rows, nodes) / 60


# --- running and writing ------------------------------------------------------------------------------


def read_entry(entry: Entry, runs_dir: Path) -> tuple[Results, str]:
    """The entry's result files, read back per run name (and ``<run>:stdout``), or why it is pending."""
    if entry.pending:
        return {}, entry.pending
    pending = runs_dir / entry.key / PENDING_FILE
    if pending.is_file():
        return {}, pending.read_text(encoding="utf-8").strip()
    results: Results = {}
    for run in entry.runs:
        if not run.results:
            continue
        out = runs_dir / entry.key / run.name
        if not (out / entry.result_file).is_file():
            return {}, f"no {entry.result_file} in {out}: run `ddlsim report gallery` to compute it"
        results[run.name] = read_csv(out / entry.result_file)
        stdout = out / "stdout.txt"
        results[f"{run.name}:stdout"] = [{"text": stdout.read_text(encoding="utf-8") if stdout.is_file() else ""}]
    return results, ""


def _fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit in ("%",):
        return f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}"


def build_gallery(out: Path, entries: Sequence[Entry] | None = None) -> list[str]:
    """Write README.md, index.html and the PNGs into ``out`` from the run directories under
    ``out/runs`` (``read_entry``); the names written."""
    if entries is None:
        from ddlsim.reports.gallery_entries import ENTRIES

        entries = ENTRIES
    out = Path(out)
    runs_dir = out / "runs"
    markdown = [
        "# Gallery: ddlsim beside published results",
        "",
        "Regenerate with `ddlsim report gallery --out DIR` (runs every command below). Nothing is fitted "
        "to these figures: the inputs are the catalog datasheets, the stated assumptions and, for the "
        f"synchronous entries, the rank jitter calibrated on the development data (sigma {RANK_JITTER_SIGMA}: "
        "each step waits for the expected slowest of N ranks, `--stragglers lognormal:SIGMA:expected`); the "
        "MLPerf entry calibrates on published_dev.csv first, as a user would, and that file holds its one-node "
        "rows. Times from throughput use 1,281,167 ImageNet images per epoch and leave out start-up, input pipeline "
        "and "
        "evaluation, so they are lower bounds. The run outputs are under `runs/<entry>/<run>/`.",
        "",
        "| entry | quantity | published | ddlsim | gap | why, where it is off by more than 10% |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    sections_md: list[str] = []
    sections_html: list[str] = []
    summary_rows: list[tuple[str, ...]] = []
    written: list[str] = []
    for entry in entries:
        results, pending = read_entry(entry, runs_dir)
        comparisons = entry.compare(results) if not pending else []
        commands = "\n".join(run.command().replace("runs/...", f"runs/{entry.key}") for run in entry.runs)
        md = [f"## {entry.title}", "", f"**Source.** {entry.source}", "", "**Inputs.**", "", "```", commands, "```"]
        md += ["", f"**Assumptions.** {entry.assumptions}", ""]
        html_parts = [
            f"<h2 id='{esc(entry.key)}'>{esc(entry.title)}</h2>",
            f"<p><b>Source.</b> {esc(entry.source)}</p>",
            f"<p><b>Inputs.</b></p><pre><code>{esc(commands)}</code></pre>",
            f"<p><b>Assumptions.</b> {esc(entry.assumptions)}</p>",
        ]
        if pending:
            md += [f"**Pending.** {pending}", ""]
            html_parts.append(f"<p><b>Pending.</b> {esc(pending)}</p>")
            summary_rows.append((entry.title, "pending", "", "", "", ""))
        else:
            md += ["| quantity | published | ddlsim | gap | note |", "| --- | ---: | ---: | ---: | --- |"]
            rows = []
            for c in comparisons:
                cells = (c.quantity, _fmt(c.published, c.unit), _fmt(c.predicted, c.unit), c.gap(), c.note)
                rows.append(cells)
                md.append("| " + " | ".join(cells) + " |")
                summary_rows.append((entry.title, *cells[:4], c.reason if c.off() else ""))
            md.append("")
            html_parts.append(table(("quantity", "published", "ddlsim", "gap", "note"), rows, (0, 4)))
        md += [f"**The gap, honestly.** {entry.gap_note}", ""]
        html_parts.append(f"<p><b>The gap, honestly.</b> {esc(entry.gap_note)}</p>")
        if not pending and entry.plot != "none":
            plotted = entry.extra.get("plot_runs") or [run.name for run in entry.runs]
            run_dirs = [runs_dir / entry.key / name for name in plotted]
            if entry.plot == "scaling":
                png = plots.scaling_png(run_dirs)
            elif entry.plot == "per_node":
                png = plots.per_node_png(run_dirs)
            else:
                png = plots.collective_png(run_dirs, entry.extra.get("references", ()))
            plots.save_png(png, out / f"{entry.key}.png")
            written.append(f"{entry.key}.png")
            md += [f"![{entry.title}]({entry.key}.png)", ""]
            width, height = plots.png_size(png)
            html_parts.append(
                f"<figure><img src='{entry.key}.png' alt='{esc(entry.title)}' width='{width}' "
                f"height='{height}'></figure>"
            )
        sections_md += md
        sections_html += html_parts
    for row in summary_rows:
        markdown.append("| " + " | ".join(row) + " |")
    markdown += ["", *sections_md]
    with atomic_open(out / "README.md") as handle:
        handle.write("\n".join(markdown).rstrip() + "\n")
    summary_html = table(
        ("entry", "quantity", "published", "ddlsim", "gap", "why (over 10% off)"), summary_rows, (0, 1, 5)
    )
    intro = (
        "<p>Regenerate with <code>ddlsim report gallery --out DIR</code>. Nothing is fitted to these figures; "
        "times from throughput use 1,281,167 images per epoch and leave out start-up, input pipeline and "
        "evaluation.</p>"
    )
    with atomic_open(out / "index.html") as handle:
        body = intro + summary_html + "\n".join(sections_html)
        handle.write(page("ddlsim gallery: predictions beside published results", body))
    return ["README.md", "index.html", *written]
