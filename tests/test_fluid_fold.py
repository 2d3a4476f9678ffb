"""The fluid path folded onto one period of ranks (``fluid_fold``) gives the message path's times; it
folds only where the schedule, the fabric and the start repeat."""

import numpy as np
import pytest

from ddlsim.algorithms.collective import COLLECTIVE_ALGORITHMS
from ddlsim.algorithms.schedule import Round, Schedule
from ddlsim.simulator.engine.collective_engine import (
    ContentionDetected,
    MessageExecutor,
    VectorisedExecutor,
    run_collective,
)
from ddlsim.simulator.engine.fluid_executor import FluidExecutor
from ddlsim.simulator.engine.fluid_fold import find_fold, run_fluid
from ddlsim.simulator.engine.round_structures import ScheduleRuns
from tests.test_collective_engine import fabric_of, random_schedule

TOLERANCE = 1e-9


def _fold(schedule, fabric, start=0.0):
    return find_fold(schedule, fabric, ScheduleRuns().get(schedule), start)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=TOLERANCE, atol=0)


@pytest.mark.parametrize(
    ("nodes", "nodes_per_router", "rows", "cols"),
    [
        (128, 2, 16, 8),  # a row a group of 8 nodes: column rings cross a global link each step
        (64, 4, 4, 16),  # a row a group of 16 nodes (4 routers)
    ],
)
def test_torus_2d_on_a_dragonfly_folds_onto_a_row(nodes, nodes_per_router, rows, cols):
    """Column rings whose routes skip a local hop run ahead of the others and share the global
    links with flows of other rounds: the round path declines, the fluid path's state does not
    repeat, and the folded run (one row) gives the message path's times."""
    fabric = fabric_of(nodes, topology="dragonfly", nodes_per_router=nodes_per_router, routers_per_group=4)
    schedule = COLLECTIVE_ALGORITHMS.get("torus_2d").schedule("allreduce", nodes, rows=rows)
    fold = _fold(schedule, fabric)
    assert fold is not None and (fold.ranks, fold.copies) == (cols, rows)
    with pytest.raises(ContentionDetected):
        VectorisedExecutor(fabric).run(schedule, 1e6, 0.0)
    expected = MessageExecutor(fabric).run(schedule, 1e6, 0.0)
    folded, full = FluidExecutor(fabric, fold=fold), FluidExecutor(fabric)
    _close(folded.run(schedule, 1e6, 0.0), expected)
    _close(full.run(schedule, 1e6, 0.0), expected)
    assert folded.transfers == full.transfers == sum(len(rnd) for rnd in schedule.rounds())
    assert folded.instants == full.instants  # the copies' flows start and end together
    times, path = run_collective(schedule, fabric, 1e6)
    assert path == "fluid"
    _close(times, expected)


def _tiled(rng, ranks, copies, rounds):
    """A random schedule over ``ranks * copies`` ranks that repeats every ``ranks`` ranks: each round
    a random pattern of one period's senders (several flows a rank, any receiver), copied to every
    period."""
    total = ranks * copies
    built = []
    for _ in range(rounds):
        count = int(rng.integers(1, 2 * ranks))
        src = rng.integers(0, ranks, count)
        dst = (src + rng.integers(1, total, count)) % total
        lo, size, op = rng.integers(0, 4, count), rng.integers(1, 4, count), rng.integers(0, 2, count)
        shift = np.repeat(np.arange(copies) * ranks, count)
        rnd = Round(
            np.tile(src, copies) + shift,
            (np.tile(dst, copies) + shift) % total,
            np.tile(lo, copies),
            np.tile(lo + size, copies),
            np.tile(op, copies),
        )
        built.extend([rnd] * int(rng.integers(1, 4)))
    return Schedule("tiled", "allreduce", total, 8, lambda: built)


@pytest.mark.parametrize("seed", range(6))
def test_random_repeating_schedules_fold_and_keep_their_times(seed):
    """Any schedule that repeats every 4 ranks on a fat tree of 4 nodes a leaf (each period a leaf,
    several flows a rank, flows of several rounds in flight), started at times that repeat too."""
    rng = np.random.default_rng(seed)
    copies = int(rng.integers(4, 7))
    fabric = fabric_of(4 * copies, topology="fat_tree", nodes_per_leaf=4, oversubscription=2.0)
    schedule = _tiled(rng, 4, copies, 3)
    start = np.tile(rng.uniform(0, 1e-4, 4), copies)
    fold = _fold(schedule, fabric, start)
    assert fold is not None and fold.ranks * fold.copies == schedule.ranks and fold.ranks <= 4
    expected = MessageExecutor(fabric).run(schedule, 1e5, start)
    _close(FluidExecutor(fabric, fold=fold).run(schedule, 1e5, start), expected)
    _close(run_fluid(fabric, schedule, 1e5, start), expected)


def test_no_fold_where_the_schedule_the_fabric_or_the_start_breaks_the_repeat():
    rng = np.random.default_rng(3)
    fabric = fabric_of(24, topology="fat_tree", nodes_per_leaf=4, oversubscription=2.0)
    tiled = _tiled(rng, 4, 6, 3)
    assert _fold(tiled, fabric) is not None
    start = np.zeros(24)
    start[5] = 1e-6  # one rank late
    assert _fold(tiled, fabric, start) is None
    # a period of 6 ranks straddles the leaves of 4 nodes: no link permutation maps the routes
    assert _fold(_tiled(rng, 6, 4, 2), fabric) is None
    assert _fold(random_schedule(rng, 24, most_rounds=4, most_repeats=2), fabric) is None


def test_a_folded_run_keeps_no_log():
    fabric = fabric_of(16, topology="fat_tree", nodes_per_leaf=4)
    schedule = _tiled(np.random.default_rng(0), 4, 4, 2)
    fold = _fold(schedule, fabric)
    assert fold is not None
    with pytest.raises(ValueError, match="folded"):
        FluidExecutor(fabric, fold=fold).run(schedule, 1e5, 0.0, link_use=True)


def test_a_folded_flow_crossing_one_orbit_twice_counts_twice():
    """On a 4 x 8 torus, rank r sends two rows down (r + 16): its route crosses the +row links of its
    own row and of the next, one orbit under the fold (a row); each such link carries two flows,
    which the folded flow, crossing its orbit's link twice, must count twice."""
    fabric = fabric_of(32, topology="torus_2d", torus_dims=(4, 8))
    rank = np.arange(32)
    down, right = (rank + 16) % 32, rank // 8 * 8 + (rank + 1) % 8
    rounds = [Round(rank, down, rank % 3, rank % 3 + 2, np.full(32, 1))] * 3 + [
        Round(rank, right, 0 * rank, 0 * rank + 1, np.zeros(32, dtype=int))
    ]
    schedule = Schedule("down", "allreduce", 32, 4, lambda: rounds)
    start = np.tile(np.linspace(0, 3e-6, 8), 4)
    fold = _fold(schedule, fabric, start)
    assert fold is not None and fold.ranks == 8
    routes = fold.links(fabric.routes(rank[:8], down[:8]))
    assert all(np.unique(row[row >= 0]).size < (row >= 0).sum() for row in routes)  # an orbit twice
    _close(
        FluidExecutor(fabric, fold=fold).run(schedule, 1e6, start), MessageExecutor(fabric).run(schedule, 1e6, start)
    )
