"""Plots from result files only (never re-simulating), matplotlib with the Agg backend."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from simulator.records import atomic_open, read_csv

LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _label(run: Path) -> str:
    scenario_file = run / "scenario.json"
    if scenario_file.is_file():
        scenario = json.loads(scenario_file.read_text())["scenario"]
        return (
            f"{scenario['workload']} / {scenario['device']} / {scenario['network']} / {scenario['algorithm']}"
        )
    return run.name


def plot_scaling(runs: Sequence[Path], out_png: Path) -> None:
    """Scaling efficiency (left) and throughput (right) against devices, one line per run directory."""
    fig, (eff_ax, thr_ax) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for index, run in enumerate(runs):
        rows = read_csv(Path(run) / "results.csv")
        devices = [int(row["devices"]) for row in rows]
        style = {
            "linestyle": LINE_STYLES[index % 4],
            "marker": MARKERS[index % 7],
            "label": _label(Path(run)),
        }
        eff_ax.plot(devices, [100 * float(row["scaling_efficiency"]) for row in rows], **style)
        thr_ax.plot(devices, [float(row["throughput_samples_per_s"]) for row in rows], **style)
    for ax in (eff_ax, thr_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.grid(True, which="both", alpha=0.3)
    eff_ax.set_ylabel("scaling efficiency (%)")
    eff_ax.set_ylim(0, 105)
    thr_ax.set_yscale("log")
    thr_ax.set_ylabel("throughput (samples/s)")
    handles, labels = eff_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 2), fontsize=9)
    with atomic_open(out_png, "wb") as handle:
        fig.savefig(handle, format="png", dpi=120)
    plt.close(fig)
