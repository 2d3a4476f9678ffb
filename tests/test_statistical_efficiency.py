"""The statistical-efficiency model: calculator numbers, directions, bad input, the fit."""

from __future__ import annotations

import math

import pytest

from ddlsim.simulator.statistical_efficiency import (
    GENERIC,
    ConvergenceProfile,
    StatisticalModelError,
    fit_staleness_cost,
    profile_for,
    steps_to_target,
    time_to_accuracy,
)


def test_calculator_example():
    """a_max 0.9, T 1000, B_crit 4096, target 0.6, B 4096: -1000 ln(1/3) x 2 = 2197.2 steps."""
    assert steps_to_target(0.6, 4096, profile=GENERIC) == pytest.approx(2000 * math.log(3))


def test_each_factor():
    """s = 4 with c 0.05 adds 20%; tau 6 with c 0.02 adds 10%; B = B_crit / 3 gives 1 + 3 = 4 x S_min."""
    base = steps_to_target(0.6, 4096, profile=GENERIC)
    assert steps_to_target(0.6, 4096, staleness=4, profile=GENERIC) == pytest.approx(base * 1.2)
    assert steps_to_target(0.6, 4096, tau=6, profile=GENERIC) == pytest.approx(base * 1.1)
    assert steps_to_target(0.6, 4096 / 3, profile=GENERIC) == pytest.approx(base * 2)


def test_directions():
    steps = [steps_to_target(0.5, 256, staleness=s) for s in (0, 1, 4, 16)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    by_batch = [steps_to_target(0.5, b) for b in (64, 1024, 16384, 65536)]
    assert by_batch == sorted(by_batch, reverse=True)
    # beyond the critical batch (4096), a bigger batch barely saves steps (McCandlish et al. 2018)
    assert by_batch[0] / by_batch[1] > 3 and by_batch[2] / by_batch[3] < 1.3
    higher = [steps_to_target(t, 256) for t in (0.3, 0.6, 0.85)]
    assert higher == sorted(higher)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target_accuracy": 0.95}, "not reachable"),
        ({"target_accuracy": 0.0}, "not reachable"),
        ({"batch": 0}, "batch must be > 0"),
        ({"staleness": -1}, "staleness must be >= 0"),
        ({"tau": 0}, "tau must be >= 1"),
    ],
)
def test_bad_input(kwargs, message):
    arguments = {"target_accuracy": 0.5, "batch": 32} | kwargs
    with pytest.raises(StatisticalModelError, match=message):
        steps_to_target(**arguments)


def test_time_to_accuracy_units_per_family():
    """Async: a step is one server update (4 workers x 10 updates = 40 in 2 s -> 0.05 s each, batch 32);
    sync: a step is one round of all workers (10 in 2 s -> 0.2 s, batch 128)."""
    asynchronous = time_to_accuracy("asynchronous", 0.5, 2.0, 4, 10, 32)
    assert asynchronous.seconds_per_step == pytest.approx(0.05) and asynchronous.batch_per_step == 32
    synchronous = time_to_accuracy("synchronous", 0.5, 2.0, 4, 10, 32)
    assert synchronous.seconds_per_step == pytest.approx(0.2) and synchronous.batch_per_step == 128
    assert synchronous.time_to_accuracy_s == pytest.approx(steps_to_target(0.5, 128) * 0.2)
    with pytest.raises(StatisticalModelError, match="unknown algorithm family"):
        time_to_accuracy("magic", 0.5, 1.0, 1, 1, 1)


def test_fit_recovers_the_staleness_cost():
    profile = ConvergenceProfile(0.9, 100.0, 64.0, staleness_cost=0.1)
    staleness = [0.0, 2.0, 4.0, 8.0]
    steps = [steps_to_target(0.5, 32, s, profile=profile) for s in staleness]
    s0, cost = fit_staleness_cost(staleness, steps)
    assert cost == pytest.approx(0.1) and s0 == pytest.approx(steps[0])


def test_known_and_unknown_workloads():
    assert profile_for("resnet50").max_accuracy == pytest.approx(0.761)
    assert profile_for("something_new") is GENERIC
