"""One self-contained HTML page from result directories: plots inlined as base64 PNG, and tables.

``build_report([runs/a, runs/b, reports/validation])`` sorts the directories by kind (simulate,
collective, validation; ``reports.plots.result_kind``) and renders, per kind, the plots of
``reports.plots`` and the numbers behind them, through the jinja2 templates in ``templates/``
(every value escaped). Numbers are shown as in the terminal and the plots
(``reports.formatting``: one unit and format per column, fractions as percent). No external
resources (no scripts, fonts or stylesheets), no timestamps: the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import functools
import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlsim.reports import plots
from ddlsim.reports.formatting import (
    format_size,
    format_table,
    format_value,
    label_with_unit,
    number_or_none,
    validation_headline,
)
from ddlsim.simulator.records import atomic_open, is_transformer_rows, layout_columns

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


Block = dict[str, Any]


@functools.cache
def _templates() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("ddlsim.reports", "templates"),
        autoescape=True,
        trim_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def _macro(name: str) -> Any:
    return getattr(_templates().get_template("blocks.html.j2").module, name)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], text_columns: Sequence[int] = (0,)) -> str:
    """An HTML table; cells are escaped; columns listed in ``text_columns`` are left-aligned."""
    return str(_macro("table")(list(columns), [list(row) for row in rows], tuple(text_columns)))


def image(png: bytes, alt: str, caption: str = "") -> str:
    """A figure with the PNG inlined as a data URI (width and height from the PNG header)."""
    return str(_macro("figure")(**_figure_block(png, alt, caption, kind=None)))


def page(title: str, body: str) -> str:
    """The page around ``body`` (HTML, already escaped where it needs to be)."""
    import markupsafe

    return str(_templates().get_template("page.html.j2").render(title=title, css=markupsafe.Markup(CSS),
                                                                body=markupsafe.Markup(body)))  # fmt: skip


def _figure_block(png: bytes, alt: str, caption: str = "", kind: str | None = "figure") -> Block:
    width, height = plots.png_size(png)
    data = base64.b64encode(png).decode("ascii")
    block = {"src": f"data:image/png;base64,{data}", "alt": alt, "width": width, "height": height, "caption": caption}
    return block | ({"kind": kind} if kind else {})


def _table_block(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], text: Sequence[str] = ()) -> Block:
    """A table of stored ``columns``: headings with units, each column in one format (as the terminal)."""
    units, cells = format_table([dict(row) for row in rows], columns)
    headings = [label_with_unit(column, unit) for column, unit in zip(columns, units, strict=True)]
    return {"kind": "table", "columns": headings, "rows": cells,
            "text_columns": tuple(i for i, column in enumerate(columns) if column in text)}  # fmt: skip


def _render(blocks: Sequence[Block]) -> str:
    return str(_macro("section")(list(blocks)))


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
SCALING_TABLE = (
    "nodes", "devices", "global_batch", "iteration_s", "compute_s", "exposed_comm_s", "comm_s",
    "throughput_samples_per_s", "speedup", "scaling_efficiency",
)  # fmt: skip
# as ddlsim collective prints it (time in µs, as nccl-tests)
COLLECTIVE_TABLE = ("algorithm", "resolved_algorithm", "ranks", "size", "time_us", "algbw_Bps", "busbw_Bps")


def scaling_blocks(runs: Sequence[Path]) -> list[Block]:
    blocks: list[Block] = [{"kind": "h2", "text": "Training scaling", "note": ""}]
    if all(is_transformer_rows(plots.scaling_rows(run)) for run in runs):  # no efficiency against one device: MFU
        alt, caption = "MFU and tokens/s against devices", "MFU and tokens/s against devices, one line per run."
    else:
        alt = "scaling efficiency and throughput against devices"
        caption = ("Weak-scaling efficiency (throughput / (devices x one device without communication)) and "
                   "throughput against devices, one line per run.")  # fmt: skip
    blocks.append(_figure_block(plots.scaling_png(runs), alt, caption))
    for run in runs:
        scenario = plots.scenario_of(run)
        blocks.append({"kind": "h3", "text": plots.run_label(run), "note": str(run)})
        if scenario:
            shown = [(key, scenario.get(key, "")) for key in SCENARIO_KEYS if key in scenario]
            blocks.append({"kind": "table", "columns": ["input", "value"], "rows": shown, "text_columns": (0, 1)})
        rows = plots.scaling_rows(run)
        transformer = is_transformer_rows(rows)
        table = layout_columns(rows) if transformer else SCALING_TABLE  # as ddlsim simulate prints them
        columns = [column for column in table if column in rows[0]]
        blocks.append(_table_block(rows, columns))
        caption = "Per node count: compute, exposed communication and idle time per iteration."
        if transformer:
            caption = "Per node count: compute, the layout's communication and its pipeline and data-parallel waits."
        blocks.append(_figure_block(plots.breakdown_png(run), f"iteration breakdown for {run}", caption))
    return blocks


def collective_blocks(runs: Sequence[Path]) -> list[Block]:
    blocks: list[Block] = [{"kind": "h2", "text": "Collectives", "note": ""}]
    blocks.append(
        _figure_block(
            plots.collective_png(runs),
            "collective time and bus bandwidth against message size",
            "Time and bus bandwidth (nccl-tests definition) against the message size per rank.",
        )
    )
    for run in runs:
        blocks.append({"kind": "h3", "text": plots.run_label(run), "note": str(run)})
        rows = [
            row | {"size": format_size(float(row["message_bytes"])), "time_us": 1e6 * float(row["time_s"])}
            for row in plots.collective_rows(run)
        ]
        blocks.append(_table_block(rows, COLLECTIVE_TABLE, text=("algorithm", "resolved_algorithm", "size")))
    return blocks


def validation_blocks(directory: Path, max_rows: int = 60) -> list[Block]:
    rows = plots.validation_rows(directory)
    summary = plots.validation_summary(directory)
    blocks: list[Block] = [{"kind": "h2", "text": "Validation", "note": str(directory)}]
    if summary:
        passed = bool(summary.get("passed"))
        blocks.append({
            "kind": "verdict", "css": "pass" if passed else "fail", "verdict": "PASS" if passed else "FAIL",
            "text": f"against a tolerance of {format_value(summary.get('tolerance'), 'tolerance')} median "
                    f"absolute percentage error: {validation_headline(summary)}.",
        })  # fmt: skip
        shown = [
            (key, ("PASS" if value else "FAIL") if key == "passed" else format_value(value, key))
            for key, value in sorted(summary.items())
        ]
        blocks.append({"kind": "table", "columns": ["summary", "value"], "rows": shown, "text_columns": (0,)})
    blocks.append(
        _figure_block(
            plots.validate_png(directory),
            "predicted against measured",
            "Predicted against measured, per metric; shaded bands are +-10% and +-25%.",
        )
    )

    def ape(row: Mapping[str, str]) -> float:
        error = number_or_none(row.get("error_pct"))
        return -1.0 if error is None else abs(error)

    predicted = sorted((row for row in rows if row["status"] != "cannot_model"), key=ape, reverse=True)
    blocks.append({"kind": "h3", "text": f"Largest errors (up to {max_rows} of {len(predicted)})", "note": ""})
    shown_rows = [
        {
            "id": row["id"], "metric": row["metric"], "what": row.get("workload") or row.get("collective", ""),
            "device": row.get("device", ""), "nodes": row.get("nodes", ""),
            # one metric per row, each with its own unit: a time beside a throughput in one column
            "measured": format_value(row["measured"], row["metric"]),
            "predicted": format_value(row["predicted"], row["metric"]),
            "error_pct": row.get("error_pct", ""), "status": row["status"],
        }
        for row in predicted[:max_rows]
    ]  # fmt: skip
    columns = ("id", "metric", "what", "device", "nodes", "measured", "predicted", "error_pct", "status")
    table_block = _table_block(shown_rows, columns, text=("id", "metric", "what", "device", "status"))
    table_block["columns"][2] = "workload / collective"
    blocks.append(table_block)
    unmodeled = [row for row in rows if row["status"] == "cannot_model"]
    if unmodeled:
        blocks.append({"kind": "h3", "text": f"Rows the model cannot predict ({len(unmodeled)})", "note": ""})
        blocks.append({"kind": "table", "columns": ["id", "reason"], "text_columns": (0, 1),
                       "rows": [(row["id"], row.get("reason", "")) for row in unmodeled]})  # fmt: skip
    return blocks


def scaling_section(runs: Sequence[Path]) -> str:
    return _render(scaling_blocks(runs))


def collective_section(runs: Sequence[Path]) -> str:
    return _render(collective_blocks(runs))


def validation_section(directory: Path, max_rows: int = 60) -> str:
    return _render(validation_blocks(directory, max_rows))


def build_report(dirs: Sequence[Path], title: str = "ddlsim report") -> str:
    """The report page for result directories of any mix of kinds (ResultDirError on bad input)."""
    if not dirs:
        raise plots.ResultDirError("report: give at least one result directory")
    by_kind: dict[str, list[Path]] = {"scaling": [], "collective": [], "validation": []}
    for directory in dirs:
        by_kind[plots.result_kind(Path(directory))].append(Path(directory))
    blocks: list[Block] = [
        {"kind": "paragraph", "css": "note", "text": "Generated by ddlsim report from:"},
        {"kind": "table", "columns": ["directory", "kind"], "text_columns": (0, 1),
         "rows": [(str(d), kind) for kind, ds in by_kind.items() for d in ds]},
    ]  # fmt: skip
    if by_kind["scaling"]:
        blocks += scaling_blocks(by_kind["scaling"])
    if by_kind["collective"]:
        blocks += collective_blocks(by_kind["collective"])
    for directory in by_kind["validation"]:
        blocks += validation_blocks(directory)
    return page(title, _render(blocks))


def write_report(dirs: Sequence[Path], out_html: Path, title: str = "ddlsim report") -> None:
    text = build_report(dirs, title)
    with atomic_open(Path(out_html)) as handle:
        handle.write(text)
