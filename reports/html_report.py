"""One self-contained HTML page from result directories: plots inlined as base64 PNG, and tables.

``build_report([runs/a, runs/b, reports/validation])`` sorts the directories by kind (simulate,
collective, validation; ``reports.plots.result_kind``) and renders, per kind, the plots of
``reports.plots`` and the numbers behind them. No external resources (no scripts, fonts or
stylesheets), no timestamps: the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.reports import plots
from ddlsim.simulator.records import atomic_open

CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1180px;
       color: #1a1a1a; line-height: 1.45; padding: 0 1em; }
h1 { font-size: 1.7em; border-bottom: 2px solid #0072B2; padding-bottom: .2em; }
h2 { font-size: 1.35em; margin-top: 2em; color: #0b4f7c; }
h3 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .8em 0 1.2em; font-size: .88em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; vertical-align: top; }
th { background: #eef4f9; }
td.text, th.text { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #e5e5e5; }
figcaption { font-size: .9em; color: #444; }
code { background: #f4f4f4; padding: 0 .25em; }
.pass { color: #007a3d; font-weight: bold; } .fail { color: #b00020; font-weight: bold; }
.note { color: #555; font-size: .9em; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: Any, digits: int = 4) -> str:
    """A number for a table: significant digits, thousands kept readable; text passes through."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-3:
        return f"{x:.{digits}g}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], text_columns: Sequence[int] = (0,)) -> str:
    """An HTML table; cells are escaped; columns listed in ``text_columns`` are left-aligned."""
    head = "".join(
        f'<th class="text">{esc(c)}</th>' if i in text_columns else f"<th>{esc(c)}</th>" for i, c in enumerate(columns)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="text">{esc(cell)}</td>' if i in text_columns else f"<td>{esc(cell)}</td>"
            for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def image(png: bytes, alt: str, caption: str = "") -> str:
    """A figure with the PNG inlined as a data URI (width and height from the PNG header)."""
    width, height = plots.png_size(png)
    data = base64.b64encode(png).decode("ascii")
    figcaption = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}" '
        f'width="{width}" height="{height}">{figcaption}</figure>'
    )


def page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


# --- sections ---------------------------------------------------------------------------------------

SCENARIO_KEYS = (
    "workload",
    "device",
    "devices_per_node",
    "intra_node",
    "network",
    "topology",
    "algorithm",
    "per_device_batch",
    "precision",
    "bucket_bytes",
    "overlap",
    "executor",
)


def scaling_section(runs: Sequence[Path]) -> str:
    parts = ["<h2>Training scaling</h2>"]
    parts.append(
        image(
            plots.scaling_png(runs),
            "scaling efficiency and throughput against devices",
            "Weak-scaling efficiency (throughput / (devices x one device without communication)) and "
            "throughput against devices, one line per run.",
        )
    )
    for run in runs:
        scenario = plots.scenario_of(run)
        parts.append(f"<h3>{esc(plots.run_label(run))} <span class='note'>({esc(run)})</span></h3>")
        if scenario:
            shown = [(key, scenario.get(key, "")) for key in SCENARIO_KEYS if key in scenario]
            parts.append(table(("input", "value"), shown, text_columns=(0, 1)))
        rows = plots.scaling_rows(run)
        parts.append(
            table(
                (
                    "nodes",
                    "devices",
                    "global batch",
                    "iteration (ms)",
                    "compute (ms)",
                    "exposed comm (ms)",
                    "all comm (ms)",
                    "throughput (samples/s)",
                    "speedup",
                    "efficiency (%)",
                ),
                (
                    (
                        row["nodes"],
                        row["devices"],
                        row.get("global_batch", ""),
                        number(1e3 * float(row["iteration_s"])),
                        number(1e3 * float(row["compute_s"])),
                        number(1e3 * float(row["exposed_comm_s"])),
                        number(1e3 * float(row["comm_s"])) if row.get("comm_s") else "-",
                        number(row.get("throughput_samples_per_s", "")),
                        number(row.get("speedup", "")),
                        number(100 * float(row["scaling_efficiency"])),
                    )
                    for row in rows
                ),
                text_columns=(),
            )
        )
        parts.append(
            image(
                plots.breakdown_png(run),
                f"iteration breakdown for {run}",
                "Per node count: compute, exposed communication and idle time per iteration.",
            )
        )
    return "\n".join(parts)


