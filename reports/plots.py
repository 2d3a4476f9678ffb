"""Plots from result files only (never re-simulating), matplotlib with the Agg backend.

Four plots, each a pure function from result directories to one PNG:

=============== =========================== ===================================================
plot            reads                       shows
=============== =========================== ===================================================
scaling         ``ddlsim simulate --out``   scaling efficiency (%) and throughput against devices
breakdown       ``ddlsim simulate --out``   stacked compute / exposed communication / idle per scale
validate        ``validation.csv``          predicted against measured, y = x, +-10 % and +-25 % bands
collective      ``ddlsim collective --out`` time and bus bandwidth against message size
=============== =========================== ===================================================

Every figure has a fixed size in inches at ``DPI`` (``FIGURE_SIZES``), so the PNG's pixel size is
known in advance (the tests check it). Styles come from one ``rc_context`` so that importing this
module changes no global matplotlib state.
"""

from __future__ import annotations

import io
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
from matplotlib.figure import Figure

from ddlsim.reports.formatting import number_or_none, validation_headline
from ddlsim.simulator.records import atomic_open, is_transformer_rows, read_csv

DPI = 150
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
# (width, height) in inches; validate grows to two rows when it has more than two metrics
FIGURE_SIZES = {
    "scaling": (11.0, 4.6),
    "breakdown": (11.0, 4.6),
    "collective": (11.0, 4.6),
    "validate": (11.0, 4.8),
    "validate_tall": (11.0, 8.8),
}
STYLE: dict[str, Any] = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.8,
    "lines.markersize": 6,
    "savefig.dpi": DPI,
    "svg.hashsalt": "ddlsim",
}
SCALING_REQUIRED = ("nodes", "devices", "iteration_s", "compute_s", "exposed_comm_s", "scaling_efficiency")
COLLECTIVE_REQUIRED = ("algorithm", "ranks", "message_bytes", "time_s", "busbw_Bps")
VALIDATION_REQUIRED = ("id", "metric", "measured", "predicted", "status")
METRIC_LABELS = {
    "time_s": ("time", "s", 1.0),
    "throughput_samples_per_s": ("throughput", "samples/s", 1.0),
    "scaling_efficiency": ("scaling efficiency", "%", 100.0),
    "bus_bandwidth_Bps": ("bus bandwidth", "GB/s", 1e-9),
}


class ResultDirError(ValueError):
    """A path that is not the kind of result directory a plot or report needs (one-line message)."""


# --- reading result directories --------------------------------------------------------------------


