"""Sweeps: many scenario points, run by an existing executor pool, in a fixed result order.

Each point is a pure function of (scenario, nodes), so results are identical whichever pool
runs them: ``serial``, a local process pool (``process``), or ``mpi4py.futures`` under mpiexec
(``mpi``).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from typing import Any

# parse_sizes moved to hardware_models.units and parse_counts to the command line's parsing helper;
# both names stay importable from here for callers not yet moved (simulate_command)
from ddlsim.hardware_models.units import parse_sizes  # noqa: F401
from ddlsim.simulator.cli.parsing import parse_counts  # noqa: F401
from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.training.trainers import with_interference

POOLS = ("auto", "serial", "process", "mpi")


def simulate_point(scenario: Scenario, nodes: int, des_mode: str = "auto") -> dict[str, Any]:
    """One row of the results table (``simulator.training.result.RESULT_COLUMNS``, SI units).

    The DES row also carries the closed form's iteration time where the algorithm has one.
    """
    if scenario.executor == "analytic":
        result = closed_form_result(scenario, nodes)
    else:
        result = run_des(scenario, nodes, des_mode).result
        if scenario.training_algorithm.has_closed_form:
            result.analytic_iteration_s = closed_form_result(scenario, nodes).iteration_s
    factor = scenario.overlap_interference
    if factor > 0:
        iteration_s = with_interference(result.iteration_s, result.compute_s, result.comm_s, factor)
        result.time_s = iteration_s * result.steps
    return result.row(scenario.per_device_batch)


def _point(args: tuple[Scenario, int]) -> dict[str, Any]:
    return simulate_point(*args)


def run_sweep(
    scenario: Scenario,
    workers: int | None = None,
    pool: str = "auto",
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Simulate every node count of ``scenario``; rows come back in the order of ``scenario.nodes``."""
    if pool not in POOLS:
        raise ScenarioError(f"unknown executor pool {pool!r}; valid: {', '.join(POOLS)}")
    tasks = [(scenario, nodes) for nodes in scenario.nodes]
    total = len(tasks)
    if workers is not None and workers < 1:
        raise ScenarioError(f"workers must be a positive integer, got {workers!r}")
    workers = workers or min(os.cpu_count() or 1, total)
    if pool == "auto":
        pool = "serial" if workers == 1 or total == 1 else "process"
    rows: list[dict[str, Any] | None] = [None] * total
    if pool == "serial":
        for index, task in enumerate(tasks):
            rows[index] = _point(task)
            if progress:
                progress(index + 1, total)
        return [row for row in rows if row is not None]
    executor: concurrent.futures.Executor
    if pool == "mpi":
        try:
            from mpi4py.futures import MPIPoolExecutor
        except ImportError:
            raise ScenarioError("--executor-pool mpi needs mpi4py: pip install 'ddlsim[real]'") from None
        executor = MPIPoolExecutor(max_workers=workers)
    else:
        executor = concurrent.futures.ProcessPoolExecutor(max_workers=workers)
    with executor:
        # biggest points first, so the slowest does not start last
        order = sorted(range(total), key=lambda i: -tasks[i][1])
        futures = {executor.submit(_point, tasks[i]): i for i in order}
        for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            rows[futures[future]] = future.result()
            if progress:
                progress(done, total)
    return [row for row in rows if row is not None]