def collective_section(runs: Sequence[Path]) -> str:
    parts = ["<h2>Collectives</h2>"]
    parts.append(
        image(
            plots.collective_png(runs),
            "collective time and bus bandwidth against message size",
            "Time and bus bandwidth (nccl-tests definition) against the message size per rank.",
        )
    )
    for run in runs:
        parts.append(f"<h3>{esc(plots.run_label(run))} <span class='note'>({esc(run)})</span></h3>")
        rows = plots.collective_rows(run)
        parts.append(
            table(
                ("algorithm", "resolved", "ranks", "message (bytes)", "time (us)", "algbw (GB/s)", "busbw (GB/s)"),
                (
                    (
                        row["algorithm"],
                        row.get("resolved_algorithm", ""),
                        row["ranks"],
                        number(row["message_bytes"]),
                        number(1e6 * float(row["time_s"])),
                        number(float(row.get("algbw_Bps") or "nan") / 1e9),
                        number(float(row["busbw_Bps"]) / 1e9),
                    )
                    for row in rows
                ),
                text_columns=(0, 1),
            )
        )
    return "\n".join(parts)


def validation_section(directory: Path, max_rows: int = 60) -> str:
    rows = plots.validation_rows(directory)
    summary = plots.validation_summary(directory)
    parts = [f"<h2>Validation <span class='note'>({esc(directory)})</span></h2>"]
    if summary:
        verdict = "pass" if summary.get("passed") else "fail"
        parts.append(
            f"<p>Verdict: <span class='{verdict}'>{verdict.upper()}</span> against a tolerance of "
            f"{esc(summary.get('tolerance', '?'))}% median APE.</p>"
        )
        parts.append(table(("summary", "value"), [(k, number(v)) for k, v in sorted(summary.items())]))
    parts.append(
        image(
            plots.validate_png(directory),
            "predicted against measured",
            "Predicted against measured, per metric; shaded bands are +-10% and +-25%.",
        )
    )

    def ape(row: Mapping[str, str]) -> float:
        try:
            return abs(float(row["error_pct"]))
        except (KeyError, ValueError):
            return -1.0

    predicted = sorted((row for row in rows if row["status"] != "cannot_model"), key=ape, reverse=True)
    parts.append(f"<h3>Largest errors (up to {max_rows} of {len(predicted)})</h3>")
    parts.append(
        table(
            (
                "id",
                "metric",
                "workload / collective",
                "device",
                "nodes",
                "measured",
                "predicted",
                "error (%)",
                "status",
            ),
            (
                (
                    row["id"],
                    row["metric"],
                    row.get("workload") or row.get("collective", ""),
                    row.get("device", ""),
                    row.get("nodes", ""),
                    number(row["measured"]),
                    number(row["predicted"]),
                    number(row.get("error_pct", "")),
                    row["status"],
                )
                for row in predicted[:max_rows]
            ),
            text_columns=(0, 1, 2, 3, 8),
        )
    )
    unmodeled = [row for row in rows if row["status"] == "cannot_model"]
    if unmodeled:
        parts.append(f"<h3>Rows the model cannot predict ({len(unmodeled)})</h3>")
        parts.append(table(("id", "reason"), ((row["id"], row.get("reason", "")) for row in unmodeled), (0, 1)))
    return "\n".join(parts)


def build_report(dirs: Sequence[Path], title: str = "ddlsim report") -> str:
    """The report page for result directories of any mix of kinds (ResultDirError on bad input)."""
    if not dirs:
        raise plots.ResultDirError("report: give at least one result directory")
    by_kind: dict[str, list[Path]] = {"scaling": [], "collective": [], "validation": []}
    for directory in dirs:
        by_kind[plots.result_kind(Path(directory))].append(Path(directory))
    sources = table(
        ("directory", "kind"),
        ((str(d), kind) for kind, ds in by_kind.items() for d in ds),
        text_columns=(0, 1),
    )
    body = [f"<p class='note'>Generated by <code>ddlsim report</code> from:</p>{sources}"]
    if by_kind["scaling"]:
        body.append(scaling_section(by_kind["scaling"]))
    if by_kind["collective"]:
        body.append(collective_section(by_kind["collective"]))
    for directory in by_kind["validation"]:
        body.append(validation_section(directory))
    return page(title, "\n".join(body))


def write_report(dirs: Sequence[Path], out_html: Path, title: str = "ddlsim report") -> None:
    text = build_report(dirs, title)
    with atomic_open(Path(out_html)) as handle:
        handle.write(text)