def result_kind(path: Path) -> str:
    """``scaling``, ``collective`` or ``validation`` for a result directory; ResultDirError otherwise."""
    path = Path(path)
    if not path.exists():
        raise ResultDirError(f"{path}: no such directory")
    if not path.is_dir():
        raise ResultDirError(f"{path}: not a directory (give the run's output directory)")
    if (path / "validation.csv").is_file():
        return "validation"
    results = path / "results.csv"
    if not results.is_file():
        raise ResultDirError(
            f"{path}: not a result directory (no results.csv from simulate/collective, no validation.csv)"
        )
    with results.open(encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    if all(column in header for column in SCALING_REQUIRED):
        return "scaling"
    if all(column in header for column in COLLECTIVE_REQUIRED):
        return "collective"
    raise ResultDirError(f"{results}: unrecognised columns; expected a simulate or collective results.csv")


def require_kind(paths: Sequence[Path], kind: str, command: str) -> list[Path]:
    """Check that every path is a result directory of ``kind``; one-line errors name the first bad one."""
    if not paths:
        raise ResultDirError(f"{command}: give at least one result directory")
    makers = {"scaling": "ddlsim simulate --out", "collective": "ddlsim collective --out", "validation": "validate"}
    for path in paths:
        found = result_kind(path)
        if found != kind:
            raise ResultDirError(
                f"{path}: a {found} result directory; {command} needs a {kind} one (from {makers[kind]})"
            )
    return [Path(path) for path in paths]


def _read_rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    rows = read_csv(path)
    if not rows:
        raise ResultDirError(f"{path}: no rows")
    missing = [column for column in required if column not in rows[0]]
    if missing:
        raise ResultDirError(f"{path}: missing columns {', '.join(missing)}")
    return rows


def scaling_rows(run: Path) -> list[dict[str, str]]:
    return _read_rows(Path(run) / "results.csv", SCALING_REQUIRED)


def collective_rows(run: Path) -> list[dict[str, str]]:
    return _read_rows(Path(run) / "results.csv", COLLECTIVE_REQUIRED)


def validation_rows(directory: Path) -> list[dict[str, str]]:
    return _read_rows(Path(directory) / "validation.csv", VALIDATION_REQUIRED)


def validation_summary(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def scenario_of(run: Path) -> dict[str, Any]:
    """The ``scenario`` block of a simulate run's scenario.json (empty if absent)."""
    path = Path(run) / "scenario.json"
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("scenario", {}))


def run_label(run: Path) -> str:
    """A short legend label for a run: workload / device x per node / network / algorithm."""
    run = Path(run)
    scenario = scenario_of(run)
    if scenario:
        algorithm = str(scenario.get("algorithm", "?"))
        # the collective where it is not the default ring (the CLI gives one only to algorithms that
        # read it): two runs that differ only in it need two labels
        collective = (scenario.get("options") or {}).get("collective")
        if collective and collective != "ring":
            algorithm += f" ({collective})"
        parts = [
            scenario.get("workload", "?"),
            f"{scenario.get('device', '?')} x{scenario.get('devices_per_node', '?')}",
            scenario.get("network") or "-",
            algorithm,
        ]
        return " / ".join(str(part) for part in parts)
    setup_file = run / "setup.json"
    if setup_file.is_file():
        setup = json.loads(setup_file.read_text())
        network = setup.get("setup", {}).get("network") or "-"
        return f"{setup.get('collective', '?')} / {network}"
    return run.name


# --- figure plumbing ------------------------------------------------------------------------------


@contextmanager
def _figure(kind: str, nrows: int = 1, ncols: int = 2) -> Iterator[tuple[Figure, Any]]:
    # matplotlib types rc keys as literals; ours are checked by matplotlib when the context opens
    with plt.rc_context(STYLE):  # type: ignore[arg-type]
        fig, axes = plt.subplots(nrows, ncols, figsize=FIGURE_SIZES[kind], dpi=DPI, layout="constrained", squeeze=False)
        try:
            yield fig, axes
        finally:
            plt.close(fig)


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (fixed pixel size: the figure size in inches x DPI)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def save_png(data: bytes, out_png: Path) -> None:
    with atomic_open(Path(out_png), "wb") as handle:
        handle.write(data)  # type: ignore[arg-type]


def _styles() -> Iterator[dict[str, Any]]:
    """Distinct line style, marker and colour per series (colour-blind-safe Okabe-Ito palette)."""
    for index in itertools.count():
        yield {
            "color": COLORS[index % len(COLORS)],
            "linestyle": LINE_STYLES[index % len(LINE_STYLES)],
            "marker": MARKERS[index % len(MARKERS)],
        }


def _legend_below(fig: Figure, axes: Sequence[Any], ncols: int = 2) -> None:
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), ncols), frameon=False)


def _bytes_label(value: float, _position: Any = None) -> str:
    """Tick label in decimal SI bytes (1 kB = 1e3 B, as everywhere in ddlsim)."""
    for factor, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if value >= factor:
            return f"{value / factor:g} {unit}"
    return f"{value:g} B"


def _log2_devices_axis(ax: Any) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))


# --- the four plots -------------------------------------------------------------------------------


def _number(row: dict[str, str], column: str) -> float:
    """A results.csv cell as a float; NaN where empty (a figure that does not apply to the run)."""
    number = number_or_none(row.get(column))
    return math.nan if number is None else number


def scaling_png(runs: Sequence[Path]) -> bytes:
    """Scaling efficiency (left) and throughput (right) against devices, one line per run directory.

    Runs of transformer layouts (megatron), whose model does not fit one device, have no efficiency
    against one: when every run is one, the left panel is MFU and the right tokens/s; among other
    runs they are left out of the left panel."""
    with _figure("scaling") as (fig, axes):
        eff_ax, thr_ax = axes[0]
        labels = [run_label(Path(run)) for run in runs]
        transformer = all(is_transformer_rows(scaling_rows(run)) for run in runs)
        left, right = ("mfu", "tokens_per_s") if transformer else ("scaling_efficiency", "throughput_samples_per_s")
        for index, (run, style) in enumerate(zip(runs, _styles(), strict=False)):
            rows = scaling_rows(run)
            devices = [int(row["devices"]) for row in rows]
            label = labels[index] if labels.count(labels[index]) == 1 else f"{labels[index]} ({Path(run).name})"
            eff_ax.plot(devices, [100 * _number(row, left) for row in rows], label=label, **style)
            thr_ax.plot(devices, [_number(row, right) for row in rows], label=label, **style)
        for ax in (eff_ax, thr_ax):
            _log2_devices_axis(ax)
            ax.set_xlabel("devices (GPUs or CPU sockets)")
        eff_ax.set_ylabel("MFU (%)" if transformer else "scaling efficiency (%)")
        eff_ax.set_ylim(0, 105)
        eff_ax.set_title("model FLOPs utilisation" if transformer else "weak-scaling efficiency vs one device")
        thr_ax.set_yscale("log")
        thr_ax.set_ylabel("throughput (tokens/s)" if transformer else "throughput (samples/s)")
        thr_ax.set_title("training throughput")
        _legend_below(fig, [eff_ax])
        return figure_png(fig)


