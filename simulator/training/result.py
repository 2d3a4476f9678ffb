"""What a simulated training run reports, whichever executor ran it: one tidy row per scenario point.

Every algorithm, synchronous or not, gives the same columns (SI units, suffixed names):

* ``iteration_s``: seconds per gradient step of a worker, the run's time over its steps; the run's
  time is when its last worker finished;
* ``compute_s``: one device's step with no communication (forward, backward, update), the base of
  ``speedup`` = throughput / (per-device batch / compute_s) and ``scaling_efficiency`` = speedup /
  devices (weak scaling against one device);
* ``exposed_comm_s``: iteration_s - compute_s (floored at 0): what communication and waiting add;
* ``comm_s``: per worker and step, the time its collectives and messages took (overlapped or not);
* ``comm_share``: per worker, the share of its run spent blocked in communication (mean);
* parameter servers (or the EASGD master): ``server_utilisation`` (share of the run not waiting in
  a receive), ``server_queue_s`` (mean wait of a push in the mailbox), staleness of the pushes they
  applied; ``-`` where there are none.
* transformer layouts (``megatron``): ``tokens_per_s``, ``tflops_per_gpu`` (model FLOPs, as the
  papers count them) and ``mfu`` (of the device's peak at the precision), and where an iteration of
  the rank that finishes last goes: ``compute_s`` (its layers and the optimizer step), ``tp_s``,
  ``cp_s``, ``ep_s`` and ``zero3_s`` (communication inside its layers), ``pipeline_wait_s`` (waiting
  for activations and gradients from its neighbours: the bubble and the messages) and
  ``dp_wait_s`` (waiting for the data-parallel reductions and gathers). They sum to iteration_s.
  Speedup and scaling efficiency against one device do not apply (the model does not fit on one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddlsim.simulator.records import SCALING_COLUMNS, TRANSFORMER_PARTS

if TYPE_CHECKING:
    import numpy as np

RESULT_COLUMNS = (
    *SCALING_COLUMNS,
    "comm_s",
    "analytic_iteration_s",
    "algorithm",
    "collective",
    "workers",
    "servers",
    "updates",
    "time_s",
    "comm_share",
    "server_utilisation",
    "server_queue_s",
    "staleness_mean",
    "staleness_p99",
    "staleness_max",
    "buckets",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "tp_s",
    "cp_s",
    "ep_s",
    "zero3_s",
    "pipeline_wait_s",
    "dp_wait_s",
    "executor",
    "execution_path",
)


@dataclass
class TrainingResult:
    """One executed (or closed-form) scenario point; times in seconds."""

    algorithm: str
    collective: str
    nodes: int
    devices: int
    workers: int
    servers: int
    steps: int
    samples_per_step: int
    time_s: float
    compute_s: float  # one device's step, no communication
    comm_s: float  # per worker and step
    comm_share: float
    buckets: int
    executor: str
    path: str
    server_utilisation: float = math.nan
    server_queue_s: float = math.nan
    server_queue_peak: int = 0
    # staleness of each push the servers applied (the event simulation's); None: none recorded (the
    # closed form, which needs no numpy)
    staleness: np.ndarray | None = None
    transfers: int = 0
    analytic_iteration_s: float | None = None  # the closed form beside a DES result, where one exists
    layout: dict[str, float] | None = None  # transformer layouts: per-iteration figures (see the docstring)

    @property
    def iteration_s(self) -> float:
        return self.time_s / self.steps

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples_per_step / self.iteration_s

    def row(self, per_device_batch: int) -> dict[str, Any]:
        """The results.csv row (``RESULT_COLUMNS``); figures that do not apply are None."""
        if self.layout is not None:
            return self._layout_row()
        speedup = self.throughput_samples_per_s / (per_device_batch / self.compute_s)
        # a synchronous parameter server applies no stale gradient: 0, not "does not apply"
        mean, p99, largest = _staleness_figures(self.staleness)
        has_servers = self.servers > 0
        return {
            "nodes": self.nodes,
            "devices": self.devices,
            "global_batch": self.samples_per_step,
            "iteration_s": self.iteration_s,
            "compute_s": self.compute_s,
            "exposed_comm_s": max(self.iteration_s - self.compute_s, 0.0),
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "speedup": speedup,
            "scaling_efficiency": speedup / self.devices,
            "comm_s": self.comm_s,
            "analytic_iteration_s": self.analytic_iteration_s,
            "algorithm": self.algorithm,
            "collective": self.collective,
            "workers": self.workers,
            "servers": self.servers,
            "updates": self.steps,
            "time_s": self.time_s,
            "comm_share": self.comm_share,
            "server_utilisation": self.server_utilisation if has_servers else None,
            "server_queue_s": self.server_queue_s if has_servers else None,
            "staleness_mean": mean if has_servers else None,
            "staleness_p99": p99 if has_servers else None,
            "staleness_max": largest if has_servers else None,
            "buckets": self.buckets,
            "executor": self.executor,
            "execution_path": self.path,
        }

    def _layout_row(self) -> dict[str, Any]:
        assert self.layout is not None
        layout = self.layout
        row: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
        row |= {
            "nodes": self.nodes,
            "devices": self.devices,
            "global_batch": self.samples_per_step,
            "iteration_s": self.iteration_s,
            "exposed_comm_s": max(self.iteration_s - layout["compute_s"], 0.0),
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "comm_s": self.comm_s,
            "analytic_iteration_s": self.analytic_iteration_s,
            "algorithm": self.algorithm,
            "collective": self.collective,
            "workers": self.workers,
            "servers": self.servers,
            "updates": self.steps,
            "time_s": self.time_s,
            "comm_share": self.comm_share,
            "tokens_per_s": layout["tokens_per_step"] / self.iteration_s,
            "tflops_per_gpu": layout["model_flops_per_step"] / self.iteration_s / self.devices / 1e12,
            "mfu": layout["model_flops_per_step"] / self.iteration_s / self.devices / layout["peak_flops"],
            "executor": self.executor,
            "execution_path": self.path,
        }
        for name in TRANSFORMER_PARTS:
            row[name] = layout.get(name)
        return row

    def staleness_histogram(self) -> list[dict[str, int]]:
        import numpy as np

        values, counts = np.unique(self.staleness if self.staleness is not None else [], return_counts=True)
        return [
            {"nodes": self.nodes, "staleness": int(v), "count": int(c)}
            for v, c in zip(values, counts, strict=True)
        ]


def _staleness_figures(staleness: np.ndarray | None) -> tuple[float, float, int]:
    """(mean, 99th percentile, largest) of the pushes' staleness; 0 where none was recorded."""
    if staleness is None or not staleness.size:
        return 0.0, 0.0, 0
    import numpy as np

    return float(staleness.mean()), float(np.percentile(staleness, 99)), int(staleness.max())
