"""Sweeps: many scenario points, run by an existing executor pool, in a fixed result order.

Each point is a pure function of (scenario, nodes), so results are identical whichever pool
runs them: ``serial``, a local process pool (``process``), or ``mpi4py.futures`` under mpiexec
(``mpi``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import re
from collections.abc import Callable
from typing import Any

from ddlsim.simulator.closed_form.training import closed_form_result
from ddlsim.simulator.executor.des import run_des
from ddlsim.simulator.scenario import Scenario, ScenarioError
from ddlsim.simulator.training.trainers import with_interference

POOLS = ("auto", "serial", "process", "mpi")


def parse_counts(text: str, what: str = "nodes") -> tuple[int, ...]:
    """Parse counts: "1,2,4", "1,2,4,...,256" (continue the pattern), "1:256:x2", "2:16:+2", "1:8".

    Example: "1,2,4,...,32" -> (1, 2, 4, 8, 16, 32); "1:9:+4" -> (1, 5, 9).
    """
    allowed = "a list (1,2,4), a continued list (1,2,4,...,256) or a range (1:256:x2, 2:16:+2, 1:8)"
    text = text.strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop = int(parts[0]), int(parts[1])
            step = parts[2] if len(parts) == 3 else "+1"
            match = re.fullmatch(r"([x*+])(\d+)", step)
            if not match or int(match.group(2)) < (2 if match.group(1) in "x*" else 1):
                raise ValueError
            factor, values, current = int(match.group(2)), [], start
            while current <= stop:
                values.append(current)
                current = current * factor if match.group(1) in "x*" else current + factor
            counts = tuple(values)
        else:
            items = [item.strip() for item in text.split(",")]
            if "..." in items:
                at = items.index("...")
                if at < 2 or at != len(items) - 2 or "..." in items[at + 1 :]:
                    raise ValueError
                head = [int(item) for item in items[:at]]
                last = int(items[-1])
                a, b = head[-2], head[-1]
                found = _continue(head, last, geometric=True) if a > 0 and b % a == 0 and b // a >= 2 else None
                if found is None:
                    found = _continue(head, last, geometric=False)
                if found is None:
                    raise ScenarioError(f"{what}: the pattern {text!r} does not reach {last}")
                values = found
                counts = tuple(values)
            else:
                counts = tuple(int(item) for item in items)
    except ValueError:
        raise ScenarioError(f"{what}: cannot parse {text!r}; allowed: {allowed}") from None
    if not counts:
        raise ScenarioError(f"{what}: {text!r} gives no values")
    bad = [count for count in counts if count < 1]
    if bad:
        raise ScenarioError(f"{what}: counts must be positive, got {bad[0]}")
    return counts


def parse_sizes(text: str) -> tuple[float, ...]:
    """Parse message sizes: "100MB", "1KB,4KB" or a geometric sweep "1KB:1GB:x2" (bytes)."""
    from ddlsim.hardware_models.units import parse_bytes

    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3 or not re.fullmatch(r"[x*]\d+", parts[2]) or int(parts[2][1:]) < 2:
            raise ScenarioError(f"--message-bytes: cannot parse {text!r}; write e.g. 1KB:1GB:x2")
        start, stop, factor = parse_bytes(parts[0]), parse_bytes(parts[1]), int(parts[2][1:])
        sizes = []
        current = start
        while current <= stop * (1 + 1e-12) and start > 0:
            sizes.append(current)
            current *= factor
    else:
        sizes = [parse_bytes(item, "--message-bytes") for item in text.split(",")]
    if not sizes or any(not size > 0 for size in sizes):
        raise ScenarioError(f"--message-bytes: sizes must be > 0 bytes, got {text!r}")
    return tuple(sizes)


def _continue(head: list[int], last: int, geometric: bool) -> list[int] | None:
    """Extend ``head`` by its last ratio (or difference) up to ``last``; None unless it lands on ``last``
    and ``head`` itself follows the same pattern."""
    a, b = head[-2], head[-1]
    step = (lambda v: v * (b // a)) if geometric else (lambda v: v + (b - a))
    if any(step(x) != y for x, y in itertools.pairwise(head)) or step(b) <= b:
        return None
    values = list(head)
    while values[-1] < last:
        values.append(step(values[-1]))
    return values if values[-1] == last else None


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