def per_node_png(runs: Sequence[Path]) -> bytes:
    """Throughput per node (left) and in total (right) against nodes, one line per run directory: layouts
    that place a different number of ranks on a node (one per chip, one per NUMA domain, a pipeline
    over the domains) compared at the same node count, where the x axis of ``scaling_png`` (devices)
    would separate them."""
    with _figure("scaling") as (fig, axes):
        node_ax, thr_ax = axes[0]
        labels = [run_label(Path(run)) for run in runs]
        for index, (run, style) in enumerate(zip(runs, _styles(), strict=False)):
            rows = scaling_rows(run)
            nodes = [int(row["nodes"]) for row in rows]
            throughput = [float(row["throughput_samples_per_s"]) for row in rows]
            label = labels[index] if labels.count(labels[index]) == 1 else f"{labels[index]} ({Path(run).name})"
            node_ax.plot(nodes, [t / n for t, n in zip(throughput, nodes, strict=True)], label=label, **style)
            thr_ax.plot(nodes, throughput, label=label, **style)
        for ax in (node_ax, thr_ax):
            _log2_devices_axis(ax)
            ax.set_xlabel("nodes")
        node_ax.set_ylabel("throughput per node (samples/s)")
        node_ax.set_ylim(bottom=0)
        node_ax.set_title("throughput per node")
        thr_ax.set_yscale("log")
        thr_ax.set_ylabel("throughput (samples/s)")
        thr_ax.set_title("training throughput")
        _legend_below(fig, [node_ax], ncols=1)
        return figure_png(fig)


def plot_scaling(runs: Sequence[Path], out_png: Path) -> None:
    """Write ``scaling_png(runs)`` to ``out_png`` atomically."""
    save_png(scaling_png(runs), out_png)


def breakdown_png(run: Path) -> bytes:
    """Per node count: stacked compute / exposed communication / idle, in ms (left) and in % (right).

    Idle is whatever of the iteration is neither the device's compute nor exposed communication
    (stragglers, waiting); the diamond marks all communication including what overlapped backward.
    A transformer layout's rows stack their own parts instead (``transformer_parts``).
    """
    rows = scaling_rows(run)
    labels = [f"{row['nodes']}\n({row['devices']})" for row in rows]
    iteration = [float(row["iteration_s"]) for row in rows]
    compute = [float(row["compute_s"]) for row in rows]
    exposed = [float(row["exposed_comm_s"]) for row in rows]
    idle = [max(t - c - e, 0.0) for t, c, e in zip(iteration, compute, exposed, strict=True)]
    comm = [float(row["comm_s"]) if row.get("comm_s") not in (None, "") else math.nan for row in rows]
    parts: tuple[tuple[str, list[float], str, str | None], ...] = (
        ("compute", compute, "#0072B2", None),
        ("exposed communication", exposed, "#D55E00", "//"),
        ("idle", idle, "#BBBBBB", ".."),
    )
    if is_transformer_rows(rows):  # a transformer layout: its own parts
        parts = transformer_parts(rows, iteration)
        comm = [math.nan] * len(rows)  # its communication is in the parts (tensor parallel, the waits)
    with _figure("breakdown") as (fig, axes):
        abs_ax, share_ax = axes[0]
        positions = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        share_bottom = [0.0] * len(rows)
        for name, values, color, hatch in parts:
            ms = [1e3 * v for v in values]
            share = [100 * v / t if t > 0 else 0.0 for v, t in zip(values, iteration, strict=True)]
            abs_ax.bar(positions, ms, 0.65, bottom=bottom, label=name, color=color, hatch=hatch, edgecolor="white")
            share_ax.bar(positions, share, 0.65, bottom=share_bottom, color=color, hatch=hatch, edgecolor="white")
            bottom = [b + v for b, v in zip(bottom, ms, strict=True)]
            share_bottom = [b + v for b, v in zip(share_bottom, share, strict=True)]
        if not all(math.isnan(c) for c in comm):
            abs_ax.plot(
                positions,
                [1e3 * c for c in comm],
                linestyle="none",
                marker="D",
                color="black",
                label="all communication (incl. overlapped)",
            )
        for ax in (abs_ax, share_ax):
            ax.set_xticks(positions, labels)
            ax.set_xlabel("nodes (devices)")
            ax.grid(axis="x", visible=False)
        abs_ax.set_ylabel("time per iteration (ms)")
        abs_ax.set_title(run_label(Path(run)), fontsize=10)
        share_ax.set_ylabel("share of iteration (%)")
        share_ax.set_ylim(0, 100)
        share_ax.set_title("where the iteration goes")
        _legend_below(fig, [abs_ax], ncols=4)
        return figure_png(fig)


