"""Every training algorithm run for real through its role program: the MPI test bodies.

Run on every rank: ``mpiexec -n N python -m tests.mpi.test_algorithms_body [BODY ...]`` (the
launcher is ``tests/test_algorithms_mpi.py``). A failing rank prints the failure and aborts the
job, so exit status 0 means every body passed on every rank. Under plain pytest the single-rank
test below runs the bodies that make sense on one rank (``COMM_WORLD`` of size 1).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ddlsim.algorithms.training_algorithm import TRAINING_ALGORITHMS, make_options
from ddlsim.simulator.records import TRACE_COLUMNS

STEPS = 30
DELAYS = (0, 2, 4, 8)  # artificial staleness of async_sgd, in pulls
TARGET_LOSS = 1.0  # full-data cross-entropy on digits (2.31 at the start)


def runnable(name: str, ranks: int) -> bool:
    algorithm = TRAINING_ALGORITHMS.get(name)
    if algorithm.name == "megatron":  # a transformer layout: tests/mpi/test_megatron_body.py runs it
        return False
    if algorithm.name == "hybrid_parallel":
        return ranks % 2 == 0
    return ranks >= 2 or not algorithm.uses_servers


def options_for(name: str, ranks: int) -> Any:
    values: dict[str, Any] = {}
    if "easgd" in name:
        values["tau"] = 2
    if name == "sync_easgd":
        values["alpha"] = 0.9 / ranks  # Zhang et al. 2015: beta = P alpha = 0.9 keeps the center stable
    if name.startswith("hogwild"):
        values["threads"] = 2
    return make_options(name, values)


def rate_for(name: str) -> float:
    """Learning rate of the every-algorithm body. Hogwild SGD pushes each worker's two-thread delta,
    racing with the others, so its step per server update is several gradients long: at 0.3 about one
    worker in 75 (loaded 2-core machine) diverged into dead ReLUs (final loss 2.31-2.43, the
    class-prior entropy); at 0.15 the worst of 75 was 1.32. Plain async SGD on 4 ranks (3 workers
    applying stale gradients) did the same once in CI at 0.3 (2.31 -> 2.36); on a loaded machine its
    worst final/initial ratio of 300 workers was 0.83 at 0.3 and 0.47 at 0.15."""
    return 0.15 if name in ("hogwild_sgd", "async_sgd") else 0.3


def check_every_algorithm(transport: Any) -> None:
    """Fixed seed, 30 steps per worker: every worker's full-data loss falls by at least 5% (typically
    15-80%; hybrid: the last stage's minibatch loss, by 10%), synchronous replicas agree, traces keep
    the schema."""
    from ddlsim.real_runs.algorithm_runs import RunSettings, run_algorithm
    from ddlsim.real_runs.trace import read_trace

    size = transport.size
    for name in TRAINING_ALGORITHMS.names():
        if not runnable(name, size):
            continue
        with tempfile.TemporaryDirectory() as scratch:
            directory = transport.bcast_object(scratch)
            settings = RunSettings(
                name, options_for(name, size), steps=STEPS, learning_rate=rate_for(name), seed=0, trace_dir=directory
            )
            result = run_algorithm(settings, transport)
            transport.barrier()
            rows = read_trace(directory) if transport.rank == 0 else []
            transport.barrier()
        if result.role == "worker" and name != "hybrid_parallel":
            assert result.final_loss < 0.95 * result.initial_loss, (name, result.initial_loss, result.final_loss)
        if name == "hybrid_parallel" and result.losses:
            assert np.mean(result.losses[-5:]) < 0.9 * result.losses[0], (name, result.losses)
        digests = transport.allgather_object((result.role, round(result.weights_digest, 4)))
        if name in ("sync_sgd", "sync_sgd_ps"):
            assert len({digest for role, digest in digests if role == "worker"}) == 1, (name, digests)
        if transport.rank == 0:
            assert rows and all(tuple(row) == TRACE_COLUMNS for row in rows), name
            assert {row["rank"] for row in rows} == set(range(size)), name


def check_staleness_trend(transport: Any) -> None:
    """async_sgd with one worker, the weights it uses delayed by d pulls: updates until the server's
    full-data loss reaches 1.0 grow with d, as the statistical-efficiency model says (c > 0)."""
    if transport.size != 2:
        return  # one server and one worker: the delay is the only staleness
    from ddlsim.real_runs.algorithm_runs import RunSettings, run_algorithm, steps_to_target
    from ddlsim.simulator.statistical_efficiency import fit_staleness_cost

    budget = 110
    steps = []
    for delay in DELAYS:
        options = make_options("async_sgd", {"staleness": delay})
        settings = RunSettings("async_sgd", options, steps=budget, learning_rate=0.2, evaluate_every=1)
        result = run_algorithm(settings, transport)
        if transport.rank == 0:
            reached = steps_to_target(result.evaluations, TARGET_LOSS)
            steps.append(budget + 1 if reached is None else reached)  # not reached: beyond the budget
    if transport.rank == 0:
        assert steps == sorted(steps) and steps[-1] > steps[0], steps
        _, cost = fit_staleness_cost([float(d) for d in DELAYS], [float(s) for s in steps])
        assert cost > 0, (steps, cost)
        print(f"staleness {DELAYS} -> updates to loss {TARGET_LOSS}: {steps} (fitted c = {cost:.3f})", flush=True)


BODIES: dict[str, Callable[[Any], None]] = {
    "every_algorithm": check_every_algorithm,
    "staleness_trend": check_staleness_trend,
}


def test_synchronous_algorithms_on_one_rank():
    """The same bodies on a one-rank COMM_WORLD (only algorithms without servers run there)."""
    pytest.importorskip("mpi4py")
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from ddlsim.real_runs.transport import MpiTransport

    transport = MpiTransport()
    if transport.size != 1:
        pytest.skip("runs on one rank; mpiexec runs use main()")
    check_every_algorithm(transport)


def main(argv: list[str]) -> int:
    from ddlsim.real_runs.transport import MpiTransport
    from tests.mpi.run_bodies import run_named

    return run_named(MpiTransport(), BODIES, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
