"""Sweeps: many scenario points, run by an existing executor pool, in a fixed result order.

Each point is a pure function of (scenario, nodes), so results are identical whichever pool
runs them: ``serial``, a local process pool (``process``), or ``mpi4py.futures`` under mpiexec
(``mpi``). ``run_tasks`` is that machinery for any pure function of picklable tasks (``ddlsim
plan`` times its layouts and event-simulates its best ones through it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ddlsim.simulator.closed_form.training import STRAGGLER_CLOSED_FORMS, closed_form_result
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
        # imported here: the event simulation (SimPy, the engine) is a tenth of a second of imports
        # that the closed form does not need (its million-node point takes well under a second)
        from ddlsim.simulator.executor.des import run_des

        result = run_des(scenario, nodes, des_mode).result
        noisy = scenario.stragglers not in ("", "none")
        if scenario.training_algorithm.has_closed_form and (not noisy or scenario.algorithm in STRAGGLER_CLOSED_FORMS):
            result.analytic_iteration_s = closed_form_result(scenario, nodes).iteration_s
    factor = scenario.overlap_interference
    if factor > 0:
        iteration_s = with_interference(result.iteration_s, result.compute_s, result.comm_s, factor)
        result.time_s = iteration_s * result.steps
    return result.row(scenario.per_device_batch)


def _point(args: tuple[Scenario, int]) -> dict[str, Any]:
    return simulate_point(*args)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT (Ctrl-C) or SIGTERM; ``rows`` holds the points that finished
    (index into ``scenario.nodes`` -> row), which the caller's ``on_row`` has already seen."""

    def __init__(self, signum: int, rows: dict[int, dict[str, Any]]) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} after {len(rows)} finished point(s)")
        self.signum = signum
        self.rows = rows


class _Stop(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler of a running sweep."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM stops the main thread as Ctrl-C does (only the main thread can
    install handlers; elsewhere the block changes nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise _Stop()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _worker_ignores_sigint() -> None:
    # Ctrl-C reaches the whole foreground process group: the parent alone decides what it means, and
    # ends the workers itself (no traceback per worker)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _end_workers(executor: concurrent.futures.Executor) -> None:
    """Cancel what has not started and end the workers now, without waiting for their points."""
    processes = list(getattr(executor, "_processes", None) or {})
    executor.shutdown(wait=False, cancel_futures=True)
    for pid in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in processes:  # reap them, so that none is left as a zombie or an orphan
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def run_sweep(
    scenario: Scenario,
    workers: int | None = None,
    pool: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    on_row: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Simulate every node count of ``scenario``; rows come back in the order of ``scenario.nodes``.

    ``progress(done, total)`` after each point; ``on_row(index, row)`` as each point finishes (in
    finishing order; ``index`` into ``scenario.nodes``), so a caller can write rows as they come.
    SIGINT (Ctrl-C) or SIGTERM stops the sweep promptly: points not started are cancelled, the
    pool's workers are ended, and ``SweepInterrupted`` (a KeyboardInterrupt) carries the finished rows.
    """
    tasks = [(scenario, nodes) for nodes in scenario.nodes]
    # biggest points first, so the slowest does not start last
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i][1])
    return run_tasks(_point, tasks, workers, pool, progress, on_row, order)


def run_tasks(
    function: Callable[[Any], Any],
    tasks: list[Any],
    workers: int | None = None,
    pool: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    on_result: Callable[[int, Any], None] | None = None,
    order: list[int] | None = None,
) -> list[Any]:
    """``function`` of every task, in the tasks' order, run by ``pool`` with ``workers`` processes
    (default: one per task up to the cores; ``auto`` is serial for one worker or one task, else a
    process pool). ``function`` must be a top-level function and the tasks picklable. ``order``:
    the order to submit them in. Interrupts as ``run_sweep`` (``SweepInterrupted`` carries the
    finished results by index)."""
    if pool not in POOLS:
        raise ScenarioError(f"unknown executor pool {pool!r}; valid: {', '.join(POOLS)}")
    total = len(tasks)
    if workers is not None and workers < 1:
        raise ScenarioError(f"workers must be a positive integer, got {workers!r}")
    workers = workers or max(1, min(os.cpu_count() or 1, total))
    if pool == "auto":
        pool = "serial" if workers == 1 or total <= 1 else "process"
    finished: dict[int, Any] = {}

    def keep(index: int, result: Any) -> None:
        finished[index] = result
        if on_result:
            on_result(index, result)
        if progress:
            progress(len(finished), total)

    executor: concurrent.futures.Executor | None = None
    try:
        with _sigterm_interrupts():
            if pool == "serial":
                for index, task in enumerate(tasks):
                    keep(index, function(task))
            else:
                executor = _executor(pool, workers)
                submitted = range(total) if order is None else order
                futures = {executor.submit(function, tasks[i]): i for i in submitted}
                for future in concurrent.futures.as_completed(futures):
                    keep(futures[future], future.result())
                executor.shutdown()
    except KeyboardInterrupt as interrupt:
        if executor is not None:
            _end_workers(executor)
        raise SweepInterrupted(getattr(interrupt, "signum", signal.SIGINT), finished) from None
    except BaseException:
        if executor is not None:
            _end_workers(executor)
        raise
    return [finished[index] for index in range(total)]


def _executor(pool: str, workers: int) -> concurrent.futures.Executor:
    if pool == "mpi":
        try:
            from mpi4py.futures import MPIPoolExecutor
        except ImportError:
            raise ScenarioError("--executor-pool mpi needs mpi4py: pip install 'ddlsim[real]'") from None
        return MPIPoolExecutor(max_workers=workers)
    return concurrent.futures.ProcessPoolExecutor(max_workers=workers, initializer=_worker_ignores_sigint)