# a transformer layout's parts (``TrainingResult``'s layout row), as the breakdown plot stacks them
TRANSFORMER_BARS = (
    ("compute_s", "compute", "#0072B2", None),
    ("tp_s", "tensor parallel", "#D55E00", "//"),
    ("cp_s", "context parallel", "#CC79A7", "//"),
    ("ep_s", "expert parallel", "#E69F00", "//"),
    ("zero3_s", "ZeRO-3 gathers", "#56B4E9", "//"),
    ("pipeline_wait_s", "pipeline wait (bubble, messages)", "#BBBBBB", ".."),
    ("dp_wait_s", "data-parallel wait", "#009E73", "xx"),
)


def transformer_parts(rows: list[dict[str, str]], iteration: list[float]) -> tuple:
    """The stacked parts of transformer rows: each part some row has, and, where the executor did not
    split the waits (the closed form), the rest of the iteration as one wait."""

    def values(name: str) -> list[float]:
        return [float(row[name]) if row.get(name) not in (None, "") else 0.0 for row in rows]

    parts = [(label, values(name), color, hatch) for name, label, color, hatch in TRANSFORMER_BARS
             if any(values(name))]  # fmt: skip
    rest = [max(t - sum(part[1][i] for part in parts), 0.0) for i, t in enumerate(iteration)]
    if any(value > 1e-9 * t for value, t in zip(rest, iteration, strict=True)):
        parts.append(("waits (pipeline bubble, messages, data-parallel)", rest, "#BBBBBB", ".."))
    return tuple(parts)


def plot_breakdown(run: Path, out_png: Path) -> None:
    save_png(breakdown_png(run), out_png)


def _metric_axes_values(metric: str, rows: list[dict[str, str]]) -> tuple[list[float], list[float], list[str]]:
    scale = METRIC_LABELS.get(metric, (metric, "", 1.0))[2]
    measured, predicted, status = [], [], []
    for row in rows:
        try:
            m, p = float(row["measured"]) * scale, float(row["predicted"]) * scale
        except ValueError:
            continue
        if m > 0 and p > 0 and math.isfinite(m) and math.isfinite(p):
            measured.append(m)
            predicted.append(p)
            status.append(row["status"])
    return measured, predicted, status


def validate_png(directory: Path) -> bytes:
    """Predicted against measured, one panel per metric, y = x with +-10 % and +-25 % bands.

    Rows with status ``cannot_model`` have no prediction and are counted in the panel title;
    ``calibration`` rows (used to fit the model) are drawn hollow, ``predicted`` rows filled. The
    title is the summary's ``formatting.validation_headline`` (as the report shows it).
    """
    with validate_figure(directory) as fig:
        return figure_png(fig)


@contextmanager
def validate_figure(directory: Path) -> Iterator[Figure]:
    """The figure of ``validate_png``, open for inspection inside the block."""
    rows = validation_rows(directory)
    summary = validation_summary(directory)
    metrics = sorted({row["metric"] for row in rows})
    tall = len(metrics) > 2
    nrows, ncols = (2, 2) if tall else (1, max(len(metrics), 1))
    with _figure("validate_tall" if tall else "validate", nrows, ncols) as (fig, axes):
        flat = [ax for line in axes for ax in line]
        for ax in flat[len(metrics) :]:
            ax.set_visible(False)
        for ax, metric in zip(flat, metrics, strict=False):
            mine = [row for row in rows if row["metric"] == metric]
            measured, predicted, status = _metric_axes_values(metric, mine)
            name, unit, _ = METRIC_LABELS.get(metric, (metric, "", 1.0))
            unmodeled = sum(row["status"] == "cannot_model" for row in mine)
            if measured:
                low = min(min(measured), min(predicted)) / 1.5
                high = max(max(measured), max(predicted)) * 1.5
                log = metric != "scaling_efficiency" and high / low > 20
                grid = [low * (high / low) ** (i / 100) for i in range(101)]
                for band, alpha in ((0.25, 0.10), (0.10, 0.18)):
                    ax.fill_between(
                        grid,
                        [g * (1 - band) for g in grid],
                        [g * (1 + band) for g in grid],
                        color="#0072B2",
                        alpha=alpha,
                        linewidth=0,
                        label=f"within ±{band:.0%}",
                    )
                ax.plot(grid, grid, color="black", linewidth=1.0, linestyle="--", label="predicted = measured")
                for wanted, style in (
                    ("predicted", {"marker": "o", "color": "#D55E00", "label": "held-out prediction"}),
                    (
                        "calibration",
                        {
                            "marker": "s",
                            "markerfacecolor": "none",
                            "color": "#009E73",
                            "label": "calibration point (fitted)",
                        },
                    ),
                ):
                    xs = [m for m, s in zip(measured, status, strict=True) if s == wanted]
                    ys = [p for p, s in zip(predicted, status, strict=True) if s == wanted]
                    if xs:
                        ax.plot(xs, ys, linestyle="none", markersize=5, alpha=0.85, **style)
                if log:
                    ax.set_xscale("log")
                    ax.set_yscale("log")
                ax.set_xlim(low, high)
                ax.set_ylim(low, high)
                ax.set_aspect("equal", adjustable="box")
            suffix = f" ({unit})" if unit else ""
            ax.set_xlabel(f"measured {name}{suffix}")
            ax.set_ylabel(f"predicted {name}{suffix}")
            title = f"{name}: {len(measured)} points"
            if unmodeled:
                title += f", {unmodeled} cannot model"
            ax.set_title(title)
        if summary:
            fig.suptitle(validation_headline(summary), fontsize=11)
        _legend_below(fig, flat[: len(metrics)], ncols=5)
        yield fig


def plot_validate(directory: Path, out_png: Path) -> None:
    save_png(validate_png(directory), out_png)


Reference = tuple[str, int, Sequence[float], Sequence[float]]  # label, ranks, message bytes, times (s)


def collective_png(runs: Sequence[Path], references: Sequence[Reference] = ()) -> bytes:
    """Time (left) and bus bandwidth (right) against message size, one line per (run, algorithm, ranks).

    ``references``: measured points to draw beside the predictions (hollow black markers), e.g. a
    published benchmark; their bus bandwidth uses the all-reduce factor 2(n-1)/n.
    """
    with _figure("collective") as (fig, axes):
        time_ax, bw_ax = axes[0]
        styles = _styles()
        for run in runs:
            rows = collective_rows(run)
            context = run_label(Path(run))
            series: dict[tuple[str, int], list[dict[str, str]]] = {}
            for row in rows:
                series.setdefault((row["algorithm"], int(row["ranks"])), []).append(row)
            for (algorithm, ranks), points in series.items():
                resolved = sorted({row.get("resolved_algorithm") or algorithm for row in points} - {algorithm})
                name = f"{algorithm} (as {'/'.join(resolved)})" if resolved else algorithm
                points.sort(key=lambda row: float(row["message_bytes"]))
                sizes = [float(row["message_bytes"]) for row in points]
                style = next(styles)
                label = f"{name}, {ranks} ranks, {context}"
                time_ax.plot(sizes, [float(row["time_s"]) * 1e3 for row in points], label=label, **style)
                bw_ax.plot(sizes, [float(row["busbw_Bps"]) / 1e9 for row in points], label=label, **style)
        for (label, ranks, measured_sizes, times), marker in zip(references, MARKERS, strict=False):
            hollow = {"linestyle": "none", "marker": marker, "markerfacecolor": "none", "color": "black"}
            time_ax.plot(measured_sizes, [1e3 * t for t in times], label=label, markersize=8, **hollow)
            factor = 2 * (ranks - 1) / ranks
            bw = [size / t * factor / 1e9 for size, t in zip(measured_sizes, times, strict=True)]
            bw_ax.plot(measured_sizes, bw, markersize=8, **hollow)
        for ax in (time_ax, bw_ax):
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_bytes_label))
            ax.set_xlabel("message size per rank")
        time_ax.set_yscale("log")
        time_ax.set_ylabel("collective time (ms)")
        time_ax.set_title("time")
        bw_ax.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
        bw_ax.set_ylim(bottom=0)
        bw_ax.set_title("bus bandwidth")
        _legend_below(fig, [time_ax])
        return figure_png(fig)


def plot_collective(runs: Sequence[Path], out_png: Path) -> None:
    save_png(collective_png(runs), out_png)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def expected_png_size(kind: str) -> tuple[int, int]:
    width, height = FIGURE_SIZES[kind]
    return round(width * DPI), round(height * DPI)
